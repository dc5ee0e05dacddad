"""The cost of `saphan measure-base`'s steps 1-3 (measure/driver.py) on a
repository with a long history, against plain clones of it in the same run.

    python3 bench/measure.py [--commits 10000] [--files 200] [--reps 7] [--dir D]

The fixture is a normal non-bare repository built in a temporary directory
(under --dir, else $TMPDIR; removed at exit): `git fast-import` of a stream
generated here — a first commit of --files small text files (40 lines each,
in 10 directories), then --commits - 1 commits, each changing one line in 3
files (one in four also appends a line), so every commit has new blobs and
trees — then `git gc -q --prune=now` (one pack, packed refs) and `git reset
--hard` (the working tree written). The base is the commit in the middle of
history. `/.saphan-run/` is in its info/exclude, as saphan writes it.

Every sample clones into a fresh `<repo>/.saphan-run/base-N` (in the
repository's own working tree, where the real scratch goes), which is
removed after it, then os.sync() (neither timed: a sample's writeback
is not left to land in the next one). Every git command runs as the driver runs it:
`git -c core.hooksPath=/dev/null -c core.fsmonitor=false`, the GIT_*
variables the driver unsets unset, GIT_OPTIONAL_LOCKS=0; the machine's own
git config is kept out (GIT_CONFIG_NOSYSTEM=1, GIT_CONFIG_GLOBAL=/dev/null).
Cases, interleaved, their order rotated each rep, after one untimed round:

    shared           the driver's steps 1-3: [1] clone -q --shared --no-checkout
                     REPO DEST; [2] rev-parse --verify -q SHA^{commit} in DEST
                     (the driver's choice of target), checkout -q --detach SHA;
                     [3] rev-parse HEAD, checked equal to SHA
    plain            clone -q --no-checkout REPO DEST [baseline]: a local path,
                     so git copies refs and *hardlinks* objects/ (no pack
                     protocol; a copy only across filesystems)
    copy             clone -q --no-checkout --no-local file://REPO DEST
                     [baseline]: the history really copied, through
                     upload-pack / index-pack
    plain+checkout   plain, then [2] and [3] as in shared (for information)
    copy+checkout    copy, then [2] and [3] as in shared (for information)

Per case: median, min and max wall time of --reps samples, the ratio of the
medians to plain's and to copy's, the median of each step (clone, [2], [3]),
and the bytes DEST/.git occupies (st_blocks * 512 of every file and
directory under it, a hardlinked inode once) with, beside it, the part not
shared with the source (regular files with one link only). Caches are warm:
the fixture was just written and the untimed round read it.

A table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: what the driver unsets before its first git command
UNSET = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
         "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES",
         "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_EXTERNAL_DIFF")
#: the driver's g(): hooks and fsmonitor off
GIT = ("git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
CASES = ("shared", "plain", "copy", "plain+checkout", "copy+checkout")
STEPS = ("clone", "checkout", "rev-parse")
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
         "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi",
         "omega", "fn", "let", "mut", "return", "match", "struct", "impl", "self", "value", "index",
         "count", "total", "error", "result")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_PAGER="cat",
               GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", LC_ALL="C")
    return env


ENV = _env()


def _git(*args: str, out: bool = False) -> str:
    done = subprocess.run([*GIT, *args], env=ENV, check=True, text=True,
                          stdout=subprocess.PIPE if out else subprocess.DEVNULL)
    return done.stdout.strip() if out else ""


def _stream(commits: int, files: int, seed: int = 1) -> Iterator[bytes]:
    """The fast-import stream, in chunks: refs/heads/main, `commits` commits."""
    rnd = random.Random(seed)
    paths = [f"d{i % 10:02d}/f{i:04d}.txt".encode() for i in range(files)]

    def line() -> bytes:
        return (" ".join(rnd.choices(WORDS, k=rnd.randint(4, 10))) + "\n").encode()

    texts = [[line() for _ in range(40)] for _ in range(files)]
    t0 = 1_700_000_000
    chunk: list[bytes] = []
    for n in range(commits):
        if n == 0:
            changed = list(range(files))
        else:
            changed = rnd.sample(range(files), min(3, files))
            for i in changed:
                text = texts[i]
                text[rnd.randrange(len(text))] = line()
                if rnd.random() < 0.25:
                    text.append(line())
        msg = f"commit {n}: {len(changed)} files\n".encode()
        who = b"Bench <bench@example.invalid> %d +0000\n" % (t0 + n * 60)
        chunk += [b"commit refs/heads/main\nauthor ", who, b"committer ", who,
                  b"data %d\n" % len(msg), msg]
        for i in changed:
            body = b"".join(texts[i])
            chunk += [b"M 100644 inline ", paths[i], b"\ndata %d\n" % len(body), body, b"\n"]
        chunk.append(b"\n")
        if len(chunk) > 4096:
            yield b"".join(chunk)
            chunk = []
    chunk.append(b"done\n")
    yield b"".join(chunk)


def _du(path: Path) -> tuple[int, int]:
    """(bytes, unshared bytes) under path: st_blocks * 512, an inode once;
    unshared leaves out regular files with more than one link."""
    seen: set[tuple[int, int]] = set()
    total = own = 0
    for root, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            size = st.st_blocks * 512
            total += size
            if not (os.path.isfile(os.path.join(root, name)) and st.st_nlink > 1):
                own += size
    st = os.lstat(path)
    return total + st.st_blocks * 512, own + st.st_blocks * 512


def _fs_type(path: str) -> str:
    best, kind = "", "?"
    with open("/proc/self/mountinfo") as f:
        for row in f:
            left, _, right = row.partition(" - ")
            mount = left.split()[4]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                best, kind = mount, right.split()[0]
    return kind


def _build(repo: Path, commits: int, files: int) -> dict[str, float]:
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    _git("init", "-q", "-b", "main", str(repo))
    imp = subprocess.Popen([*GIT, "-C", str(repo), "fast-import", "--quiet", "--done"],
                           env=ENV, stdin=subprocess.PIPE)
    assert imp.stdin is not None
    for chunk in _stream(commits, files):
        imp.stdin.write(chunk)
    imp.stdin.close()
    if imp.wait() != 0:
        raise subprocess.CalledProcessError(imp.returncode, "git fast-import")
    times["fast_import_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    _git("-C", str(repo), "gc", "-q", "--prune=now")
    times["gc_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    _git("-C", str(repo), "reset", "-q", "--hard")
    times["work_tree_s"] = time.perf_counter() - t1
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("\n# saphan's per-run scratch directory\n/.saphan-run/\n")
    times["total_s"] = time.perf_counter() - t0
    return times


def _verify(dest: str, sha: str) -> float:
    """Steps [2] (target chosen as the driver does, then the checkout); its time."""
    t0 = time.perf_counter()
    _git("-C", dest, "rev-parse", "--verify", "-q", f"{sha}^{{commit}}", out=True)
    _git("-C", dest, "checkout", "-q", "--detach", sha)
    return time.perf_counter() - t0


def _head(dest: str, sha: str) -> float:
    t0 = time.perf_counter()
    got = _git("-C", dest, "rev-parse", "HEAD", out=True)
    took = time.perf_counter() - t0
    if got != sha:
        raise RuntimeError(f"{dest}: HEAD is {got}, wanted {sha}")
    return took


def _case(name: str, repo: Path, dest: str, sha: str) -> dict[str, float]:
    """One sample of a case: each step's seconds (and "total")."""
    clone = {"shared": ["--shared", "--no-checkout", "--", str(repo)],
             "plain": ["--no-checkout", "--", str(repo)],
             "copy": ["--no-checkout", "--no-local", "--", f"file://{repo}"]}[name.split("+")[0]]
    t0 = time.perf_counter()
    _git("clone", "-q", *clone, dest)
    steps = {"clone": time.perf_counter() - t0}
    if name == "shared" or name.endswith("+checkout"):
        steps["checkout"] = _verify(dest, sha)
        steps["rev-parse"] = _head(dest, sha)
    steps["total"] = time.perf_counter() - t0
    return steps


