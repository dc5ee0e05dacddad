"""The record writer: the ONLY module that writes a run's outcome.

Every way a run's row changes state goes through here, signed with the
workspace record key (records.py) in the store and in ``runs/<id>/record.json``:

    refused(...)             a run refused before or at its reservation
    running(...)             the boundary is composed, the tool starts
    still_running(...)       a far run whose connection was lost (left live)
    finished(...)            every lane's end: exited, failed, refused at
                             composition, interrupted, cancelled, error
    finalized_by_operator()  `saphan runs finalize`
    cancelled_by_operator()  `saphan runs cancel`, when the run's driver is gone
    reconciled(...)          an outcome the record file holds and the store
                             missed, recorded by the next command (run/live.py)
    holder_dead(...)         conflict handling (or reconciliation) found the
                             holder dead

An outcome is never lost: it is written to ``record.json`` FIRST (a new file,
fsync'd, renamed over the old one, the directory fsync'd), then to the store.
The store is tried again with a bounded backoff — the first retry after
0.25 s, each wait doubled up to 4 s, for at most ``database.write_retry_seconds``
(30 s by default; a connection being opened when the budget ends may add
PostgreSQL's 10 s connect timeout), reconnecting before each retry, so a
PostgreSQL restart within that time loses nothing. Past it, :class:`RecordPending`
says what is pending and where its record is; the next saphan command that
opens the store finishes the row from the file (run/live.reconcile).

A test holds every other module off the store's outcome-writing methods.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.errors import RecordPending, StoreError
from saphan.refusals import Refusal
from saphan.run.end import RunEnd, cancel_request, signal_text
from saphan.timefmt import now_iso

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import Holder
    from saphan.records import RunRecord
    from saphan.store import Store
    from saphan.store.rows import RunRow


def signed_json(ctx: Context, record: dict[str, Any]) -> str:
    """``record`` signed with the workspace record key, as the store keeps it.

    Should the key fail its custody check (a run checks it before it starts,
    so only a key changed mid-run), the record is still written — the row
    must be finished — unsigned, with a note naming why: it reads back
    flagged "missing", never as valid.
    """
    from saphan.records import signed_record_json

    try:
        return signed_record_json(ctx.record_key(), record)
    except Refusal as e:
        record["notes"] = [*(record.get("notes") or []),
                           f"this record is not signed: the record key failed its custody "
                           f"check when it was written ({e.message})"]
        record.pop("record_signature", None)
        return json.dumps(record, sort_keys=True)


#: the first wait before the store is tried again, and the longest (seconds)
RETRY_FIRST_WAIT = 0.25
RETRY_MAX_WAIT = 4.0


def write_file(ctx: Context, record: dict[str, Any]) -> Path:
    """runs/<id>/record.json, signed like the store's copy."""
    return _write_signed(ctx, record["id"], signed_json(ctx, dict(record)))


def _write_signed(ctx: Context, run_id: str, record_json: str) -> Path:
    """Write a signed record as runs/<id>/record.json, durably: a new file of
    this process's own (never through a link), fsync'd, renamed over the old
    one, then the directory fsync'd — so a crash leaves the old record or the
    new one, whole."""
    run_dir = ctx.workspace.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "record.json"
    tmp = run_dir / f".record.json.{os.getpid()}.tmp"
    text = json.dumps(json.loads(record_json), indent=2, sort_keys=True) + "\n"
    with suppress(FileNotFoundError):
        tmp.unlink()  # one this process left by a crash between its create and rename
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def _to_store(ctx: Context, run_id: str, path: Path, what: str,
              write: Callable[[], object]) -> object:
    """``write`` the store, the record file already holding the outcome;
    retried with the backoff the module docstring gives. RecordPending when
    the budget is spent."""
    budget = float(ctx.config.write_retry_seconds)
    deadline = time.monotonic() + budget
    wait = RETRY_FIRST_WAIT
    while True:
        try:
            return write()
        except StoreError as e:
            last = e
        if time.monotonic() + wait > deadline:
            break
        time.sleep(wait)
        wait = min(wait * 2, RETRY_MAX_WAIT)
        try:
            ctx.store.reopen()
        except StoreError as e:
            last = e
            if time.monotonic() >= deadline:
                break
    raise RecordPending(
        f"run {run_id} {what}, and its signed record is in {path}, but the store "
        f"({ctx.store.description}) could not be written for {budget:.0f} s ({last}); the "
        f"outcome is pending there: the next saphan command that reaches the store records "
        f"it from that file (e.g. `saphan runs show {run_id}`)", run_id=run_id, path=str(path))


