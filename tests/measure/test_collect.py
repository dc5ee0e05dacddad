"""measure/collect.py: the driver's command line for each site, and after a
run on this host the report from the return directory — the refusal of an
unignored scratch only when the driver itself ended there (never a step file
alone), what the run made above the scratch removed (what was there before
the run never), files planted as links not read, measure.json always."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.repos import python_repo
from saphan.errors import Refusal, UserError
from saphan.measure import collect, driver, order, scratch

BASE = "a" * 40


def _order(**kw: str) -> order.Order:
    return order.make("main", ["sh", "-c", "true"], token="t1", **kw)


def test_the_rule_is_added_by_the_driver_only_far_and_only_for_the_default() -> None:
    for o, far, add in ((_order(), True, "add"), (_order(), False, "keep"),
                        (_order(scratch="build/x"), True, "keep")):
        argv = collect.command(o, out="/o", repository="/r", workdir="/w", far=far)
        assert argv[:2] == [driver.SHELL, "-c"] and argv[3] == driver.NAME
        assert argv[4:13] == ["/o", "/r", "/w", o.scratch, "main", "", "exit", add, "--"]
        assert argv[13:] == ["sh", "-c", "true"]


def _out(tmp_path: Path, files: dict[str, str], name: str = "out") -> Path:
    out = tmp_path / name
    out.mkdir()
    for fname, text in files.items():
        (out / f"measure-{fname}").write_text(text)
    return out


def _local(o: order.Order, out: Path, wd: Path, run_dir: Path, *, exit_code: int | None,
           made: str | None = None) -> dict[str, object]:
    return collect.local(o, out_dir=str(out), workdir=str(wd), repository=str(wd),
                         run_dir=str(run_dir), exit_code=exit_code, made=made)


def test_an_unignored_scratch_is_refused_naming_the_rule(tmp_path: Path) -> None:
    out = _out(tmp_path, {"steps": "fresh 0\ntoplevel 0\nignored 1\n"})
    with pytest.raises(Refusal) as e:
        _local(_order(scratch="build/base"), out, tmp_path, tmp_path,
               exit_code=driver.NOT_IGNORED)
    assert e.value.cls == "scratch-not-ignored"
    assert "`/build/base/`" in e.value.remediation and "build/base" in e.value.message
    saved = json.loads((tmp_path / "measure.json").read_text())
    assert saved["result"] == "refused: scratch-not-ignored"
    # the default scratch's fix names the directory, and where saphan writes no rule
    with pytest.raises(Refusal) as e:
        _local(_order(), out, tmp_path, tmp_path, exit_code=driver.NOT_IGNORED)
    assert "`/.saphan-run/`" in e.value.remediation and "linked worktree" in e.value.remediation


def test_a_step_file_alone_never_makes_a_refusal(tmp_path: Path) -> None:
    # review: a suite that ran later wrote these two lines and killed the
    # driver; the run had started and cloned: it is no refusal
    repo, _, _ = python_repo(tmp_path)
    o = _order()
    (repo / o.scratch).mkdir(parents=True)
    out = _out(tmp_path, {"steps": "fresh 0\ntoplevel 0\nignored 1\n"})
    for code in (-9, 0, 1, None):
        rep = _local(o, out, repo, tmp_path, exit_code=code, made=o.scratch)
        assert rep["result"] == "base not measured"
    assert not (repo / o.scratch).exists()


def test_what_the_run_made_above_the_scratch_is_removed(tmp_path: Path) -> None:
    repo, _, _ = python_repo(tmp_path)
    o = _order(scratch="scr/a/b")
    assert scratch.first_missing(str(repo), o.scratch) == "scr"
    (repo / "scr" / "a" / "b").mkdir(parents=True)
    (repo / "scr" / "a" / "b" / "f").write_text("x")
    # the driver was killed during the base suite
    out = _out(tmp_path, {"steps": "fresh 0\ntoplevel 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\n"
                                   "verify 0\n", "expected": BASE, "measured": BASE})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rep = _local(o, out, repo, run_dir, exit_code=-9, made="scr")
    assert not (repo / "scr").exists()
    tree = rep["one_tree"]
    assert isinstance(tree, dict)
    assert tree["removed_by_saphan"] and not tree["scratch_present"] and not tree["holds"]
    assert rep["result"] == "outcomes unreadable" and "did not reach" in str(rep["why"])
    assert json.loads((run_dir / "measure.json").read_text())["one_tree"] == tree
    assert rep["file"] == str(run_dir / "measure.json")


def test_a_path_that_was_there_before_is_never_removed(tmp_path: Path) -> None:
    repo, _, _ = python_repo(tmp_path)
    o = _order(scratch="keep/x")
    (repo / "keep" / "x").mkdir(parents=True)
    (repo / "keep" / "x" / "mine").write_text("mine")
    assert scratch.first_missing(str(repo), o.scratch) is None
    for i, steps in enumerate(("fresh 0\n", "", "fresh 1\n")):
        out = _out(tmp_path, {"steps": steps}, name=f"out{i}")
        rep = _local(o, out, repo, tmp_path, exit_code=0, made=None)
        tree = rep["one_tree"]
        assert isinstance(tree, dict)
        assert tree["scratch_present"] and not tree["removed_by_saphan"]
        assert any("still there after the run" in n for n in rep["notes"])  # type: ignore[attr-defined]
    assert (repo / "keep" / "x" / "mine").read_text() == "mine"


def test_files_planted_as_links_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("fresh 0\ntoplevel 0\nignored 0\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "measure-steps").symlink_to(secret)
    rep = _local(_order(), out, tmp_path, tmp_path, exit_code=0)
    assert rep["steps"] == [] and rep["result"] == "base not measured"
    assert any("step file could not be read" in n for n in rep["notes"])  # type: ignore[attr-defined]


def test_a_test_argument_naming_the_tree_absolutely_is_refused() -> None:
    # review: `pytest /wd` made the base run collect head's files
    for arg in ("/w", "/w/tests", "--rootdir=/w/x"):
        o = order.make("main", ["pytest", arg], token="t1")
        with pytest.raises(UserError, match="names the working tree absolutely"):
            collect.command(o, out="/o", repository="/w", workdir="/w", far=False)
    ok = order.make("main", ["pytest", "tests", "/elsewhere/x", "/wx"], token="t1")
    assert collect.command(ok, out="/o", repository="/w", workdir="/w", far=False)[-3:] == [
        "tests", "/elsewhere/x", "/wx"]
