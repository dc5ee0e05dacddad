"""Is the process holding a seat still alive?

A holder is identified by (host, pid, process start time, boot id), so a pid
that was reused by a new process is not mistaken for the holder, and a holder
from before a reboot is known dead. A local boot id carries the machine id
(``MACHINE/BOOT``): a holder on another machine with the same host name is
"unknown", not "rebooted". When liveness cannot be determined (a
holder on another host) the answer is "unknown", which callers treat as alive:
refuse rather than double-book.

A holder on a remote runner is read over that machine's own transport: the
engine passes :func:`check` a :data:`RemoteCheck` that recognises the
holders it can read (saphan.site.far) and answers with the same verdicts,
computed by the same :func:`judge`. Unreachable is "unknown".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


# NamedTuples, not dataclasses: `runs list` of a live run imports this module,
# and the dataclass machinery (with `socket` for the host name) cost ~7 ms of it.
class Holder(NamedTuple):
    host: str
    pid: int
    start_ticks: int | None
    boot_id: str | None

    def as_tuple(self) -> tuple[str, int, int | None, str | None]:
        return (self.host, self.pid, self.start_ticks, self.boot_id)


class Liveness(NamedTuple):
    state: str  # "alive" | "dead" | "unknown"
    evidence: str


_boot_id: list[str | None] = []
_MACHINE_ID_PATH = "/etc/machine-id"


def boot_id() -> str | None:
    """This host's boot id (read once per process: it cannot change under
    us), qualified by a digest of its machine id when it has one:
    ``MACHINE/BOOT``. Two
    control planes sharing a host name are then told apart (one's holder is
    "unknown" to the other, never "dead: rebooted")."""
    if not _boot_id:
        try:
            with open(_BOOT_ID_PATH) as f:
                boot = f.read().strip()
        except OSError:
            _boot_id.append(None)
            return None
        try:
            with open(_MACHINE_ID_PATH) as f:
                machine = f.read().strip()
        except OSError:
            machine = ""
        ok = len(machine) == 32 and all(c in "0123456789abcdef" for c in machine)
        # the machine id is confidential (machine-id(5)): rows hold a digest of it
        import hashlib

        tag = hashlib.sha256(b"saphan holder machine " + machine.encode()).hexdigest()[:32]
        _boot_id.append(f"{tag}/{boot}" if ok else boot)
    return _boot_id[0]


def same_boot(recorded: str, here: str) -> bool | None:
    """Whether a recorded boot id is this boot: True, False (a reboot), or
    None (another machine of the same name: its machine id differs). An id
    recorded without its machine id (an older saphan's) compares by boot."""
    r_machine, _, r_boot = recorded.rpartition("/")
    h_machine, _, h_boot = here.rpartition("/")
    if r_machine and h_machine and r_machine != h_machine:
        return None
    return r_boot == h_boot


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses; it ends at the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])


def this_host() -> str:
    """The host name (what socket.gethostname() returns: the kernel's node name)."""
    return os.uname().nodename


def current_holder() -> Holder:
    pid = os.getpid()
    return Holder(this_host(), pid, process_start_ticks(pid), boot_id())


#: Reads a holder on another machine; None when it is not one it can read.
RemoteCheck = Callable[[Holder], Liveness | None]


def check(holder: Holder, remote: RemoteCheck | None = None) -> Liveness:
    if remote is not None:
        far = remote(holder)
        if far is not None:
            return far
    if holder.host != this_host():
        return Liveness(
            "unknown", f"holder is on host {holder.host}; its liveness is not readable from here"
        )
    ticks: int | None = None
    state: str | None = None
    try:
        with open(f"/proc/{holder.pid}/stat", "rb") as f:
            # comm (field 2) may contain spaces and parentheses; it ends at the last ')'.
            rest = f.read().rsplit(b")", 1)[1].split()
        state, ticks = rest[0].decode(), int(rest[19])
    except (OSError, IndexError, ValueError):
        pass
    return judge(holder, here_boot=boot_id(), ticks=ticks, state=state, where=holder.host)


def judge(
    holder: Holder, *, here_boot: str | None, ticks: int | None, state: str | None, where: str
) -> Liveness:
    """The verdict from what was read on the holder's host: its boot id now,
    and the pid's start time and state (None when the pid does not exist)."""
    if holder.boot_id is None or here_boot is None or holder.start_ticks is None:
        return Liveness("unknown", "the holder's boot id or start time was not recorded")
    same = same_boot(holder.boot_id, here_boot)
    if same is None:
        return Liveness("unknown", f"the holder ran on another machine named {where} (machine "
                        f"id {holder.boot_id.rpartition('/')[0]}, here "
                        f"{here_boot.rpartition('/')[0]}); its liveness is not readable here")
    if not same:
        return Liveness("dead", f"host rebooted since (boot id {holder.boot_id} -> {here_boot})")
    if ticks is None:
        return Liveness("dead", f"pid {holder.pid} does not exist on {where}")
    if ticks != holder.start_ticks:
        return Liveness(
            "dead",
            f"pid {holder.pid} on {where} was reused (start time {ticks} ticks, holder had "
            f"{holder.start_ticks})",
        )
    # A zombie is dead for our purposes: it will never finalise its run.
    if state in ("Z", "X"):
        return Liveness("dead", f"pid {holder.pid} on {where} is a zombie")
    return Liveness("alive", f"pid {holder.pid} on {where} is running (start time {ticks})")
