"""Seat conflicts with holders on a far machine: their liveness is read over
the machine's own transport; an unreachable machine's holder counts as alive."""

from __future__ import annotations

import signal
import time

from remote.conftest import Remote, pid_alive, stop


def test_far_holder_killed_is_finalised_by_the_next_reservation(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("holder/wd")
    proc = far.start_run("far1", wd, "sleep", "60")
    holder = far.wait_far_holder("far1")
    assert holder["liveness"] == "alive"
    # saphan dies without finalising (SIGKILL); its connection drops, the far
    # side sees its lifeline close and hangs up the far process.
    stop(proc, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(holder["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(holder["pid"])
    assert far.record(holder["run"])["finished_at"] is None  # still holding the seat
    assert far.ok("slot", "show", "far1", "s1", "--json").json()["holders"][0]["liveness"] \
        == "dead"
    far.ok("run", "--machine", "far1", "--slot", "s1", "--workdir", str(wd), "--", "true")
    dead = far.record(holder["run"])
    assert dead["outcome"] == "holder-dead" and dead["finished_at"]
    assert any(f"pid {holder['pid']} does not exist on far1" in n for n in dead["notes"])


def test_unreachable_far_holder_counts_as_alive(far: Remote) -> None:
    far.ready("far3")
    h = far.host("far3")
    wd = h.mkdir("unreachable/wd")
    proc = far.start_run("far3", wd, "sleep", "60", slot="s1")
    holder = far.wait_far_holder("far3")
    h.link_down()
    try:
        r = far("run", "--machine", "far3", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert r.code == 3, r.err
        assert "refused [seat-full]: slot s1 on far3 carries 1 run and may carry 1" in r.err
        assert f"run {holder['run']} (pid {holder['pid']} on ssh://{h.user}@{h.addr}:22" in r.err
        assert "liveness unknown" in r.err
        assert "No route to host" in r.err or "Network is unreachable" in r.err
        assert "counted as alive" in r.err
        assert pid_alive(holder["pid"])  # nothing was done to it
    finally:
        h.link_up()
    code, _out, err = stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err
    assert far.record(holder["run"])["outcome"] == "interrupted"
