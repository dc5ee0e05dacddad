"""A run's context over a real workspace and a real store (SQLite AND
PostgreSQL, tests/conftest.py's database_url), for run/ modules' tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from saphan.context import Context
from saphan.store.rows import Machine, Slot
from saphan.workspace import Workspace


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own registry of workspaces (never the account's)."""
    d = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(d))
    return d


@pytest.fixture
def workspace(tmp_path: Path, state: Path) -> Workspace:
    ws = Workspace(tmp_path / "home")
    ws.init()
    return ws


@pytest.fixture
def ctx(workspace: Workspace, database_url: str) -> Iterator[Context]:
    """A context whose store is ``database_url``, with machine m and slots
    s1 (capacity 1) and s2 (capacity 2)."""
    workspace.config_path.write_text(f'[database]\nurl = "{database_url}"\n')
    c = Context(workspace)
    c.store.add_machine(Machine("m", "local"))
    c.store.add_slot(Slot("m", "s1", "command", None))
    c.store.add_slot(Slot("m", "s2", "command", 2))
    yield c
    c.close()
