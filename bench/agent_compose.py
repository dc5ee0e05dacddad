"""What composing an agent's command line costs a run, against a baseline tree.

    python3 bench/agent_compose.py [--runs 200] [--baseline-tree DIR]

For Claude Code and Codex CLI, the in-process steps a run takes between its
derived policy and the launch, all of them saphan's own work (no tool runs):
the adapter's argv (Claude: the per-run settings file written too), its
record, the argv guard on the final line, the environment built from the
adapter's allow-list and the variables it sets, and for Codex its vendor
boundary (the reaper's custody check included). The binary is a stand-in
file: identifying and digesting the real binary is measured elsewhere
(bench/custody.py) and is the same in both trees.

With ``--baseline-tree DIR`` (a checkout of an earlier commit with its
``_native*.so`` and ``_bin/saphan-launcher`` copied in), the same steps of
that tree run in a child process with ``PYTHONPATH=DIR/python``, interleaved
with this tree's, and the report gives both medians and their difference.
Target (issue 16): the composition adds at most 5 ms per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _child(runs: int) -> dict[str, float]:
    """Run inside the tree under test (PYTHONPATH): medians in ms per tool."""
    from saphan.confine import environment
    from saphan.confine.grants import derive
    from saphan.tools.binaries import AgentBinary
    from saphan.tools.claude import ClaudeAdapter
    from saphan.tools.codex import CodexAdapter
    from saphan.tools.instruction import Instruction

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp, "wd")
        wd.mkdir()
        run_dir = Path(tmp, "run")
        run_dir.mkdir()
        prompt = run_dir / "prompt.txt"
        prompt.write_text("the task\n")
        exe = Path(tmp, "tool")
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        os.environ.setdefault("CODEX_HOME", str(Path(tmp, "codex-home")))
        policy = derive(str(wd), return_path=str(run_dir))
        for tool, cls in (("claude", ClaudeAdapter), ("codex", CodexAdapter)):
            binary = AgentBinary(tool, str(exe), "0" * 64, "bench")
            instruction = Instruction(prompt_path=str(prompt), workdir=str(wd), model="m1")
            adapter: Any = cls(binary, instruction, "engine", "01BENCHRUN")
            xs = []
            for _ in range(runs):
                t0 = time.perf_counter()
                vendor = adapter.vendor_boundary(policy)
                prefix = vendor.prefix if vendor is not None else []
                argv = adapter.argv(policy)
                adapter.record(policy)
                adapter.guard([*prefix, *argv], agent_at=len(prefix))
                env_set = adapter.env_set() if hasattr(adapter, "env_set") else {}
                environment.build(os.environ, allow=adapter.env_allowed(),
                                  set_vars={**env_set, "TMPDIR": policy.scratch_dir})
                xs.append(time.perf_counter() - t0)
            out[tool] = statistics.median(xs) * 1000
    return out


def _measure(tree: Path, runs: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "python")}
    got = subprocess.run([sys.executable, str(HERE / "bench" / "agent_compose.py"), "--child",
                          "--runs", str(runs)], env=env, capture_output=True, text=True,
                         check=True)
    value: dict[str, float] = json.loads(got.stdout)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--baseline-tree", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.runs)))
        return
    trees = {"this tree": HERE}
    if args.baseline_tree:
        trees["baseline"] = Path(args.baseline_tree).resolve()
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(5):  # interleaved: each round measures every tree once
        for name, tree in trees.items():
            rounds[name].append(_measure(tree, args.runs))
    print(f"agent composition, median of {args.runs} in-process runs, median of 5 rounds (ms)")
    result: dict[str, dict[str, float]] = {}
    for name, rs in rounds.items():
        result[name] = {t: statistics.median(r[t] for r in rs) for t in ("claude", "codex")}
        print(f"  {name:10} claude {result[name]['claude']:.3f}  codex {result[name]['codex']:.3f}")
    if "baseline" in result:
        for t in ("claude", "codex"):
            d = result["this tree"][t] - result["baseline"][t]
            print(f"  {t}: +{d:.3f} ms over the baseline (target: at most 5 ms)")


if __name__ == "__main__":
    main()
