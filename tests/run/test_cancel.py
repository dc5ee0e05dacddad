"""`saphan runs cancel` on this host (run/cancel.py), through the real CLI,
with a real `saphan run` under bubblewrap as the run's driver, on SQLite and
PostgreSQL. The far host's turn is tests/integration/sshd/test_far_cancel.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan, saphan_exe
from saphan.context import Context
from saphan.run.cancel import parse_signal


def processes_with(token: str) -> list[int]:
    """Every process on this host whose command line holds ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def start(s: Saphan, workdir: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(workdir),
         "--", *argv], env=s.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def wait_running(s: Saphan, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in s.ok("runs", "list", "--json").json():  # type: ignore[union-attr]
            if r["state"] == "running" and r["finished_at"] is None:
                return dict(r)
        time.sleep(0.1)
    raise AssertionError("no run started")


@pytest.fixture
def here(saphan: Saphan) -> Saphan:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command")
    return saphan


@pytest.mark.usefixtures("bwrap_available")
def test_cancel_ends_a_local_runs_tree_records_it_and_frees_the_seat(
        here: Saphan, tmp_path: Path) -> None:
    token = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"
    driver = start(here, tmp_path, "sh", "-c", f"sleep {token} & sleep {token}; wait")
    try:
        run = wait_running(here)
        deadline = time.monotonic() + 10
        while len(processes_with(token)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The sh, its two sleeps, and the boundary's processes around them.
        assert len(processes_with(token)) >= 3
        # A live run is shown from its live record, with its holder.
        shown = here.ok("runs", "show", run["id"]).out
        assert f'sh", "-c", "sleep {token} & sleep {token}; wait"]' in shown, shown
        assert f"workdir:     {tmp_path}" in shown
        assert "enforced_by: bubblewrap" in shown
        assert f"holder:      pid {driver.pid} on " in shown and "(alive: " in shown
        assert "enforced_by: nothing" not in shown and "argv: null" not in shown
        # Finalising a live holder's row is refused; cancel is the way.
        r = here("runs", "finalize", run["id"])
        assert r.code == 2 and "holder is alive" in r.err
        assert f"`saphan runs cancel {run['id']}`" in r.err
        t0 = time.monotonic()
        r = here("runs", "cancel", run["id"], "--json")
        assert r.code == 0, r.err
        assert time.monotonic() - t0 < 10
        rec = r.json()
        assert isinstance(rec, dict)
        assert (rec["outcome"], rec["state"]) == ("cancelled", "ended")
        # the command itself got SIGTERM (the launcher passed it on): 128 + 15
        assert rec["exit_code"] == 128 + signal.SIGTERM and rec["signature"]["status"] == "valid"
        assert rec["cancel"]["signal"] == "SIGTERM"
        assert any("the run's own driver recorded it" in n for n in rec["notes"])
        assert "recorded by its own saphan process" in r.err
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        assert processes_with(token) == []  # the whole tree is gone
        text = here.ok("runs", "show", run["id"]).out
        assert "outcome:     cancelled  exit: 143" in text
        listed = here.ok("runs", "list").out.splitlines()[1]
        assert "cancelled" in listed
        # The seat is free: the next run gets it.
        here.ok("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--",
                "true")
        again = here("runs", "cancel", run["id"])
        assert again.code == 2 and "already finished" in again.err and "cancelled" in again.err
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.communicate()


@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_the_command_gets_the_signal_cancel_names_and_may_end_on_its_own(
        here: Saphan, tmp_path: Path, sig: str) -> None:
    """Through saphan's lifeline the launcher passes the signal to the
    command (review: it used to reach bubblewrap, which died of it and took
    the jail down at once: no trap ever ran, `--signal` and `--grace` did
    nothing on the local lanes)."""
    name = sig.removeprefix("SIG")
    driver = start(here, tmp_path, "sh", "-c",
                   f"trap 'echo {name} > got; exit 7' {name}; echo up; "
                   "while :; do sleep 0.05; done")
    try:
        run = wait_running(here)
        deadline = time.monotonic() + 10
        while "up" not in (here.home / "runs" / run["id"] / "stdout.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = here("runs", "cancel", run["id"], "--signal", sig, "--json")
        assert r.code == 0, r.err
        rec = r.json()
        assert isinstance(rec, dict)
        assert (rec["outcome"], rec["exit_code"]) == ("cancelled", 7), rec
        assert (tmp_path / "got").read_text() == f"{name}\n"
        assert rec["cancel"]["signal"] == sig
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.communicate()


def test_a_run_whose_saphan_was_killed_is_already_finished_when_cancel_comes(
        here: Saphan, tmp_path: Path) -> None:
    """SIGKILL to the driver: its jail dies with it; the next command that
    opens the store (here `runs cancel` itself) finishes the row holder-dead,
    so there is nothing left to cancel."""
    token = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"
    driver = start(here, tmp_path, "sleep", token)
    run = wait_running(here)
    driver.kill()
    driver.communicate()
    r = here("runs", "cancel", run["id"])
    assert r.code == 2 and "already finished" in r.err and "holder-dead" in r.err, r.err
    rec = here.ok("runs", "show", run["id"], "--json").json()
    assert isinstance(rec, dict)
    assert rec["outcome"] == "holder-dead"
    assert rec["notes"][-1].startswith("reconciled by `saphan runs cancel` at ")
    assert processes_with(token) == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--grace", "601"], "--grace"), (["--grace", "-1"], "--grace"),
    (["--signal", "SIGSTOP"], "--signal 'SIGSTOP' is not one runs cancel sends"),
    (["--signal", "19"], "is not one runs cancel sends"),
])
def test_out_of_bounds_options_are_exit_2(saphan_sqlite: Saphan, args: list[str],
                                          needle: str) -> None:
    r = saphan_sqlite("runs", "cancel", "01ANY", *args)
    assert r.code == 2 and needle in r.err, r.err


def test_an_unknown_run_is_exit_2(saphan_sqlite: Saphan) -> None:
    r = saphan_sqlite("runs", "cancel", "01NOSUCHRUN")
    assert r.code == 2 and "no run '01NOSUCHRUN'" in r.err


@pytest.mark.parametrize(("given", "name"), [
    ("TERM", "SIGTERM"), ("sigint", "SIGINT"), ("1", "SIGHUP"), ("9", "SIGKILL"),
    ("SIGKILL", "SIGKILL"),
])
def test_signals_are_named_any_usual_way(given: str, name: str) -> None:
    assert parse_signal(given) == name


# -- a driver that cannot be signalled is not taken for dead -------------------------

def _held_by(ctx: Context, proc: subprocess.Popen[bytes]) -> str:
    """A live row on m/s1 held by ``proc`` (standing in for the run's saphan)."""
    from saphan.ids import new_run_id
    from saphan.liveness import Holder, boot_id, process_start_ticks, this_host
    from saphan.run.reserve import reserve
    from saphan.timefmt import now_iso

    s1 = ctx.store.get_slot("m", "s1")
    assert s1 is not None
    base = {"id": new_run_id(), "machine": "m", "slot": "s1", "workdir": "/wd",
            "started_at": now_iso()}
    reserve(ctx, s1, base, "/wd",
            Holder(this_host(), proc.pid, process_start_ticks(proc.pid), boot_id()))
    return str(base["id"])


@pytest.mark.parametrize(("said", "fix"), [
    ("not sent: permission denied (another user's saphan drives it)",
     "as the user whose saphan drives it (uid "),
    ("not sent: its start time or boot id was not recorded",
     "then `saphan runs finalize "),
])
def test_a_driver_cancel_cannot_signal_keeps_its_run_live_and_its_seat(
        ctx: Context, monkeypatch: pytest.MonkeyPatch, said: str, fix: str) -> None:
    """Review (lc_cancel_eperm): "not sent" is alive-or-unknown, never dead —
    cancel refuses, the row stays live, the seat held, the request taken back."""
    import saphan.run.cancel as cancel_mod
    from saphan.refusals import Refusal
    from saphan.run.end import cancel_request

    driver = subprocess.Popen(["sleep", "60"])
    try:
        rid = _held_by(ctx, driver)
        monkeypatch.setattr(cancel_mod, "_signal_here", lambda h, s: said)
        with pytest.raises(RuntimeError) as info:
            cancel_mod.cancel(ctx, rid, grace=0)
        msg = str(info.value)
        assert f"pid {driver.pid}" in msg and said in msg and fix in msg, msg
        assert "the row stays live and its seat held" in msg
        row = ctx.store.get_run(rid)
        assert row is not None and row.live and row.outcome is None
        assert cancel_request(ctx.workspace.run_dir(rid)) is None
        assert driver.poll() is None
        s1 = ctx.store.get_slot("m", "s1")
        assert s1 is not None
        with pytest.raises(Refusal) as full:
            _held_by(ctx, driver)
        assert full.value.cls == "seat-full"
    finally:
        driver.kill()
        driver.wait()


def test_a_driver_measured_dead_after_the_signal_lets_cancel_record_the_end(
        ctx: Context) -> None:
    """The signal reached it and it is gone (a zombie here, never reaped by a
    saphan that would record): cancel records the run cancelled itself."""
    from saphan.run.cancel import cancel

    driver = subprocess.Popen(["sleep", "60"])
    try:
        rid = _held_by(ctx, driver)
        done = cancel(ctx, rid, grace=5)
        assert done.recorded_by == "cancel", done.steps
        assert done.record.outcome == "cancelled"
        assert "SIGTERM to the run's driver" in done.steps[0] and done.steps[0].endswith("sent")
        row = ctx.store.get_run(rid)
        assert row is not None and not row.live
    finally:
        driver.kill()
        driver.wait()
