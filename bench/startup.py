"""Start-up cost of `saphan --help` and `saphan runs list`, against a bare
interpreter measured side by side in the same run (medians of N runs).

    python3 bench/startup.py [--runs 30]

Target (issue 2): each within 60 ms of `python3 -c pass`.
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


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    saphan = scripts if os.path.exists(scripts) else shutil.which("saphan")
    if saphan is None:
        sys.exit("saphan is not installed (run ci/setup)")
    home = tempfile.mkdtemp(prefix="saphan-bench-")
    env = dict(os.environ, SAPHAN_HOME=home)
    subprocess.run([saphan, "init"], env=env, check=True, stdout=subprocess.DEVNULL)
    cases = {
        "python3 -c pass (baseline)": [sys.executable, "-c", "pass"],
        "python3 -c 'import psycopg, paramiko' (what lazy imports avoid)":
            [sys.executable, "-c", "import psycopg, paramiko"],
        "saphan --help": [saphan, "--help"],
        "saphan runs list": [saphan, "runs", "list"],
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):  # interleaved, so drift hits every case alike
        for name, argv in cases.items():
            samples[name].append(_time(argv, env))
    base = statistics.median(samples["python3 -c pass (baseline)"])
    print(f"{'case':<62} {'median ms':>10} {'vs baseline':>12}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:<62} {med * 1000:>10.1f} {f'+{(med - base) * 1000:.1f} ms':>12}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
