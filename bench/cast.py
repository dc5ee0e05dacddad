"""The cast decision's cost for 1, 10 and 100 candidate slots (issue 21: "the
target is linear at worst"), beside today's named-slot reservation, measured
side by side in the same run (medians, interleaved rounds).

    python3 bench/cast.py [--rounds 200] [--calls 10] [--store sqlite|postgresql] [--profile]

Each fleet is its own throw-away workspace (``Engine(home).init()``; SQLite
by default, or a PostgreSQL 15 started on loopback with bench/reserve.py's
recipe and one database per workspace), with N = 1, 10, 100 ``command``
slots of one seat each, in three shapes:

    local     the N slots on one local machine (every slot eligible)
    half-ssh  ceil(N/2) slots on the local machine, N//2 on SSH machines (one
              slot each: the worst case, a gate per machine) whose rows were
              never probed: no Landlock row, no launcher row, nothing dialled;
              each is passed over after its signed-row lookups
    labels    the N slots on one local machine labelled zone=us, tier=a; each
              slot labelled rack=rK, and every 10th slot zone=eu (overriding
              its machine's); cast with --label zone=eu: ~10% match

Measured, per shape and N:

  cast   fleet.cast.candidates(ctx, "command", labels=...) alone: one call's
         wall time (reading machines, slots and labels, gating each machine
         from signed rows, matching labels, ranking), ``--calls`` calls per
         round.
  walk   "cast decision + walk to the first free seat": candidates(), then
         capacity.reserve_seat on each eligible candidate in the ranked order
         as run/cast.py does, one run id for the whole walk. The first K-1
         eligible slots are full, held by live rows whose holder is this
         process (liveness says alive), so each of them costs what a full
         candidate costs in a real cast: a losing INSERT, the holders read and
         tested, a second losing INSERT, the holders read again for the
         seat-full refusal's message. The last one is free and taken. The row
         taken is then finalised (Store.finalize, as bench/reserve.py; not
         timed). Left out: run/cast.py's per-candidate site.inspect (local:
         paths and the boundary binary; SSH: its one preflight dial), which
         belongs to the run, not to the decision.
  named  the baseline: one reserve_seat on a named slot that is free (today's
         `saphan run --machine M --slot S` reservation), finalised untimed;
         one per (shape, N) step, so it is interleaved with everything else;
         walk and named swap places every other round.

Rounds visit every (shape, N) step in a rotated order, so drift on a shared
machine hits every case alike. Reported per case: median and p90 (nearest
rank) in microseconds, the cost per slot (median / N) and, for the walk, per
candidate walked (median / K), and the ratios N=100 / N=10 and N=10 / N=1:
linear growth gives 10, a fixed cost plus a linear part less. "Linear at worst"
is judged on N=100 / N=10 <= 12 (10, with room for noise). Then one JSON
line. ``--profile`` adds cProfile's top functions (cumulative) for one
half-ssh N=100 cast call and one local N=100 walk. Defaults run in about
10 s on 2 cores with SQLite, about a minute with PostgreSQL.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saphan import Engine
    from saphan.fleet.cast import Cast
    from saphan.liveness import Holder
    from saphan.store.rows import Slot

SIZES = (1, 10, 100)
SHAPES = ("local", "half-ssh", "labels")
LOCAL = "here"
WANTED = {"zone": "eu"}
HOSTKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBhjZXZhbGlkLWtleS1hLTAwMDAwMDAwMDAwMDAwMDAw"
LINEAR_AT_WORST = 12.0  # N=100 / N=10 at most this: no worse than linear (10, plus noise)


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]  # nearest rank


@dataclass
class Fleet:
    shape: str
    n: int
    engine: Engine
    labels: dict[str, str]
    eligible: list[Slot] = field(default_factory=list)
    fill: list[str] = field(default_factory=list)  # run ids holding the K-1 full seats
    cast_s: list[float] = field(default_factory=list)
    walk_s: list[float] = field(default_factory=list)
    named_s: list[float] = field(default_factory=list)


def _workspace(root: Path, name: str, url: str | None) -> Engine:
    from saphan import Engine

    engine = Engine(root / name)
    engine.init(url)
    return engine


def _build(root: Path, shape: str, n: int, url: str | None, holder: Holder) -> Fleet:
    from saphan.capacity import reserve_seat
    from saphan.fleet import cast, labels
    from saphan.ids import new_run_id
    from saphan.store.rows import Machine

    engine = _workspace(root, f"{shape}-{n}", url)
    engine.add_machine(LOCAL, local=True)
    local = n if shape != "half-ssh" else n - n // 2
    for i in range(local):
        engine.add_slot(LOCAL, f"s{i:03d}", tool="command")
    if shape == "half-ssh":
        for i in range(n // 2):
            name = f"far-{i:03d}"
            assert engine.store.add_machine(Machine(name, "ssh", "u", "host.invalid", 22, "/k",
                                                    HOSTKEY, "t"))
            engine.add_slot(name, "s000", tool="command")
    wanted: dict[str, str] = {}
    if shape == "labels":
        wanted = dict(WANTED)
        labels.set_labels(engine.ctx, LOCAL, "", ["zone=us", "tier=a"], [])
        for i in range(n):
            add = [f"rack=r{i % 7}"] + (["zone=eu"] if i % 10 == 0 else [])
            labels.set_labels(engine.ctx, LOCAL, f"s{i:03d}", add, [])
    fleet = Fleet(shape, n, engine, wanted)
    found = cast.candidates(engine.ctx, "command", labels=wanted)
    fleet.eligible = [c.slot for c in found.eligible]
    assert fleet.eligible, f"{shape} N={n}: no eligible slot ({found.passed_over[:1]})"
    assert len(found.eligible) + len(found.passed_over) == n
    for s in fleet.eligible[:-1]:  # fill all but the last: held by this (live) process
        rid = new_run_id()
        reserve_seat(engine.store, s, run_id=rid, tool="command", workdir=None, holder=holder)
        fleet.fill.append(rid)
    return fleet


def _named(root: Path, url: str | None) -> tuple[Engine, Slot]:
    engine = _workspace(root, "named", url)
    engine.add_machine(LOCAL, local=True)
    return engine, engine.add_slot(LOCAL, "named", tool="command")


def _walk(f: Fleet, holder: Holder) -> tuple[Cast, str, str]:
    """candidates() and reserve_seat on each candidate in order (run/cast.py's
    _reserve_one without the sites): the run id and the slot taken."""
    from saphan.capacity import reserve_seat
    from saphan.fleet.cast import candidates
    from saphan.ids import new_run_id
    from saphan.refusals import Refusal

    ctx = f.engine.ctx
    run_id = new_run_id()
    found = candidates(ctx, "command", labels=f.labels)
    for c in found.eligible:
        try:
            reserve_seat(ctx.store, c.slot, run_id=run_id, tool="command", workdir=None,
                         holder=holder, remote=None, record_key=ctx.record_key)
        except Refusal as r:
            if r.cls != "seat-full":
                raise
            continue
        return found, run_id, c.slot.name
    raise AssertionError(f"{f.shape} N={f.n}: the walk found no free seat")


def _release(f: Fleet, run_id: str) -> None:
    assert f.engine.store.finalize(run_id, state="ended", outcome="exited", exit_code=0)


def _step(f: Fleet, named: tuple[Engine, Slot], holder: Holder, calls: int,
          named_first: bool) -> None:
    """One round's visit of a fleet: ``calls`` cast calls, then one walk and
    one named reservation, in the order given (alternated across rounds: a
    reservation just after another's commit pays for it, on SQLite's fsync)."""
    from saphan.capacity import reserve_seat
    from saphan.fleet.cast import candidates
    from saphan.ids import new_run_id

    ctx = f.engine.ctx
    for _ in range(calls):
        t0 = time.perf_counter()
        candidates(ctx, "command", labels=f.labels)
        f.cast_s.append(time.perf_counter() - t0)

    def walk() -> None:
        t0 = time.perf_counter()
        _, run_id, took = _walk(f, holder)
        f.walk_s.append(time.perf_counter() - t0)
        assert took == f.eligible[-1].name, f"took {took}, expected the last candidate"
        _release(f, run_id)

    def one_named() -> None:
        engine, slot = named
        run_id = new_run_id()
        t0 = time.perf_counter()
        reserve_seat(engine.store, slot, run_id=run_id, tool="command", workdir=None,
                     holder=holder, remote=None, record_key=engine.ctx.record_key)
        f.named_s.append(time.perf_counter() - t0)
        assert engine.store.finalize(run_id, state="ended", outcome="exited", exit_code=0)

    for fn in ((one_named, walk) if named_first else (walk, one_named)):
        fn()


def _profile(label: str, fn: Callable[[], object], after: Callable[[], object], reps: int,
             top: int = 10) -> list[str]:
    """cProfile over ``reps`` calls of ``fn`` (``after`` runs between them,
    unprofiled); prints and returns the top functions by cumulative time."""
    prof = cProfile.Profile()
    for _ in range(reps):
        prof.enable()
        fn()
        prof.disable()
        after()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    rows = [ln.strip() for ln in lines[start + 1:] if ln.strip()]
    print(f"\ncProfile, {label}, {reps} calls (top {top} by cumulative time; ncalls and "
          "times are totals over the calls)")
    print("  " + lines[start].strip())
    for ln in rows:
        print("  " + ln)
    return rows


def _postgres_urls(stack: ExitStack, names: list[str]) -> Iterator[str]:
    """A PostgreSQL started for this run (bench/reserve.py's recipe), one
    database per workspace; yields their URLs in ``names``' order."""
    import importlib

    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    postgres = importlib.import_module("reserve").postgres  # bench/reserve.py's recipe
    base: str = stack.enter_context(postgres())
    server, _, _ = base.rpartition("/")
    with psycopg.connect(base, autocommit=True) as c:
        for name in names:
            db = "cast_" + name.replace("-", "_")
            c.execute(f"CREATE DATABASE {db}")
            yield f"{server}/{db}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="rounds (walk and named samples)")
    ap.add_argument("--calls", type=int, default=10, help="cast calls per step per round")
    ap.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile one N=100 cast call (half-ssh) and one N=100 walk (local)")
    args = ap.parse_args()

    import sqlite3

    import saphan
    from saphan.fleet.cast import candidates
    from saphan.liveness import current_holder

    t_begin = time.time()
    print(f"bench/cast: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, store {args.store}"
          + (f" (SQLite {sqlite3.sqlite_version})" if args.store == "sqlite" else "")
          + f", load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"saphan {saphan.__version__} from {Path(saphan.__file__).parent}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="saphan-bench-cast-"))
    saved = {k: os.environ.get(k) for k in ("SAPHAN_HOME", "XDG_STATE_HOME")}
    os.environ.update(SAPHAN_HOME=str(root / "unused"), XDG_STATE_HOME=str(root / "state"))
    holder = current_holder()
    fleets: list[Fleet] = []
    named: tuple[Engine, Slot] | None = None
    try:
        with ExitStack() as stack:
            steps = [(shape, n) for shape in SHAPES for n in SIZES]
            names = [f"{s}-{n}" for s, n in steps] + ["named"]
            urls: Iterator[str | None] = (
                _postgres_urls(stack, names) if args.store == "postgresql"
                else iter([None] * len(names)))
            for shape, n in steps:
                fleets.append(_build(root, shape, n, next(urls), holder))
            named = _named(root, next(urls))
            for f in fleets:  # warm-up: imports, statement caches, first pages
                _step(f, named, holder, 2, False)
                f.cast_s.clear()
                f.walk_s.clear()
                f.named_s.clear()
            for r in range(args.rounds):
                k = r % len(fleets)
                for f in fleets[k:] + fleets[:k]:
                    _step(f, named, holder, args.calls, r % 2 == 1)
            if args.profile:
                big = {(f.shape, f.n): f for f in fleets}
                ssh = big["half-ssh", 100]
                _profile("cast call, half-ssh N=100",
                         lambda: candidates(ssh.engine.ctx, "command", labels=ssh.labels),
                         lambda: None, 100)
                loc = big["local", 100]
                got: list[str] = []
                _profile("cast + walk, local N=100 (99 full, the last free)",
                         lambda: got.append(_walk(loc, holder)[1]),
                         lambda: _release(loc, got.pop()), 20)
            for f in fleets:
                for rid in f.fill:
                    _release(f, rid)
                f.engine.close()
            named[0].close()
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        shutil.rmtree(root, ignore_errors=True)
    _report(fleets, args, time.time() - t_begin)


