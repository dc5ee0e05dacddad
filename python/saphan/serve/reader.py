"""What the dashboard's pages show, read through the Engine's API.

Every run is read as `saphan runs list` / `runs show` read it (run/live.py):
its record verified against the workspace record key, a live run completed
from its signed live record with its holder's liveness judged here. Nothing
is dialled (a far holder reads "unknown"; `saphan runs show ID` reads it over
SSH), nothing is written: the Engine is opened without reconciliation
(serve/app.py), so the page shows the store as it is.

A record that does not verify is shown flagged, never hidden; what a run
wrote (its output, its record's strings) is returned as text for the page to
escape, never interpreted. A run's output is read from the workspace's
runs/<id>/ by the run id alone (run/logs.window), never by a path a request
names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.refusals import Refusal

if TYPE_CHECKING:
    from saphan.engine import Engine
    from saphan.records import RunRecord
    from saphan.serve.params import RunFilters
    from saphan.store.rows import Fact, Machine, Task

#: the most of one log a request returns (bytes)
OUTPUT_WINDOW = 64 << 10
#: the keys of a fact's value the fleet page names first (the rest: in full, cut)
FACT_KEYS = ("level", "floor", "highest_known", "reason", "kernel_release", "launcher_version",
             "launcher_sha256", "version", "sha256", "path", "image", "runtime", "name", "value")
FACT_TEXT_LIMIT = 400


class NotFound(LookupError):
    pass


# -- the fleet -----------------------------------------------------------------------------

def fleet(engine: Engine) -> dict[str, Any]:
    """Machines with their facts and labels; slots with every ordinal."""
    from saphan.fleet.labels import all_labels
    from saphan.run import live

    ctx = engine.ctx
    machines = engine.machines()
    labels = all_labels(ctx)
    live_rows = ctx.store.all_live_runs()
    key = ctx.record_key() if live_rows or machines else b""
    held: dict[tuple[str, str], list[RunRecord]] = {}
    for row in live_rows:
        held.setdefault((row.machine, row.slot), []).append(live.view(ctx, row, key))
    slots = engine.slots()
    shown = {(s.machine, s.name) for s in slots}
    stray = [r for (m_, s_), rs in held.items() if (m_, s_) not in shown for r in rs]
    stray += [r for rs in held.values() for r in rs
              if not (isinstance(o := r.data.get("session_ordinal"), int) and o >= 0)
              and r not in stray]
    out = []
    for m in machines:
        mine = [s for s in slots if s.machine == m.name]
        out.append({
            "name": m.name, "transport": m.transport, "address": m.address(),
            "labels": labels.get((m.name, ""), {}),
            "facts": [_fact_or_flag(engine, m, f, key) for f in ctx.store.list_facts(m.name)],
            "slots": [{
                "name": s.name, "tool": s.tool, "capacity": s.capacity,
                "labels": labels.get((m.name, s.name), {}),
                "agent_pin": s.agent_sha256,
                "ordinals": _ordinals(s.capacity, held.get((m.name, s.name), [])),
            } for s in mine],
        })
    # live rows on no slot listed above, or on no ordinal: listed, never left out
    others = [{"run": r.id, "machine": r.data.get("machine"), "slot": r.data.get("slot"),
               "ordinal": r.data.get("session_ordinal"), "state": r.data.get("state")}
              for r in stray]
    return {"machines": out, "live": len(live_rows), "stray": others}


def _fact_or_flag(engine: Engine, m: Machine, f: Fact, key: bytes) -> dict[str, Any]:
    """The fact as :func:`_fact` shows it; one that cannot even be read is one
    flagged row (the page, and every other fact, still shown)."""
    from saphan.errors import StoreError

    try:
        return _fact(engine, m, f, key)
    except StoreError:
        raise  # the store's failure is the page's (503), not this row's
    except Exception as e:  # a forged row must not hide the fleet
        return {"kind": f.kind, "measured_at": f.measured_at, "age": "?", "status": "invalid",
                "message": f"the row cannot be read ({type(e).__name__}); it is not trusted",
                "summary": ""}


def _fact(engine: Engine, m: Machine, f: Fact, key: bytes) -> dict[str, Any]:
    from saphan.records import foreign_fact
    from saphan.timefmt import age_text

    base = {"kind": f.kind, "measured_at": f.measured_at, "age": age_text(f.measured_at)}
    other = foreign_fact(key, f)
    if other is not None:
        return {**base, "status": "foreign", "message": other.get("message"),
                "summary": _summary_text(f.value_json)}
    try:
        got = engine.verified_fact(m.name, f.kind)
    except Refusal as e:
        return {**base, "status": "invalid", "message": e.message,
                "remediation": e.remediation, "summary": _summary_text(f.value_json)}
    if got is None:  # removed between the listing and the read
        return {**base, "status": "gone", "message": "no longer in the store", "summary": ""}
    return {**base, "status": "valid", "summary": _summary(got[0])}


def _summary_text(value_json: str) -> str:
    try:
        value = json.loads(value_json)
    except (ValueError, RecursionError):
        return value_json[:FACT_TEXT_LIMIT]
    return _summary(value) if isinstance(value, dict) else str(value)[:FACT_TEXT_LIMIT]


def _summary(value: dict[str, Any]) -> str:
    first = [f"{k}={value[k]}" for k in FACT_KEYS if k in value]
    rest = {k: v for k, v in value.items() if k not in FACT_KEYS and k not in ("seq",)}
    text = " ".join(first) + (" " + json.dumps(rest, sort_keys=True) if rest else "")
    return text if len(text) <= FACT_TEXT_LIMIT else text[:FACT_TEXT_LIMIT - 3] + "..."


def _ordinals(capacity: int, holders: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """Every ordinal, free or held: each held one a row, each run of free ones
    between them ONE row (``ordinal``..``last``), so the page's size follows
    the live runs, never a capacity (up to 1,000,000) or an ordinal a row claims."""
    by_ordinal = {o: r for r in holders
                  if isinstance(o := r.data.get("session_ordinal"), int) and o >= 0}
    out: list[dict[str, Any]] = []
    at = 0
    for n in [*sorted(by_ordinal), None]:
        end = capacity if n is None else min(n, capacity)
        if end > at:
            out.append({"ordinal": at, "last": end - 1, "held": False, "over_capacity": False})
        if n is None:
            break
        at = max(at, n + 1)
        r = by_ordinal[n]
        live = r.data.get("live") or {}
        holder, life = live.get("holder") or {}, live.get("liveness") or {}
        out.append({"ordinal": n, "last": n, "held": True, "over_capacity": n >= capacity,
                    "run": r.id, "tool": r.data.get("tool"), "state": r.data.get("state"),
                    "pid": holder.get("pid"), "host": holder.get("host"),
                    "since": r.data.get("started_at"),
                    "liveness": life.get("state", "unknown"),
                    "evidence": life.get("evidence", "no holder recorded"),
                    # a row alone claims the seat unless a live record signed
                    # here, for this very run and its holder, backs it (run/live.backs)
                    "backed": live.get("backed") is True})
    return out


# -- runs ------------------------------------------------------------------------------------

def runs(engine: Engine, f: RunFilters) -> dict[str, Any]:
    """One page of runs, newest first, and the cursor of the next (None: the last page)."""
    from saphan.serve.params import cursor_ok, cursor_text

    records = engine.runs(f.limit + 1, **f.store)
    more = len(records) > f.limit
    records = records[:f.limit]
    last = records[-1].data if records else None
    nxt, blocked = None, None
    if more and last is not None:
        if cursor_ok(last.get("started_at"), last.get("id")):
            nxt = cursor_text(str(last["started_at"]), str(last["id"]))
        else:  # a row saphan did not write: no cursor can start after it
            blocked = (f"paging stops at run {str(last.get('id'))[:40]!r}: its id or start "
                       "time is not one saphan writes (a forged row); narrow the filters "
                       "(machine, slot, state) to see older runs")
    return {"rows": [row(r) for r in records], "next": nxt, "blocked": blocked}


def row(r: RunRecord) -> dict[str, Any]:
    """One run as the runs table shows it."""
    from saphan.run.end import signal_text

    d = r.data
    refusal = d.get("refusal") if isinstance(d.get("refusal"), dict) else None
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else None
    enforced = d.get("enforced_by") if isinstance(d.get("enforced_by"), dict) else None
    return {
        "id": r.id, "machine": d.get("machine"), "slot": d.get("slot"),
        "ordinal": d.get("session_ordinal"), "tool": d.get("tool"), "state": d.get("state"),
        "started_at": d.get("started_at"), "finished_at": d.get("finished_at"),
        "outcome": d.get("outcome"),
        "exit": None if d.get("exit_code") is None else signal_text(d.get("exit_code")),
        "refusal_class": (refusal or {}).get("class"),
        "enforced": (enforced or {}).get("mechanism"),
        "signature": r.signature, "flagged": r.signature_unverified,
        "cost": _cost(usage), "live": d.get("live") is not None,
        # a live row a live record signed here backs (run/live.backs); else the row alone
        "backed": (d.get("live") or {}).get("backed") is True,
    }


def _cost(usage: dict[str, Any] | None) -> str | None:
    if usage is None:
        return None
    tokens = usage.get("tokens") if isinstance(usage.get("tokens"), dict) else {}
    total = sum(v for v in (tokens or {}).values() if isinstance(v, int) and v >= 0)
    cost = usage.get("cost_usd")
    money = f"${cost:.4f}" if isinstance(cost, (int, float)) and cost >= 0 else "-"
    return f"{total} tok {money}"


def run(engine: Engine, run_id: str, diff: bool = True) -> dict[str, Any]:
    """One run: its record, the lines `runs show` prints, its refusal, usage and
    (``diff``) its branch's diff (run/diff.py; None for a run without --repo)."""
    from saphan.run.diff import branch_diff
    from saphan.run.shown import record_lines

    try:
        r = engine.run_record(run_id, dial=False)
    except UserError as e:
        raise NotFound(str(e)) from None
    try:
        lines = record_lines(r)
        shaped = True
    except Exception:
        # A record that does not verify need not have the shape saphan
        # writes (a string where a number was, nesting, anything): shown as
        # stored. One that verifies was written by saphan: a failure is a bug.
        if not r.signature_unverified:
            raise
        lines, shaped = r.to_json().splitlines(), False
    lines, cut = _bounded(lines)
    d = r.data
    refusal = d.get("refusal") if isinstance(d.get("refusal"), dict) else None
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else None
    verified = d.get("signature") if isinstance(d.get("signature"), dict) else {}
    return {
        "row": row(r), "lines": lines, "shaped": shaped, "cut": cut, "refusal": refusal,
        "usage": usage, "signature": verified, "live": d.get("live") is not None,
        "diff": branch_diff(d, signature=r.signature) if diff else None,
        "record": d, "signature_status": r.signature,
    }


