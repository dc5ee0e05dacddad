"""A freshly migrated store on SQLite AND on PostgreSQL (``database_url``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from saphan.store import Store, open_store


@pytest.fixture
def store(database_url: str, tmp_path: Path) -> Iterator[Store]:
    s = open_store(database_url, tmp_path / "unused.db")
    try:
        yield s
    finally:
        s.close()
