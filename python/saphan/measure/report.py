"""The measure-base report, built here from what the driver left in the run's
return directory (measure/driver.py) and what saphan itself saw of the
working tree after the run (measure/scratch.py).

Everything read here was written inside the boundary, so it is parsed, never
trusted for shape: step lines must be ``NAME STATUS`` with a known name, SHAs
must be hexadecimal, suite reports go through measure/outcomes.py. saphan
compares the measured SHA with the expected one itself; per-test verdicts are
given only when they are equal (the design document: a measurement at an
unverified commit is not a measurement of the base).

``result`` is one of:

- ``measured``: the base verified, both sides' outcomes read, every item paired;
- ``base not measured``: with why, and both SHAs when there are two; no verdicts;
- ``base not isolated``: the base verified, but its run would import from the
  working tree outside the scratch (pytest: an editable install, a path
  entry), so its outcomes would be head's: no verdicts;
- ``outcomes unreadable``: the base verified, but a side's per-test report
  could not be read (named): no verdicts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from saphan.measure import outcomes as oc
from saphan.measure.order import SOURCES, Order

#: the steps the driver reports, in its order
STEPS = ("fresh", "toplevel", "ignored", "expected", "clone", "checkout", "verify", "paths",
         "base", "head", "removed", "final")
#: a shell's statuses for a command that could not be started
NOT_STARTED = {126: "not executable", 127: "not found"}
PHASES = ("base", "head", "final")
#: pytest's exit statuses that say the suite did not run to its end
PYTEST_INCOMPLETE = {2: "interrupted (a collection error, or stopped)", 3: "internal error",
                     4: "usage error", 5: "no tests collected"}
#: the files the driver writes (besides the phases' reports)
FACTS = ("steps", "expected", "target", "measured", "head")
#: the exit status `saphan measure-base` gives for a report that is not "measured"
EXIT_NOT_MEASURED = 4
#: names per class `runs show` prints (the record and --json hold every one)
SHOWN = 20
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_HEXISH = re.compile(r"[0-9a-fA-F]{4,64}")
_STEP = re.compile(r"([a-z]+) (-?[0-9]{1,4})")

#: a file of the run's return directory, by its name after ``measure-``
#: (None: not there); raises outcomes.ReportUnreadable when it cannot be read
Reader = Callable[[str], "bytes | None"]


def phase_file(kind: str, phase: str) -> str | None:
    """The name (after ``measure-``) of a phase's suite report."""
    return {"pytest": f"{phase}.xml", "cargo": f"{phase}.json"}.get(kind)


def files_for(order: Order) -> tuple[str, ...]:
    """Every file the report reads for ``order``."""
    extra = [phase_file(order.kind, p) for p in PHASES]
    paths = ("paths",) if order.kind == "pytest" else ()
    return (*FACTS, *paths, *(f for f in extra if f is not None))


