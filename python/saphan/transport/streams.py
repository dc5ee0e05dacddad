"""What both transports share while a run's child is going: its output copied
to the run's log (and the terminal), and SIGINT/SIGTERM/SIGHUP caught, not
fatal (SIGHUP: the terminal or SSH session closed).

Each transport decides what a caught signal means (transport/local.py
forwards SIGTERM to the child; transport/ssh.py closes the far lifeline).

Around the child, for the whole of a run's driving (the reservation, the
composing, the record, a --repo run's import: run/pipeline.py), the same
signals are caught by :func:`run_signals`, never fatal there either:
- before the child starts, a signal is noted and the run does not start:
  :func:`launching` (right before the child is started) and the pipeline's
  own checkpoints raise Interrupted with no exit status; a second signal
  raises at once, wherever it lands (a step that hangs stays interruptible);
- from the launch on, a signal is noted only: one that came before the
  transport's own handler was installed is handed to it (:func:`catching`:
  forwarded to the child), one that comes after the child ended waits until
  the record and the import are complete (:func:`pending`), then saphan exits
  128+N.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Protocol

from saphan.errors import Interrupted


class Sink(Protocol):
    """Where a run's output is shown: the terminal's binary stream, or a view
    of it (run/view.py) that shows something else and keeps no bytes."""

    def write(self, chunk: bytes, /) -> object: ...

    def flush(self) -> object: ...


def tee(log: IO[bytes], term: Sink | None, chunk: bytes) -> None:
    """One chunk of output to the run's log, and to the terminal when streaming."""
    log.write(chunk)
    log.flush()
    if term is not None:
        try:
            term.write(chunk)
            term.flush()
        except (OSError, ValueError):
            pass  # the terminal is gone (a hangup): the log keeps every byte


#: the signals a run's driver catches: each finalises the run, then saphan
#: exits 128+N (cli.main)
CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def catching(handler: Callable[[int, object], None]) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to ``handler`` while the block runs; the previous
    handlers come back afterwards. Handlers can be set only from the main
    thread: called from any other (an embedding program's worker), nothing is
    installed and the process keeps its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in CAUGHT}
    try:
        guard = _guard()
        if guard is not None and guard.launched:
            # Signals between the launch and now are this handler's (the
            # child may already run: it is told).
            for signum in guard.take():
                handler(signum, None)
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class RunSignals:
    """The signals that reached a run's driver outside a transport's own
    handler (module docstring)."""

    def __init__(self) -> None:
        self.got: list[int] = []
        #: how many of ``got`` were acted on (raised, or handed to a handler)
        self.taken = 0
        #: the child was (about to be) started, or the run is ending: nothing
        #: is raised from here on
        self.launched = False

    def handler(self, signum: int, _frame: object) -> None:
        self.got.append(signum)
        if not self.launched and len(self.got) - self.taken > 1:
            # A second signal before the child: at once, wherever it lands.
            self.taken, self.launched = len(self.got), True
            raise Interrupted(signum, None, "before its command started; it was not started")

    def take(self) -> list[int]:
        new = self.got[self.taken:]
        self.taken = len(self.got)
        return new

    def check(self) -> None:
        """Before the child: a signal that came means the run does not start."""
        if not self.launched and len(self.got) > self.taken:
            first = self.got[self.taken]
            self.taken, self.launched = len(self.got), True
            raise Interrupted(first, None, "before its command started; it was not started")


#: the main thread's run_signals, innermost last (only the main thread's
#: runs use it: a worker thread's run sets no handler and sees none)
_guards: list[RunSignals] = []


def _guard() -> RunSignals | None:
    if not _guards or threading.current_thread() is not threading.main_thread():
        return None
    return _guards[-1]


@contextmanager
def run_signals() -> Iterator[RunSignals]:
    """SIGINT, SIGTERM and SIGHUP caught for the block (module docstring);
    the previous handlers come back afterwards. Off the main thread nothing
    is installed (:func:`catching`); nested, the outer one is used."""
    if threading.current_thread() is not threading.main_thread():
        yield RunSignals()  # never installed: nothing reaches it
        return
    if _guards:
        yield _guards[-1]
        return
    guard = RunSignals()
    previous = {s: signal.signal(s, guard.handler) for s in CAUGHT}
    _guards.append(guard)
    try:
        yield guard
    finally:
        _guards.pop()
        for s, h in previous.items():
            signal.signal(s, h)


def checkpoint() -> None:
    """Raise Interrupted if a signal came and the child was not started."""
    g = _guard()
    if g is not None:
        g.check()


def launching() -> None:
    """Right before the child starts: a signal that came stops it here
    (Interrupted, no exit status); from now on signals are only noted."""
    g = _guard()
    if g is not None:
        g.check()
        g.launched = True


def settled() -> None:
    """The child is over (or never started): from now on signals are only
    noted, never raised, until the record is written."""
    g = _guard()
    if g is not None:
        g.launched = True


def pending() -> int | None:
    """The first signal no one acted on yet (it came after the child
    ended, or before and the run ends otherwise), or None."""
    g = _guard()
    if g is not None and len(g.got) > g.taken:
        return g.got[g.taken]
    return None