def refused(ctx: Context, base: dict[str, Any], tool: str, holder: Holder,
            refusal: Refusal) -> None:
    """A run refused before it held a seat (or as it tried to take one)."""
    # Every column the row will carry is in the signed record (records.py
    # holds them against each other when the record is read).
    record = {
        **base, "tool": tool, "state": "refused", "outcome": "refused", "exit_code": None,
        "session_ordinal": None, "refusal": refusal.as_dict(), "enforced_by": None,
        "finished_at": now_iso(),
    }
    ctx.store.insert_refused_run(
        run_id=base["id"], machine=base["machine"], slot=base["slot"], tool=tool,
        workdir=base.get("workdir"), holder=holder.as_tuple(),
        refusal_class=refusal.cls, record_json=signed_json(ctx, record),
        at=record["finished_at"],
    )
    refusal.run_id = base["id"]


def running(ctx: Context, record: dict[str, Any]) -> None:
    """The boundary is composed and the tool is about to start: the live
    record file (what `runs show` shows of a live run), naming the process
    that drives the run (``driven_by``: this one, as liveness.py identifies
    a process — `runs cancel` signals it, and nothing else, by that)."""
    from saphan.liveness import current_holder

    me = current_holder()
    record["driven_by"] = {"host": me.host, "pid": me.pid, "start_ticks": me.start_ticks,
                           "boot_id": me.boot_id}
    write_file(ctx, {**record, "state": "running"})
    ctx.store.mark_running(record["id"])


def still_running(ctx: Context, record: dict[str, Any]) -> None:
    """A far run whose connection was lost while its process ran: the row
    stays live with its far holder; conflict handling or the operator ends it.
    ``left_running`` (signed) says so: its driver is gone by design
    (run/live.backs)."""
    live = signed_json(ctx, {**record, "state": "running", "left_running": True})
    path = _write_signed(ctx, record["id"], live)
    _to_store(ctx, record["id"], path, "is left running on its far machine",
              lambda: ctx.store.set_record(record["id"], live))


def finished(ctx: Context, record: dict[str, Any], end: RunEnd) -> None:
    """Finalise a run's row by id (every lane ends here): the record file
    first, then the store (retried). A cancel request in the run's directory
    (`saphan runs cancel`) makes the outcome ``cancelled``."""
    request = cancel_request(ctx.workspace.run_dir(record["id"]))
    if request is not None:
        end.cancelled(request, record)
    record.update({"finished_at": now_iso(), "outcome": end.outcome,
                   "exit_code": end.exit_code, "state": end.state})
    signed = signed_json(ctx, record)
    path = _write_signed(ctx, record["id"], signed)
    done = _to_store(
        ctx, record["id"], path,
        f"ended ({end.outcome}, exit {signal_text(end.exit_code)})",
        lambda: ctx.store.finalize(
            record["id"], state=end.state, outcome=end.outcome, exit_code=end.exit_code,
            refusal_class=end.refusal_class, record_json=signed,
            finished_at=record["finished_at"]))
    if not done:
        _file_from_store(ctx, record["id"])


def _file_from_store(ctx: Context, run_id: str) -> None:
    """The row was finished by someone else first (reconciliation, conflict
    handling, the operator): the record file becomes the store's record, so
    the two never disagree."""
    row = ctx.store.get_run(run_id)
    if row is not None and row.record_json:
        _write_signed(ctx, run_id, row.record_json)


def finalize_by_operator(ctx: Context, run_id: str, *, reason: str,
                         force: bool = False) -> RunRecord:
    """`saphan runs finalize`: a live row whose holder is measured alive (here,
    or on its far machine) is not ended unless ``force``; what was measured
    is recorded with the reason."""
    from saphan.errors import UserError

    row = ctx.find_run(run_id)
    if not row.live:
        raise UserError(f"run {row.id} already finished at {row.finished_at}")
    seen = ctx.holder_liveness(row)
    if seen is not None and seen.state == "alive" and not force:
        raise UserError(
            f"run {row.id}'s holder is alive ({seen.evidence}): ending its row would free "
            f"its seat while it runs; end the run with `saphan runs cancel {row.id}`, or pass "
            "--force (recorded)")
    held = "" if seen is None else f"; its holder was {seen.state} ({seen.evidence})"
    return finalized_by_operator(ctx, row, f"{reason}{' (--force)' if force else ''}{held}")