#: the most of a record's text a run page shows (a forged record can be any size)
RECORD_TEXT_LIMIT = 256 << 10


def _bounded(lines: list[str]) -> tuple[list[str], bool]:
    out: list[str] = []
    size = 0
    for line in lines:
        size += len(line) + 1
        if size > RECORD_TEXT_LIMIT:
            return out, True
        out.append(line)
    return out, False


def output(engine: Engine, run_id: str, stream: str, start: int | None) -> dict[str, Any]:
    """A window of the run's output (run/logs.window) as text: whole UTF-8
    characters; control characters but newline and tab, C1 controls and
    bidi overrides escaped (terminal.terminal_safe: ``\\x1b``, ``\\u202e``)."""
    from saphan.run.logs import window
    from saphan.terminal import terminal_safe

    row_ = engine.ctx.store.get_run(run_id)
    if row_ is None:
        raise NotFound(f"no run {run_id}")
    w = window(engine.ctx, run_id, stream, start, OUTPUT_WINDOW)
    data, at = w.data, w.start
    if start is None:  # a tail: begin at a character
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
            skip += 1
        data, at = data[skip:], at + skip
    if row_.live or w.end < w.size:
        data = _whole(data)  # the rest of a character cut here is read next time
    # else: the log is complete; a character it ends in the middle of never will be
    return {"text": terminal_safe(data.decode("utf-8", "replace")), "start": at,
            "end": at + len(data), "size": w.size, "live": row_.live}


