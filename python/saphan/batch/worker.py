"""A batch worker: claims tasks and runs each as a child process, as seats
free up (``saphan batch run | work | resume``).

    claim      one pending task for a new run id (Store.claim_task: one
               statement; on PostgreSQL ``FOR UPDATE SKIP LOCKED``)
    child      ``python -m saphan.batch.child`` in a session of its own,
               the claim on its stdin (which stays open: its lifeline): it
               reads its task from the store, checks its signature, and is a
               cast of the task's tool that waits for a seat (batch/child.py)
    seated     the child's run row exists (it took a seat, or was refused);
               a task is claimed only while fewer than STARTING children
               have none, so at most STARTING wait for a seat (they start up
               side by side: a child's start-up is most of a short task's
               cost): the running tasks are bounded by the free seats, and
               by ``parallel``
    reaped     the child exited: the claim is concluded from the run's row
               (batch/recover.py): done, or back to pending
    recover    every second, the claims nobody watches (a dead worker's)

Ctrl-C (SIGINT, SIGTERM, SIGHUP): no task is claimed any more; each child
is told SIGINT, which ends its run as ``saphan run`` ends one (recorded
interrupted), and its task goes back to pending; the worker returns once
every child has ended. A second signal kills what is left (SIGKILL); the
worker ends those runs holder-dead and gives their tasks back before it
returns. Stops never use up a task's attempts (batch/recover.py). On
SQLite one process works a batch (a lock beside the store).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from saphan.batch import EXIT_BAD_TASK, EXIT_CLAIM_GONE, EXIT_RETRY
from saphan.batch.recover import conclude, recover
from saphan.errors import UserError
from saphan.ids import new_run_id
from saphan.liveness import current_holder

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store.rows import Holder4, RunRow, Task

#: how long a child waits for a seat before its cast is refused fleet-full
SEAT_WAIT = 86_400.0
#: how often the claims nobody watches are concluded
RECOVER_EVERY = 1.0
#: children that may be starting (no run row yet) at once
STARTING = 2
#: the loop's pause while a child starts up (else ``poll``)
POLL_STARTING = 0.02
#: what is kept of a child's standard output and error
OUT_LIMIT, ERR_TAIL = 1 << 20, 4096
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Event:
    """What a worker tells its display: ``kind`` is "claimed", "seated",
    "done", "requeued" or "left" (its run goes on without a child)."""

    kind: str
    task: Task
    run: RunRow | None = None
    note: str = ""


@dataclass
class Worked:
    """How a worker ended: ``signum`` the signal that stopped it (None: the
    batch has nothing left), and the tasks it started."""

    batch: str
    signum: int | None = None
    started: int = 0


@dataclass
class _Child:
    task: Task
    proc: subprocess.Popen[bytes]
    seated: bool = False
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    readers: list[threading.Thread] = field(default_factory=list)


class _Stop:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.count += 1


def work(ctx: Context, batch_id: str, *, parallel: int | None = None,
         wait: float = SEAT_WAIT, on_event: Callable[[Event], None] | None = None,
         poll: float = 0.1) -> Worked:
    """Work the batch until nothing is left or a signal stops it (module docstring)."""
    from saphan.store import StoreError

    if parallel is not None and parallel < 1:
        raise UserError("--parallel must be at least 1")
    store = ctx.store
    me = current_holder().as_tuple()
    emit = on_event or (lambda _e: None)
    lock = _one_worker(ctx, batch_id) if store.db.dialect == "sqlite" else None
    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in _SIGNALS}
    children: dict[int, _Child] = {}
    end = Worked(batch_id)
    state = _Loop()
    try:
        while True:
            try:
                if _step(ctx, batch_id, me, children, stop, state, parallel, wait, emit, end):
                    break
                state.fault_since = None
            except StoreError:
                # the store went away (a restart): reopen with backoff, for a while
                now = time.monotonic()
                state.fault_since = state.fault_since or now
                if now - state.fault_since > STORE_PATIENCE:
                    raise
                time.sleep(min(5.0, 0.5 * 2 ** min(4, int(now - state.fault_since))))
                with contextlib.suppress(StoreError):
                    store.reopen()
                continue
            time.sleep(POLL_STARTING if any(not c.seated for c in children.values())
                       else poll)
        if stop.signum is not None:
            from saphan.run import live

            # Every child has ended. What a second signal killed (or a
            # child that died between its seat and its run) is ended
            # holder-dead now, and its task given back here, stopped (never
            # counted as a failed attempt), not left claimed for the next
            # worker to judge.
            live.reconcile(ctx)
            for t in store.batch_tasks(batch_id, "claimed"):
                if t.worker == me and (what := conclude(
                        ctx, t, why="the batch was stopped", interrupted=True)) is not None:
                    emit(Event(what, t, store.get_run(t.run_id) if t.run_id else None,
                               note="stopped"))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if lock is not None:
            os.close(lock)
        for c in children.values():  # only when the worker itself failed: they end too
            _close(c)
    end.signum = stop.signum
    return end


#: how long a worker keeps trying to reach a store that went away (seconds)
STORE_PATIENCE = 120.0
#: a child that hit a passing fault (EXIT_RETRY) holds claiming back this long, doubling
RETRY_FIRST, RETRY_MOST = 1.0, 30.0


@dataclass
class _Loop:
    told: int = 0
    next_recover: float = 0.0
    fault_since: float | None = None
    hold_until: float = 0.0
    hold: float = RETRY_FIRST
    far_checked: dict[tuple[str, str], float] = field(default_factory=dict)


def _step(ctx: Context, batch_id: str, me: Holder4, children: dict[int, _Child], stop: _Stop,
          state: _Loop, parallel: int | None, wait: float, emit: Callable[[Event], None],
          end: Worked) -> bool:
    """One turn of the worker's loop; True when it is over."""
    store = ctx.store
    for seq, c in list(children.items()):
        if c.proc.poll() is not None:
            _reaped(ctx, c, stop.signum is not None, emit, state)
            del children[seq]
    if stop.signum is not None:
        if state.told < stop.count:
            state.told = stop.count
            for c in children.values():
                _signal(c, signal.SIGINT if state.told == 1 else signal.SIGKILL)
        return not children
    if time.monotonic() >= state.next_recover:
        for t, what in recover(ctx, batch_id, me, children, state.far_checked):
            emit(Event(what, t, store.get_run(t.run_id) if t.run_id else None,
                       note="recovered"))
        state.next_recover = time.monotonic() + RECOVER_EVERY
    for c in children.values():
        if not c.seated and c.task.run_id is not None:
            row = store.get_run(c.task.run_id)
            if row is not None:
                c.seated = True
                emit(Event("seated", c.task, row))
    if ((parallel is None or len(children) < parallel)
            and sum(not c.seated for c in children.values()) < STARTING
            and time.monotonic() >= state.hold_until):
        claimed = store.claim_task(batch_id, new_run_id(), me)
        if claimed is not None:
            children[claimed.seq] = _spawn(ctx, claimed, wait)
            end.started += 1
            emit(Event("claimed", claimed))
            return False
        if not children and not store.batch_tasks(batch_id, "claimed") \
                and not store.batch_tasks(batch_id, "pending"):
            return True
    return False


