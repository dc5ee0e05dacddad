"""The measure-base report (measure/report.py) built from what a driver left
in a run's return directory, given here as a Reader over a dict of file
contents: the step lines, the SHAs, and real suite reports (pytest's
--junitxml written by a real pytest run in a temporary directory; libtest's
JSON lines as cargo's test harness prints them).

Held: verdicts per item only when the measured SHA equals the expected one
(saphan compares them itself); every early step failing, or missing, is
"base not measured" with a why naming it; hostile step files, SHAs and
reports are parsed, never trusted for shape; the exit status; the lines
`runs show` prints; measure.json written as a new file, never through a
link."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from saphan.measure import order as order_mod
from saphan.measure import outcomes, report
from saphan.measure.order import Order

BASE_SHA = hashlib.sha1(b"base").hexdigest()
OTHER_SHA = hashlib.sha1(b"moved").hexdigest()
HEAD_SHA = hashlib.sha1(b"head").hexdigest()
WORKDIR = "/w/tree"
PYTEST_ORDER = order_mod.make("main", ("pytest", "-q"), token="t1")
STEPS_OK = (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\nverify 0\npaths 0\n"
            b"base 1\nhead 1\nremoved 0\nfinal 1\n")
#: the base run's import paths: the scratch first, then the interpreter's own
PATHS_OK = "\0".join([f"{WORKDIR}/{PYTEST_ORDER.scratch}", "/usr/lib/python3.11",
                      "/usr/lib/python3/dist-packages"]).encode()
TREE_CLEAN: dict[str, Any] = {"scratch_present": False, "removed_by_saphan": False,
                              "git_dirs_below": []}

# -- real pytest reports ------------------------------------------------------------

SUITE = '''
def test_keep():
    assert True

def test_pre():
    assert False

def test_intro():
    assert {intro}

def test_fix():
    assert {fix}
'''


def _junit(root: Path, name: str, *, intro: bool, fix: bool, extra: str = "") -> bytes:
    d = root / name
    d.mkdir()
    (d / "test_suite.py").write_text(SUITE.format(intro=intro, fix=fix) + extra)
    xml = d / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", "test_suite.py"], cwd=d, capture_output=True,
                   timeout=120, check=False)
    return xml.read_bytes()


@pytest.fixture(scope="module")
def junit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """base: intro passes, fix fails, test_gone only here; head: intro
    fails, fix passes, test_new only here; final: as head but intro passes
    again (the scratch clone was in its way at head)."""
    root = tmp_path_factory.mktemp("junit")
    gone = "\ndef test_gone():\n    assert True\n"
    new = "\ndef test_new():\n    assert True\n"
    return {
        "base.xml": _junit(root, "base", intro=True, fix=False, extra=gone),
        "head.xml": _junit(root, "head", intro=False, fix=True, extra=new),
        "final.xml": _junit(root, "final", intro=True, fix=True, extra=new),
    }


# -- readers --------------------------------------------------------------------------


def reader(files: Mapping[str, bytes]) -> report.Reader:
    def read(name: str) -> bytes | None:
        return files.get(name)
    return read


def measured_files(junit: Mapping[str, bytes], **over: bytes) -> dict[str, bytes]:
    files = {"steps": STEPS_OK, "expected": BASE_SHA.encode() + b"\n", "target": b"main\n",
             "measured": BASE_SHA.encode() + b"\n", "head": HEAD_SHA.encode() + b"\n",
             "paths": PATHS_OK, **junit}
    files.update(over)
    return files


def build(files: Mapping[str, bytes], order: Order = PYTEST_ORDER,
          tree: Mapping[str, Any] = TREE_CLEAN) -> dict[str, Any]:
    got: dict[str, Any] = report.build(order, reader(files), workdir=WORKDIR,
                                       repository="/w/repo", one_tree=dict(tree))
    return got


def t(name: str) -> str:
    return f"test_suite::{name}"


# -- measured -------------------------------------------------------------------------


def test_a_full_run_is_measured_with_every_item_paired(junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit))
    assert got["result"] == "measured"
    assert "why" not in got
    assert got["pairs"] == {
        "pre-existing": [t("test_pre")], "introduced": [t("test_intro")],
        "fixed": [t("test_fix")], "passing": [t("test_keep")],
        "only-base": [t("test_gone")], "only-head": [t("test_new")],
    }
    assert got["counts"] == {"pre-existing": 1, "introduced": 1, "fixed": 1, "passing": 1,
                             "only-base": 1, "only-head": 1}
    assert got["phases"]["base"] == {"status": 1, "source": order_mod.SOURCES["pytest"],
                                     "items": 5, "failed": [t("test_fix"), t("test_pre")]}
    assert got["phases"]["head"]["failed"] == [t("test_intro"), t("test_pre")]
    assert got["phases"]["final"]["items"] == 5
    assert got["phases"]["final"]["failed"] == [t("test_pre")]
    assert got["base"] == {"named": "main", "expect": None, "expected": BASE_SHA,
                           "expected_from": "'main' resolved in the repository when the run "
                                            "began (the order gave no SHA: --expect)",
                           "checked_out": "main", "measured": BASE_SHA, "verified": True}
    assert got["head"] == {"commit": HEAD_SHA}
    assert [s["step"] for s in got["steps"]] == list(report.STEPS)
    assert got["notes"] == []
    tree = got["one_tree"]
    assert tree["holds"] is True
    assert tree["final_ran"] is True
    assert tree["scratch_removed_before_final"] is True
    assert tree["changed_since_head"] == [{"item": t("test_intro"), "head": outcomes.FAILED,
                                           "final": outcomes.PASSED}]
    assert report.exit_status(got) == 1


def test_nothing_introduced_exits_zero(junit: dict[str, bytes]) -> None:
    same = junit["head.xml"]
    got = build(measured_files(junit, **{"base.xml": same, "final.xml": same}))
    assert got["result"] == "measured"
    assert got["counts"]["introduced"] == 0
    assert got["counts"]["pre-existing"] == 2
    assert got["one_tree"]["changed_since_head"] == []
    assert report.exit_status(got) == 0


def test_the_order_sha_is_named_as_the_expected_source(junit: dict[str, bytes]) -> None:
    order = order_mod.make("main", ("pytest",), expect=BASE_SHA[:12].upper(), token="t1")
    got = build(measured_files(junit), order)
    assert got["base"]["expect"] == BASE_SHA[:12]
    assert got["base"]["expected_from"] == (f"the order's SHA {BASE_SHA[:12]}, expanded in "
                                            "the repository")


@pytest.mark.parametrize(("tree", "steps", "holds"), [
    ({**TREE_CLEAN, "scratch_present": True}, STEPS_OK, False),
    (TREE_CLEAN, STEPS_OK.replace(b"removed 0\nfinal 1\n", b"removed 1\n"), False),
    (TREE_CLEAN, STEPS_OK.replace(b"final 1\n", b""), False),
    (TREE_CLEAN, STEPS_OK, True),
])
def test_one_tree_holds_only_when_the_scratch_is_gone_before_the_final_run(
        junit: dict[str, bytes], tree: dict[str, Any], steps: bytes, holds: bool) -> None:
    got = build(measured_files(junit, steps=steps), tree=tree)
    assert got["result"] == "measured"
    assert got["one_tree"]["holds"] is holds
    if b"final" not in steps:
        assert got["phases"]["final"]["unreadable"] == "the driver did not reach it"
        assert "changed_since_head" not in got["one_tree"]


# -- base not measured -----------------------------------------------------------------


def _not_measured(got: Mapping[str, Any]) -> None:
    assert got["result"] == "base not measured"
    assert "pairs" not in got
    assert "counts" not in got
    assert "phases" not in got
    assert report.exit_status(got) == report.EXIT_NOT_MEASURED


@pytest.mark.parametrize("steps", [
    STEPS_OK,  # a hostile run claiming every step went on: saphan compares itself
    b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\nverify 0\n",  # as the driver ends
])
def test_a_measured_sha_other_than_expected_is_not_measured(junit: dict[str, bytes],
                                                              steps: bytes) -> None:
    got = build(measured_files(junit, steps=steps, measured=OTHER_SHA.encode() + b"\n"))
    _not_measured(got)
    assert OTHER_SHA in got["why"]
    assert BASE_SHA in got["why"]
    assert got["base"]["verified"] is False
    assert got["base"]["measured"] == OTHER_SHA


@pytest.mark.parametrize(("steps", "over", "named"), [
    (b"fresh 1\n", {}, [f"{WORKDIR}/.saphan-run/base-t1 already exists"]),
    (b"fresh 0\ntoplevel 0\nignored 128\n", {}, ["git check-ignore .saphan-run/base-t1/", "status 128",
                                     WORKDIR]),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 1\n", {"expected": b"\n"},
     ["'main' names no single commit"]),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 128\n", {}, ["git clone --shared"]),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 1\n", {"target": b"\n"},
     ["found no commit 'main'", "origin/main"]),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\nverify 128\n", {},
     ["`git rev-parse HEAD` failed"]),
])
def test_each_early_step_failing_is_not_measured_and_named(
        steps: bytes, over: dict[str, bytes], named: list[str]) -> None:
    files = {"expected": BASE_SHA.encode() + b"\n", "steps": steps, **over}
    got = build(files)
    _not_measured(got)
    for words in named:
        assert words in got["why"]
    assert got["one_tree"]["holds"] is False


def test_a_checkout_that_found_its_target_but_failed_is_not_called_a_missing_commit() -> None:
    files = {"steps": b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 1\n",
             "expected": BASE_SHA.encode() + b"\n", "target": b"main\n"}
    got = build(files)
    _not_measured(got)
    assert got["base"]["checked_out"] == "main"
    assert "found no commit" not in got["why"]
    assert "`git checkout --detach` failed" in got["why"]


@pytest.mark.parametrize(("steps", "before", "after"), [
    (b"", "fresh", "no step"),
    (b"fresh 0\n", "toplevel", "fresh"),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\n", "checkout", "clone"),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\n", "verify", "checkout"),
])
def test_a_driver_killed_between_steps_names_the_step_it_stopped_before(
        junit: dict[str, bytes], steps: bytes, before: str, after: str) -> None:
    got = build(measured_files(junit, steps=steps))
    _not_measured(got)
    assert got["why"] == (f"the driver stopped before its {before!r} step (after {after}): "
                          "killed, or its step file was changed")


# -- hostile inputs -------------------------------------------------------------------


def test_step_lines_not_name_status_are_ignored_with_a_note(junit: dict[str, bytes]) -> None:
    steps = (b"fresh 0\nrm -rf /\nfresh  0 extra\ntoplevel 0\nignored 0\nbogus 0\n"
             b"expected 0\nClone 0\nclone 0\ncheckout 0\nverify 0\npaths 0\nbase 99999\n"
             b"base 1\nhead 1\nremoved 0\nfinal 1\n")
    got = build(measured_files(junit, steps=steps))
    assert got["result"] == "measured"
    ignored = [n for n in got["notes"] if n.startswith("a step line the driver does not write")]
    assert len(ignored) == 5
    assert any("'rm -rf /'" in n for n in ignored)
    assert any("'bogus 0'" in n for n in ignored)
    assert any("'base 99999'" in n for n in ignored)
    assert {"step": "base", "status": 1} in got["steps"]


def test_an_unknown_step_name_does_not_stand_in_for_a_known_one() -> None:
    files = {"steps": b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclones 0\n",
             "expected": BASE_SHA.encode() + b"\n"}
    got = build(files)
    _not_measured(got)
    assert "before its 'clone' step" in got["why"]
    assert [s["step"] for s in got["steps"]] == ["fresh", "toplevel", "ignored", "expected"]
    assert any("'clones 0'" in n for n in got["notes"])


def test_a_step_reported_twice_keeps_the_first(junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit, steps=b"fresh 1\nfresh 0\n" + STEPS_OK[len(b"fresh 0\n"):]))
    _not_measured(got)
    assert "already exists" in got["why"]
    assert "step 'fresh' was reported twice; the first is kept" in got["notes"]
    assert got["steps"][0] == {"step": "fresh", "status": 1}
    kept = build(measured_files(junit, steps=STEPS_OK + b"head 0\n"))
    assert kept["result"] == "measured"
    assert kept["phases"]["head"]["status"] == 1
    assert "step 'head' was reported twice; the first is kept" in kept["notes"]


@pytest.mark.parametrize("bad", [b"not a sha; rm -rf ~\n", BASE_SHA.upper().encode(),
                                 BASE_SHA[:39].encode(), (BASE_SHA + "0").encode()])
def test_an_expected_that_is_not_a_sha_is_noted_and_not_measured(junit: dict[str, bytes],
                                                                 bad: bytes) -> None:
    got = build(measured_files(junit, expected=bad))
    _not_measured(got)
    assert got["base"]["expected"] is None
    assert got["why"] == "the expected or the measured SHA is missing from what the driver wrote"
    assert any(n.startswith("measure-expected does not hold a SHA") for n in got["notes"])


def test_a_sha256_sha_is_taken(junit: dict[str, bytes]) -> None:
    sha = hashlib.sha256(b"base").hexdigest().encode()
    got = build(measured_files(junit, expected=sha, measured=sha))
    assert got["result"] == "measured"
    assert got["base"]["verified"] is True


def test_only_the_first_4096_bytes_of_the_steps_are_looked_at(junit: dict[str, bytes]) -> None:
    before_final = STEPS_OK.replace(b"final 1\n", b"")
    padded = before_final + b"#" * (4096 - len(before_final) + 10) + b"\nfinal 1\n"
    got = build(measured_files(junit, steps=padded))
    assert got["result"] == "measured"
    assert got["one_tree"]["final_ran"] is False
    assert "final" not in [s["step"] for s in got["steps"]]
    huge = build(measured_files(junit, steps=b"bogus 0\n" * 200_000))
    _not_measured(huge)
    assert len(huge["notes"]) <= 4096 // len(b"bogus 0\n") + 1
    assert all(len(n) < 200 for n in huge["notes"] + got["notes"])


def test_a_junit_report_with_a_doctype_is_outcomes_unreadable(junit: dict[str, bytes]) -> None:
    bomb = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]>'
            b'<testsuites><testsuite><testcase classname="m" name="&lol;"/></testsuite>'
            b'</testsuites>')
    got = build(measured_files(junit, **{"head.xml": bomb}))
    assert got["result"] == "outcomes unreadable"
    assert "pairs" not in got
    assert got["why"].startswith("the head run's outcomes could not be read: ")
    assert "DOCTYPE" in got["why"]
    assert "DOCTYPE" in got["phases"]["head"]["unreadable"]
    assert got["phases"]["base"]["items"] == 5
    assert report.exit_status(got) == report.EXIT_NOT_MEASURED


def test_a_missing_junit_at_base_is_outcomes_unreadable_naming_base(
        junit: dict[str, bytes]) -> None:
    files = measured_files(junit)
    del files["base.xml"]
    got = build(files)
    assert got["result"] == "outcomes unreadable"
    assert got["why"] == ("the base run's outcomes could not be read: the suite wrote no report "
                          "(measure-base.xml; exit status 1)")
    assert "pairs" not in got
    assert report.exit_status(got) == report.EXIT_NOT_MEASURED


def test_a_junit_that_is_not_xml_names_the_side(junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit, **{"base.xml": b"<testsuite><testcase"}))
    assert got["result"] == "outcomes unreadable"
    assert got["why"].startswith("the base run's outcomes could not be read: the JUnit report "
                                 "is not XML")


def _raising(files: Mapping[str, bytes], bad: str) -> report.Reader:
    def read(name: str) -> bytes | None:
        if name == bad:
            raise outcomes.ReportUnreadable(f"measure-{name} is a symbolic link")
        return files.get(name)
    return read


def test_a_steps_file_that_cannot_be_read_is_noted_and_not_measured(
        junit: dict[str, bytes]) -> None:
    got = report.build(PYTEST_ORDER, _raising(measured_files(junit), "steps"), workdir=WORKDIR,
                       repository="/w/repo", one_tree=dict(TREE_CLEAN))
    _not_measured(got)
    assert got["steps"] == []
    assert got["notes"] == ["the driver's step file could not be read: measure-steps is a "
                            "symbolic link"]
    assert "before its 'fresh' step (after no step)" in got["why"]
    assert not report.not_ignored(_raising({}, "steps"), 21)


@pytest.mark.parametrize("bad", ["expected", "measured"])
def test_a_sha_file_that_cannot_be_read_is_not_measured(junit: dict[str, bytes],
                                                         bad: str) -> None:
    got = report.build(PYTEST_ORDER, _raising(measured_files(junit), bad), workdir=WORKDIR,
                       repository="/w/repo", one_tree=dict(TREE_CLEAN))
    _not_measured(got)
    assert got["base"][bad] is None


def test_a_suite_report_that_cannot_be_read_is_outcomes_unreadable(
        junit: dict[str, bytes]) -> None:
    got = report.build(PYTEST_ORDER, _raising(measured_files(junit), "head.xml"),
                       workdir=WORKDIR, repository="/w/repo", one_tree=dict(TREE_CLEAN))
    assert got["result"] == "outcomes unreadable"
    assert got["why"] == ("the head run's outcomes could not be read: measure-head.xml is a "
                          "symbolic link")


# -- other kinds ------------------------------------------------------------------------


def test_a_plain_command_is_one_item_per_side_from_its_phase_status() -> None:
    order = order_mod.make("main", ("sh", "-c", "x"), token="t1")
    assert order.kind == "exit"
    steps = STEPS_OK.replace(b"base 1", b"base 0").replace(b"head 1", b"head 3") \
        .replace(b"final 1", b"final 0")
    files = {"steps": steps, "expected": BASE_SHA.encode(), "measured": BASE_SHA.encode(),
             "target": b"main"}
    got = build(files, order)
    item = "sh -c x (exit status)"
    assert got["result"] == "measured"
    assert got["pairs"]["introduced"] == [item]
    assert sum(got["counts"].values()) == 1
    for phase, failed in (("base", []), ("head", [item]), ("final", [])):
        assert got["phases"][phase]["items"] == 1
        assert got["phases"][phase]["failed"] == failed
        assert got["phases"][phase]["source"] == order_mod.SOURCES["exit"]
    assert got["one_tree"]["changed_since_head"] == [
        {"item": item, "head": outcomes.FAILED, "final": outcomes.PASSED}]
    assert report.exit_status(got) == 1
    assert any(item in ln and "passes over one tree" in ln for ln in report.lines(got))


def _libtest(results: Mapping[str, str], *, failed_output: str = "") -> bytes:
    """JSON lines as `cargo test -- -Z unstable-options --format json` prints them."""
    out = [f'{{ "type": "suite", "event": "started", "test_count": {len(results)} }}']
    for name, event in results.items():
        quoted = json.dumps(name)
        out.append(f'{{ "type": "test", "event": "started", "name": {quoted} }}')
        if event == "failed":
            stdout = json.dumps(f"thread '{name}' panicked at src/lib.rs:12:9:\n{failed_output}"
                                "\nnote: run with `RUST_BACKTRACE=1` environment variable to "
                                "display a backtrace\n")
            out.append(f'{{ "type": "test", "name": {quoted}, "event": "failed", '
                       f'"stdout": {stdout} }}')
        else:
            out.append(f'{{ "type": "test", "name": {quoted}, "event": "{event}" }}')
    n = list(results.values())
    out.append(f'{{ "type": "suite", "event": "{"failed" if "failed" in n else "ok"}", '
               f'"passed": {n.count("ok")}, "failed": {n.count("failed")}, '
               f'"ignored": {n.count("ignored")}, "measured": 0, "filtered_out": 0, '
               '"exec_time": 0.000412345 }')
    return ("\n".join(out) + "\n").encode()


CARGO_ORDER = order_mod.make("main", ("cargo", "+stable", "test", "--offline"), token="t1")


def _cargo_files(base: Mapping[str, str], head: Mapping[str, str],
                 final: Mapping[str, str]) -> dict[str, bytes]:
    return {"steps": STEPS_OK, "expected": BASE_SHA.encode(), "measured": BASE_SHA.encode(),
            "target": b"main", "head": HEAD_SHA.encode(),
            "base.json": _libtest(base), "head.json": _libtest(head, failed_output="no"),
            "final.json": _libtest(final)}


def test_cargo_outcomes_come_from_libtest_json_lines() -> None:
    assert CARGO_ORDER.kind == "cargo"
    files = _cargo_files(
        {"tests::keep": "ok", "tests::pre": "failed", "tests::intro": "ok",
         "tests::fixed": "failed", "tests::later": "ignored"},
        {"tests::keep": "ok", "tests::pre": "failed", "tests::intro": "failed",
         "tests::fixed": "ok", "tests::later": "ignored", "tests::new": "ok"},
        {"tests::keep": "ok", "tests::pre": "failed", "tests::intro": "failed",
         "tests::fixed": "ok", "tests::later": "ignored", "tests::new": "ok"})
    got = build(files, CARGO_ORDER)
    assert got["result"] == "measured"
    assert got["pairs"] == {"pre-existing": ["tests::pre"], "introduced": ["tests::intro"],
                            "fixed": ["tests::fixed"],
                            "passing": ["tests::keep", "tests::later"],
                            "only-base": [], "only-head": ["tests::new"]}
    assert got["phases"]["head"]["items"] == 6
    assert got["phases"]["head"]["source"] == order_mod.SOURCES["cargo"]
    assert got["one_tree"]["changed_since_head"] == []
    assert report.exit_status(got) == 1


def test_files_for_names_every_file_build_reads(junit: dict[str, bytes]) -> None:
    assert report.files_for(PYTEST_ORDER) == (*report.FACTS, "paths", "base.xml", "head.xml",
                                              "final.xml")
    assert report.files_for(CARGO_ORDER) == (*report.FACTS, "base.json", "head.json",
                                             "final.json")
    exit_order = order_mod.make("main", ("make", "test"), token="t1")
    assert report.files_for(exit_order) == report.FACTS
    cases: list[tuple[Order, dict[str, bytes]]] = [
        (PYTEST_ORDER, measured_files(junit)),
        (CARGO_ORDER, _cargo_files({"a": "ok"}, {"a": "ok"}, {"a": "ok"})),
        (exit_order, {"steps": STEPS_OK, "expected": BASE_SHA.encode(),
                      "measured": BASE_SHA.encode()}),
    ]
    for order, files in cases:
        asked: list[str] = []

        def read(name: str, files: Mapping[str, bytes] = files,
                 asked: list[str] = asked) -> bytes | None:
            asked.append(name)
            return files.get(name)
        got = report.build(order, read, workdir=WORKDIR, repository="/w/repo",
                           one_tree=dict(TREE_CLEAN))
        assert got["result"] == "measured"
        assert set(asked) <= set(report.files_for(order))
        assert set(asked) >= {"steps", "expected", "measured"}


# -- not_ignored -------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "code", "want"), [
    (b"fresh 0\ntoplevel 0\nignored 1\n", 21, True),
    # review: a suite that ran later wrote the two lines and killed the driver
    (b"fresh 0\ntoplevel 0\nignored 1\n", -9, False),
    (b"fresh 0\ntoplevel 0\nignored 1\n", 0, False),
    (b"fresh 0\ntoplevel 0\nignored 1\n", None, False),
    (b"fresh 0\ntoplevel 0\nignored 1\nexpected 0\n", 21, False),
    (b"fresh 0\ntoplevel 0\nignored 0\nexpected 0\n", 21, False),
    (b"fresh 0\ntoplevel 0\nignored 128\n", 21, False),
    (b"fresh 1\n", 21, False),
    (b"fresh 1\nignored 1\n", 21, False),
    (b"ignored 1\n", 21, False),
    (b"", 21, False),
])
def test_not_ignored_only_when_the_driver_itself_ended_there(steps: bytes, code: int | None,
                                                             want: bool) -> None:
    assert report.not_ignored(reader({"steps": steps}), code) is want


# -- lines ---------------------------------------------------------------------------------


def test_lines_give_the_result_every_class_in_order_and_the_one_tree_mark(
        junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit))
    out = report.lines(got)
    assert out[0].startswith("measure:     measured: base 'main'")
    rows = [next(i for i, ln in enumerate(out) if ln.startswith(f"  {cls}:"))
            for cls in outcomes.CLASSES]
    assert rows == sorted(rows)
    intro = out[rows[outcomes.CLASSES.index("introduced")]]
    assert intro == (f"  introduced:   1: {t('test_intro')} (passes over one tree: the scratch "
                     "clone was in its way)")
    assert out[rows[outcomes.CLASSES.index("pre-existing")]] == (
        f"  pre-existing: 1: {t('test_pre')}")
    assert any(ln.startswith("  one tree:  yes:") for ln in out)
    assert any(ln.startswith(f"  changed:   {t('test_intro')}: failed at head") for ln in out)
    assert f"  expected:  {BASE_SHA}  (" in "\n".join(out)


def test_lines_of_a_report_not_measured_give_why_and_no_classes(
        junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit, measured=OTHER_SHA.encode()))
    out = report.lines(got)
    assert out[0].startswith("measure:     base not measured: ")
    assert any(ln.startswith("  why:       ") and OTHER_SHA in ln for ln in out)
    assert not any(ln.startswith(f"  {cls}:") for cls in outcomes.CLASSES for ln in out)


def test_lines_truncate_a_long_class_and_pass_odd_names_through() -> None:
    many = {f"tests::t{i:02d}": "ok" for i in range(report.SHOWN + 5)}
    odd = "tests::esc\x1b[31mred\x1b[0m"
    files = _cargo_files({**many, odd: "ok"}, {**many, odd: "failed"}, {**many, odd: "failed"})
    got = build(files, CARGO_ORDER)
    assert got["pairs"]["introduced"] == [odd]
    out = report.lines(got)
    passing = next(ln for ln in out if ln.startswith("  passing:"))
    total = report.SHOWN + 5
    assert passing.startswith(f"  passing:      {total}: tests::t00, ")
    assert passing.endswith(f", … and {total - report.SHOWN} more (--json)")
    assert f"tests::t{report.SHOWN - 1:02d}" in passing
    assert f"tests::t{report.SHOWN:02d}" not in passing
    intro = next(ln for ln in out if ln.startswith("  introduced:"))
    assert intro == f"  introduced:   1: {odd}"
    assert "\x1b[31m" in intro


# -- write ---------------------------------------------------------------------------------


def test_write_puts_measure_json_in_place_private(tmp_path: Path,
                                                  junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit))
    (tmp_path / "measure.json").write_text("stale\n")
    path = report.write(tmp_path, got)
    assert path == str(tmp_path / "measure.json")
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert json.loads(Path(path).read_text()) == got
    assert sorted(os.listdir(tmp_path)) == ["measure.json"]


def test_write_never_follows_a_link_planted_at_its_names(tmp_path: Path,
                                                         junit: dict[str, bytes]) -> None:
    got = build(measured_files(junit))
    outside = tmp_path / "outside"
    outside.write_text("keep me\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tmp = run_dir / f".measure.json.{os.getpid()}"
    tmp.symlink_to(outside)
    with pytest.raises(OSError):
        report.write(run_dir, got)
    assert outside.read_text() == "keep me\n"
    assert not (run_dir / "measure.json").exists()
    tmp.unlink()
    (run_dir / "measure.json").symlink_to(outside)
    path = report.write(run_dir, got)
    assert outside.read_text() == "keep me\n"
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert json.loads(Path(path).read_text()) == got


# -- review: what a benign suite must not hide ----------------------------------------


def test_a_base_run_importing_the_working_tree_is_base_not_isolated(
        junit: dict[str, bytes]) -> None:
    # review: an editable install (a .pth, or setuptools' finder map) made the
    # "base" run import head's package: a regression read as pre-existing
    leak = f"{WORKDIR}/src"
    paths = PATHS_OK + b"\0" + leak.encode() + b"\0" + f"{WORKDIR}/.saphan-run/x".encode()
    got = build(measured_files(junit, paths=paths))
    assert got["result"] == "base not isolated"
    assert got["base"]["imports_from_working_tree"] == [f"{WORKDIR}/.saphan-run/x", leak]
    assert "editable install" in got["why"] and "pairs" not in got
    assert report.exit_status(got) == report.EXIT_NOT_MEASURED
    # the scratch itself, and paths outside the tree, are not leaks
    assert build(measured_files(junit))["result"] == "measured"
    # a probe that could not run: no verdict (review: a wrapper script made
    # the probe run as shell, and the report paired head's code as base)
    for status, why in ((b"127", "its interpreter was not found"),
                        (b"126", "its interpreter is not a Python (a wrapper script)"),
                        (b"2", "the probe ended 2")):
        got = build(measured_files(junit, steps=STEPS_OK.replace(b"paths 0", b"paths " + status)))
        assert got["result"] == "base not isolated" and why in got["why"], got["why"]
        assert "pairs" not in got
    got = build(measured_files(junit, paths=b"x" * ((1 << 20) + 1)))
    assert got["result"] == "base not isolated" and "larger than 1 MiB" in got["why"]
    # a venv inside the tree: its site-packages is not the tree's code
    venv = f"{WORKDIR}/.venv/lib/python3.11/site-packages".encode()
    assert build(measured_files(junit, paths=PATHS_OK + b"\0" + venv))["result"] == "measured"


def _with_head(junit: dict[str, bytes], head: bytes, status: int) -> dict[str, Any]:
    steps = STEPS_OK.replace(b"head 1", b"head %d" % status)
    return build(measured_files(junit, **{"head.xml": head, "steps": steps}))


def test_a_head_run_that_did_not_complete_needs_attention(junit: dict[str, bytes]) -> None:
    # review: a collection error at head (pytest exit 2) paired every base item
    # as only-base and exited 0
    broken = (b'<testsuites><testsuite><testcase classname="" name="test_suite">'
              b'<error message="collection failure"/></testcase></testsuite></testsuites>')
    got = _with_head(junit, broken, 2)
    assert got["result"] == "measured" and got["counts"]["introduced"] == 0
    assert "fails at head, absent at base: ::test_suite" in got["attention"]
    assert ("the head run did not complete: pytest exit 2, interrupted (a collection error, "
            "or stopped)") in got["attention"]
    assert "no item is named at both base and head: nothing could be compared" \
        in got["attention"]
    assert report.exit_status(got) == 1
    assert any(ln.startswith("  attention: the head run did not complete")
               for ln in report.lines(got))
    empty = b"<testsuites><testsuite/></testsuites>"
    got = _with_head(junit, empty, 5)
    assert any(a.startswith("the head run reported no items") for a in got["attention"])


def test_nothing_to_look_at_is_exit_zero(junit: dict[str, bytes]) -> None:
    files = measured_files(junit, **{"head.xml": junit["base.xml"]})
    got = build(files)
    assert got["result"] == "measured" and got["attention"] == []
    assert report.exit_status(got) == 0


def test_git_repositories_left_below_the_tree_are_named(junit: dict[str, bytes]) -> None:
    tree = {**TREE_CLEAN, "git_dirs_below": ["vendor/lib/.git", "(stopped looking after 9 "
                                             "entries)"]}
    got = build(measured_files(junit), tree=tree)
    assert any(n.startswith("git repositories below the working tree after the run")
               and n.endswith(": vendor/lib/.git") for n in got["notes"])


def test_what_passed_at_base_and_is_gone_or_skipped_at_head_needs_attention(
        junit: dict[str, bytes]) -> None:
    # review: an importorskip that skipped the whole module at head read as exit 0
    got = build(measured_files(junit))
    assert "passes at base, absent at head: test_suite::test_gone" in got["attention"]
    skipped = junit["head.xml"].replace(
        b'name="test_keep"', b'name="test_keep"><skipped message="no module"/></testcase'
        b'><testcase classname="test_suite" name="test_keep_dup"', 1)
    got = build(measured_files(junit, **{"head.xml": skipped}))
    assert "passes at base, skipped at head: test_suite::test_keep" in got["attention"]


def test_an_exit_status_failing_at_both_sides_hides_nothing(junit: dict[str, bytes]) -> None:
    # review: `python -X dev -m pytest` is one exit-status item; failing at base
    # already, a new failure at head came out as exit 0
    order = order_mod.make("main", ("make", "test"), token="t1")
    files = {"steps": STEPS_OK.replace(b"paths 0\n", b""), "expected": BASE_SHA.encode(),
             "measured": BASE_SHA.encode()}
    got = build(files, order=order)
    assert got["result"] == "measured" and got["pairs"]["pre-existing"] == [
        "make test (exit status)"]
    assert any(a.startswith("the command fails at base and at head") for a in got["attention"])
    assert report.exit_status(got) == 1


@pytest.mark.parametrize(("phase", "status", "words"), [
    ("base", 127, "could not be started in the base run (exit 127: not found)"),
    ("head", 126, "could not be started in the head run (exit 126: not executable)"),
])
def test_a_command_that_did_not_start_is_no_outcome(phase: str, status: int,
                                                     words: str) -> None:
    # review: `.venv/bin/python` missing in the scratch (127) was paired as a failure
    order = order_mod.make("main", ("make", "test"), token="t1")
    steps = STEPS_OK.replace(b"paths 0\n", b"").replace(
        f"{phase} 1".encode(), f"{phase} {status}".encode())
    got = build({"steps": steps, "expected": BASE_SHA.encode(),
                 "measured": BASE_SHA.encode()}, order=order)
    assert got["result"] == "outcomes unreadable" and words in got["why"]
    assert report.exit_status(got) == report.EXIT_NOT_MEASURED