def _whole(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end (read next time)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data
        if b >= 0xC0:  # a lead byte: complete if its sequence fits
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


# -- batches ----------------------------------------------------------------------------------

def batches(engine: Engine, limit: int = 50) -> list[dict[str, Any]]:
    """The newest batches, each with its tasks per state and how many of its
    task rows do not verify under the workspace key (a batch row itself is
    not signed: its tasks are)."""
    from saphan.batch.api import record_key_or_none

    key = record_key_or_none(engine.ctx)
    out = []
    for b in engine.batches.list(limit):
        tasks = engine.ctx.store.batch_tasks(b.id)
        states: dict[str, int] = {}
        for t in tasks:
            states[t.state] = states.get(t.state, 0) + 1
        out.append({"id": b.id, "created_at": b.created_at, "source": b.source,
                    "tasks": b.tasks, "states": states,
                    "unverified": sum(not _task_signed(key, t) for t in tasks)})
    return out


def _task_signed(key: bytes | None, t: Task) -> bool:
    from saphan.records import task_verifies

    return key is not None and task_verifies(key, t.batch, t.seq, t.task_id, t.spec_json,
                                             t.signature)


def batch(engine: Engine, batch_id: str) -> dict[str, Any]:
    """The batch and every task as `batch show` reports them (batch/api.task_view),
    each task's view and its signature check (``task_signature``: "valid" or
    "invalid") made from the same read of its row: a task row the workspace
    key did not sign is shown flagged, and only verified tasks count as done.
    (Which run a claim names is the store's word: the run's record is
    verified, the claim is not signed.)"""
    from saphan.batch.api import record_key_or_none, task_view

    ctx = engine.ctx
    b = ctx.store.get_batch(batch_id)
    if b is None:
        raise NotFound(f"no batch {batch_id}")
    key = record_key_or_none(ctx)
    tasks = []
    states: dict[str, int] = {}
    for t in ctx.store.batch_tasks(b.id):
        view = task_view(ctx, t, key=key)
        view["task_signature"] = "valid" if _task_signed(key, t) else "invalid"
        tasks.append(view)
        states[t.state] = states.get(t.state, 0) + 1
    return {"batch": b.id, "created_at": b.created_at, "source": b.source, "tasks": tasks,
            "states": states,
            # done: the task row verifies AND its run's record does (a task's
            # state and claim are the store's word; its spec and the record are signed)
            "done_verified": sum(v["state"] == "done" and v["task_signature"] == "valid"
                                 and v.get("signature") == "valid" for v in tasks)}
