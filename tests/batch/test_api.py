"""Batches through the Python API (batch/api.py) on a real workspace (SQLite
AND PostgreSQL): create from a JSONL file (all or nothing), find, report,
and one task's view with its run's row."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from saphan.batch.api import Batches, elapsed, task_view
from saphan.errors import UserError
from saphan.liveness import current_holder
from saphan.records import task_verifies
from saphan.timefmt import now_iso

ME = current_holder().as_tuple()
VIEW_KEYS = {"id", "seq", "state", "tool", "what", "run_id", "machine", "slot", "outcome",
             "exit_code", "refusal_class", "error", "attempts", "earlier_runs", "worker",
             "started_at", "finished_at", "elapsed_seconds", "usage", "signature"}


def _file(path: Path, *tasks: object) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _simple(tmp_path: Path, name: str = "b.jsonl", n: int = 2) -> Path:
    return _file(tmp_path / name, *({"id": f"t{i}", "command": ["echo", str(i)]}
                                    for i in range(n)))


# -- create ---------------------------------------------------------------------------

def test_create(engine_ctx: Any, tmp_path: Path) -> None:
    path = _file(tmp_path / "b.jsonl",
                 {"id": "a", "command": ["make", "test"], "workdir": "/src/a"},
                 {"tool": "claude", "prompt": "fix it", "repo": "/src/b", "base": "main"})
    b = Batches(engine_ctx).create(str(path))
    assert b.source == str(path)
    assert b.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert b.tasks == 2
    assert engine_ctx.store.get_batch(b.id) == b
    tasks = engine_ctx.store.batch_tasks(b.id)
    assert [(t.seq, t.task_id, t.state) for t in tasks] == [(0, "a", "pending"),
                                                            (1, "line-2", "pending")]
    assert tasks[0].spec() == {"tool": "command", "command": ["make", "test"],
                               "workdir": "/src/a"}
    assert tasks[1].spec() == {"tool": "claude", "prompt": "fix it", "repo": "/src/b",
                               "base": "main"}
    # stored compact with sorted keys, and signed with the workspace's record key
    assert tasks[0].spec_json == ('{"command":["make","test"],"tool":"command",'
                                  '"workdir":"/src/a"}')
    key = engine_ctx.record_key()
    for t in tasks:
        assert task_verifies(key, b.id, t.seq, t.task_id, t.spec_json, t.signature)
        # bound to its batch and its place in it
        assert not task_verifies(key, b.id, t.seq + 1, t.task_id, t.spec_json, t.signature)
        assert not task_verifies(key, "OTHER", t.seq, t.task_id, t.spec_json, t.signature)


def test_create_relative_path_stored_absolute(engine_ctx: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    _file(sub / "b.jsonl", {"command": ["true"], "workdir": "wd"})
    monkeypatch.chdir(sub)
    b = Batches(engine_ctx).create("b.jsonl")
    assert b.source == str(sub / "b.jsonl") and os.path.isabs(b.source)
    (t,) = engine_ctx.store.batch_tasks(b.id)
    assert t.spec()["workdir"] == str(sub / "wd")


def test_create_bad_line_writes_nothing(engine_ctx: Any, tmp_path: Path) -> None:
    path = _file(tmp_path / "b.jsonl", {"command": ["true"]}, {"command": ["true"]},
                 {"command": ["true"], "bogus": 1})
    batches = Batches(engine_ctx)
    with pytest.raises(UserError, match=r"b\.jsonl:3: unknown key 'bogus'"):
        batches.create(str(path))
    assert batches.list() == []
    with pytest.raises(UserError, match="cannot read the batch file"):
        batches.create(str(tmp_path / "missing.jsonl"))
    assert batches.list() == []


# -- find and list ---------------------------------------------------------------------

def test_find(engine_ctx: Any, tmp_path: Path) -> None:
    batches = Batches(engine_ctx)
    with pytest.raises(UserError, match="no batches yet"):
        batches.find("last")
    first = batches.create(str(_simple(tmp_path, "1.jsonl")))
    time.sleep(0.002)  # ids sort by their millisecond
    second = batches.create(str(_simple(tmp_path, "2.jsonl")))
    assert first.id < second.id
    assert [b.id for b in batches.list()] == [second.id, first.id]
    assert [b.id for b in batches.list(1)] == [second.id]
    assert batches.find(first.id) == first
    assert batches.find("last") == second
    n = next(i for i, (x, y) in enumerate(zip(first.id, second.id, strict=True)) if x != y)
    common = first.id[:n]
    assert batches.find(first.id[:len(common) + 1]) == first
    assert batches.find(second.id[:len(common) + 1].lower()) == second  # any case
    with pytest.raises(UserError, match="ambiguous"):
        batches.find(common)
    with pytest.raises(UserError, match="no batch 'ZZZZ'"):
        batches.find("ZZZZ")
    with pytest.raises(UserError, match="no batch"):
        batches.find("%")


# -- report and task_view --------------------------------------------------------------------

def test_report(engine_ctx: Any, tmp_path: Path) -> None:
    store = engine_ctx.store
    path = _file(tmp_path / "b.jsonl", *({"id": f"t{i}", "command": ["echo", str(i)]}
                                         for i in range(4)))
    b = Batches(engine_ctx).create(str(path))
    t0 = store.claim_task(b.id, "R0", ME)
    t1 = store.claim_task(b.id, "R1", ME)
    store.claim_task(b.id, "R2", ME)
    assert t0 is not None and t1 is not None
    assert store.finish_task(b.id, 0, "R0", outcome="exited", exit_code=0)
    assert store.finish_task(b.id, 1, "R1", outcome="error", exit_code=None, error="bad")
    rep = Batches(engine_ctx).report(b.id[:20].lower())
    assert {k: rep[k] for k in ("batch", "created_at", "source", "source_sha256")} == {
        "batch": b.id, "created_at": b.created_at, "source": str(path),
        "source_sha256": b.source_sha256}
    assert rep["states"] == {"done": 2, "claimed": 1, "pending": 1}
    assert rep["outcomes"] == {"exited": 1, "error": 1}
    assert [v["id"] for v in rep["tasks"]] == ["t0", "t1", "t2", "t3"]
    for v in rep["tasks"]:
        assert set(v) == VIEW_KEYS
    v0, v1, v2, v3 = rep["tasks"]
    # no run row R0 exists: a done task names no run that was never made
    assert (v0["state"], v0["outcome"], v0["exit_code"], v0["run_id"]) == (
        "done", "exited", 0, None)
    assert (v1["outcome"], v1["error"]) == ("error", "bad")
    assert v2["state"] == "claimed" and v2["worker"] == {"host": ME[0], "pid": ME[1]}
    assert v0["worker"] is None  # shown only while claimed
    assert v3 == {**v3, "state": "pending", "run_id": None, "attempts": 0, "worker": None,
                  "tool": "command", "what": "echo 3", "earlier_runs": []}
    assert json.loads(json.dumps(rep)) == rep  # --json as is
    with pytest.raises(UserError):
        Batches(engine_ctx).report("ZZZZ")


def test_task_view_with_a_finished_run(engine_ctx: Any, tmp_path: Path) -> None:
    store = engine_ctx.store
    b = Batches(engine_ctx).create(str(_simple(tmp_path, n=1)))
    assert store.claim_task(b.id, "R0", ME) is not None
    assert store.reserve(run_id="R0", machine="m1", slot="s1", capacity=1, tool="command",
                         workdir=None, holder=ME) == 0
    row = store.get_run("R0")
    assert row is not None
    # a known end: 2.5 s after it started
    t_end = (datetime.fromisoformat(row.started_at.replace("Z", "+00:00"))
             + timedelta(seconds=2.5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    record = {"usage": {"tokens": {"input": 100, "output": 20}, "cost_usd": 0.25,
                        "other": "dropped"}}
    assert store.finalize("R0", state="ended", outcome="refused", refusal_class="fleet-full",
                          record_json=json.dumps(record), finished_at=t_end)
    assert store.finish_task(b.id, 0, "R0", outcome="refused", exit_code=None)
    (t,) = store.batch_tasks(b.id)
    v = task_view(engine_ctx, t)
    assert set(v) == VIEW_KEYS
    assert (v["machine"], v["slot"], v["run_id"]) == ("m1", "s1", "R0")
    assert v["refusal_class"] == "fleet-full"
    assert v["started_at"] == row.started_at
    assert v["elapsed_seconds"] == 2.5
    # an unsigned record is not believed: no usage from it, and it is flagged
    assert v["usage"] is None and v["signature"] == "unverified"
    keyed = task_view(engine_ctx, t, key=engine_ctx.record_key())
    assert keyed["usage"] is None and keyed["signature"] == "missing"
    assert keyed["outcome"] == "refused"  # the task's own column, flagged
    assert v["what"] == "echo 0" and v["tool"] == "command"
    # the row given is used instead of the store's
    other = row._replace(machine="m2", slot="s2", finished_at=None)
    w = task_view(engine_ctx, t, other)
    assert (w["machine"], w["slot"]) == ("m2", "s2")
    assert w["usage"] is None  # a live row's record is not read for usage


def test_task_view_live_run(engine_ctx: Any, tmp_path: Path) -> None:
    store = engine_ctx.store
    b = Batches(engine_ctx).create(str(_simple(tmp_path, n=1)))
    assert store.claim_task(b.id, "R0", ME) is not None
    store.reserve(run_id="R0", machine="m1", slot="s1", capacity=1, tool="command",
                  workdir=None, holder=ME)
    store.set_record("R0", json.dumps({"usage": {"tokens": {"input": 1}, "cost_usd": 1.0}}))
    (t,) = store.batch_tasks(b.id)
    v = task_view(engine_ctx, t)
    assert v["state"] == "claimed" and v["machine"] == "m1"
    assert v["usage"] is None
    assert v["elapsed_seconds"] is not None and 0 <= v["elapsed_seconds"] < 60
    assert v["worker"] == {"host": ME[0], "pid": ME[1]}


def test_task_view_without_a_run_row(engine_ctx: Any, tmp_path: Path) -> None:
    store = engine_ctx.store
    b = Batches(engine_ctx).create(str(_simple(tmp_path, n=1)))
    store.claim_task(b.id, "R0", ME)
    (t,) = store.batch_tasks(b.id)
    v = task_view(engine_ctx, t)
    assert v["run_id"] == "R0"
    assert (v["machine"], v["slot"], v["started_at"], v["elapsed_seconds"], v["usage"]) == (
        None, None, None, None, None)
    assert v["attempts"] == 1


def test_task_view_usage_not_a_dict(engine_ctx: Any, tmp_path: Path) -> None:
    store = engine_ctx.store
    b = Batches(engine_ctx).create(str(_simple(tmp_path, n=1)))
    store.claim_task(b.id, "R0", ME)
    store.reserve(run_id="R0", machine="m", slot="s", capacity=1, tool="command",
                  workdir=None, holder=ME)
    store.finalize("R0", state="ended", outcome="exited", exit_code=0,
                   record_json=json.dumps({"usage": "none"}))
    (t,) = store.batch_tasks(b.id)
    assert task_view(engine_ctx, t)["usage"] is None


# -- elapsed ---------------------------------------------------------------------------

def test_elapsed() -> None:
    a = now_iso()
    time.sleep(0.05)
    b = now_iso()
    got = elapsed(a, b)
    assert got is not None and 0.04 <= got < 5
    assert elapsed(b, a) == -got
    assert elapsed("2024-01-01T00:00:00.000000Z", "2024-01-01T00:01:01.500000Z") == 61.5
    assert elapsed("2024-01-01T23:59:59.999000Z", "2024-01-02T00:00:00.000600Z") == 0.002
    now = elapsed(a, None)
    assert now is not None and got <= now < 5
    assert elapsed("not a time", None) is None
    assert elapsed(a, "nor this") is None
