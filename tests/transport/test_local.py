"""transport/local.py: the stdin pipe and the engine's watchdog, directly.

The watchdog is the backstop behind a tool's own budgets: a child still
running at ``time_limit`` is SIGKILLed, and output is read for at most
KILL_GRACE more seconds even when a grandchild still holds the pipes — so
``run`` returns, whatever the child left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from saphan.errors import Interrupted
from saphan.transport import local


def test_stdin_bytes_arrive_then_eof(tmp_path: Path) -> None:
    done = local.run(["sh", "-c", "cat; echo; cat /proc/self/environ | grep -c sk-piped || true"],
                     cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                     stdin_bytes=b"sk-piped-secret-0123456789", env={"PATH": "/usr/bin:/bin"})
    out = Path(done.stdout_path).read_text().splitlines()
    assert done.exit_code == 0 and not done.killed_at_limit
    assert out[0] == "sk-piped-secret-0123456789"  # then EOF: cat returned
    assert out[1] == "0"  # nothing rode the environment


def test_time_limit_kills_the_child(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = local.run(["sleep", "30"], cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                     time_limit=1.0)
    took = time.monotonic() - t0
    # SIGTERM first (a reaper passes it on and ends the tree); sleep ends on it
    assert done.killed_at_limit and done.exit_code == -15
    assert 1.0 <= took < 1.0 + local.KILL_GRACE + 2, took


def test_time_limit_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = local.run(["sh", "-c", "trap '' TERM; sleep 30"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False, time_limit=1.0)
    took = time.monotonic() - t0
    assert done.killed_at_limit and done.exit_code == -9
    assert 1.0 + local.TERM_GRACE <= took < 1.0 + local.TERM_GRACE + local.KILL_GRACE + 2, took


def test_time_limit_does_not_wait_for_a_grandchild_holding_the_pipes(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = local.run(["sh", "-c", "setsid sleep 20 & echo started; sleep 30"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False, time_limit=1.0)
    took = time.monotonic() - t0
    assert done.killed_at_limit
    assert Path(done.stdout_path).read_text() == "started\n"
    assert took < 1.0 + local.KILL_GRACE + 2, took


def test_no_limit_means_no_kill(tmp_path: Path) -> None:
    done = local.run(["sh", "-c", "sleep 1; echo ok"], cwd=str(tmp_path), run_dir=str(tmp_path),
                     stream=False)
    assert done.exit_code == 0 and not done.killed_at_limit
    assert Path(done.stdout_path).read_text() == "ok\n"


def test_set_dumpable_reports_and_restores() -> None:
    assert local.set_dumpable(False) is True
    try:
        assert local.set_dumpable(False) is False
    finally:
        assert local.set_dumpable(True) is False
    assert local.set_dumpable(True) is True


def test_the_libc_fallback_agrees_with_the_native_one() -> None:
    """Where saphan's native extension is absent (the loop's zipapp on a
    runner), prctl goes through libc: the same answers."""
    from saphan import _native

    assert local._set_dumpable_libc(False) is True
    try:
        assert _native.set_dumpable(False) is False  # the kernel's own state, read natively
        assert local._set_dumpable_libc(False) is False
    finally:
        assert local._set_dumpable_libc(True) is False
    assert _native.set_dumpable(True) is True


def test_runs_from_a_worker_thread(tmp_path: Path) -> None:
    """An embedding program may run from a worker thread, where signal
    handlers cannot be set: nothing is installed there, and the run works."""
    got: list[local.Finished] = []
    t = threading.Thread(target=lambda: got.append(local.run(
        ["sh", "-c", "echo from a thread"], cwd=str(tmp_path), run_dir=str(tmp_path),
        stream=False)))
    t.start()
    t.join(30)
    assert got and got[0].exit_code == 0
    assert Path(got[0].stdout_path).read_text() == "from a thread\n"


# -- stdin, output and the status channel ----------------------------------------------------

def test_stdin_is_dev_null_or_the_prompt_file(tmp_path: Path) -> None:
    done = local.run(["cat"], cwd=str(tmp_path), run_dir=str(tmp_path), stream=False)
    assert done.exit_code == 0 and Path(done.stdout_path).read_bytes() == b""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the task, never on a command line\n")
    done = local.run(["cat"], cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                     stdin_path=str(prompt))
    assert Path(done.stdout_path).read_text() == "the task, never on a command line\n"


def test_stdin_bytes_must_fit_one_pipe_buffer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="limited to 4096 bytes"):
        local.run(["cat"], cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                  stdin_bytes=b"x" * 4097)
    done = local.run(["wc", "-c"], cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                     stdin_bytes=b"x" * 4096)
    assert Path(done.stdout_path).read_text().strip() == "4096"


def test_output_is_logged_apart_and_streamed_when_asked(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    argv = ["sh", "-c", "echo out-1; echo err-1 >&2; echo out-2; exit 4"]
    done = local.run(argv, cwd=str(tmp_path), run_dir=str(tmp_path), stream=True)
    assert done.exit_code == 4 and done.status_path is None
    assert done.stdout_path == str(tmp_path / "stdout.log")
    assert done.stderr_path == str(tmp_path / "stderr.log")
    assert Path(done.stdout_path).read_bytes() == b"out-1\nout-2\n"
    assert Path(done.stderr_path).read_bytes() == b"err-1\n"
    seen = capfdbinary.readouterr()
    assert seen.out == b"out-1\nout-2\n" and seen.err == b"err-1\n"
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    local.run(argv, cwd=str(tmp_path), run_dir=str(quiet), stream=False)
    assert capfdbinary.readouterr() == (b"", b"")
    assert (quiet / "stdout.log").read_bytes() == b"out-1\nout-2\n"


def test_term_out_and_term_err_stand_in_for_the_terminal(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """A view (run/view.py) gets what the terminal would have; the logs
    still get every byte; without streaming nothing is shown at all."""
    import io

    argv = ["sh", "-c", "echo out-1; echo err-1 >&2; printf out-2"]
    out, err = io.BytesIO(), io.BytesIO()
    local.run(argv, cwd=str(tmp_path), run_dir=str(tmp_path), term_out=out, term_err=err)
    assert (out.getvalue(), err.getvalue()) == (b"out-1\nout-2", b"err-1\n")
    assert capfdbinary.readouterr() == (b"", b"")
    assert (tmp_path / "stdout.log").read_bytes() == b"out-1\nout-2"
    assert (tmp_path / "stderr.log").read_bytes() == b"err-1\n"
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    out, err = io.BytesIO(), io.BytesIO()
    local.run(argv, cwd=str(tmp_path), run_dir=str(quiet), stream=False, term_out=out,
              term_err=err)
    assert (out.getvalue(), err.getvalue()) == (b"", b"")
    assert (quiet / "stdout.log").read_bytes() == b"out-1\nout-2"


def test_the_status_channel_is_kept_apart_from_the_output(tmp_path: Path) -> None:
    done = local.run(["sh", "-c", "echo control-line >&7; echo output"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False, status_fd=7)
    assert done.exit_code == 0
    assert done.status_path == str(tmp_path / "status.log")
    assert Path(done.status_path).read_text() == "control-line\n"
    assert Path(done.stdout_path).read_text() == "output\n"


def test_pass_fds_are_inherited_at_their_numbers(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        argv = [sys.executable, "-c", f"import os; os.write({w}, b'through-{w}\\n')"]
        # Not passed: closed in the child, whatever saphan itself holds open.
        done = local.run(argv, cwd=str(tmp_path), run_dir=str(tmp_path), stream=False)
        assert done.exit_code != 0
        done = local.run(argv, cwd=str(tmp_path), run_dir=str(tmp_path), stream=False,
                         pass_fds=(w,))
        assert done.exit_code == 0, Path(done.stderr_path).read_text()
        os.set_blocking(r, False)
        assert os.read(r, 100) == f"through-{w}\n".encode()
    finally:
        os.close(r)
        os.close(w)


# -- signals and the death of saphan ------------------------------------------------------------

def test_sigterm_to_saphan_is_forwarded_and_reported(tmp_path: Path) -> None:
    """The child gets SIGTERM, the run waits for it, then Interrupted carries
    the signal and the child's status up; saphan's own handler comes back."""
    before = signal.getsignal(signal.SIGTERM)
    ready = tmp_path / "ready"

    def send_when_running() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ready.exists() and signal.getsignal(signal.SIGTERM) is not before:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    sender = threading.Thread(target=send_when_running)
    sender.start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as info:
        local.run(["sh", "-c", f"touch {ready}; exec sleep 30"], cwd=str(tmp_path),
                  run_dir=str(tmp_path), stream=False)
    sender.join()
    assert info.value.signum == signal.SIGTERM
    assert info.value.exit_code == -signal.SIGTERM  # the child ended by the forwarded signal
    assert time.monotonic() - t0 < 15
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_child_dies_with_a_sigkilled_saphan(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = ("import sys; from saphan.transport import local; "
            f"local.run(['sh', '-c', 'echo $$ > {pid_file}; exec sleep 60'], cwd={str(tmp_path)!r}, "
            f"run_dir={str(tmp_path)!r}, stream=False)")
    holder = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the run's child outlived the saphan that started it"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in (b"Z", b"X")


def _signal_when_ready(ready: Path, signals: list[tuple[float, int]]) -> threading.Thread:
    """Send this process each signal once the child made ``ready`` (and the
    run's handler is in place), waiting the given seconds before each."""
    before = signal.getsignal(signal.SIGTERM)

    def send() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ready.exists() and signal.getsignal(signal.SIGTERM) is not before:
                for pause, sig in signals:
                    time.sleep(pause)
                    os.kill(os.getpid(), sig)
                return
            time.sleep(0.02)

    t = threading.Thread(target=send)
    t.start()
    return t


def test_a_cancel_request_names_the_signal_the_child_gets(tmp_path: Path) -> None:
    """`runs cancel --signal SIGINT`: the request in the run's directory says
    which signal the driver passes on (here the child reports what it got)."""
    from saphan.run.end import write_cancel_request

    ready = tmp_path / "ready"
    write_cancel_request(tmp_path, {"signal": "SIGINT", "grace": 5})
    script = (f"trap 'echo got-INT; exit 7' INT; trap 'echo got-TERM; exit 8' TERM; "
              f"touch {ready}; while :; do sleep 0.05; done")
    sender = _signal_when_ready(ready, [(0, signal.SIGTERM)])
    with pytest.raises(Interrupted) as info:
        local.run(["sh", "-c", script], cwd=str(tmp_path), run_dir=str(tmp_path),
                  stream=False)
    sender.join()
    assert info.value.signum == signal.SIGTERM  # what reached saphan
    assert info.value.exit_code == 7  # what the child got: SIGINT
    assert (tmp_path / "stdout.log").read_text() == "got-INT\n"


def test_a_second_signal_kills_a_child_that_ignores_the_first(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    sender = _signal_when_ready(ready, [(0, signal.SIGTERM), (0.5, signal.SIGTERM)])
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as info:
        # The watchdog (time_limit) only bounds this test should the second
        # signal not kill: it would end the child ~18 s in, failing the timing.
        local.run(["sh", "-c", f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done"],
                  cwd=str(tmp_path), run_dir=str(tmp_path), stream=False, time_limit=6)
    sender.join()
    assert info.value.exit_code == -signal.SIGKILL
    assert time.monotonic() - t0 < 5


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_what_the_child_left_in_its_group_is_killed_when_it_ends(tmp_path: Path) -> None:
    """The child ends while something it started still holds the pipes, with
    no time limit (a command run): that is killed and the run returns at once
    (review: bubblewrap's inner process, stuck in its handshake after a
    signal killed the outer one, held a stopping batch open for ever)."""
    t0 = time.monotonic()
    done = local.run(["sh", "-c", "sleep 300 & echo $!; exit 7"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False)
    took = time.monotonic() - t0
    assert done.exit_code == 7 and not done.killed_at_limit
    pid = int(Path(done.stdout_path).read_text())
    assert took < 5, took
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid), "the sleep the child left went on after the run"


def test_one_that_left_the_group_and_holds_the_pipes_is_not_waited_for(tmp_path: Path) -> None:
    """A process of its own session (not in the child's group) holding the
    pipes after the child ended: the output is read for KILL_GRACE more, then
    the run returns (no time limit needed)."""
    t0 = time.monotonic()
    done = local.run(["sh", "-c", "setsid sleep 20 & echo started; exit 0"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False)
    took = time.monotonic() - t0
    assert done.exit_code == 0 and not done.killed_at_limit
    assert Path(done.stdout_path).read_text() == "started\n"
    assert took < local.EXIT_POLL + local.KILL_GRACE + 2, took


def test_the_child_leads_its_own_process_group(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches saphan alone (it tells the run), and the
    group is what is killed when the child ends."""
    done = local.run(["sh", "-c", "cat /proc/$$/stat"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False)
    stat = Path(done.stdout_path).read_text()
    pid, pgid = stat.split()[0], stat.rsplit(")", 1)[1].split()[2]
    assert pid == pgid and int(pgid) != os.getpgid(0)


def test_the_time_limit_holds_a_child_that_closed_its_output(tmp_path: Path) -> None:
    """Review: with both pipes closed the output loop returned at once and
    the run then waited for the child however long it took."""
    t0 = time.monotonic()
    done = local.run(["sh", "-c", "exec >&- 2>&-; sleep 15"], cwd=str(tmp_path),
                     run_dir=str(tmp_path), stream=False, time_limit=1.0)
    took = time.monotonic() - t0
    assert done.killed_at_limit and done.exit_code == -15
    assert took < 1.0 + local.EXIT_POLL + 2, took


def test_a_command_that_reads_the_terminal_gets_none(tmp_path: Path) -> None:
    """saphan on a terminal (a pty as its controlling terminal): the child
    leads a session of its own, so /dev/tty is not its terminal — nothing
    reads the operator's keystrokes, and nothing is stopped in the
    background (review: in a process group of its own it was stopped by
    SIGTTIN and the run hung)."""
    import fcntl
    import termios

    code = (
        "import sys; from saphan.transport import local\n"
        "d = local.run(['sh', '-c', 'if read -r x </dev/tty; then echo read; else echo none; fi'],"
        f" cwd={str(tmp_path)!r}, run_dir={str(tmp_path)!r}, stream=False, time_limit=3)\n"
        "print(open(d.stdout_path).read().strip(), d.killed_at_limit)\n")
    master, slave = os.openpty()

    def take_terminal() -> None:  # after setsid: the pty becomes its terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        p = subprocess.run([sys.executable, "-c", code], stdin=slave, capture_output=True,
                           text=True, start_new_session=True, preexec_fn=take_terminal,
                           timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["none", "False"], p.stdout


def test_a_child_reaped_by_someone_else_is_never_signalled_by_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedding program's child watcher reaped it: its pid may belong to
    another process by now, so neither it nor its group is signalled."""
    proc = subprocess.Popen(["true"])
    os.waitpid(proc.pid, 0)  # someone else reaps it
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("killpg", pid)))
    assert local._ended(proc)
    local._signal(proc, signal.SIGTERM)
    local._kill_group(proc)
    assert sent == []