def _spawn(ctx: Context, t: Task, wait: float) -> _Child:
    order = {"home": str(ctx.workspace.home), "batch": t.batch, "seq": t.seq,
             "run_id": t.run_id, "wait": wait}
    # -P: the current directory is not on the child's sys.path (a run may
    # have written a module there), and the child starts in the workspace,
    # which no run can write
    proc = subprocess.Popen(
        [sys.executable, "-P", "-s", "-m", "saphan.batch.child"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        close_fds=True, cwd=ctx.workspace.home)
    c = _Child(t, proc)
    for stream, into, keep_tail in ((proc.stdout, c.out, False), (proc.stderr, c.err, True)):
        th = threading.Thread(target=_drain, args=(stream, into, keep_tail), daemon=True)
        th.start()
        c.readers.append(th)
    assert proc.stdin is not None
    try:
        # one line; the pipe stays open while this worker lives (the child's lifeline)
        proc.stdin.write(json.dumps(order).encode() + b"\n")
        proc.stdin.flush()
    except OSError:
        pass  # it died first: reaped as any child that ran nothing
    return c


def _close(c: _Child) -> None:
    with contextlib.suppress(OSError):
        if c.proc.stdin is not None:
            c.proc.stdin.close()


def _drain(stream: Any, into: bytearray, keep_tail: bool) -> None:
    while chunk := stream.read(65536):
        into += chunk
        if keep_tail and len(into) > ERR_TAIL:
            del into[:-ERR_TAIL]
        elif not keep_tail and len(into) > OUT_LIMIT:
            del into[OUT_LIMIT:]
    stream.close()


def _signal(c: _Child, sig: int) -> None:
    try:
        if sig == signal.SIGKILL:
            os.killpg(c.proc.pid, sig)  # its session: the child and what it started
        else:
            os.kill(c.proc.pid, sig)  # saphan run tells its run, then records it
    except ProcessLookupError:
        pass


def _reaped(ctx: Context, c: _Child, stopping: bool, emit: Callable[[Event], None],
            state: _Loop) -> None:
    _close(c)
    for th in c.readers:
        th.join(5)
    t = ctx.store.get_task(c.task.batch, c.task.seq)
    if t is None or t.state != "claimed" or t.run_id != c.task.run_id:
        return  # concluded by another worker meanwhile
    rc = c.proc.returncode
    error = None
    if rc == EXIT_BAD_TASK:
        error = _said(c.out) or _tail(c.err) or "the task could not be run"
    elif rc == EXIT_RETRY:
        # a passing fault before any run: claimed again, after a pause
        state.hold_until = time.monotonic() + state.hold
        state.hold = min(state.hold * 2, RETRY_MOST)
    elif rc not in (0, 3, EXIT_CLAIM_GONE) and 0 < rc < 128 and not stopping:
        # While stopping, a child told SIGINT before its handlers were up
        # (Python still starting: KeyboardInterrupt, status 1) is a stopped
        # task, not a failed one: concluded from its row, or given back.
        error = f"its process exited {rc}: {_tail(c.err) or '(nothing on stderr)'}"
    if rc == 0:
        state.hold = RETRY_FIRST
    why = (f"its child exited {rc}" + (f" ({_said(c.out)})" if rc == EXIT_RETRY else "")
           if rc >= 0 else f"its child was killed by signal {-rc}")
    what = conclude(ctx, t, why=why, error=error, interrupted=stopping)
    row = ctx.store.get_run(t.run_id) if t.run_id else None
    if what is not None:
        emit(Event(what, t, row, note=error or ""))
    elif row is not None and row.live:
        emit(Event("left", t, row, note=(
            "its child was killed; the next command ends its run holder-dead" if stopping
            else "its run's row is still live without its child; it is concluded once that "
                 "run ends")))


def _said(out: bytearray) -> str | None:
    try:
        value = json.loads(bytes(out).decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return str(value["error"]) if isinstance(value, dict) and "error" in value else None


def _tail(err: bytearray) -> str:
    text = bytes(err).decode("utf-8", "replace").strip()
    return text.splitlines()[-1] if text else ""


def _one_worker(ctx: Context, batch_id: str) -> int:
    """SQLite: one process works a batch. A lock file beside the store,
    held (flock) while the worker runs; never followed through a link."""
    import fcntl
    import stat

    d = ctx.workspace.home / "batches"
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{d} is not a directory (a link or a file): saphan keeps batch locks "
                        "there and follows no link; remove it")
    try:
        fd = os.open(d / f"{batch_id}.lock",
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise UserError(f"cannot open the batch lock {d / f'{batch_id}.lock'}: "
                        f"{e.strerror or e} (saphan follows no link there; remove it)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"batch {batch_id} is being worked by another process of this "
                        "workspace; on SQLite one process works a batch (with PostgreSQL, "
                        "`saphan batch work` runs on several hosts)") from None
    return fd