def finalized_by_operator(ctx: Context, row: RunRow, reason: str) -> RunRecord:
    """`saphan runs finalize`: end a live run's row, recorded as such."""
    from saphan.records import finalised_record_json

    now = now_iso()
    record_json = finalised_record_json(
        ctx.record_key(), row, outcome="finalized-by-operator", finished_at=now,
        note=f"finalised by `saphan runs finalize` at {now} (uid {os.getuid()}): {reason}",
    )
    done = ctx.store.finalize(
        row.id, state="ended", outcome="finalized-by-operator", record_json=record_json,
        finished_at=now,
    )
    if done and (ctx.workspace.run_dir(row.id) / "record.json").exists():
        # the live record file ("running") would otherwise outlive the row's end
        _file_from_store(ctx, row.id)
    return ctx.run_record(row.id)


def cancelled_by_operator(ctx: Context, row: RunRow, *, note: str,
                          live: dict[str, Any] | None, exit_code: int | None,
                          extra: dict[str, Any]) -> bool:
    """`saphan runs cancel` ends a run whose driver is gone (or did not end
    it in time): outcome ``cancelled``, the file first, then the store.
    ``live``: the run's verified live record (run/live.read_record);
    ``extra``: what cancel measured (the signals sent, the far status).
    False when the row was finished by someone else first."""
    from saphan.records import finalised_record_json

    now = now_iso()
    record = json.loads(finalised_record_json(
        ctx.record_key(), row, outcome="cancelled", note=note, finished_at=now, live=live,
        exit_code=exit_code))
    record.update(extra)
    signed = signed_json(ctx, record)
    path = _write_signed(ctx, row.id, signed)
    done = bool(_to_store(ctx, row.id, path, "was cancelled",
                          lambda: ctx.store.finalize(
                              row.id, state="ended", outcome="cancelled", exit_code=exit_code,
                              record_json=signed, finished_at=now)))
    if not done:
        _file_from_store(ctx, row.id)
    return done


def reconciled(ctx: Context, row: RunRow, found: dict[str, Any], note: str) -> bool:
    """A live row whose record file — signed with this workspace's key, for
    this run (run/live.read_record checked both) — says the run ended: the
    store gets that outcome, with ``note`` (who reconciled it, when). The
    store first, then the file, so a file never claims a reconciliation that
    lost to the run's own driver. False when the row was finished already."""
    record = {k: v for k, v in found.items() if k != "record_signature"}
    record["notes"] = [*(record.get("notes") or []), note]
    signed = signed_json(ctx, record)
    refusal = record.get("refusal") or {}
    done = ctx.store.finalize(
        row.id, state=str(record["state"]), outcome=str(record["outcome"]),
        exit_code=record.get("exit_code"),
        refusal_class=refusal.get("class") if isinstance(refusal, dict) else None,
        record_json=signed, finished_at=str(record["finished_at"]))
    if done:
        _write_signed(ctx, row.id, signed)
    return done


def holder_dead(store: Store, run: RunRow, evidence: str,
                record_key: Callable[[], bytes] | None, *,
                by: str = "finalised by conflict handling",
                live: dict[str, Any] | None = None) -> None:
    """Conflict handling found the holder dead: finalise this run by id.
    ``by`` opens the note (reconciliation: "reconciled by `saphan VERB` at
    TIME"); ``live``: the run's verified live record, the base of the final one.

    Without ``record_key`` (store-level callers: tests, benches) the record is
    written unsigned and reads back flagged "missing"."""
    note = f"{by}: holder dead ({evidence})"
    finished_at = now_iso()
    if record_key is not None:
        from saphan.records import finalised_record_json

        record_json = finalised_record_json(
            record_key(), run, outcome="holder-dead", note=note, finished_at=finished_at,
            live=live,
        )
    else:
        record = run.record()
        record.pop("record_signature", None)  # it would no longer verify
        record.setdefault("notes", []).append(note)
        record["outcome"] = "holder-dead"
        record_json = json.dumps(record, sort_keys=True)
    store.finalize(run.id, state="ended", outcome="holder-dead", record_json=record_json,
                   finished_at=finished_at)