def _ms(x: float) -> float:
    return round(x * 1000, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=10000)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where the fixture goes (default: $TMPDIR)")
    args = ap.parse_args()
    if args.commits < 2 or args.files < 3 or args.reps < 1:
        ap.error("needs --commits >= 2, --files >= 3, --reps >= 1")
    top = Path(tempfile.mkdtemp(prefix="saphan-bench-measure-", dir=args.dir)).resolve()
    try:
        repo = top / "repo"
        built = _build(repo, args.commits, args.files)
        os.sync()
        objects, _ = _du(repo / ".git" / "objects")
        packs = sorted((repo / ".git" / "objects" / "pack").glob("*.pack"))
        history = _git("-C", str(repo), "rev-list", "--reverse", "main", out=True).split()
        if len(history) != args.commits:
            raise RuntimeError(f"{len(history)} commits, wanted {args.commits}")
        base_index = len(history) // 2
        sha = history[base_index]
        count = dict(line.split(": ", 1) for line in _git(
            "-C", str(repo), "count-objects", "-v", out=True).splitlines())

        scratch = repo / ".saphan-run"
        n = 0
        samples: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
        sizes: dict[str, tuple[int, int]] = {}
        t_run = time.perf_counter()
        for rep in range(args.reps + 1):  # rep 0: the untimed round
            order = CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]
            for name in order:
                n += 1
                dest = scratch / f"base-{n}"
                got = _case(name, repo, str(dest), sha)
                if rep == 0:
                    sizes[name] = _du(dest / ".git")
                else:
                    samples[name].append(got)
                shutil.rmtree(scratch)  # the driver removes the scratch's top
                os.sync()  # this sample's writeback not left to the next one
        t_run = time.perf_counter() - t_run
    finally:
        shutil.rmtree(top, ignore_errors=True)

    med = {c: {s: statistics.median(x[s] for x in xs) for s in (*STEPS, "total") if s in xs[0]}
           for c, xs in samples.items()}
    totals = {c: [x["total"] for x in xs] for c, xs in samples.items()}
    plain, copy = med["plain"]["total"], med["copy"]["total"]
    print(f"fixture: {args.commits} commits, {args.files} files, {count['count'].strip()} loose + "
          f"{count['in-pack'].strip()} packed objects in {len(packs)} pack(s), objects/ "
          f"{objects / 1e6:.1f} MB on {_fs_type(str(top))}; built in {built['total_s']:.1f} s "
          f"(fast-import {built['fast_import_s']:.1f}, gc {built['gc_s']:.1f}, "
          f"work tree {built['work_tree_s']:.2f})")
    print(f"base: commit {base_index + 1} of {args.commits} ({sha[:12]}); "
          f"{args.reps} reps, cases interleaved, order rotated; warm caches")
    print(f"{'case':<16} {'median ms':>10} {'min':>9} {'max':>9} {'vs plain':>9} {'vs copy':>8} "
          f"{'clone':>9} {'[2] co':>8} {'[3] rp':>7} {'.git bytes':>12} {'unshared':>11}")
    for c in CASES:
        m = med[c]
        tag = {"plain": " [base]", "copy": " [base]"}.get(c, "")
        co = f"{m['checkout'] * 1000:>8.1f}" if "checkout" in m else f"{'-':>8}"
        rp = f"{m['rev-parse'] * 1000:>7.1f}" if "rev-parse" in m else f"{'-':>7}"
        print(f"{c + tag:<16} {m['total'] * 1000:>10.1f} {min(totals[c]) * 1000:>9.1f} "
              f"{max(totals[c]) * 1000:>9.1f} {m['total'] / plain:>8.2f}x {m['total'] / copy:>7.2f}x "
              f"{m['clone'] * 1000:>9.1f} {co} {rp} {sizes[c][0]:>12,} {sizes[c][1]:>11,}")
    print(f"(objects/ of the source: {objects:,} bytes; unshared: .git bytes without files "
          f"hardlinked from it; ran {t_run:.1f} s)")
    print(json.dumps({
        "bench": "measure", "commits": args.commits, "files": args.files, "reps": args.reps,
        "git": _git("--version", out=True), "fs": _fs_type(str(top)),
        "fixture": {"objects_bytes": objects, "packs": len(packs),
                    "objects_in_pack": int(count["in-pack"]), "loose": int(count["count"]),
                    "base_sha": sha, "base_index": base_index,
                    "build_s": {k: round(v, 3) for k, v in built.items()}},
        "median_ms": {c: {s: _ms(v) for s, v in m.items()} for c, m in med.items()},
        "min_ms": {c: _ms(min(v)) for c, v in totals.items()},
        "max_ms": {c: _ms(max(v)) for c, v in totals.items()},
        "samples_ms": {c: [_ms(x) for x in v] for c, v in totals.items()},
        "ratio_vs_plain": {c: round(m["total"] / plain, 3) for c, m in med.items()},
        "ratio_vs_copy": {c: round(m["total"] / copy, 3) for c, m in med.items()},
        "git_dir_bytes": {c: {"bytes": b, "unshared": u} for c, (b, u) in sizes.items()},
        "run_s": round(t_run, 1),
    }))


if __name__ == "__main__":
    main()
