"""A live run as this workspace knows it: its live record file, how `runs
show` / `runs list` show it, and what the next command does with a row the
store left live.

    read_record(ctx, key, row)   runs/<id>/record.json, only as saphan wrote
                                 it: signed with this workspace's key, for this
                                 very run (id, machine, slot, tool, ordinal),
                                 a regular file (never through a link), at most
                                 RECORD_LIMIT bytes. Anything else is None.
    listing(ctx, limit)          `runs list`: the newest rows, each through view
    view(ctx, row, key, dial)    the row's record; a live row is completed
                                 from its live record (argv, workdir, what
                                 enforces it) and carries ``live``: its holder
                                 and that holder's liveness, and whether its
                                 live record backs the row (:func:`backs`)
    reconcile(ctx)               called once per command, when the Context
                                 opens the store: every live row (the handful
                                 the partial index holds; no directory is
                                 listed) whose record file says it ENDED gets
                                 that outcome (run/record.reconciled); one
                                 whose holder ran on this host and is measured
                                 dead is finalised holder-dead. Each record
                                 says "reconciled by `saphan VERB` at TIME".

The workspace is hidden from every run, so no run can plant a record file;
the signature is checked all the same, and a file that fails any check is
left alone (the row stays live for conflict handling or the operator).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import TYPE_CHECKING, Any

from saphan.errors import StoreError, UserError
from saphan.records import SIGNATURE_FIELD, RunRecord, verify_record
from saphan.refusals import Refusal

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import Liveness
    from saphan.store.rows import RunRow

#: a record file larger than this is not read (records are a few kB)
RECORD_LIMIT = 8 << 20


def read_record(ctx: Context, key: bytes, row: RunRow) -> dict[str, Any] | None:
    """The run's record file if saphan wrote it, for this run (module docstring)."""
    from saphan.ids import is_run_id

    if not is_run_id(row.id) or not isinstance(row.session_ordinal, int):
        return None  # a row saphan did not make: its id is no name under runs/
    path = ctx.workspace.run_dir(row.id) / "record.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_LIMIT:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        data = json.loads(b"".join(chunks))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or not verify_record(key, data):
        return None
    ordinal = row.session_ordinal if row.session_ordinal >= 0 else None
    if (data.get("id"), data.get("machine"), data.get("slot"), data.get("tool"),
            data.get("session_ordinal")) != (row.id, row.machine, row.slot, row.tool, ordinal):
        return None
    return data


def ended(record: dict[str, Any]) -> bool:
    """The record says the run ended, in the shape the record writer gives."""
    code = record.get("exit_code")
    return (record.get("state") in ("ended", "refused")
            and isinstance(record.get("outcome"), str)
            and isinstance(record.get("finished_at"), str)
            and (code is None or (isinstance(code, int) and not isinstance(code, bool))))


def view(ctx: Context, row: RunRow, key: bytes, *, dial: bool = False) -> RunRecord:
    """The row's record, verified (RunRecord.from_row); a live row completed
    from its live record file and given ``live`` (holder, liveness, the file).
    ``dial``: read a far holder over SSH (`runs show`); without it a far
    holder's liveness is not read (`runs list` dials nothing)."""
    rec = RunRecord.from_row(row, key)
    if not row.live:
        return rec
    found = read_record(ctx, key, row)
    data = rec.data
    if found is not None:
        # The row's columns (and how it verified) stay over the file's values.
        data = {**{k: v for k, v in found.items() if k != SIGNATURE_FIELD}, **data}
    life = _liveness(ctx, row, dial)
    data["live"] = {
        "holder": {"host": row.holder_host, "pid": row.holder_pid,
                   "start_ticks": row.holder_start_ticks, "boot_id": row.holder_boot_id},
        "liveness": None if life is None else {"state": life.state, "evidence": life.evidence},
        "record_file": (str(ctx.workspace.run_dir(row.id) / "record.json")
                        if found is not None else None),
        "backed": backs(found, row, far_tag=_far_tag(ctx, row)),
    }
    return RunRecord(data)


def _far_tag(ctx: Context, row: RunRow) -> str | None:
    """How the row's machine writes a far holder (site/far.holder_host), when
    the row names one and the machine is an SSH machine; else None."""
    if not (row.holder_host or "").startswith("ssh://"):
        return None
    m = ctx.store.get_machine(row.machine)
    if m is None or m.transport != "ssh":
        return None
    from saphan.site.far import holder_host

    return holder_host(m)


