"""Per-test outcomes (measure/outcomes.py) from what real suites write —
pytest's --junitxml and cargo's libtest JSON, produced here by the real
tools on fixture projects — and their pairing base against head: every
item in exactly one class, never a total."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require
from saphan.measure import outcomes
from saphan.measure.outcomes import FAILED, PASSED, SKIPPED, Outcomes, ReportUnreadable

SUITE = '''
import pytest

def test_stays_green():
    assert True

def test_pre_existing():
    assert {pre}

def test_introduced():
    assert {intro}

def test_fixed():
    assert {fixed}

@pytest.mark.skip(reason="never")
def test_skipped():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n
'''


def _pytest(tmp_path: Path, name: str, *, pre: bool, intro: bool, fixed: bool,
            extra: str = "") -> Outcomes:
    d = tmp_path / name
    d.mkdir()
    (d / "test_suite.py").write_text(SUITE.format(pre=pre, intro=intro, fixed=fixed) + extra)
    report = d / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", str(d / "test_suite.py")],
                   cwd=d, capture_output=True, timeout=120, check=False)
    return outcomes.from_junit(outcomes.read_limited(str(report)))


def test_a_real_pytest_report_pairs_every_item(tmp_path: Path) -> None:
    base = _pytest(tmp_path, "base", pre=False, intro=True, fixed=False)
    head = _pytest(tmp_path, "head", pre=False, intro=False, fixed=True,
                   extra="\ndef test_new_at_head():\n    assert True\n")
    assert base.source == "junit"
    assert base.items["test_suite::test_skipped"] == SKIPPED
    assert base.items["test_suite::test_param[1]"] == PASSED
    paired = outcomes.pair(base, head)
    assert paired["pre-existing"] == ["test_suite::test_pre_existing"]
    assert paired["introduced"] == ["test_suite::test_introduced"]
    assert paired["fixed"] == ["test_suite::test_fixed"]
    assert paired["only-head"] == ["test_suite::test_new_at_head"]
    assert paired["only-base"] == []
    assert set(paired["passing"]) == {"test_suite::test_stays_green", "test_suite::test_skipped",
                                      "test_suite::test_param[1]", "test_suite::test_param[2]"}
    # every item once
    every = [n for names in paired.values() for n in names]
    assert sorted(every) == sorted(set(base.items) | set(head.items))


def test_a_real_cargo_json_report(tmp_path: Path) -> None:
    cargo = shutil.which("cargo")
    require(cargo is not None, "cargo (rustup)")
    assert cargo is not None
    crate = tmp_path / "crate"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "fixture"\nversion = "0.1.0"\n'
                                      'edition = "2021"\n\n[workspace]\n')
    (crate / "src" / "lib.rs").write_text(
        "#[cfg(test)]\nmod tests {\n"
        "    #[test] fn green() {}\n"
        "    #[test] fn red() { panic!(\"no\") }\n"
        "    #[test] #[ignore] fn later() {}\n}\n")
    env = {**os.environ, "RUSTC_BOOTSTRAP": "1", "CARGO_TARGET_DIR": str(tmp_path / "target")}
    p = subprocess.run([cargo, "test", "--offline", "-q", "--", "-Z", "unstable-options",
                        "--format", "json"], cwd=crate, capture_output=True, timeout=600,
                       env=env, check=False)
    got = outcomes.from_cargo(p.stdout.splitlines())
    assert got.source == "cargo"
    assert got.items == {"tests::green": PASSED, "tests::red": FAILED, "tests::later": SKIPPED}, \
        p.stderr.decode()[-2000:]


def test_a_plain_command_is_one_item_labelled_as_its_exit_status() -> None:
    assert outcomes.from_exit(0, "make test").items == {"make test (exit status)": PASSED}
    failed = outcomes.from_exit(2, "make test")
    assert failed.items == {"make test (exit status)": FAILED}
    assert failed.source == "exit status"
    assert outcomes.pair(failed, outcomes.from_exit(0, "make test"))["fixed"] == [
        "make test (exit status)"]


def test_a_name_reported_twice_fails_if_either_failed() -> None:
    xml = (b'<testsuites><testsuite><testcase classname="m" name="t"/>'
           b'<testcase classname="m" name="t"><failure message="x"/></testcase>'
           b'<testcase classname="m" name="e"><error/></testcase></testsuite></testsuites>')
    assert outcomes.from_junit(xml).items == {"m::t": FAILED, "m::e": FAILED}
    lines = [b'{"type":"test","event":"failed","name":"a"}',
             b'{"type":"test","event":"ok","name":"a"}',
             b'{"type":"test","event":"timeout","name":"b"}',
             b'not json', b'{"type":"suite","event":"ok"}', b'{"type":"test","name":7}']
    assert outcomes.from_cargo(lines).items == {"a": FAILED, "b": FAILED}


@pytest.mark.parametrize("xml", [
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]><testsuite/>',
    b'<!doctype x SYSTEM "file:///etc/passwd"><testsuite/>',
    b"<testsuite><testcase",
    # the same DOCTYPE in UTF-16 (no "<!DOCTYPE" bytes to find; review: expat
    # parsed it and a billion-laughs report took 3 GB)
    '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE l [<!ENTITY l "lol">]>'
    '<testsuite><testcase name="&l;"/></testsuite>'.encode("utf-16"),
    '<!DOCTYPE l [<!ENTITY l "lol">]><testsuite/>'.encode("utf-16-be"),
    b'<?xml version="1.0" encoding="latin-1"?><testsuite/>',
    b'<testsuite><testcase name="&undefined;"/></testsuite>',
])
def test_a_hostile_or_broken_junit_report_is_unreadable(xml: bytes) -> None:
    with pytest.raises(ReportUnreadable):
        outcomes.from_junit(xml)


def test_a_deep_or_huge_report_is_streamed_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    deep = b"<a>" * 200_000 + b'<testcase classname="m" name="t"/>' + b"</a>" * 200_000
    assert outcomes.from_junit(deep).items == {"m::t": PASSED}
    long = b'<testsuite><testcase classname="m" name="' + b"x" * 5000 + b'"/></testsuite>'
    (name,) = outcomes.from_junit(long).items
    assert len(name) == outcomes.MAX_NAME + len("…(cut)") and name.endswith("…(cut)")
    monkeypatch.setattr(outcomes, "MAX_ITEMS", 3)
    many = b"<s>" + b"".join(b'<testcase name="%d"/>' % i for i in range(4)) + b"</s>"
    with pytest.raises(ReportUnreadable, match="more than 3 items"):
        outcomes.from_junit(many)
    lines = [b'{"type":"test","event":"ok","name":"t%d"}' % i for i in range(4)]
    with pytest.raises(ReportUnreadable, match="more than 3 items"):
        outcomes.from_cargo(lines)


def test_a_name_two_cargo_binaries_report_is_told_apart() -> None:
    # review: tests/a.rs::same fails at both, tests/b.rs::same only at head;
    # folded into one name, b's introduced failure was reported pre-existing
    def run(b_result: str) -> outcomes.Outcomes:
        return outcomes.from_cargo([
            b'{"type":"suite","event":"started","test_count":1}',
            b'{"type":"test","event":"failed","name":"same"}',
            b'{"type":"suite","event":"started","test_count":2}',
            b'{"type":"test","event":"%s","name":"same"}' % b_result.encode(),
            b'{"type":"test","event":"ok","name":"only_b"}'])
    base, head = run("ok"), run("failed")
    assert base.items == {"same [binary 1]": FAILED, "same [binary 2]": PASSED,
                          "only_b": PASSED}
    pairs = outcomes.pair(base, head)
    assert pairs["introduced"] == ["same [binary 2]"]
    assert pairs["pre-existing"] == ["same [binary 1]"]


def test_a_report_through_a_link_or_too_large_is_unreadable(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real.xml"
    real.write_bytes(b"<testsuite/>")
    link = tmp_path / "link.xml"
    link.symlink_to(real)
    with pytest.raises(ReportUnreadable, match="cannot be opened"):
        outcomes.read_limited(str(link))
    with pytest.raises(ReportUnreadable, match="not a regular file"):
        outcomes.read_limited(str(tmp_path))
    monkeypatch.setattr(outcomes, "MAX_REPORT_BYTES", 4)
    with pytest.raises(ReportUnreadable, match="larger than"):
        outcomes.read_limited(str(real))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ReportUnreadable, match="not a regular file"):
        outcomes.read_limited(str(fifo))


def test_cargo_binaries_are_told_apart_by_name_not_by_place() -> None:
    # review: with crate a gone at head, its base failure paired with b's new one
    def run(*crates: tuple[str, str]) -> outcomes.Outcomes:
        lines = [b"   Compiling x v0.1.0"]
        for crate, result in crates:
            lines += [b"     Running unittests src/lib.rs (target/debug/deps/%s-0123456789abcdef)"
                      % crate.encode(),
                      b'{"type":"suite","event":"started","test_count":1}',
                      b'{"type":"test","event":"%s","name":"t::ok"}' % result.encode(),
                      b'{"type":"suite","event":"ok","passed":1,"failed":0}']
        lines += [b"   Doc-tests a", b'{"type":"suite","event":"started","test_count":1}',
                  b'{"type":"test","event":"ok","name":"src/lib.rs - f (line 3)"}']
        return outcomes.from_cargo(lines)
    base = run(("a", "failed"), ("b", "ok"), ("c", "ok"))
    head = run(("b", "failed"), ("c", "ok"))
    assert set(base.items) == {"t::ok [a src/lib.rs]", "t::ok [b src/lib.rs]",
                               "t::ok [c src/lib.rs]", "src/lib.rs - f (line 3)"}
    pairs = outcomes.pair(base, head)
    assert pairs["introduced"] == ["t::ok [b src/lib.rs]"]
    assert pairs["only-base"] == ["t::ok [a src/lib.rs]"] and pairs["pre-existing"] == []
