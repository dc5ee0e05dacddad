"""Start a composed command on this machine and stream its output.

Output goes to the terminal (when asked) and to ``stdout.log``/``stderr.log``
in the run directory, as it arrives. SIGINT/SIGTERM/SIGHUP to saphan are
forwarded to the child (as SIGTERM, or the signal `saphan runs cancel` asked
for; a second one as SIGKILL) and the run still finalises: :class:`Interrupted`
carries the signal up to the engine after the child has exited.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import subprocess
import sys
import time
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import IO

from saphan.errors import Interrupted
from saphan.transport.streams import Sink, catching, launching, tee


@dataclass(frozen=True)
class Finished:
    exit_code: int
    stdout_path: str
    stderr_path: str
    #: the child outlived ``time_limit`` and was killed
    killed_at_limit: bool = False
    #: where the launcher's control lines were kept (``status_fd`` runs)
    status_path: str | None = None


#: seconds to keep reading a killed child's output (its own children may
#: still hold the pipes; they are not waited for beyond this)
KILL_GRACE = 2.0
#: after the time limit's SIGTERM, how long the run's reaper gets to end the
#: command and what it left (its own deadline is 10 s) before SIGKILL
TERM_GRACE = 12.0
#: how often the output loop looks whether the child itself has ended
EXIT_POLL = 0.5


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` has exited, without reaping it: until it is reaped its
    pid (and so its process group's id) cannot be reused, so the group can be
    killed by id without reaching anyone else."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        # Reaped by someone else (an embedding program's child watcher): it
        # has ended, and its id is no longer its own (never killed by id).
        setattr(proc, _REAPED_ELSEWHERE, True)
        return True


#: set on a Popen whose child was reaped by someone else (_ended)
_REAPED_ELSEWHERE = "_saphan_reaped_elsewhere"


def _own(proc: subprocess.Popen[bytes]) -> bool:
    """The child's pid is still its own: not reaped, here or elsewhere."""
    return proc.returncode is None and not getattr(proc, _REAPED_ELSEWHERE, False)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to the child, never reaping it (Popen.send_signal polls, and
    would reap it): nothing here reaps the child but the final ``wait``, so
    its pid and its group's id stay its own while it is signalled."""
    if _own(proc):
        with suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left in the child's process group; only while the
    child is unreaped (:func:`_ended`), so the id is still its."""
    if _own(proc):
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _die_with_saphan() -> None:
    """In the child, before exec: SIGKILL it if saphan dies (even by SIGKILL).

    Without this a SIGKILLed saphan would leave its boundary process running,
    outliving the record that describes it. bubblewrap's own --die-with-parent
    then takes the jailed command down with it. (rust/core's prctl wrapper;
    the native module is loaded before the fork, so the child imports nothing.)
    """
    from saphan import _native

    _native.set_parent_death_signal(signal.SIGKILL)


def set_dumpable(on: bool) -> bool:
    """Set PR_SET_DUMPABLE on this process; returns the previous setting.

    Off, /proc/<pid>/{environ,mem,root} and ptrace are closed to every
    same-user process without CAP_SYS_PTRACE — the key a process holds in
    memory, and an operator's exported copy of it in its environment, stay
    its own. (Not Linux: nothing to do, and "on" is returned.)
    """
    if sys.platform != "linux":
        return True
    try:
        from saphan import _native
    except ImportError:
        # The loop's zipapp on a runner (loop/zipapp.py) has no native
        # extension: prctl(2) through libc, checked the same way.
        return _set_dumpable_libc(on)
    return _native.set_dumpable(on)


def _set_dumpable_libc(on: bool) -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_get_dumpable, pr_set_dumpable = 3, 4
    was = libc.prctl(pr_get_dumpable, 0, 0, 0, 0)
    if was < 0 or libc.prctl(pr_set_dumpable, 1 if on else 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE): {os.strerror(err)}")
    return bool(was)


#: the signals a lifeline line can name (saphan-launcher --help)
_LINE_NAMES: dict[int, str] = {signal.SIGTERM: "TERM", signal.SIGINT: "INT", signal.SIGHUP: "HUP",
                               signal.SIGKILL: "KILL"}


class _Lifeline:
    """saphan's end of a launcher's ``--lifeline-fd`` pipe (saphan-launcher
    --help): only this process holds the write end (close-on-exec, never
    inherited). A line asks the launcher to pass a signal to the command,
    through its supervisor (a signal to the boundary process itself would
    kill bubblewrap, and the jail with it, before the command heard
    anything). Closing it — here once the child ended, or by the kernel when
    saphan dies — makes a launcher still running anywhere kill the command
    and all it left, and one not yet started run nothing (review: a signal
    during bubblewrap's set-up left the jail running after the run was
    recorded)."""

    def __init__(self) -> None:
        r, w = os.pipe()
        try:
            # Above the numbers a child is given (stdio, the status and
            # lifeline descriptors): never clobbered while they are set up.
            self.read_end = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10)
        finally:
            os.close(r)
        self.write_end: int | None = w
        os.set_blocking(w, False)

    def tell(self, sig: int) -> bool:
        """One ``signal NAME`` line; False when it cannot be said (no such
        line, the pipe is closed or full): the caller signals the child."""
        name = _LINE_NAMES.get(sig)
        if name is None or self.write_end is None:
            return False
        try:
            return os.write(self.write_end, f"signal {name}\n".encode()) > 0
        except OSError:
            return False

    def close_read_end(self) -> None:
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1

    def cut(self) -> None:
        """The child ended, or saphan is done with it: whatever of the run
        still runs under a launcher is killed by it."""
        if self.write_end is not None:
            with suppress(OSError):
                os.close(self.write_end)
            self.write_end = None


def _forward_signals(proc: subprocess.Popen[bytes], got: list[int], run_dir: str,
                     lifeline: _Lifeline | None) -> AbstractContextManager[None]:
    """The first signal to saphan sends the command SIGTERM, or the signal a
    cancel request names (run/end.py): on the lifeline when there is one, so
    the launcher passes it on, else to the child; a second one sends the
    child SIGKILL."""
    from saphan.run.end import requested_signal

    def handler(signum: int, _frame: object) -> None:
        first = not got
        got.append(signum)
        forward = requested_signal(run_dir) if first else signal.SIGKILL
        if first and lifeline is not None and lifeline.tell(forward):
            return
        _signal(proc, forward)

    return catching(handler)


def run(
    argv: list[str],
    *,
    cwd: str,
    run_dir: str,
    env: dict[str, str] | None = None,
    stream: bool = True,
    stdin_path: str | None = None,
    stdin_bytes: bytes | None = None,
    time_limit: float | None = None,
    status_fd: int | None = None,
    lifeline_fd: int | None = None,
    pass_fds: tuple[int, ...] = (),
    term_out: Sink | None = None,
    term_err: Sink | None = None,
) -> Finished:
    """Run ``argv``; stdin is /dev/null, the file ``stdin_path`` (an agent's
    prompt: never on the command line), or a pipe holding ``stdin_bytes`` and
    then EOF (the loop's key: never in argv or an environment). With
    ``time_limit`` (seconds), a child still running then is sent SIGTERM
    (its reaper ends the whole tree) and SIGKILL if it is still there
    :data:`TERM_GRACE` later — a watchdog behind a tool's own budgets, so no
    run can hang for ever.

    With ``status_fd``, the child gets a pipe's write end at that descriptor
    number (saphan-launcher's control lines; the launcher closes it before
    the command starts) and what arrives on it is kept in ``status.log``,
    apart from anything the command itself prints. With ``lifeline_fd``, the
    child gets the read end of saphan's lifeline pipe there (:class:`_Lifeline`,
    the launcher's ``--lifeline-fd``). ``pass_fds`` are inherited at their
    numbers (the boundary's ``--bind-fd`` descriptors).

    When streaming, ``term_out``/``term_err`` (a view: run/view.py) stand in
    for this process's stdout/stderr; the logs get every byte either way."""
    out_path = os.path.join(run_dir, "stdout.log")
    err_path = os.path.join(run_dir, "stderr.log")
    status_path = os.path.join(run_dir, "status.log") if status_fd is not None else None
    got: list[int] = []
    if sys.platform == "linux":
        from saphan import _native  # noqa: F401 - loaded here, used by the child before exec
    status_r, status_w = os.pipe() if status_fd is not None else (-1, -1)
    lifeline = _Lifeline() if lifeline_fd is not None else None

    def child_setup() -> None:
        # A session of its own, which it leads: what it starts and has not
        # moved to a session of its own (bubblewrap's sandbox before its
        # set-up handshake) is killed with it when it ends (_pump); it has
        # no controlling terminal (opening /dev/tty fails, never stops the
        # run in the background); a terminal's Ctrl-C reaches saphan alone,
        # which tells the run (forwarded).
        os.setsid()
        if sys.platform == "linux":
            _die_with_saphan()
        if status_fd is not None and status_w != status_fd:
            os.dup2(status_w, status_fd)
        if lifeline is not None and lifeline_fd is not None:
            os.dup2(lifeline.read_end, lifeline_fd)

    try:
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f, \
                open(status_path or os.devnull, "wb") as status_f, \
                _stdin(stdin_path, stdin_bytes) as in_f:
            launching()  # a signal before this: the child is not started
            numbered = tuple(n for n in (status_fd, lifeline_fd) if n is not None)
            held = _hold_numbers(numbered, in_f.fileno())
            try:
                proc = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=in_f,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    preexec_fn=child_setup, pass_fds=(*pass_fds, *numbered),
                )
            finally:
                for fd in held:
                    os.close(fd)
            if lifeline is not None:
                lifeline.close_read_end()
            shown_out = (sys.stdout.buffer if term_out is None else term_out) if stream else None
            shown_err = (sys.stderr.buffer if term_err is None else term_err) if stream else None
            sinks: dict[int, tuple[IO[bytes], Sink | None]] = {
                proc.stdout.fileno(): (out_f, shown_out),  # type: ignore[union-attr]
                proc.stderr.fileno(): (err_f, shown_err),  # type: ignore[union-attr]
            }
            if status_fd is not None:
                os.close(status_w)
                status_w = -1
                sinks[status_r] = (status_f, None)
            with _forward_signals(proc, got, run_dir, lifeline):
                killed = _pump(sinks, proc, time_limit, lifeline)
                with suppress(ChildProcessError):
                    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
                # it ended: nothing of the run goes on, under a launcher or
                # in its session
                if lifeline is not None:
                    lifeline.cut()
                _kill_group(proc)
                code = proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        if lifeline is not None:
            lifeline.close_read_end()
            lifeline.cut()
    if got:
        raise Interrupted(got[0], code)
    return Finished(code, out_path, err_path, killed_at_limit=killed, status_path=status_path)


def _hold_numbers(numbers: tuple[int, ...], src: int) -> list[int]:
    """Each of ``numbers`` not open here, opened (a close-on-exec copy of
    ``src``) until the child is started: Popen makes every descriptor it
    passes inheritable in the child before ``child_setup`` puts the status
    and lifeline pipes there, and fails (EBADF) on a number that is not open.
    F_DUPFD takes the lowest free number from the one asked: a number that
    was taken meanwhile is never reused, and the copy is closed again.
    Returns what to close once the child is started."""
    held: list[int] = []
    for n in numbers:
        fd = fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, n)
        if fd == n:
            held.append(fd)
        else:
            os.close(fd)  # n was open already
    return held


