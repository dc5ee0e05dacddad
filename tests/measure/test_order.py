"""A measure-base order (measure/order.py): what is refused before anything
is reserved, the default scratch, and where per-test outcomes come from."""

from __future__ import annotations

import pytest

from saphan.errors import UserError
from saphan.measure import order


def test_the_default_scratch_is_new_and_under_saphans_ignored_tree() -> None:
    a = order.make("main", ["pytest"])
    b = order.make("main", ["pytest"])
    assert a.default_scratch and a.scratch.startswith(".saphan-run/base-")
    assert a.scratch != b.scratch
    assert order.make("main", ["pytest"], token="x1").scratch == ".saphan-run/base-x1"
    assert a.ignore_rule() == f"/{a.scratch}/"


@pytest.mark.parametrize("base", ["", "-rf", "--upload-pack=x", "a..b", "ma\nin", "a b",
                                  "x.lock", "dir/", "x" * 256])
def test_a_base_git_would_read_as_an_option_or_no_name_is_refused(base: str) -> None:
    with pytest.raises(UserError, match="--base"):
        order.make(base, ["pytest"])


@pytest.mark.parametrize("base", ["0a1b2c3", "main", "release/1.2", "v1.0", "HEAD~2"])
def test_names_git_takes(base: str) -> None:
    assert order.make(base, ["pytest"]).base == base


def test_expect_is_a_sha_and_is_lowered() -> None:
    assert order.make("main", ["t"], expect="ABCDEF12").expect == "abcdef12"
    for bad in ("xyz", "abc", "a" * 65, "main"):
        with pytest.raises(UserError, match="--expect"):
            order.make("main", ["t"], expect=bad)


@pytest.mark.parametrize("scratch", ["/abs", "../up", "a/../../b", ".", "./x", "a//b",
                                     ".git", "sub/.git/x", ".GIT", ".git. ", "-x", "a b",
                                     ".saphan-run", ".saphan-run/tmp", ".saphan-run/tmp/x",
                                     "build/-/src", "a/-b",
                                     "x\x1b[2J"])
def test_a_scratch_outside_the_tree_or_in_git_or_saphans_own_is_refused(scratch: str) -> None:
    with pytest.raises(UserError, match="--scratch"):
        order.make("main", ["t"], scratch=scratch)


def test_a_scratch_below_the_tree_is_taken_as_given() -> None:
    o = order.make("main", ["t"], scratch="build/base/")
    assert o.scratch == "build/base" and not o.default_scratch
    assert order.make("main", ["t"], scratch=".saphan-run/mine").scratch == ".saphan-run/mine"


def test_nothing_to_measure_is_refused() -> None:
    with pytest.raises(UserError, match="test command"):
        order.make("main", [])


@pytest.mark.parametrize(("test", "kind"), [
    (["pytest", "-q"], "pytest"),
    (["/usr/bin/py.test"], "pytest"),
    (["python3", "-m", "pytest", "tests"], "pytest"),
    (["/opt/py/bin/python3.11", "-m", "pytest"], "pytest"),
    (["python3", "-m", "unittest"], "exit"),
    (["python3", "pytest"], "exit"),
    (["cargo", "test"], "cargo"),
    (["cargo", "+nightly", "test", "--", "--nocapture"], "cargo"),
    (["cargo", "build"], "exit"),
    (["make", "test"], "exit"),
])
def test_outcomes_are_read_off_the_test_command(test: list[str], kind: str) -> None:
    o = order.make("main", test)
    assert o.kind == kind
    assert o.as_record()["outcomes_from"] == order.SOURCES[kind]


def test_cargo_is_asked_for_libtest_json_once() -> None:
    assert order.make("main", ["cargo", "test"]).test_argv() == [
        "cargo", "test", "--no-fail-fast", "--", *order.CARGO_JSON]
    assert order.make("main", ["cargo", "+nightly", "test", "-q", "--", "--nocapture"]
                      ).test_argv() == ["cargo", "+nightly", "test", "--no-fail-fast", "-q",
                                        "--", "--nocapture", *order.CARGO_JSON]
    assert order.make("main", ["cargo", "test", "--no-fail-fast"]).test_argv() == [
        "cargo", "test", "--no-fail-fast", "--", *order.CARGO_JSON]
    assert order.make("main", ["pytest", "-q"]).test_argv() == ["pytest", "-q"]
