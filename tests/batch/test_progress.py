"""What an operator sees of a batch (batch/progress.py): a line per change,
the cells of each task (one word each but the note), the summary as plain
columns or as a rich table, and the counts. Whatever a task or a run chose
is shown escaped, never read as markup."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from saphan.batch.progress import HEADERS, Display, cells, counts, line, summary, table
from saphan.batch.worker import Event
from saphan.liveness import current_holder
from saphan.store.rows import Batch


def _view(**kw: Any) -> dict[str, Any]:
    """A task as batch.api.task_view makes it."""
    v: dict[str, Any] = {
        "id": "t1", "seq": 0, "state": "pending", "tool": "command", "what": "true",
        "run_id": None, "machine": None, "slot": None, "outcome": None, "exit_code": None,
        "refusal_class": None, "error": None, "attempts": 0, "earlier_runs": [],
        "worker": None, "started_at": None, "finished_at": None, "elapsed_seconds": None,
        "usage": None,
    }
    v.update(kw)
    return v


DONE = _view(state="done", run_id="R1", machine="m", slot="s", outcome="exited", exit_code=0,
             elapsed_seconds=1.25, started_at="2024-01-01T00:00:00.000000Z",
             usage={"tokens": {"input": 10, "output": 20}, "cost_usd": 0.01})
REFUSED = _view(id="t2", state="done", run_id="R2", machine="m", slot="s", outcome="refused",
                refusal_class="fleet-full", elapsed_seconds=0.0)


def _render(renderable: Any) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=200).print(renderable)
    return out.getvalue()


# -- line ---------------------------------------------------------------------------

def test_line_claimed() -> None:
    assert line("claimed", _view(state="claimed", run_id="R1")) == "task t1: claimed (run R1)"


def test_line_seated() -> None:
    v = _view(state="claimed", run_id="R1", machine="m", slot="s")
    assert line("seated", v) == "task t1: running on m/s (run R1)"
    assert line("seated", dict(v, state="done")) == "task t1: run R1 on m/s"


def test_line_done() -> None:
    assert line("done", DONE) == (
        "task t1: exited (exit 0) on m/s in 1.2 s, 30 tokens, $0.0100 (run R1)")
    assert line("done", REFUSED) == "task t2: refused [fleet-full] on m/s in 0.0 s (run R2)"
    bare = _view(state="done", run_id=None, outcome="error", error="boom")
    assert line("done", bare, "boom") == "task t1: error: no run was made: boom"


def test_line_requeued_names_the_last_run() -> None:
    v = _view(state="pending", last_run="R9")
    assert line("requeued", v) == "task t1: back to pending (run R9)"
    assert line("requeued", _view()) == "task t1: back to pending (run -)"


def test_line_other_kinds_and_note() -> None:
    v = _view(state="claimed", run_id="R1")
    assert line("left", v, "its run goes on") == "task t1: left (run R1): its run goes on"


# -- cells ----------------------------------------------------------------------------

def test_cells_done() -> None:
    assert cells(DONE) == ["t1", "done", "m/s", "1.2s", "30", "$0.0100", "exited:0", "R1", ""]
    assert len(cells(DONE)) == len(HEADERS)


def test_cells_refusal_is_outcome_and_class() -> None:
    assert cells(REFUSED) == ["t2", "done", "m/s", "0.0s", "-", "-", "refused:fleet-full",
                              "R2", ""]


def test_cells_pending_and_waiting() -> None:
    assert cells(_view()) == ["t1", "pending", "-", "-", "-", "-", "-", "-", ""]
    # claimed but not seated yet: waiting for a seat
    assert cells(_view(state="claimed", run_id="R1"))[:3] == ["t1", "waiting", "-"]
    running = cells(_view(state="claimed", run_id="R1", machine="m", slot="s",
                          started_at="2000-01-01T00:00:00.000000Z"))
    assert running[1:3] == ["claimed", "m/s"]
    assert re.fullmatch(r"\d+\.\ds", running[3])  # the time since it started
    assert float(running[3][:-1]) > 365 * 86400


def test_cells_error_without_exit_code() -> None:
    v = _view(state="done", run_id="R1", outcome="error", error="no such machine 'x'")
    assert cells(v)[6:] == ["error:-", "R1", "no such machine 'x'"]


@pytest.mark.parametrize("usage, want", [
    (None, ["-", "-"]),
    ("junk", ["-", "-"]),
    ({"tokens": None, "cost_usd": None}, ["-", "-"]),
    ({"tokens": {"input": 0}, "cost_usd": 0}, ["-", "$0.0000"]),
    ({"tokens": {"input": 5, "note": "x"}, "cost_usd": "1"}, ["5", "-"]),
    ({"tokens": {"in": 1, "out": 2, "cache": 3}, "cost_usd": 1.23456}, ["6", "$1.2346"]),
])
def test_cells_usage(usage: Any, want: list[str]) -> None:
    assert cells(_view(usage=usage))[4:6] == want


def test_cells_each_one_word_but_the_note() -> None:
    v = _view(id="t 1\n", state="done", run_id="R1", machine="m", slot="s", outcome="exited",
              exit_code=1, elapsed_seconds=12.0, error="it said\nsomething long")
    got = cells(v)
    assert got[-1] == "it said\\nsomething long"
    assert all("\n" not in c for c in got)
    assert all(" " not in c for c in got[1:-1])


def test_printable_escaping_and_no_markup() -> None:
    v = _view(state="done", run_id="R1", machine="m", slot="s", outcome="error",
              error="\x1b[31mred [bold]loud[/bold]")
    note = cells(v)[-1]
    assert note == "\\x1b[31mred [bold]loud[/bold]"
    text = _render(table([v]))
    assert "\x1b" not in text
    assert "\\x1b[31mred" in text
    assert "[bold]loud[/bold]" in text  # shown as written, not read as markup
    for h in HEADERS:
        assert h in text


# -- counts ----------------------------------------------------------------------------

def test_counts_order() -> None:
    views = [DONE, _view(), REFUSED, _view(state="claimed"), DONE,
             _view(state="done", outcome=None), _view(state="done", outcome="error"), _view()]
    assert counts(views) == "pending 2, claimed 1, done 1, error 1, exited 2, refused 1"
    assert counts([DONE]) == "exited 1"
    assert counts([]) == ""


# -- summary -----------------------------------------------------------------------------

def _report(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"batch": "B1", "tasks": tasks}


def test_summary_plain_columns(capsys: pytest.CaptureFixture[str]) -> None:
    tasks = [DONE, REFUSED, _view(id="a-much-longer-id", error="x y")]
    summary(_report(tasks), terminal=False)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert out.endswith("\n") and len(lines) == 5
    assert lines[0].split() == [h.upper() for h in HEADERS]
    assert lines[-1] == "batch B1: pending 1, exited 1, refused 1"
    rows = [cells(v) for v in tasks]
    for got, want in zip(lines[1:4], rows, strict=True):
        assert got.split()[:8] == want[:8]
    # aligned: every column starts where its header does
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    for row_line, row in zip(lines[1:4], rows, strict=True):
        pos = 0
        for start, cell in zip(starts, row, strict=True):
            if cell:
                at = row_line.index(cell, pos)
                assert at == start, (row_line, cell)
                pos = at + len(cell)
    assert lines[3].rstrip().endswith("x y")
    assert all(x == x.rstrip() for x in lines)


def test_summary_plain_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    summary(_report([_view(error="\x1b[2Jgone\r")]), terminal=False)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert "\\x1b[2Jgone\\r" in out


def test_summary_terminal(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    summary(_report([DONE, _view(id="t3", error="[red]plain[/red]")]), terminal=True)
    out = capsys.readouterr().out
    assert "batch B1: pending 1, exited 1" in out
    assert "exited:0" in out and "$0.0100" in out
    assert "[red]plain[/red]" in out


# -- Display (no terminal: a line per event on stderr) ---------------------------------

def test_display_lines(engine_ctx: Any, capsys: pytest.CaptureFixture[str]) -> None:
    store = engine_ctx.store
    store.add_batch(Batch("B1", "2024-01-01T00:00:00.000000Z", "/b", "0" * 64, 2),
                    [("t0", json.dumps({"tool": "command", "command": ["true"]}), "sig"),
                     ("t1", json.dumps({"tool": "command", "command": ["false"]}), "sig")])
    me = current_holder().as_tuple()
    with Display(engine_ctx, "B1", live=False) as d:
        assert sorted(d.rows) == [0, 1]
        t = store.claim_task("B1", "R1", me)
        assert t is not None
        d.event(Event("claimed", t))
        store.reserve(run_id="R1", machine="m", slot="s", capacity=1, tool="command",
                      workdir=None, holder=me)
        store.finalize("R1", state="ended", outcome="exited", exit_code=1,
                       record_json=json.dumps({"usage": {"tokens": {"in": 4},
                                                         "cost_usd": 0.5}}))
        assert store.finish_task("B1", 0, "R1", outcome="exited", exit_code=1)
        d.event(Event("done", t, store.get_run("R1")))
        t1 = store.claim_task("B1", "R2", me)
        assert t1 is not None
        assert store.requeue_task("B1", 1, "R2", child_pid=None, why="w", attempted=False)
        d.event(Event("requeued", t1, note="\x1b[1mwhy"))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "task t0: claimed (run R1)"
    # the record is not signed: its usage is not believed, and the line says so
    assert re.fullmatch(r"task t0: exited \(exit 1\) on m/s in \d+\.\d s \(run R1\); its "
                        r"record is !missing \(not believed\)", err[1]), err[1]
    assert err[2] == "task t1: back to pending (run R2): \\x1b[1mwhy"
    assert len(err) == 3
    assert d.recent == [0, 1]
    assert d.rows[0]["state"] == "done" and d.rows[1]["state"] == "pending"
    shown = _render(d.render())
    assert "batch B1: pending 1, exited 1" in shown
    assert "just finished" in shown and "running" in shown
