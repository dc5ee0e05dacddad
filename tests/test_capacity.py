"""Seat capacity enforced by the database: races, dead holders, the refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Saphan, saphan_exe
from saphan.capacity import reserve_seat
from saphan.ids import new_run_id
from saphan.liveness import Holder, current_holder, process_start_ticks
from saphan.refusals import Refusal
from saphan.store import Store, open_store
from saphan.store.rows import Machine, Slot


def _store(url: str, tmp_path: Path) -> Store:
    return open_store(url, tmp_path / "unused.db")


def _slot(store: Store, n: int | None, name: str = "s1") -> Slot:
    if store.get_machine("m1") is None:
        store.add_machine(Machine("m1", "local"))
    store.add_slot(Slot("m1", name, "command", n))
    slot = store.get_slot("m1", name)
    assert slot is not None
    return slot


def _reserve(store: Store, slot: Slot, holder: Holder | None = None) -> tuple[str, int]:
    run_id = new_run_id()
    ordinal = reserve_seat(store, slot, run_id=run_id, tool="command", workdir=None,
                           holder=holder or current_holder())
    return run_id, ordinal


def test_a_checkpoint_that_raises_stops_the_wait_for_a_seat(database_url: str,
                                                             tmp_path: Path) -> None:
    """`run --wait`: a signal (run/pipeline's checkpoint raising) ends the
    waiting after the pause it landed in, not at the end of --wait."""
    store = _store(database_url, tmp_path)
    one = _slot(store, 1)
    _reserve(store, one)
    calls: list[float] = []

    def checkpoint() -> None:
        calls.append(time.monotonic())
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        reserve_seat(store, one, run_id=new_run_id(), tool="command", workdir=None,
                     holder=current_holder(), wait=60, checkpoint=checkpoint)
    assert len(calls) == 1 and time.monotonic() - t0 < 5
    assert len(store.live_runs("m1", "s1")) == 1


def test_ordinals_are_distinct_keys_and_none_means_one(database_url: str, tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    three = _slot(store, 3)
    assert [_reserve(store, three)[1] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Refusal) as e:
        _reserve(store, three)
    assert e.value.cls == "seat-full"
    assert "carries 3 runs and may carry 3" in e.value.message
    one = _slot(store, None, "single")
    assert _reserve(store, one)[1] == 0
    with pytest.raises(Refusal, match="carries 1 run and may carry 1"):
        _reserve(store, one)


def test_finalised_ordinal_is_reusable_and_finalize_is_once(database_url: str,
                                                             tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    slot = _slot(store, 2)
    a, _ = _reserve(store, slot)
    _b, _ = _reserve(store, slot)
    assert store.finalize(a, state="ended", outcome="exited", exit_code=0)
    assert not store.finalize(a, state="ended", outcome="exited", exit_code=0)
    _c, ordinal = _reserve(store, slot)
    assert ordinal == 0


def test_lowering_capacity_never_evicts_raising_is_immediate(database_url: str,
                                                              tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    slot = _slot(store, 3)
    ids = [_reserve(store, slot)[0] for _ in range(3)]
    store.set_max_sessions("m1", "s1", 1)
    lowered = store.get_slot("m1", "s1")
    assert lowered is not None
    assert len(store.live_runs("m1", "s1")) == 3
    # ordinal 0 is still held: refused until ordinals below the new N free up
    store.finalize(ids[2], state="ended", outcome="exited")
    with pytest.raises(Refusal, match="carries 2 runs and may carry 1"):
        _reserve(store, lowered)
    store.finalize(ids[0], state="ended", outcome="exited")
    assert _reserve(store, lowered)[1] == 0
    store.set_max_sessions("m1", "s1", 4)
    raised = store.get_slot("m1", "s1")
    assert raised is not None
    assert _reserve(store, raised)[1] == 2


def test_dead_holder_finalised_by_id_live_never(database_url: str, tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    slot = _slot(store, 2)
    child = subprocess.Popen(["sleep", "60"])
    try:
        me = current_holder()
        live_holder = Holder(me.host, child.pid, process_start_ticks(child.pid), me.boot_id)
        live_id, _ = _reserve(store, slot, live_holder)
        dead = subprocess.Popen(["true"])
        dead.wait()
        dead_holder = Holder(me.host, dead.pid, 12345, me.boot_id)
        dead_id, _ = _reserve(store, slot, dead_holder)
        new_id, ordinal = _reserve(store, slot)
        assert ordinal == 1
        dead_row = store.get_run(dead_id)
        assert dead_row is not None and dead_row.outcome == "holder-dead"
        assert "does not exist" in json.dumps(dead_row.record())
        live_row = store.get_run(live_id)
        assert live_row is not None and live_row.live
        assert {r.id for r in store.live_runs("m1", "s1")} == {live_id, new_id}
    finally:
        child.kill()
        child.wait()


def test_pid_reuse_is_a_dead_holder(database_url: str, tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    slot = _slot(store, 1)
    me = current_holder()
    assert me.start_ticks is not None
    # Same pid as a live process (this one), different start time: reused pid.
    impostor = Holder(me.host, me.pid, me.start_ticks - 1, me.boot_id)
    old_id, _ = _reserve(store, slot, impostor)
    _new_id, ordinal = _reserve(store, slot)
    assert ordinal == 0
    row = store.get_run(old_id)
    assert row is not None and row.outcome == "holder-dead"
    assert "reused" in json.dumps(row.record())


def test_unknown_liveness_counts_as_alive(database_url: str, tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    slot = _slot(store, 1)
    far = Holder("some-other-host", 4711, 99, "boot")
    far_id, _ = _reserve(store, slot, far)
    with pytest.raises(Refusal) as e:
        _reserve(store, slot)
    assert far_id in e.value.message
    assert "liveness unknown" in e.value.message
    row = store.get_run(far_id)
    assert row is not None and row.live


def _wait_running(s: Saphan, timeout: float = 30) -> dict[str, object]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = s("runs", "list", "--json")
        if r.code == 0:
            runs = json.loads(r.out)
            live = [x for x in runs if x["state"] == "running"]
            if live:
                return live[0]  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError("run never started")


@pytest.mark.usefixtures("bwrap_available")
def test_seat_full_through_cli_names_numbers_and_holder(saphan: Saphan, tmp_path: Path) -> None:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command")
    first = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sleep", "60"], env=saphan.env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        holder = _wait_running(saphan)
        r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--",
                   "true")
        assert r.code == 3
        assert "refused [seat-full]: slot s1 on here carries 1 run and may carry 1" in r.err
        assert f"run {holder['id']} (pid {first.pid} on " in r.err
        assert "fix: " in r.err and "`saphan runs cancel ID`" in r.err
        refused = saphan.ok("runs", "show", "last", "--json").json()
        assert isinstance(refused, dict)
        assert refused["refusal"]["class"] == "seat-full"
        shown = saphan.ok("slot", "show", "here", "s1", "--json").json()
        assert isinstance(shown, dict)
        assert [(h["ordinal"], h["liveness"]) for h in shown["holders"]] == [(0, "alive")]
        # SIGTERM to saphan: forwarded to the run, the row is finalised.
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 128 + signal.SIGTERM
        row = saphan.ok("runs", "show", str(holder["id"]), "--json").json()
        assert isinstance(row, dict)
        assert row["outcome"] == "interrupted" and row["finished_at"] is not None
    finally:
        first.kill()
        first.wait()


@pytest.mark.usefixtures("bwrap_available")
def test_sigkilled_saphan_is_recovered_by_next_reservation(saphan: Saphan,
                                                           tmp_path: Path) -> None:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command")
    marker = tmp_path / "still-running"
    first = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sh", "-c", f"sleep 3; touch {marker}"], env=saphan.env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    holder = _wait_running(saphan)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--",
               "true")
    assert r.code == 0, r.err
    old = saphan.ok("runs", "show", str(holder["id"]), "--json").json()
    assert isinstance(old, dict)
    assert old["outcome"] == "holder-dead"
    assert any("holder dead" in n for n in old["notes"])
    # The orphaned jail died with saphan: its command never finished.
    time.sleep(4)
    assert not marker.exists()


def test_operator_finalize(saphan: Saphan, tmp_path: Path) -> None:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command")
    store = open_store(_config_url(saphan), saphan.home / "saphan.db")
    slot = store.get_slot("here", "s1")
    assert slot is not None
    far_id, _ = _reserve(store, slot, Holder("elsewhere", 1, 1, "b"))
    store.close()
    r = saphan.ok("runs", "finalize", far_id, "--reason", "host decommissioned")
    assert "finalised" in r.out
    rec = saphan.ok("runs", "show", far_id, "--json").json()
    assert isinstance(rec, dict)
    assert rec["outcome"] == "finalized-by-operator"
    assert any("host decommissioned" in n for n in rec["notes"])
    again = saphan("runs", "finalize", far_id)
    assert again.code == 2 and "already finished" in again.err


def _config_url(s: Saphan) -> str:
    import tomllib

    return str(tomllib.loads((s.home / "config.toml").read_text())["database"]["url"])


def test_the_reservation_or_its_holders_in_one_reading(database_url: str,
                                                       tmp_path: Path) -> None:
    """Store.reserve_or_holders (one round trip on PostgreSQL, migration 9):
    the ordinal taken, or, with every ordinal held, exactly the live rows
    holding them — and the losing attempt wrote nothing."""
    store = open_store(database_url, tmp_path / "h.db")
    try:
        args = dict(machine="m", slot="s", capacity=2, tool="command", workdir=None,
                    holder=("h", 1, 2, "b"))
        assert store.reserve_or_holders(run_id="r1", **args) == (0, [])  # type: ignore[arg-type]
        assert store.reserve_or_holders(run_id="r2", **args) == (1, [])  # type: ignore[arg-type]
        got, holders = store.reserve_or_holders(run_id="r3", **args)  # type: ignore[arg-type]
        assert got is None
        assert [(r.id, r.session_ordinal, r.holder_pid) for r in holders] == [
            ("r1", 0, 1), ("r2", 1, 1)]
        assert store.get_run("r3") is None
        assert store.finalize("r1", state="ended", outcome="exited")
        got, holders = store.reserve_or_holders(run_id="r3", **args)  # type: ignore[arg-type]
        assert (got, holders) == (0, [])
    finally:
        store.close()
