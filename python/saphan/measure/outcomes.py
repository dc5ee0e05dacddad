"""Per-test outcomes of one suite run, and the pairing of base against head.

A measure-base report never gives just a total: every test item is paired
across the two runs (:func:`pair`) and put in exactly one class:

- ``pre-existing``: fails at base and at head;
- ``introduced``: passes at base, fails at head;
- ``fixed``: fails at base, passes at head;
- ``passing``: fails at neither (a skipped item counts as not failing);
- ``only-base`` / ``only-head``: present on one side only.

Outcomes come from what the suite wrote (:func:`from_junit` for pytest's
``--junitxml``, :func:`from_cargo` for libtest's JSON lines) or, for any
other command, its exit status as one item labelled as such
(:func:`from_exit`). What a run wrote is hostile input: files are read with a
size limit and without following a link, XML with no external entities or
DTD-driven expansion (expat's amplification limits, and a DOCTYPE refused
outright), names kept as given (the report escapes them when printed).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: an item's result at one side
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
#: the classes of a pair (module docstring)
CLASSES = ("pre-existing", "introduced", "fixed", "passing", "only-base", "only-head")
#: what a suite's report file may weigh
MAX_REPORT_BYTES = 64 << 20


class ReportUnreadable(Exception):
    """A suite's report that cannot be taken as outcomes (named in the message)."""


@dataclass(frozen=True)
class Outcomes:
    """One suite run: item -> result, and where the results came from."""

    items: Mapping[str, str]
    #: "junit", "cargo" or "exit status"
    source: str


def from_exit(code: int, label: str) -> Outcomes:
    """A command with no per-test report: its exit status, one item."""
    return Outcomes({f"{label} (exit status)": PASSED if code == 0 else FAILED}, "exit status")


def read_limited(path: str) -> bytes:
    """A report file the run wrote: a regular file, not through a link, at
    most :data:`MAX_REPORT_BYTES`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise ReportUnreadable(f"{path} cannot be opened ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ReportUnreadable(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise ReportUnreadable(f"{path} is larger than {MAX_REPORT_BYTES} bytes")
    return data


def from_junit(data: bytes) -> Outcomes:
    """pytest's ``--junitxml``: each ``testcase`` is ``classname::name``;
    a ``failure`` or ``error`` child fails it, ``skipped`` skips it."""
    import xml.etree.ElementTree as ET

    if b"<!DOCTYPE" in data[:4096].upper() or b"<!ENTITY" in data.upper():
        raise ReportUnreadable("a JUnit report with a DOCTYPE or an entity declaration")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise ReportUnreadable(f"the JUnit report is not XML ({e})") from None
    items: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        result = (FAILED if tags & {"failure", "error"} else
                  SKIPPED if "skipped" in tags else PASSED)
        # a name twice (a rerun, a parametrised id clash): a failure wins
        if items.get(name) != FAILED:
            items[name] = result
    return Outcomes(items, "junit")


def from_cargo(lines: Iterable[bytes]) -> Outcomes:
    """libtest's JSON lines (``cargo test -- -Z unstable-options --format
    json``): ``{"type": "test", "event": "ok"|"failed"|"ignored", "name": …}``;
    other lines (the build's, a suite's summary) are ignored."""
    items: dict[str, str] = {}
    for raw in lines:
        raw = raw.strip()
        if not raw.startswith(b"{"):
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("type") != "test":
            continue
        name, what = event.get("name"), event.get("event")
        if not isinstance(name, str) or what not in ("ok", "failed", "ignored", "timeout"):
            continue
        result = {"ok": PASSED, "ignored": SKIPPED}.get(str(what), FAILED)
        if items.get(name) != FAILED:
            items[name] = result
    return Outcomes(items, "cargo")


def pair(base: Outcomes, head: Outcomes) -> dict[str, list[str]]:
    """Every item of either side in exactly one class (sorted names); a
    skipped item counts as not failing on its side."""
    out: dict[str, list[str]] = {c: [] for c in CLASSES}
    for name in sorted(set(base.items) | set(head.items)):
        b, h = base.items.get(name), head.items.get(name)
        if b is None:
            out["only-head"].append(name)
        elif h is None:
            out["only-base"].append(name)
        elif b == FAILED and h == FAILED:
            out["pre-existing"].append(name)
        elif h == FAILED:
            out["introduced"].append(name)
        elif b == FAILED:
            out["fixed"].append(name)
        else:
            out["passing"].append(name)
    return out
