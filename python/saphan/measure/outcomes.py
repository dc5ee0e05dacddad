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
import re
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


#: what one side may hold: items, characters of one name, characters of all names
MAX_ITEMS, MAX_NAME, MAX_NAMES_TOTAL = 100_000, 1024, 16 << 20
_ENCODING = re.compile(rb"""^<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")


class _Items:
    """Items as a suite names them, capped (:data:`MAX_ITEMS` items, names cut
    at :data:`MAX_NAME` characters, :data:`MAX_NAMES_TOTAL` in all); a name
    given twice fails if either failed."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.total = 0

    def add(self, name: str, result: str) -> None:
        if len(name) > MAX_NAME:
            name = name[:MAX_NAME] + "…(cut)"
        if name not in self.items:
            if len(self.items) >= MAX_ITEMS:
                raise ReportUnreadable(f"the report names more than {MAX_ITEMS} items")
            self.total += len(name)
            if self.total > MAX_NAMES_TOTAL:
                raise ReportUnreadable(f"the report's names exceed {MAX_NAMES_TOTAL} characters")
        if self.items.get(name) != FAILED:
            self.items[name] = result


def from_junit(data: bytes) -> Outcomes:
    """pytest's ``--junitxml``: each ``testcase`` is ``classname::name``; a
    ``failure`` or ``error`` child fails it, ``skipped`` skips it. Parsed as
    a stream (no tree is built), UTF-8 only (a BOM or a declared encoding of
    another kind is refused: a DOCTYPE could hide in UTF-16), and any DOCTYPE,
    entity declaration or entity reference beyond XML's own five refused."""
    from xml.parsers import expat

    if data.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00", b"\x4c\x6f\xa7\x94")) \
            or b"\x00" in data[:4096]:
        raise ReportUnreadable("a JUnit report not in UTF-8")
    declared = _ENCODING.match(data.removeprefix(b"\xef\xbb\xbf")[:512])
    if declared is not None and declared.group(1).lower() not in (b"utf-8", b"utf8",
                                                                 b"us-ascii", b"ascii"):
        raise ReportUnreadable(f"a JUnit report declared {declared.group(1)!r}, not UTF-8")
    items = _Items()
    case: list[str] = []  # the open testcase's name, and its result so far

    def refuse(*_args: object) -> None:
        raise ReportUnreadable("a JUnit report with a DOCTYPE or an entity declaration")

    def start(tag: str, attrs: dict[str, str]) -> None:
        if tag == "testcase":
            case[:] = [f"{attrs.get('classname', '')}::{attrs.get('name', '')}", PASSED]
        elif case and tag in ("failure", "error"):
            case[1] = FAILED
        elif case and tag == "skipped" and case[1] != FAILED:
            case[1] = SKIPPED

    def end(tag: str) -> None:
        if tag == "testcase" and case:
            items.add(case[0], case[1])
            case.clear()

    parser = expat.ParserCreate("utf-8")
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.UnparsedEntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse  # type: ignore[assignment]
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        raise ReportUnreadable(f"the JUnit report is not XML ({e})") from None
    return Outcomes(items.items, "junit")


#: cargo's line naming the test binary it runs next (its stderr, joined to
#: stdout by the driver): ``Running unittests src/lib.rs (target/debug/deps/a-1f2e)``
_RUNNING = re.compile(rb"^\s*Running (?:unittests )?(\S+) \((?:.*/)?([^/()]+?)(?:-[0-9a-f]{8,})?"
                      rb"(?:\.exe)?\)\s*$")
_DOCTESTS = re.compile(rb"^\s*Doc-tests (\S+)\s*$")


def from_cargo(lines: Iterable[bytes]) -> Outcomes:
    """libtest's JSON lines (``cargo test -- -Z unstable-options --format
    json``): ``{"type": "test", "event": "ok"|"failed"|"ignored", "name": …}``;
    other lines are ignored but cargo's ``Running SRC (…/deps/CRATE-hash)``
    and ``Doc-tests CRATE``, which name the test binary the next events come
    from. A name more than one binary reports (two crates, or two
    integration-test files, both holding ``t::ok``) is told apart by its
    binary, ``NAME [CRATE SRC]`` — the same at base and at head whatever
    order the binaries ran in — so one's failure never pairs with another's."""
    events: list[tuple[str, str, str]] = []
    binary, suites = "", 0
    named: str | None = None  # the binary the last Running / Doc-tests line named
    for raw in lines:
        raw = raw.strip()
        if not raw.startswith(b"{"):
            m = _RUNNING.match(raw)
            d = _DOCTESTS.match(raw) if m is None else None
            if m is not None:
                named = (f"{m.group(2).decode(errors='replace')} "
                         f"{m.group(1).decode(errors='replace')}")
            elif d is not None:
                named = f"{d.group(1).decode(errors='replace')} doc-tests"
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "suite" and event.get("event") == "started":
            suites += 1
            binary, named = named or f"binary {suites}", None
            continue
        if event.get("type") != "test":
            continue
        name, what = event.get("name"), event.get("event")
        if not isinstance(name, str) or what not in ("ok", "failed", "ignored", "timeout"):
            continue
        events.append((binary, name, {"ok": PASSED, "ignored": SKIPPED}.get(str(what), FAILED)))
        if len(events) > 4 * MAX_ITEMS:
            raise ReportUnreadable(f"the report names more than {MAX_ITEMS} items")
    binaries_of: dict[str, set[str]] = {}
    for b, name, _ in events:
        binaries_of.setdefault(name, set()).add(b)
    items = _Items()
    for b, name, result in events:
        items.add(name if len(binaries_of[name]) == 1 else f"{name} [{b}]", result)
    return Outcomes(items.items, "cargo")


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
