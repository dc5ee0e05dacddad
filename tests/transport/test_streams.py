"""transport/streams.py: what both transports share while a run's child goes —
each chunk of output to the run's log (flushed at once, so a crash loses
nothing already printed) and to the terminal when streaming; SIGINT/SIGTERM
caught for the run's duration, the previous handlers back afterwards."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from saphan.transport.streams import catching, tee


def test_tee_writes_the_log_at_once_and_the_terminal_when_asked(tmp_path: Path) -> None:
    log_path = tmp_path / "stdout.log"
    term = io.BytesIO()
    with open(log_path, "wb") as log:
        tee(log, term, b"first ")
        # Flushed: another reader sees it while the log is still open.
        assert log_path.read_bytes() == b"first "
        tee(log, None, b"second")
        assert log_path.read_bytes() == b"first second"
    assert term.getvalue() == b"first "  # not streaming: the log only


def test_catching_routes_both_signals_then_restores(tmp_path: Path) -> None:
    got: list[int] = []

    def handler(signum: int, _frame: FrameType | object) -> None:
        got.append(signum)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with catching(handler):
        assert signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGTERM) is handler
        os.kill(os.getpid(), signal.SIGTERM)  # not fatal while the block runs
        os.kill(os.getpid(), signal.SIGINT)  # nor a KeyboardInterrupt
    assert got == [signal.SIGTERM, signal.SIGINT]
    assert {s: signal.getsignal(s) for s in before} == before


def test_catching_restores_after_an_exception() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        with catching(lambda *_: None):
            raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_catching_from_a_worker_thread_installs_nothing() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    seen: list[object] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with catching(lambda *_: None):
                seen.extend(signal.getsignal(s) for s in before)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    assert errors == []
    assert seen == list(before.values())
    assert {s: signal.getsignal(s) for s in before} == before


def test_sighup_is_caught_like_sigterm_then_restored() -> None:
    """A closed terminal or SSH session (SIGHUP) reaches the run's handler,
    which finalises the run, instead of killing saphan outright."""
    got: list[int] = []
    before = signal.getsignal(signal.SIGHUP)
    with catching(lambda signum, _frame: got.append(signum)):
        os.kill(os.getpid(), signal.SIGHUP)
    assert got == [signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is before


def test_a_terminal_that_went_away_does_not_stop_the_log(tmp_path: Path) -> None:
    """After a hangup, writing to the terminal fails (EIO); the log keeps
    every chunk and the run goes on."""
    r, w = os.pipe()
    os.close(r)  # nobody reads the "terminal" any more: writes fail (EPIPE)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    term = os.fdopen(w, "wb", buffering=0)
    log_path = tmp_path / "stdout.log"
    try:
        with open(log_path, "wb") as log:
            tee(log, term, b"one ")
            tee(log, term, b"two")
        assert log_path.read_bytes() == b"one two"
    finally:
        signal.signal(signal.SIGPIPE, previous)
        term.close()


# -- run_signals: the whole of a run's driving (review: lc_window) ----------------------

def test_run_signals_before_the_child_stop_it_at_the_next_checkpoint() -> None:
    import pytest

    from saphan.errors import Interrupted
    from saphan.transport import streams

    before = {s: signal.getsignal(s) for s in streams.CAUGHT}
    with streams.run_signals():
        os.kill(os.getpid(), signal.SIGHUP)  # noted, not fatal
        with pytest.raises(Interrupted) as e:
            streams.launching()
        assert (e.value.signum, e.value.exit_code) == (signal.SIGHUP, None)
        assert "before its command started" in str(e.value)
        os.kill(os.getpid(), signal.SIGTERM)  # the run is ending: noted only
        os.kill(os.getpid(), signal.SIGTERM)
        assert streams.pending() == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in streams.CAUGHT} == before


def test_run_signals_after_the_launch_go_to_the_transports_handler_or_wait() -> None:
    from saphan.transport import streams

    seen: list[int] = []
    with streams.run_signals():
        streams.launching()
        os.kill(os.getpid(), signal.SIGINT)  # before the transport's handler
        with catching(lambda signum, _f: seen.append(signum)):
            assert seen == [signal.SIGINT]  # handed on (local: forwarded to the child)
            os.kill(os.getpid(), signal.SIGTERM)
            assert seen == [signal.SIGINT, signal.SIGTERM]
        assert streams.pending() is None
        os.kill(os.getpid(), signal.SIGHUP)  # the child is over: waits for the record
        assert streams.pending() == signal.SIGHUP
    assert streams.pending() is None


def test_run_signals_off_the_main_thread_installs_nothing() -> None:
    from saphan.transport import streams

    before = {s: signal.getsignal(s) for s in streams.CAUGHT}
    during: list[object] = []

    def work() -> None:
        with streams.run_signals():
            during.extend(signal.getsignal(s) for s in streams.CAUGHT)
            streams.checkpoint()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert during == list(before.values())
