"""Batches end to end (batch/worker.py with batch/child.py), through the real
CLI and real bubblewrap runs on this host's slots.

Every task is a command that marks itself live in a shared witness
directory, sleeps, marks itself done (``mkdir done/ID``: a second run of a
task finds it and leaves ``dup/ID``), then unmarks itself. An independent
witness thread counts the live marks while the batch works.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import PgServer, Saphan, saphan_exe

pytestmark = pytest.mark.usefixtures("bwrap_available")

#: $1 is the task's id; the mark "done" is made at the end of the sleep
TASK = ('mkdir -p live done dup && : > "live/$1" && sleep "$2" && '
        '{ mkdir "done/$1" 2>/dev/null || : > "dup/$1"; } && rm -f "live/$1"')


def _fleet(s: Saphan, seats: dict[str, int]) -> None:
    s.ok("machine", "add", "here", "--local")
    for name, n in seats.items():
        s.ok("slot", "add", "here", name, "--tool", "command", "--max-sessions", str(n))


def _batch_file(path: Path, wd: Path, n: int, sleep: float) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i:02d}", "workdir": str(wd),
                                "command": ["sh", "-c", TASK, "task", f"t{i:02d}",
                                            str(sleep)]}) + "\n")
    return path


class Witness:
    """Counts the live marks every 5 ms, from outside every run."""

    def __init__(self, wd: Path):
        self.wd, self.most, self.seen = wd, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                n = len(os.listdir(self.wd / "live"))
            except FileNotFoundError:
                n = 0
            self.most = max(self.most, n)
            self.seen += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _report(s: Saphan, batch_id: str) -> dict[str, Any]:
    r = s.ok("batch", "show", batch_id, "--json")
    value = json.loads(r.out)
    assert isinstance(value, dict)
    return value


def _start(s: Saphan, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([saphan_exe(), "batch", *args], env=s.env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _batch_id(p: subprocess.Popen[str]) -> str:
    """The id `batch run` says first on stderr."""
    assert p.stderr is not None
    first = p.stderr.readline()
    assert first.startswith("batch "), first
    return first.split()[1].rstrip(":")


def _wait(cond: Any, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.05)


def _marks(wd: Path, kind: str) -> list[str]:
    try:
        return sorted(os.listdir(wd / kind))
    except FileNotFoundError:
        return []


def test_forty_tasks_on_six_seats_run_each_exactly_once(saphan_sqlite: Saphan,
                                                       tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 2, "b": 3, "c": 1})
    wd = tmp_path / "wd"
    wd.mkdir()
    path = _batch_file(tmp_path / "b.jsonl", wd, 40, 0.4)
    witness = Witness(wd)
    try:
        r = s("batch", "run", str(path), "--json", timeout=300)
    finally:
        witness.stop()
    assert r.code == 0, r.err
    report = json.loads(r.out)
    tasks = report["tasks"]
    assert [t["id"] for t in tasks] == [f"t{i:02d}" for i in range(40)]
    assert {t["state"] for t in tasks} == {"done"}
    assert {(t["outcome"], t["exit_code"]) for t in tasks} == {("exited", 0)}
    assert report["states"] == {"done": 40} and report["outcomes"] == {"exited": 40}
    assert len({t["run_id"] for t in tasks}) == 40
    assert {t["slot"] for t in tasks} <= {"a", "b", "c"}
    assert all(t["attempts"] == 1 and t["earlier_runs"] == [] for t in tasks)
    # every outcome shown is read from a record that verifies with the key
    assert {t["signature"] for t in tasks} == {"valid"} and report["all_exited"]
    # exactly once: every task marked done once, none twice
    assert _marks(wd, "done") == [f"t{i:02d}" for i in range(40)]
    assert _marks(wd, "dup") == []
    # the witness never saw more than the 6 seats live, and saw them shared
    assert witness.seen > 100
    assert 2 <= witness.most <= 6, witness.most
    # each run is in the store as the task says
    run = json.loads(s.ok("runs", "show", tasks[7]["run_id"], "--json").out)
    assert run["outcome"] == "exited" and run["cast"]["tool"] == "command"
    assert run["argv"][-2] == "t07"


def test_sigint_stops_the_batch_and_resume_runs_the_rest_only(saphan_sqlite: Saphan,
                                                             tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 2})
    wd = tmp_path / "wd"
    wd.mkdir()
    path = _batch_file(tmp_path / "b.jsonl", wd, 10, 1.5)
    p = _start(s, "run", str(path), "--json")
    batch_id = _batch_id(p)
    # two finished, two running: then Ctrl-C
    _wait(lambda: len(_marks(wd, "done")) >= 2 and len(_marks(wd, "live")) >= 2,
          "two tasks done and two running")
    before = _marks(wd, "done")
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert f"saphan batch resume {batch_id}" in err
    report = json.loads(out)
    states = {t["id"]: t["state"] for t in report["tasks"]}
    assert "claimed" not in states.values()
    done_ids = sorted(i for i, st in states.items() if st == "done")
    assert done_ids == _marks(wd, "done"), (
        done_ids, _marks(wd, "done"),
        [t for t in report["tasks"] if t["state"] == "done" and t["id"] not in _marks(wd, "done")])
    assert len(done_ids) >= len(before)
    # the tasks running at Ctrl-C went back to pending, their runs recorded interrupted
    back = [t for t in report["tasks"] if t["earlier_runs"]]
    assert back, report["tasks"]
    for t in back:
        assert t["state"] == "pending"
        run = json.loads(s.ok("runs", "show", t["earlier_runs"][-1], "--json").out)
        assert run["outcome"] == "interrupted", run
    # nothing live is left behind: no seat held, no process running a task
    assert json.loads(s.ok("runs", "list", "--state", "live", "--json").out) == []
    assert _marks(wd, "live") == [] or all(
        i not in done_ids for i in _marks(wd, "live"))
    r = s("batch", "resume", batch_id, "--json", timeout=300)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert {(t["state"], t["outcome"]) for t in report["tasks"]} == {("done", "exited")}
    assert _marks(wd, "done") == [f"t{i:02d}" for i in range(10)]
    assert _marks(wd, "dup") == []  # what finished before Ctrl-C never ran again
    resumed = {t["id"] for t in report["tasks"] if t["attempts"] > 1}
    assert {t["id"] for t in back} <= resumed
    assert not resumed & set(done_ids)


def test_on_sqlite_one_process_works_a_batch(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    wd = tmp_path / "wd"
    wd.mkdir()
    p = _start(s, "run", str(_batch_file(tmp_path / "b.jsonl", wd, 3, 1.0)))
    try:
        batch_id = _batch_id(p)
        r = s("batch", "work", batch_id)
        assert r.code == 2, r.err
        assert f"batch {batch_id} is being worked by another process" in r.err
        assert "on SQLite one process works a batch" in r.err
    finally:
        p.communicate(timeout=120)
    assert p.returncode == 0
    assert _marks(wd, "done") == ["t00", "t01", "t02"]


def test_a_bad_batch_file_writes_nothing(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    path = tmp_path / "b.jsonl"
    path.write_text('{"command": ["true"]}\n{"command": "true"}\n')
    r = s("batch", "run", str(path))
    assert r.code == 2
    assert f"{path}:2: a command task needs 'command'" in r.err
    assert json.loads(s.ok("batch", "list", "--json").out) == []
    assert json.loads(s.ok("runs", "list", "--json").out) == []


def test_a_task_that_cannot_be_run_ends_as_error_and_the_rest_run(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    wd = tmp_path / "wd"
    wd.mkdir()
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (
        {"id": "gone", "workdir": str(tmp_path / "missing"), "command": ["true"]},
        {"id": "nothing", "tool": "command", "command": ["true"], "labels": {"zone": "mars"},
         "workdir": str(wd)},
        {"id": "ok", "command": ["true"], "workdir": str(wd)},
    )) + "\n")
    r = s("batch", "run", str(path), "--json")
    assert r.code == 1, r.err
    tasks = {t["id"]: t for t in json.loads(r.out)["tasks"]}
    assert tasks["ok"]["outcome"] == "exited"
    assert tasks["nothing"]["outcome"] == "refused"
    assert tasks["nothing"]["refusal_class"] == "no-eligible-slot"
    gone = tasks["gone"]
    assert gone["state"] == "done" and gone["run_id"] is not None
    # a working directory that does not exist: refused or an error, never run
    assert gone["outcome"] in ("refused", "error"), gone
    assert gone["outcome"] != "error" or "missing" in (gone["error"] or "")


# -- PostgreSQL: several workers ----------------------------------------------------

@pytest.fixture
def saphan_pg(home: Path, pg_server: PgServer) -> Iterator[Saphan]:
    name = f"batch{os.getpid()}_{int(time.time() * 1000) % 10_000_000}"
    pg_server.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_server.url(name))
    yield s


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_two_postgres_workers_share_a_batch_and_recover_a_killed_one(
        saphan_pg: Saphan, tmp_path: Path) -> None:
    s = saphan_pg
    _fleet(s, {"a": 2, "b": 2})
    wd = tmp_path / "wd"
    wd.mkdir()
    # 3 s: the kill lands mid-sleep even on a loaded machine (at 1 s it once
    # landed between a task's end and its record: run again, it ran twice)
    path = _batch_file(tmp_path / "b.jsonl", wd, 16, 3.0)
    witness = Witness(wd)
    first = _start(s, "run", str(path), "--json")
    batch_id = _batch_id(first)
    second = _start(s, "work", batch_id, "--json")
    try:
        # the second worker has a task whose run holds a seat: kill it and its child
        def seated() -> dict[str, Any] | None:
            for t in _report(s, batch_id)["tasks"]:
                if (t["state"] == "claimed" and t["machine"]
                        and (t["worker"] or {}).get("pid") == second.pid):
                    return t
            return None

        _wait(lambda: seated() is not None, "the second worker's task on a seat")
        victim = seated()
        assert victim is not None
        # frozen, it claims nothing more; then it and its children die at once
        os.kill(second.pid, signal.SIGSTOP)
        held = [t["id"] for t in _report(s, batch_id)["tasks"]
                if t["state"] == "claimed" and (t["worker"] or {}).get("pid") == second.pid]
        kids = _children(second.pid)
        os.kill(second.pid, signal.SIGKILL)
        for k in kids:  # its children (saphan run for one task each), in sessions of their own
            os.killpg(k, signal.SIGKILL)
        # a killed task never removes its live mark: the witness would count
        # it while the task waits to be claimed again
        for i in held:
            (wd / "live" / i).unlink(missing_ok=True)
        second.communicate(timeout=30)
        out, err = first.communicate(timeout=300)
    finally:
        witness.stop()
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert first.returncode == 0, err
    report = json.loads(out)
    tasks = {t["id"]: t for t in report["tasks"]}
    assert {(t["state"], t["outcome"]) for t in tasks.values()} == {("done", "exited")}
    assert _marks(wd, "dup") == []  # no task ran twice to its end
    assert _marks(wd, "done") == sorted(tasks)
    assert witness.most <= 4
    # the killed worker's task was recovered: its first run ended holder-dead
    # (or, had the kill come after that run ended, concluded from its row)
    v = tasks[victim["id"]]
    if v["earlier_runs"]:
        assert v["attempts"] == 2 and v["earlier_runs"] == [victim["run_id"]]
        dead = json.loads(s.ok("runs", "show", victim["run_id"], "--json").out)
        assert dead["outcome"] == "holder-dead", dead
        assert v["run_id"] != victim["run_id"]
    else:
        assert v["run_id"] == victim["run_id"]
    # both workers ran tasks
    assert len({t["run_id"] for t in tasks.values()}) == 16


def test_a_module_a_run_plants_in_the_default_workdir_is_never_imported(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """A task without a directory runs in the one `batch run` started in; a
    run may write a Python module there. The next task's child (an
    interpreter outside every jail) must not import it: it starts in the
    workspace, without the current directory on its path."""
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    wd = tmp_path / "wd"
    wd.mkdir()
    pwned = tmp_path / "pwned"
    plant = "; ".join(f"printf 'open(%s, \"w\")\\n' \"'{pwned}'\" > {m}.py"
                      for m in ("json", "signal", "subprocess", "saphan"))
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (
        {"id": "plant", "command": ["sh", "-c", plant]},
        {"id": "next", "command": ["true"]},
        {"id": "last", "command": ["true"]})) + "\n")
    r = s("batch", "run", str(path), "--json", cwd=str(wd))
    assert r.code == 0, r.err
    assert (wd / "json.py").exists()  # the run did write it, in its own directory
    assert not pwned.exists()


@pytest.mark.parametrize("stopping", [True, False])
def test_a_child_that_exits_1_while_stopping_gives_its_task_back(engine_ctx: Any,
                                                                 stopping: bool) -> None:
    """Told SIGINT while Python was still starting, a child dies of
    KeyboardInterrupt with status 1 (CI caught it: the task was done as an
    error, never run). While the batch stops that is a stopped task, given
    back; otherwise an unexplained status 1 is the task's error."""
    import sys

    from saphan.batch import worker
    from saphan.liveness import current_holder
    from saphan.store.rows import Batch

    store = engine_ctx.store
    store.add_batch(Batch("B1", "2024-01-01T00:00:00.000000Z", "/src/b.jsonl", "0" * 64, 1),
                    [("t0", json.dumps({"tool": "command", "command": ["true"]}), "sig")])
    t = store.claim_task("B1", "RUN1", current_holder().as_tuple())
    assert t is not None
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write("
                             "'KeyboardInterrupt\\n'); sys.exit(1)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    err = proc.communicate()[1]
    child = worker._Child(t, proc, err=bytearray(err))
    events: list[Any] = []
    worker._reaped(engine_ctx, child, stopping, events.append, worker._Loop())
    got = store.get_task("B1", 0)
    assert got is not None
    if stopping:
        assert (got.state, got.outcome) == ("pending", None)
        assert got.error == "no run was made: its child exited 1"
        assert [e.kind for e in events] == ["requeued"]
    else:
        assert (got.state, got.outcome) == ("done", "error")
        assert got.error == "its process exited 1: KeyboardInterrupt"


def test_double_ctrl_c_three_times_then_every_task_runs_once(saphan_sqlite: Saphan,
                                                             tmp_path: Path) -> None:
    """Two signals at once kill the children (SIGKILL); the worker ends their
    runs holder-dead and gives their tasks back before it returns, and stops
    never use up a task's attempts (review: a third stopped claim ended its
    task done, never run; a second Ctrl-C left tasks claimed)."""
    s = saphan_sqlite
    _fleet(s, {"a": 2})
    wd = tmp_path / "wd"
    wd.mkdir()
    path = _batch_file(tmp_path / "b.jsonl", wd, 3, 2.0)
    batch_id = ""
    for round_ in range(3):
        p = _start(s, "run", str(path), "--json") if round_ == 0 else \
            _start(s, "resume", batch_id, "--json")
        if round_ == 0:
            batch_id = _batch_id(p)
        _wait(lambda: len(_marks(wd, "live")) >= 2, "two tasks running")
        # two signals before the worker's next turn (two of one kind would
        # be merged while pending): it goes straight to SIGKILL
        os.kill(p.pid, signal.SIGINT)
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        states = {t["id"]: (t["state"], t["attempts"]) for t in json.loads(out)["tasks"]}
        assert all(st != "claimed" for st, _ in states.values()), states
        assert _marks(wd, "done") == [], states  # killed mid-sleep: none finished
        assert json.loads(s.ok("runs", "list", "--state", "live", "--json").out) == []
        for f in (wd / "live").iterdir():
            f.unlink()  # the killed tasks' marks
    r = s("batch", "resume", batch_id, "--json", timeout=300)
    assert r.code == 0, r.err
    tasks = json.loads(r.out)["tasks"]
    assert {(t["state"], t["outcome"]) for t in tasks} == {("done", "exited")}, tasks
    assert max(t["attempts"] for t in tasks) > 3  # stopped claims counted, never fatal
    assert _marks(wd, "done") == ["t00", "t01", "t02"] and _marks(wd, "dup") == []
