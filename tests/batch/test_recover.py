"""How a claim ends (batch/recover.py), judged from a real store (SQLite AND
PostgreSQL, through a workspace the Engine made) and from the liveness of
real processes: this one (alive), and this one's pid with another start
time (a reused pid: dead)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from saphan.batch.recover import MAX_ATTEMPTS, conclude, dead, recover
from saphan.liveness import boot_id, current_holder, this_host
from saphan.store import Store
from saphan.store.rows import Batch, Holder4, Task

pytestmark = pytest.mark.skipif(boot_id() is None, reason="needs /proc boot id (Linux)")

BATCH = "BATCH01"


def _alive() -> Holder4:
    return current_holder().as_tuple()


def _dead(pid_offset: int = 0) -> Holder4:
    """This process's pid on this host with another start time: the pid was
    reused, so the holder it names is dead."""
    h = current_holder()
    assert h.start_ticks is not None
    return (h.host, h.pid, h.start_ticks + 1 + pid_offset, h.boot_id)


FAR: Holder4 = ("another-host.invalid", 4242, 1, "far-boot")  # liveness unknown


def _batch(store: Store, n: int, batch: str = BATCH) -> None:
    store.add_batch(Batch(batch, "2024-01-01T00:00:00.000000Z", "/src/b.jsonl", "0" * 64, n),
                    [(f"t{i}", json.dumps({"tool": "command", "command": ["true"]}), "sig")
                     for i in range(n)])


def _claim(store: Store, run_id: str, worker: Holder4, batch: str = BATCH) -> Task:
    t = store.claim_task(batch, run_id, worker)
    assert t is not None and t.run_id == run_id
    return t


def _claimed_after(store: Store, attempts: int, worker: Holder4, batch: str = BATCH,
                   run_id: str = "RUN") -> Task:
    """Task 0 claimed ``attempts`` times, the earlier claims given back."""
    for k in range(attempts - 1):
        _claim(store, f"{run_id}-EARLY{k}", worker, batch)
        assert store.requeue_task(batch, 0, f"{run_id}-EARLY{k}", child_pid=None, why="x",
                                  attempted=False)
    t = _claim(store, run_id, worker, batch)
    assert t.attempts == attempts
    return t


def _run(store: Store, run_id: str, *, outcome: str | None, exit_code: int | None = None,
         holder: Holder4 = FAR, record: dict[str, Any] | None = None) -> None:
    """A run row for ``run_id``: live (outcome None) or finished."""
    got = store.reserve(run_id=run_id, machine="m", slot="s", capacity=64, tool="command",
                        workdir=None, holder=holder)
    assert got is not None
    if outcome is not None:
        assert store.finalize(run_id, state="ended", outcome=outcome, exit_code=exit_code,
                              record_json=json.dumps(record or {}))


def _task(store: Store, seq: int = 0, batch: str = BATCH) -> Task:
    t = store.get_task(batch, seq)
    assert t is not None
    return t


def test_liveness_of_the_test_holders() -> None:
    assert not dead(_alive())
    assert dead(_dead())
    assert dead(None)
    assert not dead(FAR)  # unknown counts as alive


# -- conclude: a run row ----------------------------------------------------------

def test_finished_run_is_done_with_its_outcome(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())
    _run(store, "RUN", outcome="exited", exit_code=7)
    assert conclude(engine_ctx, t, why="w") == "done"
    got = _task(store)
    assert (got.state, got.outcome, got.exit_code, got.error) == ("done", "exited", 7, None)
    assert got.earlier_runs == ""
    # concluded once: a second worker concluding the same claim changes nothing
    assert conclude(engine_ctx, t, why="w") is None
    assert _task(store) == got


def test_refused_run_is_done_refused(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())
    store.insert_refused_run(run_id="RUN", machine="m", slot="s", tool="command", workdir=None,
                             holder=FAR, refusal_class="no-seat", record_json="{}")
    assert conclude(engine_ctx, t, why="w") == "done"
    got = _task(store)
    assert (got.state, got.outcome, got.exit_code) == ("done", "refused", None)


def test_unfinished_run_requeued_while_attempts_remain(engine_ctx: Any) -> None:
    store = engine_ctx.store
    for outcome in ("holder-dead", "interrupted"):
        batch, run_id = f"B-{outcome}", f"RUN-{outcome}"
        _batch(store, 1, batch)
        t = _claimed_after(store, MAX_ATTEMPTS - 1, _dead(), batch, run_id)
        _run(store, run_id, outcome=outcome)
        assert conclude(engine_ctx, t, why="w") == "requeued"
        got = _task(store, 0, batch)
        assert got.state == "pending" and got.run_id is None and got.worker is None
        assert got.earlier_runs.split() == [run_id]
        assert got.error == f"run {run_id} ended {outcome}"
        # it is claimed again, a fresh attempt
        again = _claim(store, f"{run_id}-again", _alive(), batch)
        assert again.seq == 0 and again.attempts == MAX_ATTEMPTS


def test_holder_dead_run_done_when_attempts_reached(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claimed_after(store, MAX_ATTEMPTS, _dead())
    _run(store, "RUN", outcome="holder-dead", exit_code=None)
    assert conclude(engine_ctx, t, why="w") == "done"
    got = _task(store)
    assert (got.state, got.outcome, got.exit_code) == ("done", "holder-dead", None)
    assert got.earlier_runs == ""


def test_an_interrupted_run_gives_its_task_back_whatever_the_attempts(engine_ctx: Any) -> None:
    """Only a stop interrupts a run (a signal to its driver, or its worker's
    death through the lifeline): judged later by another worker, it still
    never uses up the task (review: three stops ended a task done unrun)."""
    store = engine_ctx.store
    _batch(store, 1)
    t = _claimed_after(store, MAX_ATTEMPTS + 2, _dead())
    _run(store, "RUN", outcome="interrupted", exit_code=None)
    assert conclude(engine_ctx, t, why="w") == "requeued"
    got = _task(store)
    assert got.state == "pending" and got.earlier_runs.split() == ["RUN"]


def test_interrupted_requeues_whatever_the_attempts(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claimed_after(store, MAX_ATTEMPTS + 1, _dead())
    _run(store, "RUN", outcome="holder-dead")
    assert conclude(engine_ctx, t, why="w", interrupted=True) == "requeued"
    got = _task(store)
    assert got.state == "pending" and got.earlier_runs.split() == ["RUN"]


def test_interrupted_finished_run_is_still_done(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _alive())
    _run(store, "RUN", outcome="exited", exit_code=0)
    assert conclude(engine_ctx, t, why="w", interrupted=True) == "done"
    assert _task(store).outcome == "exited"


def test_live_run_is_left(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())
    _run(store, "RUN", outcome=None)
    assert conclude(engine_ctx, t, why="w") is None
    assert conclude(engine_ctx, t, why="w", interrupted=True) is None
    assert conclude(engine_ctx, t, why="w", error="boom") is None
    assert _task(store) == t


# -- conclude: no run row -------------------------------------------------------------

def test_no_row_and_a_live_child_is_left(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    _claim(store, "RUN", _dead())
    assert store.register_child(BATCH, 0, "RUN", _alive())
    t = _task(store)
    assert t.child == _alive()
    assert conclude(engine_ctx, t, why="w") is None
    assert conclude(engine_ctx, t, why="w", interrupted=True) is None
    assert _task(store) == t
    # a child on another host (liveness unknown) counts as alive
    _batch(store, 1, "FAR")
    _claim(store, "RFAR", _dead(), "FAR")
    assert store.register_child("FAR", 0, "RFAR", FAR)
    far = _task(store, 0, "FAR")
    assert conclude(engine_ctx, far, why="w") is None
    assert _task(store, 0, "FAR") == far


def test_a_live_child_is_judged_before_its_row_is_read(engine_ctx: Any) -> None:
    """A run that ends after its row was read must not be run again: while
    the child lives, the claim is left, whatever the row says; once the
    child is dead the row is read, and final."""
    store = engine_ctx.store
    _batch(store, 1)
    _claim(store, "RUN", _dead())
    assert store.register_child(BATCH, 0, "RUN", _alive())
    _run(store, "RUN", outcome="holder-dead")  # would requeue if read first
    t = _task(store)
    assert conclude(engine_ctx, t, why="w") is None
    assert _task(store) == t


def test_no_row_and_a_dead_child_is_requeued(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    _claim(store, "RUN", _dead())
    assert store.register_child(BATCH, 0, "RUN", _dead(5))
    t = _task(store)
    assert conclude(engine_ctx, t, why="its worker is gone") == "requeued"
    got = _task(store)
    assert got.state == "pending" and got.child is None
    assert got.earlier_runs == ""  # no run was made: not an attempt
    assert got.error == "no run was made: its worker is gone"


def test_no_row_and_no_child_is_requeued(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())
    assert conclude(engine_ctx, t, why="w") == "requeued"
    assert _task(store).state == "pending"


def test_no_row_requeue_refused_when_a_child_registered_since(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())  # read with no child
    assert store.register_child(BATCH, 0, "RUN", _dead(5))  # then one registered (and died)
    assert conclude(engine_ctx, t, why="w") is None  # judged on a stale read: left
    assert _task(store).state == "claimed"


def test_no_row_after_max_attempts_is_done_as_error(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claimed_after(store, MAX_ATTEMPTS, _dead())
    assert conclude(engine_ctx, t, why="the last why") == "done"
    got = _task(store)
    assert (got.state, got.outcome, got.exit_code) == ("done", "error", None)
    assert got.error == f"no run was made in {MAX_ATTEMPTS} claims; the last: the last why"


def test_no_row_interrupted_is_requeued_whatever_the_attempts(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claimed_after(store, MAX_ATTEMPTS, _dead())
    assert conclude(engine_ctx, t, why="w", interrupted=True) == "requeued"
    got = _task(store)
    assert got.state == "pending" and got.earlier_runs == ""


def test_error_given_is_done_as_error(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    _claim(store, "RUN", _dead())
    assert store.register_child(BATCH, 0, "RUN", _dead(5))
    t = _task(store)
    assert conclude(engine_ctx, t, why="w", error="no such machine 'x'") == "done"
    got = _task(store)
    assert (got.state, got.outcome, got.exit_code, got.error) == (
        "done", "error", None, "no such machine 'x'")


def test_error_given_but_a_finished_run_wins(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    t = _claim(store, "RUN", _dead())
    _run(store, "RUN", outcome="exited", exit_code=1)
    assert conclude(engine_ctx, t, why="w", error="said something") == "done"
    got = _task(store)
    assert (got.outcome, got.exit_code, got.error) == ("exited", 1, None)


def test_claim_changed_meanwhile_is_left(engine_ctx: Any) -> None:
    store = engine_ctx.store
    _batch(store, 1)
    stale = _claim(store, "RUN", _dead())
    assert store.requeue_task(BATCH, 0, "RUN", child_pid=None, why="x", attempted=False)
    fresh = _claim(store, "RUN2", _alive())
    assert conclude(engine_ctx, stale, why="w") is None
    assert _task(store) == fresh


# -- recover: every claim nobody watches --------------------------------------------------

def test_recover(engine_ctx: Any) -> None:
    store = engine_ctx.store
    me: Holder4 = (this_host(), 1, 1, "me-boot")  # this worker (its liveness is not asked)
    _batch(store, 7)
    _claim(store, "R0", _dead())        # 0: a dead worker, no run: requeued
    _claim(store, "R1", _alive())       # 1: a live worker: skipped
    _claim(store, "R2", me)             # 2: mine, watched: skipped
    _claim(store, "R3", me)             # 3: mine, not watched: concluded (requeued)
    _claim(store, "R4", FAR)            # 4: a worker elsewhere (unknown): skipped
    _claim(store, "R5", _dead())        # 5: a dead worker, its run finished: done
    _run(store, "R5", outcome="exited", exit_code=0)
    _claim(store, "R6", _dead())        # 6: a dead worker, its child alive: left
    assert store.register_child(BATCH, 6, "R6", _alive())
    before = {t.seq: t for t in store.batch_tasks(BATCH)}

    got = recover(engine_ctx, BATCH, me, watching={2})
    assert sorted((t.seq, what) for t, what in got) == [(0, "requeued"), (3, "requeued"),
                                                         (5, "done")]
    assert all(t == before[t.seq] for t, _ in got)  # each as it was before
    after = {t.seq: t for t in store.batch_tasks(BATCH)}
    assert [after[s].state for s in range(7)] == [
        "pending", "claimed", "claimed", "pending", "claimed", "done", "claimed"]
    for s in (1, 2, 4, 6):
        assert after[s] == before[s]
    assert "its worker pid" in (after[0].error or "")
    assert after[5].outcome == "exited"
    # nothing else to do: a second pass changes nothing
    assert recover(engine_ctx, BATCH, me, watching={2}) == []


def test_recover_without_watching_concludes_my_claims(engine_ctx: Any) -> None:
    store = engine_ctx.store
    me = _alive()
    _batch(store, 2)
    _claim(store, "R0", me)
    _claim(store, "R1", me)
    _run(store, "R1", outcome="exited", exit_code=2)
    got = recover(engine_ctx, BATCH, me)
    assert sorted((t.seq, what) for t, what in got) == [(0, "requeued"), (1, "done")]
    assert _task(store, 1).exit_code == 2


def test_recover_ends_a_dead_holders_run_first(engine_ctx: Any) -> None:
    """A run row left live by a holder that died on this host is ended
    holder-dead (run/live.reconcile), then its task is given back."""
    store = engine_ctx.store
    _batch(store, 1)
    _claim(store, "R0", _dead())
    _run(store, "R0", outcome=None, holder=_dead(9))
    got = recover(engine_ctx, BATCH, ("elsewhere", 1, 1, "b"))
    assert [(t.seq, what) for t, what in got] == [(0, "requeued")]
    row = store.get_run("R0")
    assert row is not None and not row.live and row.outcome == "holder-dead"
    t = _task(store)
    assert t.state == "pending" and t.earlier_runs.split() == ["R0"]
