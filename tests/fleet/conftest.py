"""A real workspace for the fleet modules' functions: made by the Engine (the
public API `saphan init` uses), on SQLite AND on PostgreSQL (the
``database_url`` fixture), and handed down as the Context they work against
(tests/conftest.py's ``engine_ctx``)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def ctx(engine_ctx: Any) -> Any:
    return engine_ctx
