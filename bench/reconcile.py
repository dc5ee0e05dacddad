"""What reconciliation (run/live.reconcile, run once when a command opens the
store) adds to `saphan runs list`, measured against the same command with the
hook replaced by a no-op, side by side in the same run (medians of N fresh
processes, interleaved).

    python3 bench/reconcile.py [--runs 30] [--finished 2000] [--live 5]

The workspace (SQLite) holds ``--finished`` finished runs and ``--live``
live ones, each with its live record file (state running) and a holder that
is alive (this benchmark's own process), so reconciliation reads every live
row, opens and verifies every file, reads every holder's /proc entry, and
changes nothing — its steady-state cost. Cases, each a fresh interpreter:

    python3 -c pass                      the interpreter alone
    runs list, hook off, no live run     saphan as before reconciliation
    runs list, hook on,  no live run     + one query of the live rows
    runs list, hook off, N live runs     the listing's own live view included
    runs list, hook on,  N live runs     + N record files read, verified, holders read

Also in-process: reconcile() itself, median of 200 calls, on the same store.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_CLI = ("import sys; import saphan.engine as e; {patch}"
        "sys.argv = ['saphan', 'runs', 'list']; from saphan.cli import main; main()")


def _cases(live: int) -> dict[str, list[str]]:
    on = [sys.executable, "-c", _CLI.format(patch="")]
    off = [sys.executable, "-c", _CLI.format(patch="e._reconcile = lambda ctx: None; ")]
    return {"python3 -c pass": [sys.executable, "-c", "pass"],
            "runs list, hook off": off, "runs list, hook on": on}


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def _populate(home: str, finished: int) -> None:
    from saphan import Engine
    from saphan.ids import new_run_id
    from saphan.liveness import current_holder
    from saphan.records import signed_record_json
    from saphan.store.rows import Machine, Slot
    from saphan.timefmt import now_iso

    engine = Engine(home)
    engine.init()
    store, key = engine.store, engine.workspace.record_key()
    store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", 64))
    holder = current_holder().as_tuple()
    for _ in range(finished):
        run_id, at = new_run_id(), now_iso()
        record = {"id": run_id, "machine": "m", "slot": "s", "tool": "command",
                  "state": "refused", "outcome": "refused", "exit_code": None,
                  "finished_at": at, "session_ordinal": None, "argv": ["true"]}
        store.insert_refused_run(run_id=run_id, machine="m", slot="s", tool="command",
                                 workdir="/w", holder=holder, refusal_class="seat-full",
                                 record_json=signed_record_json(key, record), at=at)
    engine.close()


def _add_live(home: str, n: int) -> None:
    from saphan import Engine
    from saphan.ids import new_run_id
    from saphan.liveness import current_holder
    from saphan.run import record as recorder
    from saphan.timefmt import now_iso

    engine = Engine(home)
    holder = current_holder().as_tuple()
    for _ in range(n):
        run_id = new_run_id()
        ordinal = engine.store.reserve(run_id=run_id, machine="m", slot="s", capacity=64,
                                       tool="command", workdir="/w", holder=holder)
        recorder.running(engine.ctx, {
            "id": run_id, "machine": "m", "slot": "s", "tool": "command", "workdir": "/w",
            "session_ordinal": ordinal, "argv": ["sleep", "600"], "started_at": now_iso(),
            "enforced_by": {"mechanism": "bubblewrap", "version": "0.8.0"}})
    engine.close()


def _in_process(home: str, calls: int = 200) -> float:
    from saphan.context import Context
    from saphan.run import live
    from saphan.workspace import Workspace

    ctx = Context(Workspace.resolve(home))
    ctx.store  # noqa: B018 - opened first: only reconcile() is timed
    xs = []
    for _ in range(calls):
        t0 = time.perf_counter()
        live.reconcile(ctx)
        xs.append(time.perf_counter() - t0)
    ctx.close()
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--finished", type=int, default=2000)
    ap.add_argument("--live", type=int, default=5)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="saphan-bench-reconcile-")
    state = tempfile.mkdtemp(prefix="saphan-bench-state-")
    os.environ.update(SAPHAN_HOME=home, XDG_STATE_HOME=state)
    env = dict(os.environ)
    try:
        _populate(home, args.finished)
        results: dict[str, float] = {}
        for label, live in (("no live run", 0), (f"{args.live} live runs", args.live)):
            if live:
                _add_live(home, live)
            cases = _cases(live)
            samples: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(args.runs):  # interleaved, so drift hits every case alike
                for name, argv in cases.items():
                    samples[name].append(_time(argv, env))
            for name, xs in samples.items():
                results[f"{name} ({label})"] = statistics.median(xs)
            results[f"reconcile() in-process ({label})"] = _in_process(home)
        base = results["python3 -c pass (no live run)"]
        print(f"{args.finished} finished runs; medians of {args.runs} fresh processes")
        print(f"{'case':<52} {'median ms':>10} {'vs python':>11}")
        for name, med in results.items():
            extra = "" if "in-process" in name else f"+{(med - base) * 1000:.1f} ms"
            print(f"{name:<52} {med * 1000:>10.2f} {extra:>11}")
        for label in ("no live run", f"{args.live} live runs"):
            on, off = results[f"runs list, hook on ({label})"], results[
                f"runs list, hook off ({label})"]
            print(f"hook on / off, {label}: {on / off:.3f} ({(on - off) * 1000:+.1f} ms); "
                  f"reconcile() alone {results[f'reconcile() in-process ({label})'] * 1000:.3f}"
                  " ms")
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
