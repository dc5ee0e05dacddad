"""What `--expect-sha256` costs: the launcher hashing its own /proc/self/exe.

    python3 bench/self_digest.py [--runs 30] [--mib 10] [--launcher PATH]

A copy of the launcher is padded with zero bytes to about 10 MiB (an ELF with
trailing bytes still runs), so the hash has a realistic file to read, then
`<copy> reap -- /bin/true` is timed with and without `--expect-sha256 <digest
of the copy>`. Wall time of the whole process, medians; the two cases are
interleaved so machine drift hits each alike. Every run's exit code and, with
the option, its `self sha256=` line are checked, so a refusal cannot pass for
a fast run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _launcher() -> Path:
    import saphan

    path = Path(saphan.__file__).resolve().parent / "_bin" / "saphan-launcher"
    if not path.is_file():
        raise SystemExit(f"no launcher at {path} (build it: ci/setup)")
    return path


def _padded_copy(src: Path, tmp: Path, size: int) -> Path:
    copy = tmp / "saphan-launcher"
    shutil.copyfile(src, copy)
    have = copy.stat().st_size
    with copy.open("ab") as f:
        f.write(b"\0" * max(0, size - have))
    copy.chmod(0o755)
    return copy


def _run(argv: list[str], expect_line: str | None) -> float:
    start = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"{argv[1:]} exited {p.returncode}: {p.stderr}")
    if expect_line is not None and expect_line not in p.stderr.splitlines():
        raise SystemExit(f"no {expect_line!r} in: {p.stderr}")
    return seconds


def measure(src: Path, size: int, runs: int) -> tuple[float, float, float]:
    """Medians (seconds) of `reap -- /bin/true` without and with
    `--expect-sha256`, on a copy of ``src`` padded to ``size`` bytes; and the
    copy's size in MiB."""
    with tempfile.TemporaryDirectory(prefix="saphan-self-digest-") as d:
        copy = _padded_copy(src, Path(d), size)
        digest = hashlib.sha256(copy.read_bytes()).hexdigest()
        plain = [str(copy), "reap", "--", "/bin/true"]
        checked = [str(copy), "reap", "--expect-sha256", digest, "--", "/bin/true"]
        line = f"saphan-launcher: self sha256={digest}"
        copy_mib = copy.stat().st_size / 2**20
        for _ in range(3):  # warm the page cache and the dynamic paths
            _run(plain, None)
            _run(checked, line)
        without: list[float] = []
        with_digest: list[float] = []
        for i in range(runs):
            # Alternate which goes first, so neither always follows the other.
            order = [(plain, None, without), (checked, line, with_digest)]
            for argv, expect, into in order if i % 2 == 0 else reversed(order):
                into.append(_run(argv, expect))
    return statistics.median(without), statistics.median(with_digest), copy_mib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mib", type=float, default=10.0,
                    help="the padded copy's size (never below the launcher's own)")
    ap.add_argument("--launcher", type=Path, default=None)
    args = ap.parse_args()
    src = args.launcher or _launcher()
    without, with_digest, copy_mib = measure(src, int(args.mib * 1024 * 1024), args.runs)
    size_mib = os.path.getsize(src) / 2**20
    m_without, m_with = without * 1000, with_digest * 1000
    diff = m_with - m_without
    print(f"launcher {src} ({size_mib:.2f} MiB), copy padded to {copy_mib:.2f} MiB, "
          f"{args.runs} runs each")
    print(f"{'reap -- /bin/true':44} median {m_without:8.2f} ms")
    print(f"{'reap --expect-sha256 <digest> -- /bin/true':44} median {m_with:8.2f} ms")
    rate = f" ({copy_mib / (diff / 1000):.0f} MiB/s implied)" if diff > 0 else ""
    print(f"{'difference (the self-digest)':44}        {diff:8.2f} ms{rate}")


if __name__ == "__main__":
    main()
