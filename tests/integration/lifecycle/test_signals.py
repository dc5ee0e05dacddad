"""A run's outcome is never lost when saphan itself is signalled mid-run:
SIGHUP (its terminal closed) and SIGTERM finalise the run, then saphan exits
128+N; after SIGKILL, nothing of the run outlives saphan and the NEXT command
of any kind (`saphan runs list` here) finishes the row (run/live.reconcile),
not only the next reservation on that slot. Real bubblewrap runs, a real pty
for the hangup, through the installed CLI."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan, saphan_exe
from run.test_cancel import processes_with, wait_running

pytestmark = pytest.mark.usefixtures("bwrap_available")


@pytest.fixture
def here(saphan_sqlite: Saphan) -> Saphan:
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    return saphan_sqlite


def _token() -> str:
    return f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"


def _record_file(s: Saphan, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((s.home / "runs" / run_id / "record.json").read_text())
    return data


def _finished(s: Saphan, run_id: str) -> dict[str, Any]:
    rec = s.ok("runs", "show", run_id, "--json").json()
    assert isinstance(rec, dict)
    assert rec["finished_at"] is not None and rec["signature"]["status"] == "valid", rec
    on_disk = _record_file(s, run_id)
    assert (on_disk["outcome"], on_disk["exit_code"], on_disk["finished_at"]) == (
        rec["outcome"], rec["exit_code"], rec["finished_at"])
    return rec


def test_a_closed_terminal_finalises_the_run_then_saphan_exits_129(
        here: Saphan, tmp_path: Path) -> None:
    """saphan runs with a pty as its controlling terminal; the terminal is
    closed (its master end): the kernel sends saphan SIGHUP and every later
    write to the terminal fails. The run is finalised all the same."""
    token = _token()
    master, slave = os.openpty()

    def take_terminal() -> None:  # in the child, after setsid: the pty is its terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sh", "-c", f"echo started; sleep {token}"],
        stdin=slave, stdout=slave, stderr=slave, env=here.env(), start_new_session=True,
        preexec_fn=take_terminal)
    os.close(slave)
    os.set_blocking(master, False)
    seen = b""
    try:
        run = wait_running(here)
        deadline = time.monotonic() + 10
        while b"started" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(master, 4096)
            except BlockingIOError:
                time.sleep(0.05)
        assert b"started" in seen, seen
        os.close(master)  # the terminal goes away: SIGHUP
        master = -1
        assert proc.wait(timeout=30) == 128 + signal.SIGHUP
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rec = _finished(here, run["id"])
    assert rec["outcome"] == "interrupted"
    assert "interrupted by SIGHUP" in rec["notes"]
    assert processes_with(token) == []
    shown = here.ok("runs", "show", run["id"]).out
    assert "outcome:     interrupted  exit: " in shown and "exit: -15" not in shown


def test_sigterm_finalises_the_run_then_saphan_exits_143(here: Saphan, tmp_path: Path) -> None:
    token = _token()
    proc = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sleep", token], env=here.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = wait_running(here)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "saphan: interrupted by SIGTERM; the run was finalised" in err
    rec = _finished(here, run["id"])
    # The command itself got SIGTERM (over saphan's lifeline to the launcher,
    # which passed it on): its status as the launcher reports it, 128 + 15.
    assert (rec["outcome"], rec["exit_code"]) == ("interrupted", 128 + signal.SIGTERM)
    assert any("interrupted by SIGTERM" in n for n in rec["notes"]), rec["notes"]
    assert processes_with(token) == []
    listed = here.ok("runs", "list").out.splitlines()[1]
    assert "interrupted" in listed and "-15" not in listed


def test_after_sigkill_the_next_command_of_any_kind_finishes_the_row(
        here: Saphan, tmp_path: Path) -> None:
    token = _token()
    proc = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sleep", token], env=here.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = wait_running(here)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(token) == []  # the jail died with its saphan
    # Not a reservation on that slot: a listing.
    listed = here.ok("runs", "list").out.splitlines()
    assert run["id"] in listed[1] and "holder-dead" in listed[1], listed
    rec = here.ok("runs", "show", run["id"], "--json").json()
    assert isinstance(rec, dict)
    assert rec["outcome"] == "holder-dead" and rec["signature"]["status"] == "valid"
    assert rec["notes"][-1].startswith("reconciled by `saphan runs list` at ")
    assert f"holder dead (pid {proc.pid} does not exist on " in rec["notes"][-1]
    assert rec["argv"][-1] == token  # the final record keeps what the live one said
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"


# -- a signal outside the child's output pump (review: lc_window) ---------------------

def _driven(s: Saphan, patch: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`saphan *args` in a Python process where ``patch`` (code run first)
    sends signals to saphan itself at a chosen step: deterministic, where a
    signal from outside could only hope to land in the window."""
    import sys

    code = (f"import os, signal, sys\n{patch}\nfrom saphan.cli import main\n"
            f"sys.argv = ['saphan', *{list(args)!r}]\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], env=s.env(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout


def test_a_signal_while_the_commits_are_imported_waits_for_the_record_and_the_import(
        here: Saphan, tmp_path: Path) -> None:
    """SIGHUP reaches saphan after the command exited 7, while its commits are
    imported: the import and the record complete (failed, exit 7, the branch
    made), then saphan exits 129. Before: saphan died (rc -1), the row was
    left to become holder-dead, no branch."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("x\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "base")
    patch = ("import saphan.site.local as sl\n_orig = sl._settle_worktree\n"
             "def _settle(*a, **k):\n"
             "    os.kill(os.getpid(), signal.SIGHUP)\n"
             "    return _orig(*a, **k)\n"
             "sl._settle_worktree = _settle\n")
    r = _driven(here, patch, "run", "--machine", "here", "--slot", "s1", "--repo", str(repo),
                "--", "sh", "-c", "echo made > made.txt && git add made.txt && git -c "
                "user.email=a@b -c user.name=a commit -qm made; exit 7")
    assert r.returncode == 128 + signal.SIGHUP, (r.returncode, r.stderr)
    assert "interrupted by SIGHUP after the command ended" in r.stderr
    run = here.ok("runs", "list", "--json").json()[0]  # type: ignore[index]
    rec = _finished(here, run["id"])
    assert (rec["outcome"], rec["exit_code"]) == ("failed", 7)
    assert any("saphan got SIGHUP after the command ended: the record and the import were "
               "completed first, then saphan exited 129" in n for n in rec["notes"])
    branch = f"saphan/{run['id']}"
    assert _git(repo, "branch", "--list", branch).strip().endswith(branch)
    assert _git(repo, "show", f"{branch}:made.txt") == "made\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_before_the_command_starts_means_it_does_not_start(
        here: Saphan, tmp_path: Path, sig: signal.Signals) -> None:
    """The signal lands while the run is composed (after the seat): the
    command never starts, the run is recorded interrupted, the seat freed,
    saphan exits 128+N."""
    patch = ("import saphan.site.local as sl\n_orig = sl.LocalSite.prepare\n"
             "def _prepare(self, record):\n"
             f"    os.kill(os.getpid(), {int(sig)})\n"
             "    return _orig(self, record)\n"
             "sl.LocalSite.prepare = _prepare\n")
    r = _driven(here, patch, "run", "--machine", "here", "--slot", "s1", "--workdir",
                str(tmp_path), "--", "sh", "-c", "echo ran > ran.txt")
    assert r.returncode == 128 + sig, (r.returncode, r.stderr)
    assert f"interrupted by {sig.name} before its command started" in r.stderr
    assert not (tmp_path / "ran.txt").exists()
    run = here.ok("runs", "list", "--json").json()[0]  # type: ignore[index]
    rec = _finished(here, run["id"])
    assert (rec["outcome"], rec["exit_code"]) == ("interrupted", None)
    assert any(f"interrupted by {sig.name} before its command started; it was not started"
               in n for n in rec["notes"])
    here.ok("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--", "true")


def test_a_second_signal_before_the_command_ends_a_step_that_hangs(
        here: Saphan, tmp_path: Path) -> None:
    """The first signal is noted (the run stops at the next checkpoint); a
    second one stops a step that hangs at once."""
    patch = ("import saphan.site.local as sl, time\n"
             "def _prepare(self, record):\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    time.sleep(60)\n"
             "sl.LocalSite.prepare = _prepare\n")
    t0 = time.monotonic()
    r = _driven(here, patch, "run", "--machine", "here", "--slot", "s1", "--workdir",
                str(tmp_path), "--", "true")
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr)
    assert time.monotonic() - t0 < 30
    run = here.ok("runs", "list", "--json").json()[0]  # type: ignore[index]
    assert _finished(here, run["id"])["outcome"] == "interrupted"


# -- a signal while bubblewrap sets its sandbox up (review: the jail outlived its run) --

def _children_of(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_during_the_sandbox_set_up_leaves_nothing_running(
        here: Saphan, tmp_path: Path, sig: int) -> None:
    """The signal lands a few milliseconds after bubblewrap started, at
    delays spread over its set-up (before the fix, 17 of 28 such shots left
    the inner bubblewrap, the launcher and the command running after the run
    was recorded: the outer bubblewrap died before the inner one had armed
    its parent-death signal). Saphan's lifeline to the launcher ends with
    saphan's interest in the run (or saphan itself): whatever got started
    kills the command, or never starts it. A shot that misses the window
    passes the same checks."""
    for i in range(12):
        token = _token() + str(i)
        proc = subprocess.Popen(
            [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir",
             str(tmp_path), "--", "sleep", token], env=here.env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not any(token.encode() in _cmdline(c) for c in _children_of(proc.pid)):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.0002)
            time.sleep(0.0005 * (i % 8))
            proc.send_signal(sig)
            proc.wait(timeout=60)
            deadline = time.monotonic() + 5
            while processes_with(token) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert processes_with(token) == [], f"shot {i}: the run's processes outlived it"
            if sig == signal.SIGTERM:
                rec = here.ok("runs", "show", "last", "--json").json()
                assert isinstance(rec, dict) and rec["outcome"] == "interrupted", rec
                if any("started nothing" in n for n in rec["notes"]):
                    # the launcher ran nothing: no status is claimed (review)
                    assert rec["exit_code"] is None, rec
        finally:
            proc.kill()
            proc.wait()
            for pid in processes_with(token):  # what a failed shot left
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert json.loads(here.ok("runs", "list", "--state", "live", "--json").out) == []