def build(order: Order, read: Reader, *, workdir: str, repository: str,
          one_tree: Mapping[str, Any]) -> dict[str, Any]:
    """The report (module docstring). ``one_tree``: scratch.check's findings."""
    notes: list[str] = []
    steps = _steps(read, notes)
    report: dict[str, Any] = {
        "order": order.as_record(), "repository": repository, "working_tree": workdir,
        "steps": [{"step": name, "status": steps[name]} for name in STEPS if name in steps],
        "notes": notes,
    }
    expected = _sha(read, "expected", notes)
    measured = _sha(read, "measured", notes)
    target = _text(read, "target")
    report["base"] = {
        "named": order.base, "expect": order.expect,
        "expected": expected,
        "expected_from": _expected_from(order),
        "checked_out": target or None, "measured": measured,
        "verified": expected is not None and measured == expected,
    }
    report["head"] = {"commit": _sha(read, "head", notes)}
    why = _not_measured(order, steps, expected, measured, workdir, target=target)
    report["one_tree"] = {**one_tree, "scratch_removed_before_final": steps.get("removed") == 0,
                          "final_ran": "final" in steps}
    report["one_tree"]["holds"] = bool(report["one_tree"]["final_ran"]
                                       and report["one_tree"]["scratch_removed_before_final"]
                                       and not one_tree.get("scratch_present"))
    if tree_git := [g for g in one_tree.get("git_dirs_below") or [] if not g.startswith("(")]:
        notes.append("git repositories below the working tree after the run (a run could have "
                     "configured them: look before running git inside one): "
                     + ", ".join(tree_git))
    if why is not None:
        report.update(result="base not measured", why=why)
        return report
    unchecked, leaks = _isolation(order, steps, read, workdir, notes)
    if unchecked is not None:
        report.update(result="base not isolated", why=unchecked)
        return report
    if leaks:
        report["base"]["imports_from_working_tree"] = leaks
        report.update(result="base not isolated", why=(
            "the base run's Python imports from the working tree, outside the scratch clone "
            f"({', '.join(leaks[:5])}): an editable install or a path entry would run head's "
            "code in the \"base\" run; install the project non-editable, or run the suite "
            "with an interpreter that does not import it from the tree"))
        return report
    for phase in ("base", "head"):
        if steps.get(phase) in NOT_STARTED:
            report.update(result="outcomes unreadable", why=(
                f"the test command could not be started in the {phase} run (exit "
                f"{steps[phase]}: {NOT_STARTED[steps[phase]]}); a command named relative "
                "to the working tree is taken from it, one on PATH from the run's PATH"))
            return report
    sides: dict[str, oc.Outcomes | None] = {}
    unread: dict[str, str] = {}
    for phase in PHASES:
        if phase not in steps:
            unread[phase] = "the driver did not reach it"
            sides[phase] = None
            continue
        try:
            sides[phase] = _outcomes(order, phase, steps[phase], read)
        except oc.ReportUnreadable as e:
            unread[phase] = str(e)
            sides[phase] = None
    report["phases"] = {
        phase: {"status": steps.get(phase), "source": SOURCES[order.kind],
                **({"items": len(got.items), "failed": sorted(
                    n for n, r in got.items.items() if r == oc.FAILED)}
                   if (got := sides[phase]) is not None else {"unreadable": unread[phase]})}
        for phase in PHASES}
    base, head, final = sides["base"], sides["head"], sides["final"]
    if base is None or head is None:
        side = "base" if base is None else "head"
        report.update(result="outcomes unreadable",
                      why=f"the {side} run's outcomes could not be read: {unread[side]}")
        return report
    pairs = oc.pair(base, head)
    report.update(result="measured", pairs=pairs,
                  counts={cls: len(names) for cls, names in pairs.items()},
                  attention=_attention(order, steps, pairs, base, head))
    if final is not None:
        report["one_tree"]["changed_since_head"] = [
            {"item": name, "head": head.items.get(name), "final": final.items.get(name)}
            for name in sorted(set(head.items) | set(final.items))
            if head.items.get(name) != final.items.get(name)]
    return report


def _expected_from(order: Order) -> str:
    named = order.expect or (order.base if _HEXISH.fullmatch(order.base) else None)
    if named is not None:
        return f"the order's SHA {named}, expanded in the repository"
    return (f"{order.base!r} resolved in the repository when the run began (the order gave "
            "no SHA: --expect)")


def not_ignored(read: Reader, exit_code: int | None) -> bool:
    """The driver ended at its ignore check: it exited with its own status
    for that (saphan saw the exit) and its step file holds exactly the two
    steps before it — never a step file alone (a suite that ran later could
    have written one)."""
    from saphan.measure.driver import NOT_IGNORED

    try:
        raw = read("steps")
    except oc.ReportUnreadable:
        return False
    return exit_code == NOT_IGNORED and raw == b"fresh 0\ntoplevel 0\nignored 1\n"


def _isolation(order: Order, steps: Mapping[str, int], read: Reader, workdir: str,
               notes: list[str]) -> tuple[str | None, list[str]]:
    """(why the base run's isolation could not be checked, or None; its
    import paths that lie in the working tree outside the scratch clone).
    A venv's own site-packages inside the tree is not a leak (an installed
    copy of the project there is not seen: docs/measure-base.md)."""
    if order.kind != "pytest":
        notes.append("whether the base run reads the working tree (an editable install, a "
                     "build configuration above the scratch) is checked for pytest suites only")
        return None, []
    status = steps.get("paths")
    try:
        raw = read("paths") if status == 0 else None
    except oc.ReportUnreadable:
        raw = None
    if raw is None or len(raw) > 1 << 20:
        how = ("its interpreter is not a Python (a wrapper script): run the suite as "
               "`/path/to/python -m pytest …`" if status == 126 else
               "its interpreter was not found" if status == 127 else
               f"the probe ended {status}" if status not in (None, 0) else
               "the probe's answer is missing or larger than 1 MiB")
        return (f"which code the base run imports could not be checked ({how}): without it "
                "a \"base\" run may import head's code (an editable install), so no verdict "
                "is given"), []
    wd = workdir.rstrip("/")
    scratch = f"{wd}/{order.scratch}"
    leaks = []
    for entry in raw.decode("utf-8", "replace").split("\0"):
        inside = entry == wd or entry.startswith(wd + "/")
        if not inside or entry == scratch or entry.startswith(scratch + "/"):
            continue
        if entry.rstrip("/").rsplit("/", 1)[-1] in ("site-packages", "dist-packages"):
            continue  # a venv inside the tree: its installed packages, not the tree's code
        leaks.append(entry[:300])
    return None, sorted(set(leaks))


