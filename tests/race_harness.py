"""Race harness shared by tests/test_capacity.py and bench/reserve.

Several OS processes (multiprocessing, spawn) reserve on one slot in rounds
released by a barrier. Each holder proves its tenure to an independent
witness: a counter file updated under flock, incremented after the
reservation returned and decremented before the release is sent, so the
witness interval lies inside the database's. The witness records the highest
count it ever saw per round.

``mode`` is "saphan" (the product's reservation) or "naive" (a read-then-act
baseline implemented HERE, never in the product: count live rows, then insert
— the race the product's design removes).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAIVE_TABLE = """
CREATE TABLE IF NOT EXISTS naive_runs (
    id TEXT PRIMARY KEY, machine TEXT NOT NULL, slot TEXT NOT NULL, finished INTEGER NOT NULL
)"""


def _witness(path: str, delta: int) -> int:
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                with open(path) as f:
                    n = int(f.read() or 0)
            except FileNotFoundError:
                n = 0
            n += delta
            with open(path, "w") as f:
                f.write(str(n))
            return n
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _naive_reserve(store: Any, machine: str, slot: str, capacity: int, run_id: str) -> bool:
    live = store.db.execute(
        "SELECT COUNT(*) FROM naive_runs WHERE machine = ? AND slot = ? AND finished = 0",
        (machine, slot),
    )[0][0]
    if live >= capacity:
        return False
    time.sleep(0.0005)  # the gap between reading "clear" and acting on it
    store.db.execute(
        "INSERT INTO naive_runs (id, machine, slot, finished) VALUES (?, ?, ?, 0)",
        (run_id, machine, slot),
    )
    return True


def _worker(args: dict[str, Any], barrier: Any, results: Any) -> None:
    from saphan.capacity import reserve_seat
    from saphan.ids import new_run_id
    from saphan.liveness import current_holder
    from saphan.refusals import Refusal
    from saphan.store import open_store

    store = open_store(args["url"], Path(args["sqlite_default"]))
    slot = store.get_slot(args["machine"], args["slot"])
    assert slot is not None
    holder = current_holder()
    witness = args["witness"]
    per_round: list[tuple[int, int, float, float, float]] = []  # round, seen, t_req, t_in, t_out
    for rnd in range(args["rounds"]):
        barrier.wait()
        run_id = new_run_id()
        t0 = time.perf_counter()
        if args["mode"] == "saphan":
            try:
                reserve_seat(store, slot, run_id=run_id, tool="command", workdir=None,
                             holder=holder)
                got = True
            except Refusal:
                got = False
        else:
            got = _naive_reserve(store, slot.machine, slot.name, slot.capacity, run_id)
        t1 = time.perf_counter()
        if got:
            seen = _witness(witness, +1)
            t_in = time.time()
            time.sleep(random.uniform(0.0005, 0.002))
            t_out = time.time()
            _witness(witness, -1)
            if args["mode"] == "saphan":
                store.finalize(run_id, state="ended", outcome="exited", exit_code=0)
            else:
                store.db.execute("UPDATE naive_runs SET finished = 1 WHERE id = ?", (run_id,))
            per_round.append((rnd, seen, t1 - t0, t_in, t_out))
        else:
            per_round.append((rnd, 0, t1 - t0, 0.0, 0.0))
    store.close()
    results.put(json.dumps(per_round))


@dataclass
class RaceResult:
    rounds: int
    admitted: int
    max_seen_per_round: dict[int, int]
    max_overlap: int
    latencies: list[float]

    @property
    def max_seen(self) -> int:
        return max(self.max_seen_per_round.values(), default=0)


def run_race(
    *, url: str, sqlite_default: str, machine: str, slot: str, processes: int, rounds: int,
    mode: str, workdir: Path,
) -> RaceResult:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    witness = str(workdir / f"witness-{mode}-{os.getpid()}-{time.time_ns()}")
    args = dict(url=url, sqlite_default=sqlite_default, machine=machine, slot=slot,
                rounds=rounds, mode=mode, witness=witness)
    procs = [ctx.Process(target=_worker, args=(args, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    collected = [json.loads(results.get(timeout=600)) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"race worker exited {p.exitcode}")
    per_round: dict[int, int] = {}
    intervals: list[tuple[float, int]] = []
    latencies: list[float] = []
    admitted = 0
    for rows in collected:
        for rnd, seen, lat, t_in, t_out in rows:
            latencies.append(lat)
            per_round[rnd] = max(per_round.get(rnd, 0), seen)
            if seen:
                admitted += 1
                intervals += [(t_in, +1), (t_out, -1)]
    # Sweep the holders' own tenure intervals (each inside its DB interval).
    overlap = best = 0
    for _, d in sorted(intervals, key=lambda x: (x[0], x[1])):
        overlap += d
        best = max(best, overlap)
    return RaceResult(rounds, admitted, per_round, best, latencies)
