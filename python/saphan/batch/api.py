"""Batches through the Python API (``Engine.batches``): create one from a
JSONL file, work it, and read it back from the store.

    create(path)         check every line, then write the batch and its tasks
                         in one transaction (nothing is written on an error)
    work(id, ...)        batch/worker.py: run its tasks as seats free up
    find(id)             a batch by id or unique prefix ("last": the newest)
    report(id)           what the store says of each task and its run
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError

if TYPE_CHECKING:
    from saphan.batch.worker import Event, Worked
    from saphan.context import Context
    from saphan.store.rows import Batch, RunRow, Task


class Batches:
    def __init__(self, ctx: Context):
        self.ctx = ctx

    def create(self, path: str) -> Batch:
        from saphan.batch.spec import parse_file
        from saphan.ids import new_run_id
        from saphan.records import task_signature
        from saphan.store.rows import Batch
        from saphan.timefmt import now_iso

        parsed = parse_file(path)
        key = self.ctx.record_key()  # custody first: tasks are signed with it
        batch = Batch(new_run_id(), now_iso(), os.path.abspath(path), parsed.sha256,
                      len(parsed.tasks))
        rows = []
        for seq, (task_id, spec) in enumerate(parsed.tasks):
            spec_json = json.dumps(spec, sort_keys=True, separators=(",", ":"))
            rows.append((task_id, spec_json,
                         task_signature(key, batch.id, seq, task_id, spec_json)))
        self.ctx.store.add_batch(batch, rows)
        return batch

    def find(self, batch_id: str) -> Batch:
        store = self.ctx.store
        if batch_id == "last":
            newest = store.list_batches(1)
            if not newest:
                raise UserError("there are no batches yet; start one with `saphan batch run FILE`")
            return newest[0]
        got = store.get_batch(batch_id)
        if got is not None:
            return got
        found = store.find_batches(batch_id.upper())
        if len(found) == 1:
            return found[0]
        if not found:
            raise UserError(f"no batch {batch_id!r}; see `saphan batch list`")
        raise UserError(f"batch id prefix {batch_id!r} is ambiguous; give more characters")

    def list(self, limit: int = 20) -> list[Batch]:
        return self.ctx.store.list_batches(limit)

    def work(self, batch_id: str, *, parallel: int | None = None,
             on_event: Callable[[Event], None] | None = None) -> Worked:
        from saphan.batch.worker import work

        return work(self.ctx, self.find(batch_id).id, parallel=parallel, on_event=on_event)

    def report(self, batch_id: str) -> dict[str, Any]:
        """The batch and every task, as the store has them, with each
        task's run: where it ran, its outcome (from its record, verified
        with the record key: ``signature``), its time and its usage."""
        b = self.find(batch_id)
        key = record_key_or_none(self.ctx)
        tasks = [task_view(self.ctx, t, key=key) for t in self.ctx.store.batch_tasks(b.id)]
        states: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        for t in tasks:
            states[t["state"]] = states.get(t["state"], 0) + 1
            if t["outcome"] is not None:
                outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
        return {"batch": b.id, "created_at": b.created_at, "source": b.source,
                "source_sha256": b.source_sha256, "tasks": tasks, "states": states,
                "outcomes": outcomes,
                "all_exited": bool(tasks) and all(
                    t["outcome"] == "exited" and t["signature"] == "valid" for t in tasks)}


def record_key_or_none(ctx: Context) -> bytes | None:
    """The record key, or None when its custody fails (nothing then verifies)."""
    from saphan.refusals import Refusal

    try:
        return ctx.record_key()
    except (Refusal, UserError):
        return None


def task_view(ctx: Context, t: Task, row: RunRow | None = None, *,
              key: bytes | None = None) -> dict[str, Any]:
    """One task for a listing or ``--json``: its claim and its run's row. A
    finished run's outcome, exit code and usage are read from its record
    when it verifies with ``key`` (``signature`` "valid"); otherwise the
    task's own (unsigned) columns are shown and ``signature`` says why not."""
    from saphan.batch.spec import describe

    if row is None and t.run_id is not None:
        row = ctx.store.get_run(t.run_id)
    spec = t.spec()
    view: dict[str, Any] = {
        "id": t.task_id, "seq": t.seq, "state": t.state, "tool": spec.get("tool"),
        "what": describe(spec), "run_id": t.run_id, "machine": None, "slot": None,
        "outcome": t.outcome, "exit_code": t.exit_code, "refusal_class": None,
        "error": t.error,
        "attempts": t.attempts, "earlier_runs": t.earlier_runs.split(),
        "worker": (None if t.worker is None or t.state != "claimed"
                   else {"host": t.worker[0], "pid": t.worker[1]}),
        "started_at": None, "finished_at": t.finished_at, "elapsed_seconds": None,
        "usage": None, "signature": None,
    }
    if row is None:
        if t.state == "done":
            view["run_id"] = None  # the claim's id, but no run was made under it
        return view
    view["machine"], view["slot"] = row.machine, row.slot
    view["started_at"] = row.started_at
    view["refusal_class"] = row.refusal_class
    view["elapsed_seconds"] = elapsed(row.started_at, row.finished_at)
    if row.live:
        view["signature"] = "pending"
        return view
    if key is None:
        view["signature"] = "unverified"
        return view
    from saphan.records import verify_run_row

    record, sig = verify_run_row(key, row)
    view["signature"] = sig.get("status")
    if sig.get("status") != "valid":
        return view
    if t.state == "done":
        view["outcome"], view["exit_code"] = record.get("outcome"), record.get("exit_code")
        refusal = record.get("refusal")
        view["refusal_class"] = refusal.get("class") if isinstance(refusal, dict) else None
    usage = record.get("usage")
    if isinstance(usage, dict):
        view["usage"] = {"tokens": usage.get("tokens"), "cost_usd": usage.get("cost_usd")}
    return view


def elapsed(start: str, end: str | None) -> float | None:
    """Seconds from ``start`` to ``end`` (None: now), both as the store writes them."""
    from datetime import UTC, datetime

    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = (datetime.fromisoformat(end.replace("Z", "+00:00")) if end
             else datetime.now(UTC))
    except ValueError:
        return None
    return round((b - a).total_seconds(), 3)
