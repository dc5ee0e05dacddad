"""liveness.py: is a seat's holder alive? Judged against real processes of
this machine: this one, a reaped child, a reused pid, a zombie child."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from saphan.liveness import Holder, Liveness, boot_id, check, current_holder, process_start_ticks, this_host


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


@pytest.fixture
def zombie() -> Iterator[subprocess.Popen[bytes]]:
    """A real child that exited and is not reaped yet."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while _state(p.pid) != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.02)
    try:
        yield p
    finally:
        p.wait()


def test_this_process_is_alive() -> None:
    me = current_holder()
    assert me.host == this_host() and me.pid == os.getpid()
    assert me.start_ticks == process_start_ticks(os.getpid()) and me.start_ticks is not None
    assert me.boot_id == boot_id() and me.boot_id
    got = check(me)
    assert got.state == "alive", got
    assert f"pid {me.pid}" in got.evidence


def test_a_reaped_child_is_dead() -> None:
    p = subprocess.Popen(["sleep", "30"])
    ticks = process_start_ticks(p.pid)
    assert ticks is not None
    held = Holder(this_host(), p.pid, ticks, boot_id())
    assert check(held).state == "alive"
    p.kill()
    p.wait()
    got = check(held)
    assert got.state == "dead", got
    assert "does not exist" in got.evidence or "was reused" in got.evidence


def test_a_reused_pid_is_dead() -> None:
    me = current_holder()
    assert me.start_ticks is not None
    got = check(Holder(me.host, me.pid, me.start_ticks - 1, me.boot_id))
    assert got.state == "dead"
    assert f"was reused (start time {me.start_ticks} ticks, holder had {me.start_ticks - 1})" in got.evidence


def test_a_holder_from_another_boot_is_dead() -> None:
    me = current_holder()
    got = check(Holder(me.host, me.pid, me.start_ticks, "00000000-0000-0000-0000-000000000000"))
    assert got.state == "dead" and "rebooted" in got.evidence


def test_a_zombie_is_dead(zombie: subprocess.Popen[bytes]) -> None:
    ticks = process_start_ticks(zombie.pid)
    assert ticks is not None
    got = check(Holder(this_host(), zombie.pid, ticks, boot_id()))
    assert got.state == "dead" and "zombie" in got.evidence


def test_a_holder_on_another_host_is_unknown() -> None:
    me = current_holder()
    got = check(Holder("elsewhere.invalid", me.pid, me.start_ticks, me.boot_id))
    assert got.state == "unknown" and "elsewhere.invalid" in got.evidence


def test_a_holder_without_start_time_or_boot_id_is_unknown() -> None:
    me = current_holder()
    assert check(Holder(me.host, me.pid, None, me.boot_id)).state == "unknown"
    assert check(Holder(me.host, me.pid, me.start_ticks, None)).state == "unknown"


def test_check_prefers_the_remote_readers_answer() -> None:
    me = current_holder()
    far = Holder("far:runner1", 4242, 1, "b")
    asked: list[Holder] = []

    def remote(h: Holder) -> Liveness | None:
        asked.append(h)
        return Liveness("dead", "read over ssh") if h.host == "far:runner1" else None

    assert check(far, remote) == Liveness("dead", "read over ssh")
    # even for a holder on this host, the reader's answer wins when it gives one
    assert check(me, lambda h: Liveness("dead", "said so")) == Liveness("dead", "said so")
    # a reader that does not know the holder leaves it to the local judgement
    assert check(me, remote).state == "alive"
    assert asked == [far, me]


def test_a_boot_id_carries_this_machines_id() -> None:
    from saphan.liveness import boot_id

    here = boot_id()
    assert here is not None
    import hashlib

    with open("/etc/machine-id") as f:
        machine = f.read().strip()
    tag = hashlib.sha256(b"saphan holder machine " + machine.encode()).hexdigest()[:32]
    assert here.startswith(tag + "/") and machine not in here  # a digest, never the id


def test_same_boot_tells_a_reboot_from_another_machine_of_the_same_name() -> None:
    from saphan.liveness import same_boot

    a, b = "a" * 32, "b" * 32
    assert same_boot(f"{a}/boot1", f"{a}/boot1") is True
    assert same_boot(f"{a}/boot0", f"{a}/boot1") is False  # rebooted
    assert same_boot(f"{b}/boot1", f"{a}/boot1") is None  # another machine
    assert same_boot(f"{b}/boot0", f"{a}/boot1") is None
    # an id recorded by an older saphan (no machine id) compares by boot
    assert same_boot("boot1", f"{a}/boot1") is True
    assert same_boot("boot0", f"{a}/boot1") is False


def test_a_holder_of_another_machine_with_this_name_is_unknown_not_dead() -> None:
    """Two control planes sharing a host name (cloned VMs) must not end
    each other's runs as holder-dead: the other's holder is unknown, which
    conflict handling counts as alive."""
    from saphan.liveness import Holder, boot_id, check, current_holder

    me = current_holder()
    here = boot_id()
    assert here is not None
    other = "f" * 32 if not here.startswith("f" * 32) else "e" * 32
    twin = Holder(me.host, me.pid, me.start_ticks, f"{other}/{here.rpartition('/')[2]}")
    got = check(twin)
    assert got.state == "unknown", got
    assert "another machine named" in got.evidence
    rebooted = Holder(me.host, me.pid, me.start_ticks, f"{here.rpartition('/')[0]}/old-boot")
    assert check(rebooted).state == "dead"
