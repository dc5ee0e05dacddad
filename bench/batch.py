"""Batch throughput: `saphan batch run FILE --json` against shell loops of
`saphan run`, same workspace, same fleet, same run (medians, rotated order).

    python3 bench/batch.py [--tasks 200] [--reps 3] [--slots 2] [--seats 4]
                           [--sleep S] [--no-parallel-baseline] [--quick]

The fleet is one local machine (``here``, bubblewrap) with ``--slots``
command slots of ``--seats`` seats each (default 2 x 4 = 8 seats), in a
throw-away workspace (``saphan init``, SQLite) under a temp dir, removed at
the end. Every task is ``/bin/true`` in one working directory (with
``--sleep S``: ``sleep S``, to see how many tasks overlap). Cases:

  batch   one batch file of TASKS command tasks ({"command": ["/bin/true"],
          "workdir": W}), worked by `saphan batch run FILE --json` (one
          process: it claims each task and starts it as a child that casts
          it on the fleet, docs/fleet.md#batches). Its report is checked:
          every task done, outcome exited, every record verified.
  loop    the baseline: one shell loop of TASKS sequential
          `saphan run --machine here --slot S --workdir W -- /bin/true`
          (a named slot; exit 1 on the first run that does not exit 0).
  loops   the parallel baseline (unless --no-parallel-baseline): one shell
          loop per seat (8), started together, TASKS/8 runs each; loop i uses
          slot i mod SLOTS, so no slot is ever over its seats.

Wall time is from starting the case's processes to the last one's exit
(saphan's own interpreter start-up included: that is what a user waits
for). Reported per case: the median wall time over ``--reps`` and runs/s;
the ratios are batch runs/s divided by the baseline's (above 1: the batch
is faster). Also per case the CPU time (user + system of every process it
started, reaped: getrusage(RUSAGE_CHILDREN)) per run, which a busy
neighbour moves much less than wall time, and the load average after each
sample. For the batch, also the most runs that overlapped and the median
gap between consecutive run starts (from the report's started_at and
elapsed_seconds), and the slots used.

Bytecode: the subprocesses run with PYTHONPYCACHEPREFIX set to a directory
in the temp dir (and PYTHONDONTWRITEBYTECODE unset for them), so every case
imports saphan from compiled bytecode as an installed package does, and
nothing is written into the source tree; one warm-up of each case (4
tasks) fills it before anything is timed. Defaults take about 8 minutes
on 2 cores; ``--quick`` (40 tasks, 1 rep) about 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

MACHINE = "here"
TIMEOUT = 3600.0


def _saphan() -> str:
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    found = scripts if os.path.exists(scripts) else shutil.which("saphan")
    if found is None:
        sys.exit("needs the saphan package installed (run ci/setup)")
    return found


class Bench:
    def __init__(self, root: Path, saphan: str, slots: int, seats: int, sleep: float):
        self.root, self.saphan = root, saphan
        self.slots = [f"s{i + 1}" for i in range(slots)]
        self.seats = seats
        self.home, self.wd = root / "home", root / "wd"
        self.wd.mkdir()
        env = dict(os.environ, SAPHAN_HOME=str(self.home),
                   XDG_STATE_HOME=str(root / "state"),
                   PYTHONPYCACHEPREFIX=str(root / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env = env
        true = shutil.which("true") or "/bin/true"
        self.argv = [true] if sleep <= 0 else [shutil.which("sleep") or "/bin/sleep", f"{sleep:g}"]
        self.n = 0

    def cli(self, *argv: str) -> str:
        p = subprocess.run([self.saphan, *argv], env=self.env, capture_output=True, text=True,
                           timeout=TIMEOUT)
        if p.returncode != 0:
            raise SystemExit(f"saphan {' '.join(argv)} exited {p.returncode}:\n"
                             f"{p.stdout}{p.stderr}")
        return p.stdout

    def setup(self) -> None:
        self.cli("init")
        self.cli("machine", "add", MACHINE, "--local")
        for s in self.slots:
            self.cli("slot", "add", MACHINE, s, "--tool", "command",
                     "--max-sessions", str(self.seats))

    def _file(self, tasks: int) -> Path:
        self.n += 1
        path = self.root / f"batch-{self.n}.jsonl"
        with open(path, "w") as f:
            for i in range(tasks):
                f.write(json.dumps({"id": f"t{i + 1}", "command": self.argv,
                                    "workdir": str(self.wd)}) + "\n")
        return path

    def batch(self, tasks: int) -> tuple[float, dict[str, Any]]:
        path = self._file(tasks)
        err = self.root / f"batch-{self.n}.stderr"
        with open(err, "wb") as e:
            t0 = time.perf_counter()
            p = subprocess.run([self.saphan, "batch", "run", str(path), "--json"], env=self.env,
                               stdout=subprocess.PIPE, stderr=e, timeout=TIMEOUT)
            wall = time.perf_counter() - t0
        if p.returncode != 0:
            tail = err.read_text(errors="replace").splitlines()[-20:]
            raise SystemExit(f"saphan batch run exited {p.returncode}; stdout:\n"
                             f"{p.stdout.decode(errors='replace')[-4000:]}\nstderr (last lines):\n"
                             + "\n".join(tail))
        report = json.loads(p.stdout)
        if (report["states"] != {"done": tasks} or report["outcomes"] != {"exited": tasks}
                or report.get("all_exited") is False):
            raise SystemExit(f"batch {report['batch']}: states {report['states']}, "
                             f"outcomes {report['outcomes']}, all_exited "
                             f"{report.get('all_exited')} (wanted {tasks} done, exited)")
        return wall, _shape(report)

    def _loop_script(self, runs: int, slot: str) -> list[str]:
        script = ('n=$1 log=$2; shift 2; for i in $(seq "$n"); do "$@" >/dev/null 2>"$log" '
                  '|| { echo "run $i exited $?" >&2; cat "$log" >&2; exit 1; }; done')
        log = str(self.root / f"loop-{slot}-{os.urandom(4).hex()}.stderr")
        return ["bash", "-c", script, "loop", str(runs), log, self.saphan, "run", "--machine",
                MACHINE, "--slot", slot, "--workdir", str(self.wd), "--", *self.argv]

    def loops(self, counts: list[int]) -> float:
        """Shell loops started together, loop i on slot i mod slots."""
        t0 = time.perf_counter()
        procs = [subprocess.Popen(self._loop_script(k, self.slots[i % len(self.slots)]),
                                  env=self.env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
                 for i, k in enumerate(counts) if k > 0]
        errors = []
        for p in procs:
            _, err = p.communicate(timeout=TIMEOUT)
            if p.returncode != 0:
                errors.append(err.decode(errors="replace"))
        wall = time.perf_counter() - t0
        if errors:
            raise SystemExit("a baseline loop failed:\n" + "\n".join(errors))
        return wall


def _shape(report: dict[str, Any]) -> dict[str, Any]:
    """The most runs that overlapped, the median gap between one run's start
    and the next's, and the slots used (from the report)."""
    edges: list[tuple[float, int]] = []
    starts: list[float] = []
    slots: dict[str, int] = {}
    for t in report["tasks"]:
        start = datetime.fromisoformat(t["started_at"].replace("Z", "+00:00")).timestamp()
        edges += [(start, 1), (start + (t["elapsed_seconds"] or 0.0), -1)]
        starts.append(start)
        key = f"{t['machine']}/{t['slot']}"
        slots[key] = slots.get(key, 0) + 1
    live = peak = 0
    for _, d in sorted(edges, key=lambda e: (e[0], e[1])):
        live += d
        peak = max(peak, live)
    run_s = [t["elapsed_seconds"] for t in report["tasks"] if t["elapsed_seconds"] is not None]
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return {"peak_overlap": peak, "slots": slots,
            "start_gap_median_s": round(statistics.median(gaps), 4) if gaps else None,
            "run_elapsed_median_s": round(statistics.median(run_s), 4) if run_s else None}


