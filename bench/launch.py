"""`saphan run -- /bin/true` (local, SQLite), against baselines in the same run.

    python3 bench/launch.py [--runs 30]

Baselines: a bare `/bin/true`, and a hand-written `bwrap --ro-bind / / …
/bin/true`. Target (issue 4): saphan adds at most 150 ms over the bare bwrap
line. The breakdown times the same steps in-process: interpreter start
(`python3 -c pass`), CLI import, store open + reserve + finalise, policy
derivation, composition (which runs `bwrap --version`, a trial sandbox and a
SHA-256 of bwrap), and the bwrap line itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable


def _wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def _inproc(fn: Callable[[], object], runs: int) -> float:
    xs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    saphan = scripts if os.path.exists(scripts) else shutil.which("saphan")
    bwrap = shutil.which("bwrap")
    if saphan is None or bwrap is None:
        sys.exit("needs saphan and bwrap installed (run ci/setup)")
    true = shutil.which("true") or "/bin/true"
    tmp = tempfile.mkdtemp(prefix="saphan-bench-")
    home, wd = os.path.join(tmp, "home"), os.path.join(tmp, "wd")
    os.makedirs(wd)
    env = dict(os.environ, SAPHAN_HOME=home)
    for argv in (["init"], ["machine", "add", "here", "--local"],
                 ["slot", "add", "here", "s", "--tool", "command"]):
        subprocess.run([saphan, *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    bwrap_line = [bwrap, "--ro-bind", "/", "/", "--bind", wd, wd, "--dev-bind-try", "/dev/null",
                  "/dev/null", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                  "--chdir", wd, "--", true]
    cases = {
        "/bin/true": [true],
        "bwrap line (hand-written)": bwrap_line,
        "python3 -c pass": [sys.executable, "-c", "pass"],
        "saphan --help": [saphan, "--help"],
        "saphan run -- /bin/true": [saphan, "run", "--machine", "here", "--slot", "s",
                                    "--workdir", wd, "--", true],
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, argv in cases.items():
            samples[name].append(_wall(argv, env))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"wall time, median of {args.runs} runs")
    print(f"{'case':<28} {'median ms':>10} {'vs bwrap line':>14}")
    for name, m in med.items():
        print(f"{name:<28} {m * 1000:>10.1f} {(m - med['bwrap line (hand-written)']) * 1000:>+13.1f}")

    # In-process breakdown of what saphan does on top of the interpreter.
    os.environ["SAPHAN_HOME"] = home
    from saphan.capacity import reserve_seat
    from saphan.confine.compose import compose_local
    from saphan.confine.grants import derive
    from saphan.engine import Engine
    from saphan.ids import new_run_id
    from saphan.liveness import current_holder

    engine = Engine(home)
    slot = engine.slot("here", "s")
    holder = current_holder()

    def reserve_finalise() -> None:
        rid = new_run_id()
        reserve_seat(engine.store, slot, run_id=rid, tool="command", workdir=wd, holder=holder)
        engine.store.finalize(rid, state="ended", outcome="exited", exit_code=0)

    policy = derive(wd, return_path=wd)
    parts = {
        "store: open (config + migrate check)": lambda: Engine(home).store.close(),
        "store: reserve + finalise": reserve_finalise,
        "policy: derive (git rev-parse)": lambda: derive(wd, return_path=wd),
        "compose (bwrap --version, trial, sha256)": lambda: compose_local(policy, run_dir=tmp),
    }
    print("\nbreakdown (in-process medians)")
    print(f"{'step':<44} {'ms':>8}")
    print(f"{'interpreter start (python3 -c pass)':<44} {med['python3 -c pass'] * 1000:>8.1f}")
    print(f"{'CLI import + parse (saphan --help - pass)':<44} "
          f"{(med['saphan --help'] - med['python3 -c pass']) * 1000:>8.1f}")
    for name, fn in parts.items():
        print(f"{name:<44} {_inproc(fn, max(5, args.runs // 2)) * 1000:>8.1f}")
    print(f"{'bwrap line':<44} {med['bwrap line (hand-written)'] * 1000:>8.1f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