def _stdin(path: str | None, data: bytes | None) -> IO[bytes]:
    """The child's stdin. Bytes go into a pipe that is filled and closed
    before the child starts (so it reads them, then EOF); they must fit the
    pipe's buffer, which is never less than 4096 bytes on Linux and macOS."""
    if data is None:
        return open(path or os.devnull, "rb")
    if len(data) > 4096:
        raise ValueError("stdin_bytes is limited to 4096 bytes (one pipe buffer)")
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return os.fdopen(r, "rb")


def _pump(sinks: dict[int, tuple[IO[bytes], Sink | None]],
          proc: subprocess.Popen[bytes], time_limit: float | None,
          lifeline: _Lifeline | None = None) -> bool:
    """Copy output until EOF; past ``time_limit``, SIGTERM ``proc``, then
    SIGKILL it after :data:`TERM_GRACE`, and read on for at most
    :data:`KILL_GRACE`. Returns whether it had to stop it.

    Once ``proc`` itself has ended (however), what is left in its process
    group is killed and the output is read for at most :data:`KILL_GRACE`
    more: a process that escaped the group and still holds the pipes (or one
    stuck where no signal of ours reaches it) never holds the run open —
    measured: a signal landing while bubblewrap set up its sandbox left the
    inner bubblewrap waiting for ever on its handshake, holding the pipes,
    and the run, its seat and a stopping batch with it."""
    deadline = time.monotonic() + time_limit if time_limit is not None else None
    killed = False
    stage = 0  # 0: running; 1: SIGTERM sent; 2: it ended, or SIGKILL sent
    sel = selectors.DefaultSelector()
    for fd in sinks:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(sinks)
    # Until the output ends AND the child itself has (a child that closed
    # its output is still held to the time limit).
    while open_fds or stage < 2:
        if stage < 2 and _ended(proc):
            # Only what still holds the pipes is left: killed by its launcher
            # (the lifeline cut), and in the child's session.
            if lifeline is not None:
                lifeline.cut()
            _kill_group(proc)
            stage = 2
            deadline = time.monotonic() + KILL_GRACE
            if not open_fds:
                break
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if stage < 2:
            # look again soon: has it ended yet?
            wait = min(wait, 0.1 if stage == 1 else EXIT_POLL) if wait is not None \
                else EXIT_POLL
        ready = sel.select(wait)
        if not ready and deadline is not None and time.monotonic() >= deadline:
            if stage == 2:
                break  # grace over: what still holds the pipes is not waited for
            # SIGTERM first, through the launcher (it passes it on and then
            # ends every process the run left); SIGKILL if that takes too long.
            if stage != 0 or lifeline is None or not lifeline.tell(signal.SIGTERM):
                _signal(proc, signal.SIGTERM if stage == 0 else signal.SIGKILL)
            stage += 1
            killed = True
            deadline = time.monotonic() + (TERM_GRACE if stage == 1 else KILL_GRACE)
            continue
        for key, _ in ready:
            fd = key.fd
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            if not chunk:
                sel.unregister(fd)
                open_fds.discard(fd)
                continue
            tee(*sinks[fd], chunk)
    sel.close()
    return killed
