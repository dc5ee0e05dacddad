"""What saphan-launcher confirmed, read from its status descriptor.

The launcher writes its control lines to a descriptor no process of the run
can write (close-on-exec, the launcher not dumpable; on a far machine a file
in a directory the Landlock domain keeps unwritable). Nothing the run prints
is ever parsed as control. The record never claims more than these lines:

    saphan-launcher: self sha256=HEX                       (--expect-sha256)
    saphan-launcher: landlock abi=N enforced writable=[…] scopes=[…]
    saphan-launcher: refused [CLASS] MESSAGE
    saphan-launcher: abandoned pids=[…]     (it could not end every process;
                                            [unknown]: it could not list them)
    saphan-launcher: exited code=N reaped=K
    saphan-launcher: not started: WHY      (its lifeline ended or said stop first)

The command's status is the launcher's ``exited`` line where there is one:
the boundary process's own status can be forged from inside a bubblewrap
jail (its process 1's status channel; review: measured), and a run the
launcher did not report ending is never recorded ``exited``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from saphan import refusals
from saphan.refusals import CLASSES
from saphan.run.end import RunEnd

SELF = re.compile(r"^saphan-launcher: self sha256=([0-9a-f]{64})$")
CONFIRM = re.compile(r"^saphan-launcher: landlock abi=(\d+) enforced writable=\[(.*?)\]"
                     r"(?: scopes=\[(.*?)\])?$")
REFUSED = re.compile(r"^saphan-launcher: refused \[([a-z-]+)\] (.*)$")
EXITED = re.compile(r"^saphan-launcher: exited code=(-?\d+) reaped=(\d+)$")
ABANDONED = re.compile(r"^saphan-launcher: abandoned pids=\[([0-9,]*|unknown)\]$")
NOT_STARTED = re.compile(r"^saphan-launcher: not started: (.*)$")

#: at most this much of a status file is read
LIMIT = 1 << 16


class Expected(NamedTuple):
    """What the engine sent, to hold the launcher's lines against. ``landlock``
    False: the launcher only reaped (no domain is claimed from it)."""

    landlock: bool
    writable: tuple[str, ...] = ()
    abi: int | None = None
    self_sha256: str | None = None


def lines_of(raw: bytes) -> list[str]:
    return [b.decode(errors="replace").rstrip("\r") for b in raw[:LIMIT].splitlines()]


def apply(lines: list[str], expected: Expected, record: dict[str, Any], end: RunEnd,
          *, where: str = "") -> None:
    """Fold the launcher's lines into ``record`` and ``end``.

    A ``refused [CLASS]`` line raises that Refusal (the run is recorded
    refused, ``enforced_by`` none). A confirmation that is missing, or names
    another ABI or writable set than the one sent, leaves the record saying
    NOT enforced (and a run that exited 0 failed). ``where`` names the far
    machine in messages."""
    on = f" on {where}" if where else ""
    if record.get("enforced_by") is not None:
        record["enforced_by"]["status_lines"] = lines
    for line in lines:
        m = REFUSED.match(line)
        if m:
            cls, message = m.group(1), m.group(2)
            record["enforced_by"] = None
            if cls in CLASSES:
                raise refusals.of_class(cls, f"saphan-launcher{on} refused: {message}",
                                        f"see the `{cls}` row of docs/refusals.md")
            record["notes"] = [*record.get("notes", []), f"the launcher refused: {line}"]
            end.outcome = "failed"
            return
    exited = next((m for m in map(EXITED.match, lines) if m), None)
    if exited is not None:
        record["processes_killed_at_end"] = int(exited.group(2))
        code = int(exited.group(1))
        if code != end.exit_code:
            if end.exit_code is not None:
                record["notes"] = [*record.get("notes", []), (
                    f"the boundary process{on} ended with status {end.exit_code}, but the "
                    f"launcher reported the command's status {code}: the launcher's is "
                    "recorded")]
            outcome = end.outcome
            end.exited(code)
            if outcome not in ("exited", "failed"):
                end.outcome = outcome
    elif not_started(lines):
        record["processes_killed_at_end"] = 0
        record["notes"] = [*record.get("notes", []), (
            f"the launcher{on} started nothing: its lifeline ended or said stop before the "
            "command could start")]
        end.exit_code = None
        if end.outcome == "exited":
            end.outcome = "failed"
    else:
        record["processes_killed_at_end"] = None
        boundary = ("" if end.exit_code is None
                    else f" (the boundary process{on} ended with status {end.exit_code})")
        record["notes"] = [*record.get("notes", []), (
            "the launcher did not report how the run ended; processes killed at the end are "
            f"not counted, and the command's status is unknown{boundary}")]
        # No word from the launcher: no status, and never a clean end (the
        # boundary process's own status can be forged from inside).
        end.exit_code = None
        if end.outcome == "exited":
            end.outcome = "failed"
    left = next((m for m in map(ABANDONED.match, lines) if m), None)
    if left is not None and left.group(1) == "unknown":
        record["processes_left_running"] = "unknown"
        record["notes"] = [*record.get("notes", []), (
            f"the launcher{on} could not list the processes the run left (its /proc could "
            "not be read: the run may have lowered its open-file limit), so it could not end "
            "them; this run did not end cleanly")]
        if end.outcome == "exited":
            end.outcome = "failed"
    elif left is not None:
        pids = [int(p) for p in left.group(1).split(",") if p]
        record["processes_left_running"] = pids
        record["notes"] = [*record.get("notes", []), (
            f"the launcher{on} could not end every process of the run: pids {pids} were "
            "still there when it gave up; this run did not end cleanly")]
        if end.outcome == "exited":
            end.outcome = "failed"
    if not expected.landlock:
        _check_started(lines, expected, record, end)
        return
    why = _mismatch(lines, expected)
    if why is not None:
        claimed = record.get("enforced_by")
        record["enforced_by"] = None
        record["not_enforced"] = {"claimed_by_composition": claimed, "why": why}
        record["notes"] = [*record.get("notes", []), "NOT ENFORCED: the kernel's confirmation "
                           f"of the Landlock domain{on} is missing or differs from the policy"]
        if end.outcome == "exited":
            end.outcome = "failed"
        return
    confirm = next(m for m in map(CONFIRM.match, lines) if m)
    record["enforced_by"]["confirmation"] = confirm.group(0)
    record["enforced_by"]["scopes"] = [s for s in (confirm.group(3) or "").split(",") if s]


def not_started(lines: list[str]) -> bool:
    """The launcher said it started nothing (its lifeline came first)."""
    return any(NOT_STARTED.match(line) for line in lines)


def exit_code(lines: list[str]) -> int | None:
    """The command's status from the launcher's ``exited`` line."""
    exited = next((m for m in map(EXITED.match, lines) if m), None)
    return int(exited.group(1)) if exited is not None else None


def _check_started(lines: list[str], expected: Expected, record: dict[str, Any],
                   end: RunEnd) -> None:
    """The reaper is the boundary's first process and says its digest before
    anything of the run starts: without that line nothing ran inside the
    boundary (bubblewrap failed to build it: its error is in stderr.log), so
    nothing is claimed enforced — nor a network cut."""
    if expected.self_sha256 is None:
        return
    if any(m and m.group(1) == expected.self_sha256 for m in map(SELF.match, lines)):
        return
    claimed = record.get("enforced_by")
    record["enforced_by"] = None
    record["not_enforced"] = {
        "claimed_by_composition": claimed,
        "why": "the boundary never started: saphan-launcher's reaper, its first process, did "
               "not confirm its own digest (the boundary's own error is in stderr.log)"}
    if str(record.get("network", "")).startswith("off"):
        record["network"] = "not applied: the boundary never started"
    record["notes"] = [*record.get("notes", []), "NOT ENFORCED: the boundary never started, "
                       "so nothing of the run ran inside it"]
    if end.outcome == "exited":
        end.outcome = "failed"


def _mismatch(lines: list[str], expected: Expected) -> str | None:
    if expected.self_sha256 is not None:
        mine = [m for m in map(SELF.match, lines) if m]
        if len(mine) > 1:
            return "saphan-launcher's status holds more than one self-digest line"
        me = mine[0] if mine else None
        if me is None:
            return "saphan-launcher did not confirm its own digest"
        if me.group(1) != expected.self_sha256:
            return (f"the launcher measured itself as sha256 {me.group(1)}, not the "
                    f"{expected.self_sha256} sent")
    confirms = [m for m in map(CONFIRM.match, lines) if m]
    if not confirms:
        return "saphan-launcher printed no confirmation line"
    if len(confirms) > 1:
        return "saphan-launcher's status holds more than one confirmation line"
    confirm = confirms[0]
    if expected.abi is not None and int(confirm.group(1)) != expected.abi:
        return (f"the launcher confirmed Landlock ABI {confirm.group(1)}, not the measured "
                f"{expected.abi} the gate admitted")
    got = [p for p in confirm.group(2).split(",") if p]
    if got != list(expected.writable):
        return (f"the launcher confirmed writable=[{confirm.group(2)}], not the policy's "
                f"[{','.join(expected.writable)}]")
    return None
