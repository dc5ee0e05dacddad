"""saphan-launcher's cost, against baselines measured in the same run.

    python3 bench/launcher.py [--runs 200] [--gib 1]

1. Added wall time of `saphan-launcher exec --policy … -- /bin/true` over a
   bare `/bin/true`, beside `bwrap --ro-bind / / … /bin/true` and landrun
   (built from the Go module proxy into a temp dir if the proxy serves it; the
   build is never committed). Target: the launcher adds <= 2 ms.
2. SHA-256 throughput on a 1 GiB file: `saphan-launcher sha256`, coreutils
   `sha256sum`, and Python's hashlib (OpenSSL). Target: >= hashlib.
Medians; the cases are interleaved so machine drift hits each alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _launcher() -> str:
    out = subprocess.run(["saphan", "launcher", "path"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("saphan-launcher not found (run ci/setup)")
    return out.stdout.strip()


def _landrun(tmp: str) -> tuple[str | None, str]:
    gobin = os.path.join(tmp, "gobin")
    go = shutil.which("go")
    if go is None:
        return None, "no Go toolchain"
    p = subprocess.run([go, "install", "github.com/zouuup/landrun/cmd/landrun@latest"],
                       env=dict(os.environ, GOBIN=gobin, GOFLAGS="-mod=mod"),
                       capture_output=True, text=True, timeout=600)
    exe = os.path.join(gobin, "landrun")
    if p.returncode != 0 or not os.path.exists(exe):
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"could not be built from the Go module proxy: {last[:120]}"
    return exe, "built from the Go module proxy"


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def exec_overhead(runs: int, tmp: str) -> None:
    launcher = _launcher()
    wd = os.path.join(tmp, "wd")
    os.makedirs(wd, exist_ok=True)
    true = shutil.which("true") or "/bin/true"
    policy = json.dumps({"version": 1, "workdir": wd, "writable": [wd, "/dev/null"],
                         "readable": "everything"})
    cases: dict[str, list[str]] = {
        "/bin/true (baseline)": [true],
        "saphan-launcher exec (landlock)": [launcher, "exec", "--policy", policy, "--", true],
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        cases["bwrap --ro-bind / / --bind wd wd"] = [
            bwrap, "--ro-bind", "/", "/", "--bind", wd, wd, "--die-with-parent", "--", true]
    landrun, why = _landrun(tmp)
    if landrun:
        cases["landrun --rox / --rw wd"] = [landrun, "--rox", "/", "--rw", wd, true]
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, argv in cases.items():
            samples[name].append(_time(argv))
    base = statistics.median(samples["/bin/true (baseline)"])
    print(f"exec overhead, median of {runs} runs")
    print(f"{'case':<40} {'median ms':>10} {'added ms':>10}")
    for name, xs in samples.items():
        m = statistics.median(xs)
        print(f"{name:<40} {m * 1000:>10.2f} {(m - base) * 1000:>10.2f}")
    if not landrun:
        print(f"{'landrun':<40} {'-':>10} {'-':>10}  ({why})")


def sha256_throughput(gib: float, tmp: str) -> None:
    launcher = _launcher()
    path = os.path.join(tmp, "blob")
    size = int(gib * (1 << 30))
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm the page cache

    def hashlib_file() -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return h.hexdigest()

    fresh_hashlib = [sys.executable, "-c", (
        "import hashlib, sys\nh = hashlib.sha256()\nf = open(sys.argv[1], 'rb')\n"
        "while b := f.read(1 << 20):\n    h.update(b)\nprint(h.hexdigest())"), path]
    results: dict[str, list[float]] = {"saphan-launcher sha256": [], "sha256sum": [],
                                       "python hashlib (OpenSSL)": [],
                                       "fresh python3 -c hashlib": []}
    digests = set()
    for _ in range(3):
        t0 = time.perf_counter()
        digests.add(subprocess.run([launcher, "sha256", path], capture_output=True, text=True,
                                   check=True).stdout.split()[0])
        results["saphan-launcher sha256"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        digests.add(subprocess.run(["sha256sum", path], capture_output=True, text=True,
                                   check=True).stdout.split()[0])
        results["sha256sum"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        digests.add(hashlib_file())
        results["python hashlib (OpenSSL)"].append(time.perf_counter() - t0)
        # Like for like with the launcher: a new process per digest (the
        # interpreter's start is included, which favours the launcher).
        t0 = time.perf_counter()
        digests.add(subprocess.run(fresh_hashlib, capture_output=True, text=True,
                                   check=True).stdout.split()[0])
        results["fresh python3 -c hashlib"].append(time.perf_counter() - t0)
    assert len(digests) == 1, f"digests disagree: {digests}"
    base = size / statistics.median(results["python hashlib (OpenSSL)"])
    print(f"\nSHA-256 of {gib:g} GiB (page-cached), median of 3")
    print(f"{'case':<28} {'GB/s':>8} {'vs hashlib':>11}")
    for name, xs in results.items():
        rate = size / statistics.median(xs)
        print(f"{name:<28} {rate / 1e9:>8.2f} {rate / base:>10.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--gib", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="saphan-bench-") as tmp:
        exec_overhead(args.runs, tmp)
        sha256_throughput(args.gib, tmp)


if __name__ == "__main__":
    main()