def _report(fleets: list[Fleet], args: argparse.Namespace, wall: float) -> None:
    us = 1e6
    print(f"\n{args.rounds} rounds; cast: {args.calls} calls per step per round "
          f"({args.rounds * args.calls} samples), walk and named: 1 per step per round "
          f"({args.rounds} samples). N = slots of the tool, K = eligible candidates "
          "(the walk passes K-1 full seats, takes the last). Times in microseconds.")
    hdr = (f"{'shape':<9} {'N':>4} {'K':>4} | {'cast p50':>9} {'p90':>9} {'/slot':>7} | "
           f"{'walk p50':>9} {'p90':>9} {'/slot':>7} {'/cand':>7} | {'named p50':>9} {'p90':>8}")
    print(hdr)
    print("-" * len(hdr))
    rows: list[dict[str, Any]] = []
    for f in fleets:
        k = len(f.eligible)
        c50, c90 = statistics.median(f.cast_s) * us, _pct(f.cast_s, 90) * us
        w50, w90 = statistics.median(f.walk_s) * us, _pct(f.walk_s, 90) * us
        n50, n90 = statistics.median(f.named_s) * us, _pct(f.named_s, 90) * us
        print(f"{f.shape:<9} {f.n:>4} {k:>4} | {c50:>9.0f} {c90:>9.0f} {c50 / f.n:>7.1f} | "
              f"{w50:>9.0f} {w90:>9.0f} {w50 / f.n:>7.1f} {w50 / k:>7.1f} | "
              f"{n50:>9.0f} {n90:>8.0f}")
        rows.append({"shape": f.shape, "n": f.n, "k": k,
                     "cast_us": {"p50": round(c50, 1), "p90": round(c90, 1),
                                 "per_slot": round(c50 / f.n, 2)},
                     "walk_us": {"p50": round(w50, 1), "p90": round(w90, 1),
                                 "per_slot": round(w50 / f.n, 2),
                                 "per_candidate": round(w50 / k, 2)},
                     "named_us": {"p50": round(n50, 1), "p90": round(n90, 1)}})
    print("\nGrowth (median ratios; linear = 10, a fixed cost plus a linear part less; "
          f"linear at worst when N=100 / N=10 <= {LINEAR_AT_WORST:g})")
    ratios: dict[str, dict[str, float]] = {}
    verdicts: list[bool] = []
    for shape in SHAPES:
        by = {r["n"]: r for r in rows if r["shape"] == shape}
        for what in ("cast_us", "walk_us"):
            t = {n: by[n][what]["p50"] for n in SIZES}
            hi, lo = t[100] / t[10], t[10] / t[1]
            ok = hi <= LINEAR_AT_WORST
            verdicts.append(ok)
            ratios[f"{shape}/{what[:4]}"] = {"n100_n10": round(hi, 2), "n10_n1": round(lo, 2)}
            named100 = by[100]["named_us"]["p50"]
            ks = {n: (by[n]["k"] if what == "walk_us" else n) for n in SIZES}
            marginal = (t[100] - t[10]) / max(1, ks[100] - ks[10])
            ratios[f"{shape}/{what[:4]}"]["marginal_us"] = round(marginal, 2)
            print(f"  {shape:<9} {what[:4]:<5} N=100/N=10 {hi:6.2f}  N=10/N=1 {lo:6.2f}  "
                  f"+{marginal:6.1f} us per extra {'candidate' if what == 'walk_us' else 'slot'}"
                  f"  N=100 = {t[100] / named100:5.1f} x named  -> "
                  f"{'linear at worst' if ok else 'WORSE than linear'}")
    verdict = ("linear at worst" if all(verdicts) else "WORSE than linear somewhere")
    print(f"\nVerdict: {verdict} (target: issue 21, linear at worst). Wall {wall:.0f} s; "
          f"load average now {os.getloadavg()[0]:.2f}")
    print(json.dumps({"bench": "cast", "store": args.store, "rounds": args.rounds,
                      "calls": args.calls, "results": rows, "ratios": ratios,
                      "verdict": verdict, "wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
