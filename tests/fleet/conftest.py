"""A real workspace for the fleet modules' functions: made by the Engine (the
public API `saphan init` uses), on SQLite AND on PostgreSQL (the
``database_url`` fixture), and handed down as the Context they work against."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saphan.context import Context
from saphan.engine import Engine


@pytest.fixture
def ctx(database_url: str, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    # The registry of workspaces is per test, not the account's.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    engine = Engine(tmp_path_factory.mktemp("home") / "saphan")
    engine.init(database_url)
    try:
        yield engine.ctx
    finally:
        engine.close()
