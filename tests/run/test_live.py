"""run/live.py: a live run's record file, read only as saphan wrote it; how a
live run is shown; and reconciliation, which finishes what the store missed
(on SQLite and PostgreSQL, through a real workspace)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from saphan.context import Context
from saphan.ids import new_run_id
from saphan.liveness import Holder, current_holder, this_host
from saphan.records import sign_record
from saphan.run import live
from saphan.run import record as recorder
from saphan.run.end import RunEnd
from saphan.timefmt import now_iso


def _live(ctx: Context, holder: Holder | None = None, slot: str = "s1") -> dict[str, Any]:
    """A run holding a seat whose driver wrote its live record (state running)."""
    run_id = new_run_id()
    got = ctx.store.get_slot("m", slot)
    assert got is not None
    ordinal = ctx.store.reserve(run_id=run_id, machine="m", slot=slot, capacity=got.capacity,
                                tool="command", workdir="/wd",
                                holder=(holder or current_holder()).as_tuple())
    assert ordinal is not None
    record = {"id": run_id, "machine": "m", "slot": slot, "tool": "command", "workdir": "/wd",
              "session_ordinal": ordinal, "argv": ["/usr/bin/sleep", "600"],
              "started_at": now_iso(), "enforced_by": {"mechanism": "bubblewrap",
                                                       "version": "0.8.0"}}
    recorder.running(ctx, record)
    return record


def _ended_file(ctx: Context, record: dict[str, Any], key: bytes | None = None,
                **over: Any) -> Path:
    """What the driver's record writer leaves when the store could not be
    written: the ended record, signed (with ``key``: another workspace's)."""
    ended = {**record, "state": "ended", "outcome": "failed", "exit_code": 7,
             "finished_at": now_iso(), **over}
    signed = sign_record(key or ctx.record_key(), ended)
    path = ctx.workspace.run_dir(record["id"]) / "record.json"
    path.write_text(json.dumps(signed))
    return path


def _row(ctx: Context, run_id: str) -> Any:
    row = ctx.store.get_run(run_id)
    assert row is not None
    return row


# -- reading a live record --------------------------------------------------------------

def test_the_live_record_saphan_wrote_is_read(ctx: Context) -> None:
    record = _live(ctx)
    found = live.read_record(ctx, ctx.record_key(), _row(ctx, record["id"]))
    assert found is not None
    assert (found["state"], found["argv"], found["driven_by"]["pid"]) == (
        "running", ["/usr/bin/sleep", "600"], os.getpid())


def test_a_record_file_saphan_did_not_write_for_this_run_is_not_read(ctx: Context) -> None:
    record = _live(ctx)
    row = _row(ctx, record["id"])
    key = ctx.record_key()
    path = ctx.workspace.run_dir(record["id"]) / "record.json"
    # planted, unsigned
    path.write_text(json.dumps({**record, "state": "ended", "outcome": "exited",
                                "exit_code": 0, "finished_at": now_iso()}))
    assert live.read_record(ctx, key, row) is None
    # signed with another workspace's key
    _ended_file(ctx, record, key=b"k" * 32)
    assert live.read_record(ctx, key, row) is None
    # saphan's own signature, but another run's record copied here
    other = _live(ctx, slot="s2")
    _ended_file(ctx, {**record, "id": other["id"]})
    assert live.read_record(ctx, key, row) is None
    # the same record for another slot or ordinal
    _ended_file(ctx, {**record, "session_ordinal": 5})
    assert live.read_record(ctx, key, row) is None
    # a link to a record saphan did write (never followed)
    real = _ended_file(ctx, other)
    path.unlink()
    os.symlink(real, path)
    assert live.read_record(ctx, key, _row(ctx, other["id"])) is not None
    assert live.read_record(ctx, key, row) is None
    # not a regular file (a FIFO: read without blocking, refused)
    path.unlink()
    os.mkfifo(path)
    assert live.read_record(ctx, key, row) is None


# -- reconciliation ---------------------------------------------------------------------

def test_an_ended_record_file_finishes_the_live_row_with_a_note(ctx: Context) -> None:
    record = _live(ctx)
    bystander = _live(ctx, slot="s2")  # alive, running: left as it is
    _ended_file(ctx, record)
    ctx.verb = "saphan runs list"
    assert live.reconcile(ctx) == [record["id"]]
    row = _row(ctx, record["id"])
    assert not row.live and (row.state, row.outcome, row.exit_code) == ("ended", "failed", 7)
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid"
    note = rec.data["notes"][-1]
    assert note.startswith("reconciled by `saphan runs list` at ")
    assert "its signed record file said the run ended (failed, exit 7)" in note
    on_disk = json.loads((ctx.workspace.run_dir(record["id"]) / "record.json").read_text())
    assert on_disk["notes"][-1] == note  # the file says the same as the store
    assert _row(ctx, bystander["id"]).live
    assert live.reconcile(ctx) == []  # nothing left to do


def test_an_unverified_file_leaves_the_row_live(ctx: Context) -> None:
    record = _live(ctx)
    _ended_file(ctx, record, key=b"x" * 32)
    assert live.reconcile(ctx) == []
    assert _row(ctx, record["id"]).live


def test_a_dead_holder_on_this_host_is_finalised_from_its_live_record(ctx: Context) -> None:
    me = current_holder()
    assert me.start_ticks is not None
    gone = Holder(this_host(), me.pid, me.start_ticks - 1, me.boot_id)  # a reused pid
    record = _live(ctx, holder=gone)
    far = _live(ctx, holder=Holder("ssh://u@far:22", 1, 1, "b"), slot="s2")
    ctx.verb = "saphan runs show"
    assert live.reconcile(ctx) == [record["id"]]
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid" and rec.outcome == "holder-dead"
    assert rec.data["notes"][-1].startswith("reconciled by `saphan runs show` at ")
    assert f"holder dead (pid {me.pid} on {this_host()} was reused" in rec.data["notes"][-1]
    assert rec.data["argv"] == ["/usr/bin/sleep", "600"]  # from its live record
    # A far holder is read over SSH by conflict handling, never here.
    assert _row(ctx, far["id"]).live


def test_the_context_reconciles_once_when_it_opens_the_store(ctx: Context) -> None:
    record = _live(ctx)
    _ended_file(ctx, record)
    calls: list[Context] = []

    def hook(c: Context) -> None:
        calls.append(c)
        live.reconcile(c)

    fresh = Context(ctx.workspace, on_open=hook)
    try:
        assert not _row(fresh, record["id"]).live
        fresh.store  # noqa: B018 - opened already: not again
        assert calls == [fresh]
        assert "reconciled by `saphan (Python API, pid" in (
            fresh.run_record(record["id"]).data["notes"][-1])
    finally:
        fresh.close()


# -- how a live run is shown --------------------------------------------------------------

def test_a_live_run_is_shown_from_its_live_record(ctx: Context) -> None:
    record = _live(ctx)
    rec = live.view(ctx, _row(ctx, record["id"]), ctx.record_key())
    assert rec.signature == "pending"
    d = rec.data
    assert d["argv"] == ["/usr/bin/sleep", "600"] and d["workdir"] == "/wd"
    assert d["enforced_by"]["mechanism"] == "bubblewrap"
    assert (d["state"], d["outcome"], d["finished_at"]) == ("running", None, None)
    assert d["live"]["holder"]["pid"] == os.getpid()
    assert d["live"]["liveness"]["state"] == "alive"
    assert d["live"]["record_file"] == str(ctx.workspace.run_dir(record["id"]) / "record.json")
    # Without a verified file: the row alone, still with its holder.
    (ctx.workspace.run_dir(record["id"]) / "record.json").write_text("{}")
    bare = live.view(ctx, _row(ctx, record["id"]), ctx.record_key()).data
    assert "argv" not in bare and bare["live"]["record_file"] is None
    # A finished run is shown as its record, nothing added.
    end = RunEnd()
    end.exited(0)
    recorder.finished(ctx, record, end)
    done = live.view(ctx, _row(ctx, record["id"]), ctx.record_key()).data
    assert "live" not in done and done["outcome"] == "exited"


def test_a_listing_dials_no_far_holder(ctx: Context) -> None:
    far = _live(ctx, holder=Holder("ssh://u@far:22", 1, 1, "b"))
    [shown] = [r for r in live.listing(ctx, 10) if r.id == far["id"]]
    life = shown.data["live"]["liveness"]
    assert life["state"] == "unknown" and f"`saphan runs show {far['id']}`" in life["evidence"]


@pytest.mark.parametrize("value", [
    {"state": "running"}, {"state": "ended", "outcome": None, "finished_at": "t"},
    {"state": "ended", "outcome": "failed", "finished_at": None},
    {"state": "ended", "outcome": "failed", "finished_at": "t", "exit_code": "7"},
    {"state": "ended", "outcome": "failed", "finished_at": "t", "exit_code": True},
])
def test_only_a_record_in_the_writers_shape_counts_as_ended(value: dict[str, Any]) -> None:
    assert not live.ended(value)
    assert live.ended({"state": "ended", "outcome": "failed", "finished_at": "t",
                       "exit_code": 7})


# -- does a live record back its row (the dashboard's "row only") ---------------------------

def test_a_live_record_backs_its_row_only_while_running_for_its_holder(ctx: Context) -> None:
    record = _live(ctx)
    row = _row(ctx, record["id"])
    found = live.read_record(ctx, ctx.record_key(), row)
    assert live.backs(found, row)
    assert live.view(ctx, row, ctx.record_key()).data["live"]["backed"] is True
    assert not live.backs(None, row)
    other = row._replace(holder_pid=1)  # a row naming another holder than the one driving
    assert not live.backs(found, other)
    # a far process holds it: the row's SSH machine's tag, and a driver alive here
    far = row._replace(holder_host="ssh://op@far1:22", holder_pid=5)
    assert live.backs(found, far, far_tag="ssh://op@far1:22")
    assert not live.backs(found, far)  # the row's machine is not an SSH machine
    assert not live.backs(found, far, far_tag="ssh://op@far2:22")
    assert found is not None
    crashed = {**found, "driven_by": {**found["driven_by"], "pid": _dead_pid()}}
    assert not live.backs(crashed, far, far_tag="ssh://op@far1:22")  # its driver is gone
    left = {**crashed, "left_running": True}  # run/record.still_running writes it
    assert live.backs(left, far, far_tag="ssh://op@far1:22")  # left running on purpose
    # a record naming its far process backs only a row naming that very process
    named = {**left, "far_process": {"pid": 5, "start_ticks": far.holder_start_ticks,
                                     "boot_id": far.holder_boot_id}}
    assert live.backs(named, far, far_tag="ssh://op@far1:22")
    assert not live.backs(named, far._replace(holder_pid=6), far_tag="ssh://op@far1:22")
    # the run ended and its row was set live again (by a store writer): the ended record
    # verifies, but it says the run ended
    _ended_file(ctx, record)
    again = live.read_record(ctx, ctx.record_key(), row)
    assert again is not None and not live.backs(again, row)


def _dead_pid() -> int:
    import subprocess

    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_row_saphan_did_not_make_is_no_name_under_runs(ctx: Context) -> None:
    record = _live(ctx)
    row = _row(ctx, record["id"])
    assert live.read_record(ctx, ctx.record_key(), row._replace(id="../../etc")) is None
    assert live.read_record(ctx, ctx.record_key(), row._replace(session_ordinal="x")) is None
