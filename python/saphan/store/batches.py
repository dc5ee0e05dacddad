"""The batch queue's reads and writes (migration 8), part of the Store.

Claims are one statement each (queries.CLAIM_TASK; on PostgreSQL with
``FOR UPDATE SKIP LOCKED``): two workers never claim one task, and no count
is read. Every change to a claim names the run id it was made for, so a
claim given back and claimed again cannot be ended by the earlier attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from saphan.store import queries as q
from saphan.store.rows import Batch, Holder4, Task
from saphan.timefmt import now_iso

if TYPE_CHECKING:
    from saphan.store.connector import Connector


class BatchQueue:
    db: Connector

    def add_batch(self, batch: Batch, tasks: Sequence[tuple[str, str, str]]) -> None:
        """The batch and its tasks ((task id, spec JSON, signature), in order),
        all or nothing."""
        with self.db.transaction():
            self.db.execute(q.INSERT_BATCH, (batch.id, batch.created_at, batch.source,
                                             batch.source_sha256, batch.tasks))
            for seq, (task_id, spec_json, signature) in enumerate(tasks):
                self.db.execute(q.INSERT_BATCH_TASK,
                                (batch.id, seq, task_id, spec_json, signature))

    def get_batch(self, batch_id: str) -> Batch | None:
        got = self.db.execute(q.GET_BATCH, (batch_id,))
        return Batch.from_row(got[0]) if got else None

    def find_batches(self, prefix: str) -> list[Batch]:
        """Up to two batches whose id starts with ``prefix`` (to detect ambiguity)."""
        escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
        return [Batch.from_row(r) for r in self.db.execute(q.FIND_BATCHES_BY_PREFIX,
                                                           (escaped + "%",))]

    def list_batches(self, limit: int = 20) -> list[Batch]:
        return [Batch.from_row(r) for r in self.db.execute(q.LIST_BATCHES, (limit,))]

    def batch_tasks(self, batch_id: str, state: str | None = None) -> list[Task]:
        if state is None:
            return [Task.from_row(r) for r in self.db.execute(q.BATCH_TASKS, (batch_id,))]
        return [Task.from_row(r) for r in self.db.execute(q.BATCH_TASKS_IN, (batch_id, state))]

    def claim_task(self, batch_id: str, run_id: str, worker: Holder4) -> Task | None:
        """The first pending task, now claimed by ``worker`` for ``run_id``; None
        when no task is pending (or every pending one is being claimed)."""
        sql = q.CLAIM_TASK_PG if self.db.dialect == "postgresql" else q.CLAIM_TASK
        host, pid, ticks, boot = worker
        got = self.db.execute(sql, (run_id, host, pid, ticks, boot, now_iso(), batch_id,
                                    batch_id))
        return Task.from_row(got[0]) if got else None

    def register_child(self, batch_id: str, seq: int, run_id: str, child: Holder4) -> bool:
        """The child names itself on the claim for ``run_id``; False when that
        claim is no longer there (given back) or a child already registered."""
        host, pid, ticks, boot = child
        return bool(self.db.execute(q.REGISTER_CHILD,
                                    (host, pid, ticks, boot, batch_id, seq, run_id)))

    def finish_task(self, batch_id: str, seq: int, run_id: str, *, outcome: str,
                    exit_code: int | None, error: str | None = None) -> bool:
        """End the claim for ``run_id`` as done; False when it is not that claim."""
        return bool(self.db.execute(q.FINISH_TASK, (now_iso(), outcome, exit_code, error,
                                                    batch_id, seq, run_id)))

    def requeue_task(self, batch_id: str, seq: int, run_id: str, *, child_pid: int | None,
                     why: str, attempted: bool) -> bool:
        """Give the claim for ``run_id`` back (pending), only if its child is
        still the one the caller judged (``child_pid``; None: no child had
        registered). ``attempted``: a run was made for it (kept in
        earlier_runs). False when the claim changed meanwhile."""
        return bool(self.db.execute(q.REQUEUE_TASK, (
            why, f" {run_id}" if attempted else "", batch_id, seq, run_id,
            -1 if child_pid is None else child_pid)))

    def get_task(self, batch_id: str, seq: int) -> Task | None:
        got = self.db.execute(q.GET_TASK, (batch_id, seq))
        return Task.from_row(got[0]) if got else None
