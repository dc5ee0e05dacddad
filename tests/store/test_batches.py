"""The batch queue (store/batches.py, migration 8) on SQLite AND PostgreSQL:
a batch and its tasks written all or nothing, claims taken once each in
order, and every change to a claim made only for the run id it was made for."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from saphan.store import Store, StoreError, open_store
from saphan.store.rows import Batch, Holder4

WORKER: Holder4 = ("h", 1000, 1, "boot")
OTHER: Holder4 = ("h", 1001, 1, "boot")
CHILD: Holder4 = ("h", 2000, 7, "boot")


def _batch(store: Store, batch_id: str = "B1", n: int = 3,
           created_at: str = "2024-01-01T00:00:00.000000Z") -> Batch:
    b = Batch(batch_id, created_at, "/src/batch.jsonl", "ab" * 32, n)
    store.add_batch(b, [(f"t{i}", json.dumps({"tool": "command", "command": ["true", str(i)]}),
                         f"sig{i}") for i in range(n)])
    return b


# -- add_batch: all or nothing ------------------------------------------------------

def test_add_batch_writes_batch_and_tasks(store: Store) -> None:
    b = _batch(store, n=3)
    assert store.get_batch("B1") == b
    tasks = store.batch_tasks("B1")
    assert [(t.seq, t.task_id, t.state, t.attempts, t.earlier_runs) for t in tasks] == [
        (0, "t0", "pending", 0, ""), (1, "t1", "pending", 0, ""), (2, "t2", "pending", 0, "")]
    assert tasks[1].spec() == {"tool": "command", "command": ["true", "1"]}
    assert [t.signature for t in tasks] == ["sig0", "sig1", "sig2"]
    assert all(t.run_id is None and t.worker is None and t.child is None for t in tasks)
    assert store.batch_tasks("B1", "pending") == tasks
    assert store.batch_tasks("B1", "claimed") == []
    assert store.get_task("B1", 2) == tasks[2]
    assert store.get_task("B1", 3) is None
    assert store.get_task("B9", 0) is None
    assert store.get_batch("B9") is None


def test_add_batch_duplicate_task_id_writes_nothing(store: Store) -> None:
    b = Batch("B1", "2024-01-01T00:00:00.000000Z", "/src/x", "00" * 32, 3)
    with pytest.raises(StoreError):
        store.add_batch(b, [("a", "{}", "s"), ("b", "{}", "s"), ("a", "{}", "s")])
    assert store.get_batch("B1") is None
    assert store.batch_tasks("B1") == []
    assert store.list_batches() == []
    # The connection is usable afterwards and the same id can be written.
    store.add_batch(b, [("a", "{}", "s"), ("b", "{}", "s"), ("c", "{}", "s")])
    assert [t.task_id for t in store.batch_tasks("B1")] == ["a", "b", "c"]
    # a batch id is written once
    with pytest.raises(StoreError):
        store.add_batch(b, [("d", "{}", "s")])
    assert [t.task_id for t in store.batch_tasks("B1")] == ["a", "b", "c"]


# -- claims -----------------------------------------------------------------------

def test_claim_in_seq_order_each_once(store: Store) -> None:
    _batch(store, n=3)
    _batch(store, "B2", n=2)
    got = [store.claim_task("B1", f"R{i}", WORKER) for i in range(3)]
    assert [t.seq if t else None for t in got] == [0, 1, 2]
    assert [t.run_id if t else None for t in got] == ["R0", "R1", "R2"]
    assert store.claim_task("B1", "R3", WORKER) is None
    # another batch's tasks are its own
    other = store.claim_task("B2", "RX", WORKER)
    assert other is not None and (other.batch, other.seq) == ("B2", 0)
    assert store.claim_task("nope", "RY", WORKER) is None


def test_claim_sets_worker_and_counts_attempts(store: Store) -> None:
    _batch(store, n=1)
    t = store.claim_task("B1", "R1", WORKER)
    assert t is not None
    assert t.state == "claimed" and t.run_id == "R1"
    assert t.worker == WORKER and t.child is None
    assert t.claimed_at is not None and t.claimed_at.endswith("Z")
    assert t.attempts == 1
    assert store.get_task("B1", 0) == t
    assert store.requeue_task("B1", 0, "R1", child_pid=None, why="w", attempted=False)
    t2 = store.claim_task("B1", "R2", OTHER)
    assert t2 is not None
    assert t2.attempts == 2 and t2.worker == OTHER and t2.run_id == "R2"
    assert t2.error is None  # the requeue's reason is cleared by the new claim


def test_register_child_once_for_the_claims_run_id(store: Store) -> None:
    _batch(store, n=2)
    assert store.claim_task("B1", "R1", WORKER) is not None
    assert not store.register_child("B1", 0, "R-other", CHILD)
    assert not store.register_child("B1", 1, "R1", CHILD)  # seq 1 is not claimed
    assert store.get_task("B1", 0).child is None  # type: ignore[union-attr]
    assert store.register_child("B1", 0, "R1", CHILD)
    assert store.get_task("B1", 0).child == CHILD  # type: ignore[union-attr]
    second = ("h", 2001, 8, "boot")
    assert not store.register_child("B1", 0, "R1", second)
    assert store.get_task("B1", 0).child == CHILD  # type: ignore[union-attr]
    # a claim given back takes no child for its old run id
    assert store.requeue_task("B1", 0, "R1", child_pid=CHILD[1], why="gone", attempted=False)
    assert not store.register_child("B1", 0, "R1", CHILD)
    assert store.get_task("B1", 0).child is None  # type: ignore[union-attr]


def test_finish_task_only_for_its_claim(store: Store) -> None:
    _batch(store, n=2)
    assert not store.finish_task("B1", 0, "R1", outcome="exited", exit_code=0)  # pending
    store.claim_task("B1", "R1", WORKER)
    assert not store.finish_task("B1", 0, "R-other", outcome="exited", exit_code=0)
    assert store.get_task("B1", 0).state == "claimed"  # type: ignore[union-attr]
    assert store.finish_task("B1", 0, "R1", outcome="exited", exit_code=3, error="boom")
    t = store.get_task("B1", 0)
    assert t is not None
    assert (t.state, t.outcome, t.exit_code, t.error, t.run_id) == (
        "done", "exited", 3, "boom", "R1")
    assert t.finished_at is not None
    # finished once: not again, and not requeued either
    assert not store.finish_task("B1", 0, "R1", outcome="error", exit_code=None)
    assert not store.requeue_task("B1", 0, "R1", child_pid=None, why="x", attempted=True)
    assert store.get_task("B1", 0) == t
    # a done task is not claimed again
    nxt = store.claim_task("B1", "R2", WORKER)
    assert nxt is not None and nxt.seq == 1


def test_requeue_compares_child_and_run_id(store: Store) -> None:
    _batch(store, n=1)
    store.claim_task("B1", "R1", WORKER)
    # wrong run id
    assert not store.requeue_task("B1", 0, "R-other", child_pid=None, why="x", attempted=False)
    store.register_child("B1", 0, "R1", CHILD)
    # the caller judged "no child", but one registered since
    assert not store.requeue_task("B1", 0, "R1", child_pid=None, why="x", attempted=False)
    # the caller judged another child
    assert not store.requeue_task("B1", 0, "R1", child_pid=CHILD[1] + 1, why="x",
                                  attempted=False)
    assert store.get_task("B1", 0).state == "claimed"  # type: ignore[union-attr]
    assert store.requeue_task("B1", 0, "R1", child_pid=CHILD[1], why="its child died",
                              attempted=True)
    t = store.get_task("B1", 0)
    assert t is not None
    assert t.state == "pending" and t.run_id is None
    assert t.worker is None and t.child is None and t.claimed_at is None
    assert t.error == "its child died"
    assert t.earlier_runs.split() == ["R1"]
    assert t.attempts == 1


def test_requeue_appends_earlier_runs_only_when_attempted(store: Store) -> None:
    _batch(store, n=1)
    for run_id, attempted in (("R1", True), ("R2", False), ("R3", True)):
        claimed = store.claim_task("B1", run_id, WORKER)
        assert claimed is not None and claimed.seq == 0
        assert store.requeue_task("B1", 0, run_id, child_pid=None, why=f"w{run_id}",
                                  attempted=attempted)
    t = store.get_task("B1", 0)
    assert t is not None
    assert t.earlier_runs.split() == ["R1", "R3"]
    assert t.attempts == 3
    assert t.error == "wR3"


# -- finding and listing batches ----------------------------------------------------

def test_find_batches_by_prefix(store: Store) -> None:
    for bid in ("B1A", "B1B", "B2A", "X_Y"):
        _batch(store, bid, n=1)
    assert [b.id for b in store.find_batches("B2")] == ["B2A"]
    assert len(store.find_batches("B1")) == 2  # ambiguous
    assert len(store.find_batches("B")) == 2  # at most two
    assert [b.id for b in store.find_batches("B1B")] == ["B1B"]
    assert store.find_batches("Z") == []
    # LIKE's wildcards are literal in a prefix
    assert store.find_batches("%") == []
    assert store.find_batches("B_A") == []
    assert [b.id for b in store.find_batches("X_")] == ["X_Y"]


def test_list_batches_newest_first(store: Store) -> None:
    ids = ["01A", "01C", "01B"]
    for i, bid in enumerate(ids):
        _batch(store, bid, n=1, created_at=f"2024-01-0{i + 1}T00:00:00.000000Z")
    assert [b.id for b in store.list_batches()] == ["01C", "01B", "01A"]
    assert [b.id for b in store.list_batches(2)] == ["01C", "01B"]
    assert store.list_batches()[0] == Batch("01C", "2024-01-02T00:00:00.000000Z",
                                            "/src/batch.jsonl", "ab" * 32, 1)


# -- concurrent claims ----------------------------------------------------------------

def test_concurrent_claims_each_task_once(database_url: str, tmp_path: Path) -> None:
    n, workers = 50, 8
    setup = open_store(database_url, tmp_path / "unused.db")
    try:
        _batch(setup, "BC", n=n)
    finally:
        setup.close()
    claimed: list[list[int]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []
    start = threading.Barrier(workers)

    def claim(i: int) -> None:
        try:
            # each worker its own connection (SQLite: the same file)
            own = open_store(database_url, tmp_path / "unused.db")
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            start.abort()
            return
        try:
            start.wait()
            holder = ("h", 1000 + i, 1, "boot")
            k = 0
            while True:
                t = own.claim_task("BC", f"R{i}-{k}", holder)
                if t is None:
                    return
                assert t.run_id == f"R{i}-{k}" and t.worker == holder
                claimed[i].append(t.seq)
                k += 1
                time.sleep(0.001)  # a worker does something between claims
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            own.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    every = sorted(s for c in claimed for s in c)
    assert every == list(range(n))  # each claimed exactly once
    assert sum(1 for c in claimed if c) > 1  # the claims did interleave across workers
    check = open_store(database_url, tmp_path / "unused.db")
    try:
        tasks = check.batch_tasks("BC")
    finally:
        check.close()
    assert all(t.state == "claimed" and t.attempts == 1 for t in tasks)
    owner = {s: i for i, c in enumerate(claimed) for s in c}
    assert all(t.worker == ("h", 1000 + owner[t.seq], 1, "boot") for t in tasks)
    assert all(c == sorted(c) for c in claimed)  # each worker's claims in order
