"""What both transports share while a run's child is going: its output copied
to the run's log (and the terminal), and SIGINT/SIGTERM/SIGHUP caught, not
fatal (SIGHUP: the terminal or SSH session closed).

Each transport decides what a caught signal means (transport/local.py
forwards SIGTERM to the child; transport/ssh.py closes the far lifeline).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Protocol


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
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
