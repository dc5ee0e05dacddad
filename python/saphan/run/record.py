"""The record writer: the ONLY module that writes a run's outcome.

Every way a run's row changes state goes through here, signed with the
workspace record key (records.py) in the store and in ``runs/<id>/record.json``:

    refused(...)             a run refused before or at its reservation
    running(...)             the boundary is composed, the tool starts
    still_running(...)       a far run whose connection was lost (left live)
    finished(...)            every lane's end: exited, failed, refused at
                             composition, interrupted, error
    finalized_by_operator()  `saphan runs finalize`
    holder_dead(...)         conflict handling found the holder dead

A test holds every other module off the store's outcome-writing methods.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.refusals import Refusal
from saphan.run.end import RunEnd
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


def write_file(ctx: Context, record: dict[str, Any]) -> Path:
    """runs/<id>/record.json, signed like the store's copy."""
    run_dir = ctx.workspace.run_dir(record["id"])
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "record.json"
    tmp = path.with_suffix(".json.tmp")
    signed = json.loads(signed_json(ctx, dict(record)))
    tmp.write_text(json.dumps(signed, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


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
    """The boundary is composed and the tool is about to start."""
    ctx.store.mark_running(record["id"])
    write_file(ctx, {**record, "state": "running"})


def still_running(ctx: Context, record: dict[str, Any]) -> None:
    """A far run whose connection was lost while its process ran: the row
    stays live with its far holder; conflict handling or the operator ends it."""
    ctx.store.set_record(record["id"], signed_json(ctx, {**record, "state": "running"}))
    write_file(ctx, {**record, "state": "running"})


def finished(ctx: Context, record: dict[str, Any], end: RunEnd) -> None:
    """Finalise a run's row by id and write its record file (every lane ends here)."""
    record.update({"finished_at": now_iso(), "outcome": end.outcome,
                   "exit_code": end.exit_code, "state": end.state})
    ctx.store.finalize(
        record["id"], state=end.state, outcome=end.outcome, exit_code=end.exit_code,
        refusal_class=end.refusal_class, record_json=signed_json(ctx, record),
        finished_at=record["finished_at"],
    )
    write_file(ctx, record)


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
            "its seat while it runs; stop it first, or pass --force (recorded)")
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
    ctx.store.finalize(
        row.id, state="ended", outcome="finalized-by-operator", record_json=record_json,
        finished_at=now,
    )
    return ctx.run_record(row.id)


def holder_dead(store: Store, run: RunRow, evidence: str,
                record_key: Callable[[], bytes] | None) -> None:
    """Conflict handling found the holder dead: finalise this run by id.

    Without ``record_key`` (store-level callers: tests, benches) the record is
    written unsigned and reads back flagged "missing"."""
    note = f"finalised by conflict handling: holder dead ({evidence})"
    finished_at = now_iso()
    if record_key is not None:
        from saphan.records import finalised_record_json

        record_json = finalised_record_json(
            record_key(), run, outcome="holder-dead", note=note, finished_at=finished_at
        )
    else:
        record = run.record()
        record.pop("record_signature", None)  # it would no longer verify
        record.setdefault("notes", []).append(note)
        record["outcome"] = "holder-dead"
        record_json = json.dumps(record, sort_keys=True)
    store.finalize(run.id, state="ended", outcome="holder-dead", record_json=record_json,
                   finished_at=finished_at)
