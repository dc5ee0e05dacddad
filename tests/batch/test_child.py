"""The child process of one batch task (batch/child.py), run for real: it
names itself on its claim first, runs nothing when the claim is not for its
run id, and otherwise is one cast run with the claim's run id."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan
from saphan.batch.child import EXIT_BAD_TASK, EXIT_CLAIM_GONE
from saphan.engine import Engine
from saphan.store.rows import Task

pytestmark = pytest.mark.usefixtures("bwrap_available")

WORKER = ("h.example", 4242, 1, "boot")


@pytest.fixture
def engine(saphan_sqlite: Saphan, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setenv("XDG_STATE_HOME", saphan_sqlite.env()["XDG_STATE_HOME"])
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "a", "--tool", "command")
    e = Engine(saphan_sqlite.home)
    try:
        yield e
    finally:
        e.close()


def _claim(engine: Engine, tmp_path: Path, lines: list[dict[str, Any]]) -> Task:
    path = tmp_path / "b.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    b = engine.batches.create(str(path))
    from saphan.ids import new_run_id

    t = engine.store.claim_task(b.id, new_run_id(), WORKER)
    assert t is not None
    return t


def _child(s: Saphan, t: Task, run_id: str | None = None) -> subprocess.CompletedProcess[str]:
    order = {"home": str(s.home), "batch": t.batch, "seq": t.seq,
             "run_id": run_id or t.run_id, "wait": 0}
    # as the worker does: one line, and the pipe kept open (the child's lifeline)
    p = subprocess.Popen([sys.executable, "-m", "saphan.batch.child"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=s.env())
    assert p.stdin is not None and p.stdout is not None and p.stderr is not None
    p.stdin.write(json.dumps(order) + "\n")
    p.stdin.flush()
    try:
        p.wait(timeout=120)
    finally:
        p.stdin.close()
    out, err = p.stdout.read(), p.stderr.read()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_the_child_runs_its_task_with_the_claims_run_id(saphan_sqlite: Saphan, engine: Engine,
                                                        tmp_path: Path) -> None:
    t = _claim(engine, tmp_path, [{"command": ["sh", "-c", "echo made > out"],
                                   "workdir": str(tmp_path)}])
    p = _child(saphan_sqlite, t)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    assert (tmp_path / "out").read_text() == "made\n"
    assert t.run_id is not None
    row = engine.store.get_run(t.run_id)
    assert row is not None and row.outcome == "exited" and (row.machine, row.slot) == ("here", "a")
    now = engine.store.get_task(t.batch, t.seq)
    assert now is not None and now.child is not None and now.child[1] != WORKER[1]
    # the child never ends the claim: its worker concludes it from the row
    assert now.state == "claimed"


def test_a_claim_given_back_runs_nothing(saphan_sqlite: Saphan, engine: Engine,
                                         tmp_path: Path) -> None:
    t = _claim(engine, tmp_path, [{"command": ["sh", "-c", "echo made > out"],
                                   "workdir": str(tmp_path)}])
    assert t.run_id is not None
    assert engine.store.requeue_task(t.batch, t.seq, t.run_id, child_pid=None, why="test",
                                     attempted=False)
    p = _child(saphan_sqlite, t)
    assert p.returncode == EXIT_CLAIM_GONE
    assert "no longer for this run id" in json.loads(p.stdout)["error"]
    assert not (tmp_path / "out").exists()
    assert engine.store.get_run(t.run_id) is None


def test_a_second_child_for_one_claim_runs_nothing(saphan_sqlite: Saphan, engine: Engine,
                                                   tmp_path: Path) -> None:
    t = _claim(engine, tmp_path, [{"command": ["sh", "-c", "echo x >> out"],
                                   "workdir": str(tmp_path)}])
    assert _child(saphan_sqlite, t).returncode == 0
    again = _child(saphan_sqlite, t)
    assert again.returncode == EXIT_CLAIM_GONE
    assert (tmp_path / "out").read_text() == "x\n"


def test_a_task_saphan_cannot_run_says_why_and_records_nothing(
        saphan_sqlite: Saphan, engine: Engine, tmp_path: Path) -> None:
    t = _claim(engine, tmp_path, [{"command": ["true"], "repo": str(tmp_path / "no-repo")}])
    p = _child(saphan_sqlite, t)
    assert p.returncode in (EXIT_BAD_TASK, 3), p.stderr
    if p.returncode == EXIT_BAD_TASK:
        assert "no-repo" in json.loads(p.stdout)["error"]
        assert t.run_id is not None and engine.store.get_run(t.run_id) is None


def test_a_run_id_of_the_wrong_shape_is_refused_before_anything(
        saphan_sqlite: Saphan, engine: Engine, tmp_path: Path) -> None:
    t = _claim(engine, tmp_path, [{"command": ["true"], "workdir": str(tmp_path)}])
    assert t.run_id is not None
    # a forged order: the claim is for another id, so nothing is even tried
    p = _child(saphan_sqlite, t, run_id="../../etc")
    assert p.returncode == EXIT_CLAIM_GONE
    # the pipeline itself refuses an id that is not one
    with pytest.raises(Exception, match="is not a run id"):
        engine.run(None, None, ["true"], tool="command", workdir=str(tmp_path),
                   run_id="not-a-run-id", stream=False)


def test_a_task_changed_in_the_store_is_not_run(saphan_sqlite: Saphan, engine: Engine,
                                                tmp_path: Path) -> None:
    """Write access to the store does not make a worker run a command: a
    task whose spec was changed after it was signed is never run."""
    t = _claim(engine, tmp_path, [{"command": ["sh", "-c", "echo made > out"],
                                   "workdir": str(tmp_path)}])
    forged = t.spec_json.replace("echo made", "echo forged")
    engine.store.db.execute("UPDATE batch_tasks SET spec_json = ? WHERE batch = ? AND seq = ?",
                            (forged, t.batch, t.seq))
    p = _child(saphan_sqlite, t)
    assert p.returncode == EXIT_BAD_TASK
    assert json.loads(p.stdout)["error"].startswith("[record-signature-invalid]")
    assert not (tmp_path / "out").exists()
    assert t.run_id is not None and engine.store.get_run(t.run_id) is None


def test_a_child_whose_worker_is_gone_ends_its_run_recorded(saphan_sqlite: Saphan,
                                                           engine: Engine,
                                                           tmp_path: Path) -> None:
    """The lifeline: the worker's end of the child's stdin closing (the
    worker died) ends the child's run, recorded interrupted — never a task
    going on unobserved."""
    import time

    t = _claim(engine, tmp_path, [{"command": ["sh", "-c", "sleep 30; echo late > out"],
                                   "workdir": str(tmp_path)}])
    order = {"home": str(saphan_sqlite.home), "batch": t.batch, "seq": t.seq,
             "run_id": t.run_id, "wait": 0}
    p = subprocess.Popen([sys.executable, "-m", "saphan.batch.child"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=saphan_sqlite.env())
    assert p.stdin is not None and t.run_id is not None
    p.stdin.write(json.dumps(order) + "\n")
    p.stdin.flush()
    deadline = time.monotonic() + 60
    while (row := engine.store.get_run(t.run_id)) is None or row.state != "running":
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    p.stdin.close()  # the worker is gone
    p.wait(timeout=60)
    assert p.returncode == 128 + 15
    row = engine.store.get_run(t.run_id)
    assert row is not None and not row.live and row.outcome == "interrupted"
    assert not (tmp_path / "out").exists()
