"""context.py: what every step and verb works against, over a real
initialised workspace and a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.liveness import current_holder
from saphan.store.rows import Machine, Slot
from saphan.workspace import Workspace

FIRST = "01AAAAAAAAAAAAAAAAAAAAAA01"
SECOND = "01AAAAAAAAAAAAAAAAAAAAAA02"
THIRD = "01BBBBBBBBBBBBBBBBBBBBBB03"


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = Workspace(tmp_path / "home")
    ws.init()
    return ws


@pytest.fixture
def ctx(workspace: Workspace, database_url: str) -> Iterator[Context]:
    workspace.config_path.write_text(f'[database]\nurl = "{database_url}"\n')
    c = Context(workspace)
    c.store.add_machine(Machine("m", "local"))
    c.store.add_slot(Slot("m", "s", "command", 5))
    yield c
    c.close()


def _reserve(ctx: Context, run_id: str) -> None:
    got = ctx.store.reserve(run_id=run_id, machine="m", slot="s", capacity=5, tool="command",
                            workdir="/wd", holder=current_holder().as_tuple())
    assert got is not None


def test_no_workspace_names_saphan_init(tmp_path: Path) -> None:
    c = Context(Workspace(tmp_path / "none"))
    with pytest.raises(UserError, match=r"no saphan workspace at .*none; run `saphan init`"):
        c.store  # noqa: B018


def test_unknown_machine_and_slot_name_the_fix(ctx: Context) -> None:
    assert ctx.machine("m").name == "m"
    assert ctx.slot("m", "s").max_sessions == 5
    with pytest.raises(UserError, match=r"no machine named 'nope'; see `saphan machine list`"):
        ctx.machine("nope")
    with pytest.raises(UserError, match=r"no machine named 'nope'"):
        ctx.slot("nope", "s")
    with pytest.raises(UserError) as e:
        ctx.slot("m", "t")
    assert str(e.value) == ("no slot 't' on machine 'm'; see `saphan slot list` or "
                            "`saphan slot add m t --tool command`")


def test_find_run_by_id_prefix_and_last(ctx: Context) -> None:
    with pytest.raises(UserError, match="there are no runs yet"):
        ctx.find_run("last")
    for run_id in (FIRST, SECOND, THIRD):
        _reserve(ctx, run_id)
    assert ctx.find_run(FIRST).id == FIRST
    assert ctx.find_run("01b").id == THIRD  # a prefix is case-insensitive
    assert ctx.find_run("last").id == THIRD
    with pytest.raises(UserError, match=r"run id prefix '01a' is ambiguous; give more characters"):
        ctx.find_run("01a")
    with pytest.raises(UserError, match=r"no run '01C'; see `saphan runs list`"):
        ctx.find_run("01C")


def test_a_prefix_is_literal_not_a_pattern(ctx: Context) -> None:
    _reserve(ctx, FIRST)
    with pytest.raises(UserError, match="no run"):
        ctx.find_run("01_")
    with pytest.raises(UserError, match="no run"):
        ctx.find_run("%")


def test_holder_liveness(ctx: Context) -> None:
    _reserve(ctx, FIRST)
    row = ctx.find_run(FIRST)
    got = ctx.holder_liveness(row)
    assert got is not None and got.state == "alive", got
    assert ctx.holder_liveness(row._replace(holder_host=None, holder_pid=None)) is None
    assert ctx.holder_liveness(row._replace(holder_pid=None)) is None
    # a row whose machine is gone is judged here
    gone = ctx.holder_liveness(row._replace(machine="removed", holder_start_ticks=1))
    assert gone is not None and gone.state == "dead"


def test_verified_fact_is_none_when_missing(ctx: Context) -> None:
    assert ctx.verified_fact("m", "landlock") is None
    with pytest.raises(UserError, match="no machine named 'nope'"):
        ctx.verified_fact("nope", "landlock")