def backs(found: dict[str, Any] | None, row: RunRow, *, far_tag: str | None = None) -> bool:
    """The live record file (:func:`read_record`: signed here, for this run)
    says the run is running, driven by the very holder the row names. For a
    far run — the row's holder is the far process, written as ``far_tag``
    (the row's SSH machine's), and the one the record names if it names one —
    the record's driver must be a process alive on this host, or the record
    must say the run was left running (run/record.still_running). Anything
    else (no file; an ENDED record under a row set live again; another holder;
    a crashed driver's file under a far holder someone wrote) leaves the row
    alone saying the seat is held."""
    from saphan.liveness import Holder, check, this_host

    if found is None or ended(found) or found.get("state") != "running":
        return False
    d = found.get("driven_by")
    if not isinstance(d, dict):
        return False
    if (row.holder_host or "").startswith("ssh://"):
        if far_tag is None or row.holder_host != far_tag or d.get("host") != this_host():
            return False
        far = found.get("far_process")
        if isinstance(far, dict) and (far.get("pid"), far.get("start_ticks"),
                                      far.get("boot_id")) != (
                row.holder_pid, row.holder_start_ticks, row.holder_boot_id):
            return False  # the record names the far process: the row must too
        if found.get("left_running") is True:
            return True
        pid, ticks, boot = d.get("pid"), d.get("start_ticks"), d.get("boot_id")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return False
        driver = Holder(this_host(), pid, ticks if isinstance(ticks, int) else None,
                        boot if isinstance(boot, str) else None)
        return check(driver).state == "alive"
    return bool((d.get("host"), d.get("pid"), d.get("start_ticks"), d.get("boot_id"))
                == (row.holder_host, row.holder_pid, row.holder_start_ticks,
                    row.holder_boot_id))


def listing(ctx: Context, limit: int, **filters: Any) -> list[RunRecord]:
    """`runs list`: the newest runs (narrowed by ``filters``: Store.list_runs),
    each through :func:`view` (no dialling)."""
    rows = ctx.store.list_runs(limit, **filters)
    if not rows:
        return []  # no key read, no hashing: an empty list stays cheap
    key = ctx.record_key()
    return [view(ctx, r, key) for r in rows]


def _liveness(ctx: Context, row: RunRow, dial: bool) -> Liveness | None:
    from saphan.liveness import Liveness

    if row.holder_host is None or row.holder_pid is None:
        return None
    if not dial and row.holder_host.startswith("ssh://"):
        return Liveness("unknown", f"a far holder, not read by this listing; `saphan runs "
                                   f"show {row.id}` reads it over SSH")
    if dial:
        return ctx.holder_liveness(row)
    from saphan.capacity import holder_liveness

    return holder_liveness(row)


def reconcile(ctx: Context) -> list[str]:
    """Finish what the store left live and the workspace knows ended (module
    docstring). Returns the ids finished. Never fails the command that
    opened the store: what cannot be done is said on stderr and left."""
    try:
        rows = ctx.store.all_live_runs()
    except StoreError:
        return []  # the command's own use of the store says why
    if not rows:
        return []  # no key read, no file opened: a quiet store stays cheap
    try:
        key = ctx.record_key()
    except (Refusal, UserError):
        return []  # the key's custody fails: nothing can be verified (the verb says so)
    from saphan.capacity import holder_liveness
    from saphan.liveness import this_host

    # run/record.py is imported only when there is something to record: a
    # listing with live runs and nothing to reconcile does not pay for it.
    here = this_host()
    done: list[str] = []
    for row in rows:
        try:
            found = read_record(ctx, key, row)
            if found is not None and ended(found):
                note = (f"{_by(ctx)}: its signed record file said the run ended "
                        f"({found['outcome']}, exit {found.get('exit_code')}) and the store "
                        "had not been told")
                from saphan.run.record import reconciled

                if reconciled(ctx, row, found, note):
                    done.append(row.id)
            elif row.holder_host == here and row.holder_pid is not None:
                life = holder_liveness(row)
                if life.state == "dead":
                    from saphan.run.record import holder_dead

                    holder_dead(ctx.store, row, life.evidence, ctx.record_key, by=_by(ctx),
                                live=found)
                    done.append(row.id)
        except (StoreError, OSError, Refusal) as e:
            print(f"saphan: run {row.id} could not be reconciled now ({e}); it stays live",
                  file=sys.stderr)
    return done


def _by(ctx: Context) -> str:
    from saphan.timefmt import now_iso

    verb = ctx.verb or f"saphan (Python API, pid {os.getpid()})"
    return f"reconciled by `{verb}` at {now_iso()}"