def _attention(order: Order, steps: Mapping[str, int], pairs: Mapping[str, list[str]],
               base: oc.Outcomes, head: oc.Outcomes) -> list[str]:
    """What a careful reader must look at besides the pairs: introduced
    items, items failing at head only, a suite that did not run to its end,
    sides that share no item. Any of these makes the exit status 1."""
    out = [f"introduced: {n}" for n in pairs.get("introduced", [])]
    out += [f"fails at head, absent at base: {n}" for n in pairs.get("only-head", [])
            if head.items.get(n) == oc.FAILED]
    out += [f"passes at base, {'skipped' if n in head.items else 'absent'} at head: {n}"
            for n, r in base.items.items()
            if r == oc.PASSED and head.items.get(n) in (None, oc.SKIPPED)]
    if order.kind == "exit" and pairs.get("pre-existing"):
        out.append("the command fails at base and at head, and its exit status is one item: "
                   "a new failure hides behind the old one (no per-test comparison: run "
                   "pytest or cargo test directly)")
    for phase in ("base", "head"):
        status = steps.get(phase)
        if order.kind == "pytest" and status in PYTEST_INCOMPLETE:
            out.append(f"the {phase} run did not complete: pytest exit {status}, "
                       f"{PYTEST_INCOMPLETE[status]}")
    if base.items and not head.items:
        out.append(f"the head run reported no items (exit {steps.get('head')}), the base "
                   f"run {len(base.items)}")
    if base.items and head.items and not (set(base.items) & set(head.items)):
        out.append("no item is named at both base and head: nothing could be compared")
    return out


def exit_status(report: Mapping[str, Any]) -> int:
    """`saphan measure-base`: 0 measured with nothing to look at, 1 measured
    with something in ``attention`` (an introduced failure first of all),
    :data:`EXIT_NOT_MEASURED` otherwise."""
    if report.get("result") != "measured":
        return EXIT_NOT_MEASURED
    return 1 if report.get("attention") else 0


