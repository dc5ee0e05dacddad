"""doctor.py's SSH machines, against real sshd hosts: each machine reached
over its pinned key and its delivered launcher's probe run there, held
against its signed rows; a machine that answers nothing is a FAIL within the
bound, not a hang."""

from __future__ import annotations

import subprocess
import sys
import time

from integration.sshd.conftest import Remote
from test_doctor import _by_check


def test_doctor_reaches_each_ssh_machine_and_holds_its_rows(far: Remote) -> None:
    far.ready("far1")
    far.add("far2")  # registered, nothing delivered: its runs would be refused
    r = far("doctor")
    assert r.code == 1, r.out + r.err
    got = _by_check(r)
    status, detail, fix = got["machine:far1"]
    assert fix is None
    h = far.host("far1")
    assert status == "PASS", detail
    assert detail.startswith(f"{h.user}@{h.addr}:22 reached in ")
    assert "as its row says" in detail and "rows verify" in detail
    measured = far.ok("machine", "show", "far1", "--json").json()["facts"]["landlock"]
    assert f"measures Landlock level {measured['value']['level']}, as its row says " \
           f"(measured {measured['measured_at']})" in detail
    assert got["machine:far2"] == ("FAIL", "no saphan-launcher delivered: its runs are refused",
                                   "`saphan machine deliver far2 --probe`")
    assert "ssh-machines" not in got


def test_a_machine_that_answers_nothing_fails_within_the_bound(far: Remote) -> None:
    far.ready("far3")
    cfg = far.s.home / "config.toml"
    cfg.write_text(cfg.read_text() + "\n[ssh]\nconnect_timeout = 2\n")
    h = far.host("far3")
    h.stop()
    # A listener that takes the TCP connection and never says a word of SSH.
    silent = subprocess.Popen(
        ["ip", "netns", "exec", h.netns, sys.executable, "-c",
         "import socket, time\n"
         f"s = socket.create_server(('{h.addr}', 22))\n"
         "conns = []\n"
         "while True:\n"
         "    conns.append(s.accept())\n"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)
        assert silent.poll() is None, silent.stderr.read() if silent.stderr else ""
        started = time.monotonic()
        r = far("doctor")
        took = time.monotonic() - started
        assert r.code == 1, r.out + r.err
        status, detail, fix = _by_check(r)["machine:far3"]
        assert status == "FAIL", detail
        assert detail.startswith(f"machine far3 ({h.user}@{h.addr}:22): unreachable"), detail
        assert fix is not None and "bounds: 2 s to connect, 20 s for the probe" in fix
        # Bounded by the configured 2 s (measured: 2.7 s for the whole doctor), not
        # by the default 10 s, and not hung.
        assert took < 10, took
    finally:
        silent.kill()
        silent.wait()
        h.start()
    assert _by_check(far("doctor"))["machine:far3"][0] == "PASS"
