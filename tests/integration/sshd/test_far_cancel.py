"""`saphan runs cancel` on a far run (run/cancel.py, site/far.signal_holder),
on a real sshd test host under its Landlock launcher: with the run's own
saphan alive (it records the end), and with it gone — a far run left live —
where cancel ends the far tree itself and records the far launcher's status."""

from __future__ import annotations

import os
import signal
import time

from integration.sshd.conftest import Remote, pid_alive, stop
from run.test_cancel import processes_with


def _token() -> str:
    return f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"


def _gone(token: str, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not processes_with(token)


def test_cancel_with_its_saphan_alive_sends_the_signal_asked_and_it_records(
        far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("cancel/alive")
    token = _token()
    # The command answers SIGINT with status 42; its background sleep ignores
    # SIGINT (an async list of a non-interactive shell): the launcher ends it.
    proc = far.start_run("far1", wd, "sh", "-c",
                         f"trap 'exit 42' INT; sleep {token} & wait")
    holder = far.wait_far_holder("far1")
    assert len(processes_with(token)) >= 1
    shown = far.ok("runs", "show", holder["run"]).out
    assert "enforced_by: landlock abi 7" in shown and "holder:      pid " in shown
    assert f"on ssh://{far.host('far1').user}@" in shown and "(alive: " in shown
    r = far("runs", "cancel", holder["run"], "--signal", "INT", "--grace", "5")
    assert r.code == 0, r.err
    assert "cancelled (exit 42), recorded by its own saphan process" in r.out
    assert f"SIGINT to the far launcher (pid {holder['pid']} on far1): sent" in r.out
    code, _out, err = stop(proc)
    assert code == 1, err  # the command's status was 42
    rec = far.record(holder["run"])
    assert (rec["outcome"], rec["exit_code"], rec["state"]) == ("cancelled", 42, "ended")
    assert rec["signature"]["status"] == "valid" and rec["cancel"]["signal"] == "SIGINT"
    assert any("the run's own driver recorded it" in n for n in rec["notes"])
    assert not pid_alive(holder["pid"]) and _gone(token)
    assert far.ok("slot", "show", "far1", "s1", "--json").json()["holders"] == []


def test_cancel_of_a_far_run_its_saphan_left_ends_it_there_and_records_it(
        far: Remote) -> None:
    far.ready("far2")
    h = far.host("far2")
    wd = h.mkdir("cancel/left")
    token = _token()
    proc = far.start_run("far2", wd, "sleep", token)
    holder = far.wait_far_holder("far2")
    # saphan dies without a word (SIGKILL): the far run goes on, its seat held.
    stop(proc, signal.SIGKILL)
    time.sleep(0.5)
    assert pid_alive(holder["pid"]) and processes_with(token)
    assert far.record(holder["run"])["finished_at"] is None
    r = far("runs", "cancel", holder["run"])
    assert r.code == 0, r.err
    assert "cancelled (exit 143), recorded by runs cancel (its driver was gone)" in r.out
    rec = far.record(holder["run"])
    assert (rec["outcome"], rec["exit_code"]) == ("cancelled", 143)
    assert rec["signature"]["status"] == "valid"
    assert "saphan-launcher: exited code=143 reaped=0" in rec["far_status"]
    assert rec["argv"][-1] == token and rec["enforced_by"]["mechanism"] == "landlock"
    note = rec["notes"][-1]
    assert note.startswith("cancelled by `saphan runs cancel` at ")
    assert "so `runs cancel` recorded it" in note
    assert f"SIGTERM to the far launcher (pid {holder['pid']} on far2): sent" in note
    assert not pid_alive(holder["pid"]) and _gone(token)
    # Its far control directory is gone too, and the seat is free.
    from saphan.site.far import install_dir

    key = (far.s.home / "record.key").read_bytes()
    assert not h.far_path(h.home / install_dir(key) / "runs" / holder["run"]).exists()
    far.ok("run", "--machine", "far2", "--slot", "s1", "--workdir", str(wd), "--", "true")


def test_a_far_run_that_ignores_the_hangup_is_ended_before_it_is_recorded(
        far: Remote) -> None:
    """Review: a far command that ignores SIGHUP went on after saphan (SIGTERM)
    recorded it ended and gave its seat away; it wrote after its record. Now
    saphan SIGKILLs the far tree and sees the holder gone first."""
    far.ready("far3")
    h = far.host("far3")
    wd = h.mkdir("cancel/ignores-hup")
    token = _token()
    proc = far.start_run("far3", wd, "sh", "-c",
                         f"trap '' HUP; sleep {token}; echo late > late")
    holder = far.wait_far_holder("far3")
    deadline = time.monotonic() + 20
    while not processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    _code, _out, err = stop(proc)
    rec = far.record(holder["run"])
    assert rec["outcome"] == "interrupted" and rec["state"] == "ended", err
    assert not pid_alive(holder["pid"]) and _gone(token)
    assert any("did not end when hung up; saphan ended it" in n for n in rec["notes"])
    time.sleep(1)
    assert not h.far_path(wd / "late").exists()
