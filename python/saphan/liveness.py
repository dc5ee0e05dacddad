"""Is the process holding a seat still alive?

A holder is identified by (host, pid, process start time, boot id), so a pid
that was reused by a new process is not mistaken for the holder, and a holder
from before a reboot is known dead. When liveness cannot be determined (a
holder on another host) the answer is "unknown", which callers treat as alive:
refuse rather than double-book.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start_ticks: int | None
    boot_id: str | None

    def as_tuple(self) -> tuple[str, int, int | None, str | None]:
        return (self.host, self.pid, self.start_ticks, self.boot_id)


@dataclass(frozen=True)
class Liveness:
    state: str  # "alive" | "dead" | "unknown"
    evidence: str


def boot_id() -> str | None:
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return None


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
    return socket.gethostname()


def current_holder() -> Holder:
    pid = os.getpid()
    return Holder(this_host(), pid, process_start_ticks(pid), boot_id())


def check(holder: Holder) -> Liveness:
    if holder.host != this_host():
        return Liveness(
            "unknown", f"holder is on host {holder.host}; its liveness is not readable from here"
        )
    here_boot = boot_id()
    if holder.boot_id is None or here_boot is None or holder.start_ticks is None:
        return Liveness("unknown", "the holder's boot id or start time was not recorded")
    if holder.boot_id != here_boot:
        return Liveness("dead", f"host rebooted since (boot id {holder.boot_id} -> {here_boot})")
    ticks = process_start_ticks(holder.pid)
    if ticks is None:
        return Liveness("dead", f"pid {holder.pid} does not exist")
    if ticks != holder.start_ticks:
        return Liveness(
            "dead",
            f"pid {holder.pid} was reused (start time {ticks} ticks, holder had "
            f"{holder.start_ticks})",
        )
    # A zombie is dead for our purposes: it will never finalise its run.
    try:
        with open(f"/proc/{holder.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return Liveness("dead", f"pid {holder.pid} is a zombie")
    except OSError:
        return Liveness("dead", f"pid {holder.pid} exited")
    return Liveness("alive", f"pid {holder.pid} on {holder.host} is running (start time {ticks})")
