"""measure/collect.py: the driver's command line for each site, and after a
run on this host the report from the return directory — the refusal of an
unignored scratch, a scratch left by a killed run removed (only when the
driver saw the path free), files planted as links not read, measure.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.repos import python_repo
from saphan.errors import Refusal
from saphan.measure import collect, driver, order

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


def _out(tmp_path: Path, files: dict[str, str]) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    for name, text in files.items():
        (out / f"measure-{name}").write_text(text)
    return out


def test_an_unignored_scratch_is_refused_naming_the_rule(tmp_path: Path) -> None:
    out = _out(tmp_path, {"steps": "fresh 0\nignored 1\n"})
    o = _order(scratch="build/base")
    with pytest.raises(Refusal) as e:
        collect.local(o, out_dir=str(out), workdir=str(tmp_path), repository=str(tmp_path),
                      run_dir=str(tmp_path))
    assert e.value.cls == "scratch-not-ignored"
    assert "`/build/base/`" in e.value.remediation and "build/base" in e.value.message


def test_a_scratch_the_run_left_is_removed_and_the_report_written(tmp_path: Path) -> None:
    repo, _, _ = python_repo(tmp_path)
    o = _order()
    left = repo / o.scratch
    left.mkdir(parents=True)
    (left / "f").write_text("x")
    # the driver was killed during the base suite
    out = _out(tmp_path, {"steps": "fresh 0\nignored 0\nexpected 0\nclone 0\ncheckout 0\n"
                                   "verify 0\n", "expected": BASE, "measured": BASE})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rep = collect.local(o, out_dir=str(out), workdir=str(repo), repository=str(repo),
                        run_dir=str(run_dir))
    assert not left.exists()
    assert rep["one_tree"]["removed_by_saphan"] and not rep["one_tree"]["holds"]
    assert rep["result"] == "outcomes unreadable" and "did not reach" in rep["why"]
    assert json.loads((run_dir / "measure.json").read_text())["one_tree"] == rep["one_tree"]
    assert rep["file"] == str(run_dir / "measure.json")


def test_a_path_that_was_there_before_is_never_removed(tmp_path: Path) -> None:
    repo, _, _ = python_repo(tmp_path)
    o = _order(scratch="keep")
    (repo / "keep").mkdir()
    (repo / "keep" / "mine").write_text("mine")
    for steps in ("fresh 1\n", "", "fresh 0 \nignored 0\n"):
        out = tmp_path / f"out{len(steps)}"
        out.mkdir()
        (out / "measure-steps").write_text(steps)
        rep = collect.local(o, out_dir=str(out), workdir=str(repo), repository=str(repo),
                            run_dir=str(tmp_path))
        assert rep["result"] == "base not measured"
        assert rep["one_tree"]["scratch_present"] and not rep["one_tree"]["removed_by_saphan"]
    assert (repo / "keep" / "mine").read_text() == "mine"


def test_files_planted_as_links_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("fresh 0\nignored 0\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "measure-steps").symlink_to(secret)
    rep = collect.local(_order(), out_dir=str(out), workdir=str(tmp_path),
                        repository=str(tmp_path), run_dir=str(tmp_path))
    assert rep["steps"] == [] and rep["result"] == "base not measured"
    assert any("step file could not be read" in n for n in rep["notes"])
