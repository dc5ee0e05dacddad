"""run/record.py: the only writer of a run's outcome. Each way a row changes
state, through a real store (SQLite and PostgreSQL) and a real workspace:
what the row says, what runs/<id>/record.json says, and that both are signed
with the workspace record key (read back the way `runs show` reads them)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PgServer
from saphan.context import Context
from saphan.errors import Interrupted
from saphan.ids import new_run_id
from saphan.liveness import Holder, current_holder
from saphan.records import SIGNATURE_FIELD, sign_record
from saphan.refusals import Refusal
from saphan.run import record as recorder
from saphan.run.record import RunEnd
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso
from saphan.workspace import Workspace


def _base(slot: str = "s1") -> dict[str, Any]:
    return {"id": new_run_id(), "machine": "m", "slot": slot, "workdir": "/wd",
            "started_at": now_iso(), "argv": ["/bin/true"]}


def _reserved(ctx: Context, slot: str = "s1",
              holder: Holder | None = None) -> dict[str, Any]:
    """A run holding a seat, and the record the pipeline would keep for it."""
    base = _base(slot)
    got = ctx.store.get_slot("m", slot)
    assert got is not None
    ordinal = ctx.store.reserve(run_id=base["id"], machine="m", slot=slot,
                                capacity=got.capacity, tool="command", workdir="/wd",
                                holder=(holder or current_holder()).as_tuple())
    assert ordinal is not None
    return {**base, "tool": "command", "session_ordinal": ordinal}


def _file(ctx: Context, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ctx.workspace.run_dir(run_id) / "record.json").read_text())
    return data


def _file_verifies(ctx: Context, data: dict[str, Any]) -> bool:
    return sign_record(ctx.record_key(), data)[SIGNATURE_FIELD] == data[SIGNATURE_FIELD]


# -- refused -----------------------------------------------------------------------------

def test_refused_writes_a_finished_signed_row(ctx: Context) -> None:
    base = _base()
    refusal = Refusal("seat-full", "slot s1 on m carries 1 run and may carry 1", "wait")
    recorder.refused(ctx, base, "command", current_holder(), refusal)
    assert refusal.run_id == base["id"]  # the CLI prints it as `run: ID`
    row = ctx.store.get_run(base["id"])
    assert row is not None and not row.live
    assert (row.state, row.outcome, row.refusal_class, row.exit_code) == (
        "refused", "refused", "seat-full", None)
    assert row.session_ordinal < 0 and row.holder_pid == os.getpid()
    rec = ctx.run_record(base["id"])
    assert rec.signature == "valid"
    assert rec.refusal_class == "seat-full" and rec.data["enforced_by"] is None
    assert rec.data["refusal"] == refusal.as_dict()
    assert rec.data["finished_at"] == row.finished_at == row.started_at
    assert rec.data["argv"] == ["/bin/true"]
    # Nothing holds the seat: a refused run never took one.
    assert ctx.store.live_runs("m", "s1") == []


# -- running, still running, finished ------------------------------------------------------

def test_running_marks_the_row_and_writes_the_record_file(ctx: Context) -> None:
    record = _reserved(ctx)
    recorder.running(ctx, record)
    row = ctx.store.get_run(record["id"])
    assert row is not None and row.state == "running" and row.live
    assert ctx.run_record(record["id"]).signature == "pending"  # signed when it ends
    on_disk = _file(ctx, record["id"])
    assert on_disk["state"] == "running" and on_disk["argv"] == ["/bin/true"]
    assert _file_verifies(ctx, on_disk)
    assert "state" not in record  # the caller's record is not changed
    assert [p.name for p in ctx.workspace.run_dir(record["id"]).iterdir()] == ["record.json"]


def test_still_running_leaves_the_row_live_with_a_signed_record(ctx: Context) -> None:
    record = _reserved(ctx)
    recorder.running(ctx, record)
    recorder.still_running(ctx, {**record, "notes": ["connection lost"]})
    row = ctx.store.get_run(record["id"])
    assert row is not None and row.live and row.outcome is None
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid" and rec.data["notes"] == ["connection lost"]
    assert [r.id for r in ctx.store.live_runs("m", "s1")] == [record["id"]]


@pytest.mark.parametrize(("code", "outcome"), [(0, "exited"), (5, "failed")])
def test_finished_ends_the_row_and_the_file_alike(ctx: Context, code: int, outcome: str) -> None:
    record = _reserved(ctx)
    recorder.running(ctx, record)
    end = RunEnd()
    end.exited(code)
    recorder.finished(ctx, record, end)
    row = ctx.store.get_run(record["id"])
    assert row is not None and not row.live
    assert (row.state, row.outcome, row.exit_code, row.refusal_class) == (
        "ended", outcome, code, None)
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid"
    on_disk = _file(ctx, record["id"])
    assert _file_verifies(ctx, on_disk)
    assert on_disk == {k: v for k, v in json.loads(row.record_json or "{}").items()}
    assert on_disk["finished_at"] == row.finished_at
    assert ctx.store.live_runs("m", "s1") == []  # the seat is free again


def test_a_run_ends_once(ctx: Context) -> None:
    record = _reserved(ctx)
    end = RunEnd()
    end.exited(0)
    recorder.finished(ctx, dict(record), end)
    first = ctx.store.get_run(record["id"])
    end.exited(9)
    recorder.finished(ctx, dict(record), end)
    again = ctx.store.get_run(record["id"])
    assert first is not None and again is not None
    assert (again.outcome, again.exit_code, again.finished_at) == (
        "exited", 0, first.finished_at)


# -- how a run's body ended ----------------------------------------------------------------

def test_run_end_starts_as_error() -> None:
    end = RunEnd()
    assert (end.outcome, end.state, end.exit_code, end.refusal_class) == (
        "error", "ended", None, None)


def test_absorbing_a_refusal_records_it(ctx: Context) -> None:
    record = _reserved(ctx)
    refusal = Refusal("bypass-token", "argv element 3 is a bypass token", "report it")
    end = RunEnd()
    end.absorb(refusal, record)
    assert (end.outcome, end.state, end.refusal_class) == ("refused", "refused", "bypass-token")
    assert refusal.run_id == record["id"]
    recorder.finished(ctx, record, end)
    row = ctx.store.get_run(record["id"])
    assert row is not None and (row.state, row.outcome, row.refusal_class) == (
        "refused", "refused", "bypass-token")
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid" and rec.data["refusal"] == refusal.as_dict()


def test_absorbing_an_interruption_keeps_the_childs_status(ctx: Context) -> None:
    record = {**_reserved(ctx), "notes": ["earlier"]}
    end = RunEnd()
    end.absorb(Interrupted(signal.SIGINT, 130), record,
               lambda e: f"interrupted by {signal.Signals(e.signum).name}; child ended")
    assert (end.outcome, end.exit_code) == ("interrupted", 130)
    assert record["notes"] == ["earlier", "interrupted by SIGINT; child ended"]
    recorder.finished(ctx, record, end)
    row = ctx.store.get_run(record["id"])
    assert row is not None and (row.outcome, row.exit_code) == ("interrupted", 130)
    end = RunEnd()
    end.absorb(KeyboardInterrupt(), {})
    assert (end.outcome, end.exit_code) == ("interrupted", None)


def test_absorbing_anything_else_is_an_error_named_in_the_record(ctx: Context) -> None:
    record = _reserved(ctx)
    end = RunEnd()
    end.absorb(ValueError("boom"), record)
    assert end.outcome == "error" and record["error"] == "ValueError: boom"
    recorder.finished(ctx, record, end)
    rec = ctx.run_record(record["id"])
    assert rec.outcome == "error" and rec.data["error"] == "ValueError: boom"
    assert rec.signature == "valid"


# -- finalised by the operator, holder dead -----------------------------------------

def test_finalized_by_operator(ctx: Context) -> None:
    record = _reserved(ctx)
    recorder.running(ctx, record)
    row = ctx.store.get_run(record["id"])
    assert row is not None
    rec = recorder.finalized_by_operator(ctx, row, "stuck since Tuesday")
    assert rec.id == record["id"] and rec.signature == "valid"
    assert (rec.outcome, rec.exit_code, rec.data["state"]) == ("finalized-by-operator", None,
                                                               "ended")
    [note] = rec.data["notes"]
    assert note.startswith("finalised by `saphan runs finalize` at ")
    assert f"(uid {os.getuid()}): stuck since Tuesday" in note
    assert ctx.store.live_runs("m", "s1") == []
    # the live record file ("running") does not outlive the row's end
    got = _file(ctx, record["id"])
    assert got["outcome"] == "finalized-by-operator" and _file_verifies(ctx, got)


@pytest.mark.parametrize("signed", [True, False])
def test_holder_dead(ctx: Context, signed: bool) -> None:
    record = _reserved(ctx)
    row = ctx.store.get_run(record["id"])
    assert row is not None
    recorder.holder_dead(ctx.store, row, "pid 4242 does not exist",
                         ctx.record_key if signed else None)
    rec = ctx.run_record(record["id"])
    assert rec.outcome == "holder-dead" and not ctx.store.get_run(record["id"]).live  # type: ignore[union-attr]
    assert rec.data["notes"][-1] == ("finalised by conflict handling: holder dead "
                                     "(pid 4242 does not exist)")
    # Store-level callers pass no key: the record is then plainly unsigned.
    assert rec.signature == ("valid" if signed else "missing")


def test_a_key_that_fails_custody_mid_run_still_finishes_the_row(ctx: Context) -> None:
    """Unsigned, with a note saying why: it reads back flagged, never as valid."""
    record = _reserved(ctx)
    ctx.record_key()  # in custody when the run started
    os.chmod(ctx.workspace.key_path, 0o644)
    end = RunEnd()
    end.exited(0)
    recorder.finished(ctx, record, end)
    row = ctx.store.get_run(record["id"])
    assert row is not None and not row.live and row.outcome == "exited"
    stored = json.loads(row.record_json or "{}")
    assert SIGNATURE_FIELD not in stored
    assert "this record is not signed: the record key failed its custody check" in (
        stored["notes"][-1])
    assert SIGNATURE_FIELD not in _file(ctx, record["id"])
    os.chmod(ctx.workspace.key_path, 0o600)
    assert ctx.run_record(record["id"]).signature == "missing"


def test_write_file_replaces_atomically(ctx: Context) -> None:
    record = {**_base(), "state": "running"}
    path = recorder.write_file(ctx, record)
    assert path == ctx.workspace.run_dir(record["id"]) / "record.json"
    recorder.write_file(ctx, {**record, "state": "ended"})
    assert _file(ctx, record["id"])["state"] == "ended"
    assert sorted(p.name for p in Path(path).parent.iterdir()) == ["record.json"]


# -- an outcome is never lost: the file first, the store retried -------------------------------

@pytest.fixture
def pg(workspace: Workspace, pg_server: PgServer) -> tuple[PgServer, str]:
    """The workspace on a PostgreSQL database of its own (these tests cut
    its connections), machine m and slot s1: the server and the database."""
    name = f"rec_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    pg_server.psql(f"CREATE DATABASE {name}")
    workspace.config_path.write_text(f'[database]\nurl = "{pg_server.url(name)}"\n')
    c = Context(workspace)
    c.store.add_machine(Machine("m", "local"))
    c.store.add_slot(Slot("m", "s1", "command", None))
    c.close()
    return pg_server, name


def _with_retry(workspace: Workspace, seconds: int) -> Context:
    """A context on the workspace whose retry budget is ``seconds``."""
    cfg = workspace.config_path
    cfg.write_text(cfg.read_text() + f"write_retry_seconds = {seconds}\n")
    return Context(workspace)


def _cut(ctx: Context, pg: tuple[PgServer, str], *, allow: bool) -> None:
    """End ctx's connection from the server side; with ``allow`` False no new
    connection to the database is accepted until it is allowed again."""
    pid = ctx.store.db.execute("SELECT pg_backend_pid()")[0][0]
    server, db = pg
    server.psql(f"ALTER DATABASE {db} ALLOW_CONNECTIONS {'true' if allow else 'false'}")
    server.psql(f"SELECT pg_terminate_backend({int(pid)})")


def test_a_connection_lost_before_the_end_is_reopened_and_nothing_is_lost(
        workspace: Workspace, pg: tuple[PgServer, str]) -> None:
    c = _with_retry(workspace, 10)
    try:
        record = _reserved(c)
        recorder.running(c, record)
        _cut(c, pg, allow=True)  # what a restart does to the connection
        end = RunEnd()
        end.exited(7)
        recorder.finished(c, record, end)
        row = c.store.get_run(record["id"])
        assert row is not None and not row.live and (row.outcome, row.exit_code) == ("failed", 7)
        assert c.run_record(record["id"]).signature == "valid"
        assert _file(c, record["id"])["exit_code"] == 7
    finally:
        c.close()


def test_a_store_that_stays_away_leaves_the_outcome_in_the_record_file(
        workspace: Workspace, pg: tuple[PgServer, str]) -> None:
    from saphan.errors import RecordPending

    c = _with_retry(workspace, 2)
    record = _reserved(c)
    recorder.running(c, record)
    _cut(c, pg, allow=False)
    end = RunEnd()
    end.exited(7)
    t0 = time.monotonic()
    try:
        with pytest.raises(RecordPending) as info:
            recorder.finished(c, record, end)
        took = time.monotonic() - t0
    finally:
        pg[0].psql(f"ALTER DATABASE {pg[1]} ALLOW_CONNECTIONS true")
        c.close()
    assert 1.5 <= took < 6, took  # the budget (2 s), not a hang
    path = c.workspace.run_dir(record["id"]) / "record.json"
    message = str(info.value)
    assert f"run {record['id']} ended (failed, exit 7)" in message
    assert f"its signed record is in {path}" in message
    assert "could not be written for 2 s" in message and "the next saphan command" in message
    assert (info.value.run_id, info.value.path) == (record["id"], str(path))
    on_disk = _file(c, record["id"])
    assert _file_verifies(c, on_disk)
    assert (on_disk["state"], on_disk["outcome"], on_disk["exit_code"]) == ("ended", "failed", 7)
    fresh = Context(c.workspace)  # no reconciliation hook: the row as the store has it
    try:
        row = fresh.store.get_run(record["id"])
        assert row is not None and row.live  # the store never heard (run/live reconciles it)
    finally:
        fresh.close()


def test_running_names_the_process_driving_the_run(ctx: Context) -> None:
    record = _reserved(ctx)
    recorder.running(ctx, record)
    me = current_holder()
    assert _file(ctx, record["id"])["driven_by"] == {
        "host": me.host, "pid": os.getpid(), "start_ticks": me.start_ticks,
        "boot_id": me.boot_id}


def test_a_run_with_a_cancel_request_ends_cancelled(ctx: Context) -> None:
    from saphan.run.end import write_cancel_request

    record = _reserved(ctx)
    recorder.running(ctx, record)
    write_cancel_request(ctx.workspace.run_dir(record["id"]),
                         {"signal": "SIGTERM", "grace": 10, "requested_at": "T"})
    end = RunEnd()
    end.absorb(Interrupted(signal.SIGTERM, -15), record)
    recorder.finished(ctx, record, end)
    row = ctx.store.get_run(record["id"])
    assert row is not None and (row.outcome, row.exit_code) == ("cancelled", -15)
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid" and rec.data["cancel"]["signal"] == "SIGTERM"
    assert "the run's own driver recorded it" in rec.data["notes"][-1]
    assert _file(ctx, record["id"])["outcome"] == "cancelled"


def test_cancelled_by_operator_keeps_the_live_record_and_the_far_status(ctx: Context) -> None:
    from saphan.run.live import read_record

    record = _reserved(ctx)
    recorder.running(ctx, {**record, "enforced_by": {"mechanism": "landlock"}})
    row = ctx.store.get_run(record["id"])
    assert row is not None
    found = read_record(ctx, ctx.record_key(), row)
    assert found is not None
    assert recorder.cancelled_by_operator(
        ctx, row, note="cancelled here", live=found, exit_code=143,
        extra={"far_status": ["saphan-launcher: exited code=143 reaped=0"]})
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid"
    assert (rec.outcome, rec.exit_code, rec.data["state"]) == ("cancelled", 143, "ended")
    assert rec.data["argv"] == ["/bin/true"] and rec.data["enforced_by"] == {
        "mechanism": "landlock"}
    assert rec.data["notes"][-1] == "cancelled here"
    assert _file(ctx, record["id"])["outcome"] == "cancelled"
    # Once finished, nothing is finished twice; the file follows the store.
    assert not recorder.cancelled_by_operator(ctx, row, note="again", live=found,
                                              exit_code=None, extra={})
    assert _file(ctx, record["id"])["notes"][-1] == "cancelled here"


def test_reconciled_writes_the_files_outcome_once(ctx: Context) -> None:
    record = _reserved(ctx)
    ended = {**record, "state": "ended", "outcome": "failed", "exit_code": 3,
             "finished_at": now_iso()}
    row = ctx.store.get_run(record["id"])
    assert row is not None
    found = json.loads(recorder.signed_json(ctx, ended))
    assert recorder.reconciled(ctx, row, found, "reconciled by `saphan x` at T")
    rec = ctx.run_record(record["id"])
    assert rec.signature == "valid" and (rec.outcome, rec.exit_code) == ("failed", 3)
    assert rec.data["notes"] == ["reconciled by `saphan x` at T"]
    assert _file(ctx, record["id"])["notes"] == ["reconciled by `saphan x` at T"]
    assert not recorder.reconciled(ctx, row, found, "reconciled again")
    assert _file(ctx, record["id"])["notes"] == ["reconciled by `saphan x` at T"]
