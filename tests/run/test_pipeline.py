"""run/pipeline.py: the one function every run shape goes through. A bad
request is refused before anything is written (no row, no seat); a refusal
found before the seat is recorded without one; a run that got its seat is
finished whatever happens, and the seat is free again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.refusals import Refusal
from saphan.run import pipeline


def _rows(ctx: Context) -> int:
    return len(ctx.store.list_runs(1000))


@pytest.mark.parametrize(("argv", "kw", "said"), [
    ([], {}, "nothing to run"),
    (["true"], {"repo": "/x", "workdir": "/y"}, "give --repo or --workdir, not both"),
    (["true"], {"base_ref": "main"}, "--base needs --repo"),
    (["true"], {"boundary": "chroot"}, "--boundary 'chroot' is unknown"),
    (["no-such-command-here"], {}, "not found on PATH"),
])
def test_a_bad_request_writes_nothing(ctx: Context, tmp_path: Path, argv: list[str],
                                      kw: dict[str, str], said: str) -> None:
    (tmp_path / "wd").mkdir()
    kw = {"workdir": str(tmp_path / "wd"), **kw} if "repo" not in kw else kw
    with pytest.raises(UserError) as e:
        pipeline.run(ctx, "m", "s1", argv, stream=False, **kw)  # type: ignore[arg-type]
    assert said in str(e.value)
    assert _rows(ctx) == 0
    assert ctx.store.live_runs("m", "s1") == []


def test_a_refusal_before_the_seat_is_recorded_without_one(ctx: Context, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(Refusal) as e:
        pipeline.run(ctx, "m", "s1", ["true"], workdir=str(missing), stream=False)
    assert e.value.cls == "workdir-missing" and e.value.run_id
    rec = ctx.run_record(e.value.run_id)
    assert rec.outcome == "refused" and rec.data["session_ordinal"] is None
    assert rec.signature == "valid"
    assert ctx.store.live_runs("m", "s1") == []


def test_a_run_is_finished_and_gives_its_seat_back(ctx: Context, tmp_path: Path) -> None:
    tmp_path = tmp_path / "wd"
    tmp_path.mkdir()
    rec = pipeline.run(ctx, "m", "s1", ["sh", "-c", "echo hi > out.txt; exit 3"],
                       workdir=str(tmp_path), stream=False)
    assert rec.outcome == "failed" and rec.exit_code == 3
    assert rec.data["session_ordinal"] == 0 and rec.data["finished_at"]
    assert (tmp_path / "out.txt").read_text() == "hi\n"
    assert rec.data["enforced_by"]["mechanism"] == "bubblewrap"
    assert ctx.store.live_runs("m", "s1") == []
    # the seat is free: the next run on a capacity-1 slot is admitted
    again = pipeline.run(ctx, "m", "s1", ["true"], workdir=str(tmp_path), stream=False)
    assert again.outcome == "exited"


def test_a_refusal_at_composition_finishes_the_row(ctx: Context, tmp_path: Path) -> None:
    """A planted .saphan-run link is found after the seat: the row is finished
    refused, the seat is free, and nothing ran."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink(elsewhere, wd / ".saphan-run")
    with pytest.raises(Refusal) as e:
        pipeline.run(ctx, "m", "s1", ["sh", "-c", "echo x > ran"], workdir=str(wd), stream=False)
    assert e.value.cls == "workdir-unsafe"
    rec = ctx.run_record(e.value.run_id or "")
    assert rec.outcome == "refused" and rec.data["session_ordinal"] == 0
    assert rec.data["enforced_by"] is None and rec.data["finished_at"]
    assert not (wd / "ran").exists() and not any(elsewhere.iterdir())
    assert ctx.store.live_runs("m", "s1") == []


def test_run_confinement_is_checked_before_anything_else_and_keeps_the_workdir(
        ctx: Context, tmp_path: Path) -> None:
    """A bad run.confinement is the recorded refusal even when the request
    also names an unknown boundary; the refused record names the workdir asked."""
    cfg = ctx.workspace.config_path
    cfg.write_text(cfg.read_text() + '\n[run]\nconfinement = "bogus"\n')
    fresh = Context(ctx.workspace)
    try:
        with pytest.raises(Refusal) as e:
            pipeline.run(fresh, "m", "s1", ["true"], workdir=str(tmp_path / "wd"),
                         boundary="chroot", stream=False)
        assert e.value.cls == "confinement-setting-invalid"
        rec = fresh.run_record(e.value.run_id or "")
        assert rec.data["workdir"] == str(tmp_path / "wd")
    finally:
        fresh.close()
