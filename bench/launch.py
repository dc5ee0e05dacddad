"""`saphan run -- /bin/true` (local, SQLite), against baselines in the same run.

    python3 bench/launch.py [--runs 30] [--baseline-tree DIR]

With ``--baseline-tree DIR`` (a checkout of an earlier commit, its
``python/saphan/_native*.so`` built or copied in), ``saphan run -- /bin/true``
of that tree is measured side by side with this one, both started the same
way (``python3 -c``), interleaved in the same loop. The import step of a
``--repo`` run (worktrees.import_run: the run's HEAD and objects checked, a
verified fetch, the git dir reset) is measured with 1 and with 100 new
commits.

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
    ap.add_argument("--baseline-tree", default=None)
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
    run_args = ["run", "--machine", "here", "--slot", "s", "--workdir", wd, "--", true]
    if args.baseline_tree:
        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
        for label, tree in (("this tree", here),
                            ("baseline", os.path.join(args.baseline_tree, "python"))):
            code = (f"import sys; sys.path.insert(0, {tree!r}); sys.argv[0] = 'saphan'; "
                    "from saphan.entry import main; main()")
            cases[f"run /bin/true ({label})"] = [sys.executable, "-c", code, *run_args]
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
    if args.baseline_tree:
        diff = med["run /bin/true (this tree)"] - med["run /bin/true (baseline)"]
        print(f"\nthis tree vs baseline ({args.baseline_tree}): {diff * 1000:+.1f} ms "
              f"(ratio {med['run /bin/true (this tree)'] / med['run /bin/true (baseline)']:.3f})")
    _bench_import(tmp, max(3, args.runs // 6))
    shutil.rmtree(tmp, ignore_errors=True)


def _bench_import(tmp: str, reps: int) -> None:
    """worktrees.import_run after a run that made 1 and 100 commits."""
    from saphan import worktrees
    from saphan.confine.grants import derive, make_run_dirs, verify_linked_worktree

    genv = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    genv.update(GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
                GIT_COMMITTER_EMAIL="b@b")

    def git(*a: str, cwd: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(["git", *a], cwd=cwd, env=env or genv, check=True,
                              capture_output=True, text=True).stdout

    print("\nimport step of a --repo run (median of", reps, "runs)")
    for commits in (1, 100):
        xs = []
        for i in range(reps):
            root = os.path.join(tmp, f"imp-{commits}-{i}")
            repo, wt, run_dir = (os.path.join(root, n) for n in ("repo", "wt", "run"))
            os.makedirs(repo)
            os.makedirs(run_dir)
            git("init", "-q", "-b", "main", cwd=repo)
            for j in range(50):
                with open(os.path.join(repo, f"f{j}"), "w") as f:
                    f.write(f"{j}\n" * 100)
            git("add", ".", cwd=repo)
            git("commit", "-q", "-m", "base", cwd=repo)
            base = git("rev-parse", "HEAD", cwd=repo).strip()
            git("worktree", "add", "-q", "--detach", wt, cwd=repo)
            linked = verify_linked_worktree(wt, os.path.join(repo, ".git"))
            policy = derive(wt, worktree=linked)
            make_run_dirs(policy, objects=True)
            renv = {**genv, **dict(policy.setenv)}
            for j in range(commits):
                with open(os.path.join(wt, f"n{j}"), "w") as f:
                    f.write(f"change {j}\n")
                git("add", f"n{j}", cwd=wt, env=renv)
                git("commit", "-q", "-m", f"c{j}", cwd=wt, env=renv)
            spec = worktrees.RepoSpec(repo, os.path.join(repo, ".git"), base, "main")
            t0 = time.perf_counter()
            got = worktrees.import_run(spec, linked.git_dir, wt, run_dir, f"R{i}")
            xs.append(time.perf_counter() - t0)
            assert got["result"] == "imported" and got["commits"] == commits, got
        print(f"  {commits:>3} new commit(s): {statistics.median(xs) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
