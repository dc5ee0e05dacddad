"""Seat conflicts with holders on a far machine: their liveness is read over
the machine's own transport; an unreachable machine's holder counts as alive."""

from __future__ import annotations

import os
import signal
import time

import pytest

from integration.sshd.conftest import Remote, pid_alive, stop
from saphan import Engine, Refusal
from saphan.capacity import reserve_seat
from saphan.ids import new_run_id
from saphan.liveness import current_holder


def test_far_holder_killed_is_finalised_by_the_next_reservation(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("holder/wd")
    proc = far.start_run("far1", wd, "sleep", "60")
    holder = far.wait_far_holder("far1")
    assert holder["liveness"] == "alive"
    # saphan dies without finalising (SIGKILL); its connection drops. The far
    # run goes on (a lifeline that merely ends stops nothing) and keeps its seat.
    stop(proc, signal.SIGKILL)
    time.sleep(1)
    assert pid_alive(holder["pid"])
    r = far("run", "--machine", "far1", "--slot", "s1", "--workdir", str(wd), "--", "true")
    assert r.code == 3 and "refused [seat-full]" in r.err, r.err
    assert f"run {holder['run']} (pid {holder['pid']} on ssh://" in r.err
    assert far.record(holder["run"])["finished_at"] is None  # still holding the seat
    # The far process ends (killed there): the next reservation finds it dead.
    os.kill(holder["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(holder["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(holder["pid"])
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
        # A run there fails at its preflight dial, before any seat is taken.
        before = len(far.ok("runs", "list", "--json").json())
        r = far("run", "--machine", "far3", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert r.code == 1 and "machine far3" in r.err and "unreachable" in r.err, r.err
        assert len(far.ok("runs", "list", "--json").json()) == before
        # Conflict handling, which cannot read the far holder: counted as alive.
        engine = Engine(far.s.home)
        try:
            with pytest.raises(Refusal) as e:
                reserve_seat(engine.ctx.store, engine.slot("far3", "s1"), run_id=new_run_id(),
                             tool="command", workdir=str(wd), holder=current_holder(),
                             remote=engine.ctx.remote_liveness(engine.machine("far3")),
                             record_key=engine.ctx.record_key)
        finally:
            engine.close()
        msg = e.value.message
        assert e.value.cls == "seat-full"
        assert "slot s1 on far3 carries 1 run and may carry 1" in msg
        assert f"run {holder['run']} (pid {holder['pid']} on ssh://{h.user}@{h.addr}:22" in msg
        assert "liveness unknown" in msg
        assert "No route to host" in msg or "Network is unreachable" in msg
        assert "counted as alive" in msg
        assert pid_alive(holder["pid"])  # nothing was done to it
    finally:
        h.link_up()
    code, _out, err = stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err
    assert far.record(holder["run"])["outcome"] == "interrupted"
