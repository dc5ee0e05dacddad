"""How a claim ends, judged from the store (the run's row) and from the
liveness rules seats use (liveness.py).

A claim is watched by its worker while its child runs. The child is judged
before the row is read (a live child may still write it). A claim nobody
watches — its worker measured dead, or its worker's child gone — is
concluded here, by any worker of the batch:

    the run's row is finished      done, with the run's outcome; but a run
                                   that did not end on its own gives the
                                   task back to pending: always when it was
                                   interrupted (only a stop does that: a
                                   signal to its driver, or its worker's
                                   death through the lifeline), up to
                                   MAX_ATTEMPTS claims when its holder died
    the run's row is live          left: the run's own holder decides, and
                                   run/live.reconcile ends a dead holder's row
                                   here; a far holder is read over its
                                   machine's transport every FAR_EVERY s
    no row, the child alive        left: it may still be waiting for a seat
    no row, no child alive         back to pending: no run was made

Liveness "unknown" (a worker on another host) counts as alive: a claim is
never taken from a worker that may still run it. Every change is made for
the claim's run id only (store/batches.py), so two workers concluding one
claim change it once.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from saphan.liveness import Holder, check

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store.rows import Holder4, Task

#: run outcomes that did not finish the task: it is claimed again
NOT_FINISHED = frozenset({"holder-dead", "interrupted"})
#: a task is claimed at most this many times before it ends as it last did
MAX_ATTEMPTS = 3


def dead(holder: Holder4 | None) -> bool:
    return holder is None or check(Holder(*holder)).state == "dead"


def recover(ctx: Context, batch_id: str, me: Holder4, watching: Container[int] = (),
            far_checked: dict[tuple[str, str], float] | None = None) -> list[tuple[Task, str]]:
    """Conclude every claim of the batch nobody watches (module docstring);
    ``watching``: the sequence numbers whose children this worker (``me``)
    is waiting on; ``far_checked``: when each slot's far holders were last
    read (a claim left with a live far run reads them every FAR_EVERY s).
    Returns each claim changed, and what became of it."""
    from saphan.run import live

    live.reconcile(ctx)  # a run whose holder died here is ended holder-dead first
    out: list[tuple[Task, str]] = []
    for t in ctx.store.batch_tasks(batch_id, "claimed"):
        if t.worker == me:
            if t.seq in watching:
                continue
        elif not dead(t.worker):
            continue
        what = conclude(ctx, t, why=f"its worker {_who(t.worker)} is gone")
        if what is None and far_checked is not None and t.run_id is not None:
            _far_holders(ctx, t.run_id, far_checked)
        if what is not None:
            out.append((t, what))
    return out


#: how often a slot's far holders are read for a claim whose far run is live
FAR_EVERY = 30.0


def _far_holders(ctx: Context, run_id: str, checked: dict[tuple[str, str], float]) -> None:
    """A live run held by a far process (an SSH run whose channel was lost):
    its slot's holders are read over the machine's transport, as conflict
    handling reads them, and a dead one is ended holder-dead (the next pass
    concludes the claim). Unreachable is "unknown": left, counted alive."""
    import time

    from saphan.capacity import recover_dead_holders
    from saphan.errors import TransportError, UserError
    from saphan.liveness import this_host
    from saphan.store import StoreError

    row = ctx.store.get_run(run_id)
    if row is None or not row.live or row.holder_host in (None, this_host()):
        return
    key = (row.machine, row.slot)
    now = time.monotonic()
    if now - checked.get(key, -FAR_EVERY) < FAR_EVERY:
        return
    checked[key] = now
    try:
        m = ctx.machine(row.machine)
        recover_dead_holders(ctx.store, ctx.slot(row.machine, row.slot), ctx.remote_liveness(m),
                             ctx.record_key)
    except (TransportError, UserError, StoreError):
        pass  # the machine or slot is gone, or unreachable: the claim stays


def conclude(ctx: Context, t: Task, *, why: str, error: str | None = None,
             interrupted: bool = False) -> str | None:
    """End one claim whose child is not being waited on: "done", "requeued",
    or None (left: its run or its child may still be going, or the claim
    changed meanwhile). ``error``: what the child said when it ran nothing
    (the task is done as "error"); ``interrupted``: the operator stopped the
    batch, so an unfinished run gives the task back whatever its attempts."""
    store = ctx.store
    assert t.run_id is not None
    # The child first: while it is alive it may still write its run's row,
    # so the row is read only once the child is dead (it writes nothing more).
    if t.child is not None and not dead(t.child):
        return None
    row = store.get_run(t.run_id)
    if row is not None:
        if row.live:
            return None
        # An interrupted run was stopped, never failed: stops (however many)
        # do not use up the task's attempts (review: three stops ended a task
        # done that never ran).
        if row.outcome in NOT_FINISHED and (interrupted or row.outcome == "interrupted"
                                            or t.attempts < MAX_ATTEMPTS):
            ok = store.requeue_task(t.batch, t.seq, t.run_id, child_pid=t.child_pid,
                                    why=f"run {row.id} ended {row.outcome}", attempted=True)
            return "requeued" if ok else None
        ok = store.finish_task(t.batch, t.seq, t.run_id, outcome=row.outcome or "error",
                               exit_code=row.exit_code)
        return "done" if ok else None
    if error is not None or (not interrupted and t.attempts >= MAX_ATTEMPTS):
        text = error or f"no run was made in {t.attempts} claims; the last: {why}"
        ok = store.finish_task(t.batch, t.seq, t.run_id, outcome="error", exit_code=None,
                               error=text)
        return "done" if ok else None
    ok = store.requeue_task(t.batch, t.seq, t.run_id, child_pid=t.child_pid,
                            why=f"no run was made: {why}", attempted=False)
    return "requeued" if ok else None


def _who(h: Holder4 | None) -> str:
    return "(none)" if h is None else f"pid {h[1]} on {h[0]}"
