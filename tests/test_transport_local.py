"""transport/local.py: the stdin pipe and the engine's watchdog, directly.

The watchdog is the backstop behind a tool's own budgets: a child still
running at ``time_limit`` is SIGKILLed, and output is read for at most
KILL_GRACE more seconds even when a grandchild still holds the pipes — so
``run`` returns, whatever the child left behind.
"""

from __future__ import annotations

import time
from pathlib import Path

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
    assert done.killed_at_limit and done.exit_code == -9
    assert 1.0 <= took < 1.0 + local.KILL_GRACE + 2, took


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


def test_runs_from_a_worker_thread(tmp_path: Path) -> None:
    """An embedding program may run from a worker thread, where signal
    handlers cannot be set: nothing is installed there, and the run works."""
    import threading

    got: list[local.Finished] = []
    t = threading.Thread(target=lambda: got.append(local.run(
        ["sh", "-c", "echo from a thread"], cwd=str(tmp_path), run_dir=str(tmp_path),
        stream=False)))
    t.start()
    t.join(30)
    assert got and got[0].exit_code == 0
    assert Path(got[0].stdout_path).read_text() == "from a thread\n"
