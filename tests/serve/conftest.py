"""The dashboard's fixtures (served.py: how it is started and asked)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conftest import Saphan
from serve.served import Served, serving


@pytest.fixture
def served(saphan_sqlite: Saphan) -> Iterator[Served]:
    """A dashboard over a SQLite workspace with one local machine and a slot."""
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    with serving(saphan_sqlite) as got:
        yield got