def write(run_dir: str | os.PathLike[str], report: Mapping[str, Any]) -> str:
    """``measure.json`` in the run's directory (a new file renamed into place)."""
    path = Path(run_dir) / "measure.json"
    tmp = path.with_name(f".measure.json.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return str(path)


def lines(report: Mapping[str, Any]) -> list[str]:
    """The report for `runs show` (the caller escapes every line)."""
    base = report.get("base") or {}
    order = report.get("order") or {}
    out = [f"measure:     {report.get('result')}: base {order.get('base')!r}"
           + (f" (order's SHA {order['expect']})" if order.get("expect") else "")]
    out.append(f"  expected:  {base.get('expected') or '-'}  ({base.get('expected_from')})")
    out.append(f"  measured:  {base.get('measured') or '-'}  (git -C <scratch> rev-parse HEAD "
               f"after checkout --detach {base.get('checked_out') or '-'})")
    if report.get("why"):
        out.append(f"  why:       {report['why']}")
    out.append(f"  outcomes:  {order.get('outcomes_from')}")
    tree = report.get("one_tree") or {}
    cleared = {c.get("item") for c in tree.get("changed_since_head") or []
               if c.get("head") == oc.FAILED and c.get("final") != oc.FAILED}
    pairs = report.get("pairs") or {}
    for cls in oc.CLASSES:
        names = [f"{n} (passes over one tree: the scratch clone was in its way)"
                 if cls == "introduced" and n in cleared else n for n in pairs.get(cls) or []]
        if cls not in pairs:
            continue
        shown = ", ".join(names[:SHOWN]) + (f", … and {len(names) - SHOWN} more (--json)"
                                            if len(names) > SHOWN else "")
        out.append(f"  {cls + ':':<14}{len(names)}{': ' + shown if names else ''}")
    final = (report.get("phases") or {}).get("final") or {}
    if tree.get("final_ran"):
        out.append(
            "  one tree:  " + ("yes" if tree.get("holds") else "NO") + ": the scratch clone was "
            + ("removed before the final run" if tree.get("scratch_removed_before_final")
               else "NOT removed before the final run")
            + ("; after the run saphan found it gone" if not tree.get("scratch_present")
               else "; after the run saphan found it still there")
            + (f"; final run: {final.get('items')} item(s), {len(final.get('failed') or [])} "
               "failed" if "items" in final else f"; final run unreadable: "
               f"{final.get('unreadable')}"))
        for change in tree.get("changed_since_head") or []:
            out.append(f"  changed:   {change['item']}: {change['head']} at head (scratch "
                       f"present) → {change['final']} over one tree")
    for item in report.get("attention") or []:
        out.append(f"  attention: {item}")
    for note in report.get("notes") or []:
        out.append(f"  note:      {note}")
    return out


# -- reading what the driver wrote ------------------------------------------------


def _steps(read: Reader, notes: list[str]) -> dict[str, int]:
    try:
        raw = read("steps")
    except oc.ReportUnreadable as e:
        notes.append(f"the driver's step file could not be read: {e}")
        return {}
    out: dict[str, int] = {}
    for line in (raw or b"")[:4096].decode("ascii", "replace").splitlines():
        m = _STEP.fullmatch(line.strip())
        if m is None or m.group(1) not in STEPS:
            notes.append(f"a step line the driver does not write was ignored: {line[:80]!r}")
            continue
        if m.group(1) in out:
            notes.append(f"step {m.group(1)!r} was reported twice; the first is kept")
            continue
        out[m.group(1)] = int(m.group(2))
    return out


def _text(read: Reader, name: str) -> str:
    try:
        raw = read(name)
    except oc.ReportUnreadable:
        return ""
    return (raw or b"")[:512].decode("utf-8", "replace").strip()


def _sha(read: Reader, name: str, notes: list[str]) -> str | None:
    text = _text(read, name)
    if not text:
        return None
    if not _SHA.fullmatch(text):
        notes.append(f"measure-{name} does not hold a SHA: {text[:80]!r}")
        return None
    return text


def _outcomes(order: Order, phase: str, status: int, read: Reader) -> oc.Outcomes:
    name = phase_file(order.kind, phase)
    if name is None:
        return oc.from_exit(status, " ".join(order.test))
    data = read(name)
    if data is None:
        raise oc.ReportUnreadable(f"the suite wrote no report (measure-{name}; exit status "
                                  f"{status})")
    if order.kind == "pytest":
        return oc.from_junit(data)
    return oc.from_cargo(data.splitlines())


def _not_measured(order: Order, steps: Mapping[str, int], expected: str | None,
                  measured: str | None, workdir: str, *, target: str) -> str | None:
    """Why the base was not measured (None: it was, at the expected SHA)."""
    scratch = f"{workdir.rstrip('/')}/{order.scratch}"
    last = next((s for s in reversed(STEPS) if s in steps), None)
    failed = {
        "fresh": f"the scratch path {scratch} already exists (or another run took it first); "
                 "saphan clones only into a new path and never removes what it did not make "
                 "(remove it, or give another --scratch)",
        "toplevel": f"{workdir} is not the top of a git working tree (status "
                    f"{steps.get('toplevel')}): give the repository's top directory as "
                    "--workdir (the scratch clone is made from it)",
        "ignored": f"`git check-ignore {order.scratch}/` failed in {workdir} (status "
                   f"{steps.get('ignored')}): is it a git working tree, with git on the PATH?",
        "expected": f"{order.expect or order.base!r} names no single commit in the repository "
                    "(unknown, or an ambiguous abbreviation)",
        "clone": "`git clone --shared --no-checkout` failed (its message is in the run's "
                 "stderr)",
        "checkout": (f"`git checkout --detach` found no commit {order.base!r} (nor "
                     f"origin/{order.base}) in the scratch clone" if not target else
                     "`git checkout --detach` failed (its message is in the run's stderr)"),
        "verify": "`git rev-parse HEAD` failed in the scratch clone",
    }
    for name in ("fresh", "toplevel", "ignored", "expected", "clone", "checkout", "verify"):
        if name not in steps:
            return (f"the driver stopped before its {name!r} step (after "
                    f"{last or 'no step'}): killed, or its step file was changed")
        if steps[name] != 0:
            return failed[name]
    if expected is None or measured is None:
        return "the expected or the measured SHA is missing from what the driver wrote"
    if measured != expected:
        return (f"the scratch clone's HEAD after `checkout --detach "
                f"{order.base}` is {measured}, but the order named {expected}: a "
                "measurement there is not a measurement of the base")
    return None