def _what(args: argparse.Namespace) -> str:
    return "/bin/true" if args.sleep <= 0 else f"sleep {args.sleep:g}"


def _split(total: int, ways: int) -> list[int]:
    return [total // ways + (1 if i < total % ways else 0) for i in range(ways)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=None, help="tasks per case (default 200)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    ap.add_argument("--slots", type=int, default=2, help="command slots on the machine")
    ap.add_argument("--seats", type=int, default=4, help="seats per slot (--max-sessions)")
    ap.add_argument("--sleep", type=float, default=0.0, metavar="S",
                    help="tasks run `sleep S` instead of /bin/true")
    ap.add_argument("--no-parallel-baseline", action="store_true",
                    help="leave out the one-loop-per-seat baseline")
    ap.add_argument("--quick", action="store_true", help="40 tasks, 1 rep")
    args = ap.parse_args()
    tasks = args.tasks or (40 if args.quick else 200)
    reps = args.reps or (1 if args.quick else 3)
    if tasks < 1 or reps < 1 or args.slots < 1 or args.seats < 1 or args.sleep < 0:
        ap.error("--tasks, --reps, --slots and --seats must be at least 1, --sleep >= 0")
    seats = args.slots * args.seats
    saphan = _saphan()
    if shutil.which("bwrap") is None:
        sys.exit("needs bubblewrap (run ci/setup)")

    import saphan as pkg

    print(f"bench/batch: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"saphan {pkg.__version__} from {Path(pkg.__file__).parent} ({saphan}); "
          f"{tasks} tasks of {_what(args)} on {args.slots} slots x {args.seats} seats = {seats} "
          f"seats, {reps} rep{'s' if reps != 1 else ''}", flush=True)
    cases = ["batch", "loop"] + ([] if args.no_parallel_baseline else ["loops"])
    walls: dict[str, list[float]] = {c: [] for c in cases}
    cpus: dict[str, list[float]] = {c: [] for c in cases}
    shapes: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="saphan-bench-batch-"))
    t_begin = time.time()
    try:
        b = Bench(root, saphan, args.slots, args.seats, args.sleep)
        b.setup()

        def one(case: str, n: int) -> float:
            if case == "batch":
                wall, shape = b.batch(n)
                shapes.append(shape)
                return wall
            if case == "loop":
                return b.loops([n])
            return b.loops(_split(n, seats))

        for case in cases:  # warm-up: bytecode, page cache, the store's first pages
            one(case, 4)
        shapes.clear()
        for r in range(reps):
            k = r % len(cases)
            for case in cases[k:] + cases[:k]:
                cpu0 = _child_cpu()
                wall = one(case, tasks)
                cpu = _child_cpu() - cpu0
                walls[case].append(wall)
                cpus[case].append(cpu)
                print(f"  rep {r + 1}: {case:<5} {wall:7.2f} s  {tasks / wall:6.2f} runs/s  "
                      f"CPU {cpu / tasks * 1000:5.0f} ms/run  load {os.getloadavg()[0]:.2f}",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _report(walls, cpus, shapes, tasks, reps, seats, args, time.time() - t_begin)


def _child_cpu() -> float:
    """User + system CPU seconds of every reaped descendant so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _report(walls: dict[str, list[float]], cpus: dict[str, list[float]],
            shapes: list[dict[str, Any]], tasks: int, reps: int, seats: int,
            args: argparse.Namespace, total: float) -> None:
    names = {"batch": "saphan batch run --json", "loop": f"shell loop, {tasks} x saphan run",
             "loops": f"{seats} shell loops in parallel"}
    med = {c: statistics.median(w) for c, w in walls.items()}
    rate = {c: tasks / m for c, m in med.items()}
    print(f"\n{tasks} tasks of {_what(args)}, {seats} seats; medians of {reps}")
    cpu = {c: statistics.median(x) / tasks * 1000 for c, x in cpus.items()}
    hdr = (f"{'case':<34} {'wall s':>8} {'min':>8} {'max':>8} {'runs/s':>8} {'batch x':>8} "
           f"{'CPU ms/run':>10}")
    print(hdr)
    print("-" * len(hdr))
    for c in walls:
        print(f"{names[c]:<34} {med[c]:>8.2f} {min(walls[c]):>8.2f} {max(walls[c]):>8.2f} "
              f"{rate[c]:>8.2f} {rate['batch'] / rate[c]:>8.2f} {cpu[c]:>10.0f}")
    peaks = [s["peak_overlap"] for s in shapes]
    run_s = [s["run_elapsed_median_s"] for s in shapes if s["run_elapsed_median_s"] is not None]
    slots: dict[str, int] = {}
    for s in shapes:
        for k, v in s["slots"].items():
            slots[k] = slots.get(k, 0) + v
    gaps = [s["start_gap_median_s"] for s in shapes if s["start_gap_median_s"] is not None]
    print(f"\nbatch: most runs overlapping {max(peaks)} (per rep: {peaks}); median run "
          f"{statistics.median(run_s) * 1000:.0f} ms (the run row's start to end); median gap "
          f"between consecutive run starts "
          f"{statistics.median(gaps) * 1000 if gaps else float('nan'):.0f} ms; tasks per slot "
          f"over all reps {slots}")
    print("'batch x' = batch runs/s / the case's runs/s (above 1: the batch is faster); "
          "CPU: user + system of every process the case started, per run (median). "
          f"Wall {total:.0f} s; load average now {os.getloadavg()[0]:.2f}")
    print(json.dumps({
        "bench": "batch", "tasks": tasks, "reps": reps, "slots": args.slots,
        "seats_per_slot": args.seats, "seats": seats, "command": _what(args),
        "quick": args.quick,
        "cases": {c: {"wall_s": round(med[c], 3), "runs_per_s": round(rate[c], 3),
                      "samples_s": [round(w, 3) for w in walls[c]],
                      "cpu_ms_per_run": round(cpu[c], 1)} for c in walls},
        "ratios": {f"batch_vs_{c}": round(rate["batch"] / rate[c], 3)
                   for c in walls if c != "batch"},
        "batch_peak_overlap": peaks, "batch_slots": slots,
        "batch_run_median_s": round(statistics.median(run_s), 4) if run_s else None,
        "batch_start_gap_median_s": round(statistics.median(gaps), 4) if gaps else None,
        "wall_s": round(total, 1)}))


if __name__ == "__main__":
    main()
