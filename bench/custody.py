"""What the entry custody check costs (issue 8): it runs on every start.

    python3 bench/custody.py [--calls 5000] [--runs 30]

Measured side by side in one run:

* the check itself, in-process: ``saphan.custody.violation`` over the three
  files the entry measures (console script, package directory, native
  module), median of single calls; and one file alone;
* importing what the check needs (``saphan._native`` and ``saphan.custody``)
  in a fresh interpreter, median over runs;
* ``saphan --version`` and ``saphan --help`` start time through the real
  console script (check included) against a script of the same shape that
  calls ``saphan.cli.main`` directly (no check), interleaved, medians.

The product has no switch to turn the check off; the "without" side is that
second script. Target: the check under 1 ms.
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

NO_CHECK_SCRIPT = """#!{python}
# pip's console-script shape, calling the CLI without saphan.entry's check.
import re
import sys
from saphan.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""

IMPORT_PROBE = (
    "import time, saphan; t = time.perf_counter_ns(); import saphan.custody; "
    "print(time.perf_counter_ns() - t)"
)


def _median_call_ns(fn: object, calls: int) -> float:
    assert callable(fn)
    xs = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        xs.append(time.perf_counter_ns() - t)
    return statistics.median(xs)


def _time_run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000, help="in-process calls (default 5000)")
    ap.add_argument("--runs", type=int, default=30, help="process starts per case (default 30)")
    args = ap.parse_args()

    script = os.path.join(sysconfig.get_path("scripts"), "saphan")
    if not os.path.isfile(script):
        found = shutil.which("saphan")
        if found is None:
            sys.exit("saphan is not installed (run ci/setup)")
        script = found

    from saphan import custody

    sys.argv[0] = script  # measure what the console script's entry measures
    paths = custody.entry_paths()
    if custody.violation(paths) is not None:
        sys.exit(f"the installed saphan fails its own custody check:\n{custody.violation(paths)}")
    roles = ", ".join(role for role, _ in paths)
    check_all = _median_call_ns(lambda: custody.violation(paths), args.calls)
    check_one = _median_call_ns(lambda: custody.violation(paths[:1]), args.calls)

    tmp = tempfile.mkdtemp(prefix="saphan-bench-custody-")
    try:
        no_check = os.path.join(tmp, "saphan-no-check")
        with open(no_check, "w") as f:
            f.write(NO_CHECK_SCRIPT.format(python=sys.executable))
        os.chmod(no_check, 0o755)
        env = dict(os.environ, SAPHAN_HOME=os.path.join(tmp, "home"))

        imports = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], env=env,
                                 capture_output=True, text=True, check=True).stdout
            imports.append(int(out))

        cases = {
            "saphan --version (entry, with check)": [script, "--version"],
            "saphan --version (no check)": [no_check, "--version"],
            "saphan --help (entry, with check)": [script, "--help"],
            "saphan --help (no check)": [no_check, "--help"],
        }
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.runs):  # interleaved, so drift hits every case alike
            for name, argv in cases.items():
                samples[name].append(_time_run(argv, env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"entry check over {len(paths)} files ({roles})")
    print(f"{'measure':<48} {'median':>12}")
    print(f"{'check, all files, in-process (' + str(args.calls) + ' calls)':<48} "
          f"{check_all / 1000:>9.1f} us")
    print(f"{'check, one file, in-process':<48} {check_one / 1000:>9.1f} us")
    print(f"{'import saphan.custody + _native (fresh process)':<48} "
          f"{statistics.median(imports) / 1000:>9.1f} us")
    print()
    print(f"{'start time (' + str(args.runs) + ' runs each)':<48} {'median ms':>12} "
          f"{'vs no check':>12}")
    for verb in ("--version", "--help"):
        with_check = statistics.median(samples[f"saphan {verb} (entry, with check)"])
        without = statistics.median(samples[f"saphan {verb} (no check)"])
        print(f"{'saphan ' + verb + ' (no check)':<48} {without * 1000:>12.1f}")
        print(f"{'saphan ' + verb + ' (entry, with check)':<48} {with_check * 1000:>12.1f} "
              f"{f'{(with_check - without) * 1000:+.1f} ms':>12}")
    verdict = "within" if check_all < 1_000_000 else "OVER"
    print(f"\ntarget: the check under 1 ms -> {check_all / 1000:.1f} us, {verdict} target")


if __name__ == "__main__":
    main()
