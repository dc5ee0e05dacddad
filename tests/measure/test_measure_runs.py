"""`saphan measure-base` on real fixture repositories, as real confined runs
(bubblewrap; the record, `runs show`, measure.json): pre-existing,
introduced and fixed per item; a moved branch is "base not measured" with
both SHAs; an unignored scratch is refused before anything is cloned; the
tree-walking test passes at step 5 because the scratch is gone; cargo's
per-test JSON; a plain command's exit status as one labelled item."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Result, Saphan, require
from measure.repos import cargo_repo, git, python_repo

pytestmark = pytest.mark.usefixtures("bwrap_available")

#: the suite, run by this interpreter (its pytest), no cache written in the tree
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")


def _local(s: Saphan) -> None:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")


def _measure(s: Saphan, where: tuple[str, ...], base: str, *extra: str,
             test: tuple[str, ...] = PYTEST) -> tuple[Result, dict[str, Any]]:
    r = s("measure-base", "--machine", "here", "--slot", "s1", *where, "--base", base,
          *extra, "--json", "--", *test, timeout=600)
    rec = json.loads(r.out)
    return r, rec


def test_pre_existing_introduced_fixed_and_one_tree(saphan_sqlite: Saphan,
                                                    tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, head = python_repo(tmp_path)
    r, rec = _measure(s, ("--workdir", str(repo)), base[:9])
    assert r.code == 1, r.err  # measured, a failure introduced
    m = rec["measure"]
    assert m["result"] == "measured" and rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert m["base"]["expected"] == m["base"]["measured"] == base and m["base"]["verified"]
    assert m["base"]["named"] == base[:9] and m["head"]["commit"] == head
    pairs = m["pairs"]
    assert pairs["pre-existing"] == ["test_suite::test_pre"]
    assert pairs["introduced"] == ["test_suite::test_intro", "test_suite::test_tree"]
    assert pairs["fixed"] == ["test_suite::test_fix"]
    assert pairs["passing"] == ["test_suite::test_keep"]
    assert pairs["only-base"] == pairs["only-head"] == []
    # step 5: the scratch gone, the tree-walking test passes over one tree
    tree = m["one_tree"]
    assert tree["holds"] and not tree["scratch_present"] and not tree["removed_by_saphan"]
    assert tree["git_dirs_below"] == []  # no second repository under the first
    assert tree["changed_since_head"] == [
        {"item": "test_suite::test_tree", "head": "failed", "final": "passed"}]
    assert m["phases"]["final"]["failed"] == ["test_suite::test_intro", "test_suite::test_pre"]
    assert not (repo / m["order"]["scratch"]).exists()
    assert m["order"]["scratch"].startswith(".saphan-run/base-")
    assert [st["step"] for st in m["steps"]] == [
        "fresh", "toplevel", "ignored", "expected", "clone", "checkout", "verify", "paths", "base",
        "head", "removed", "final"]
    # the same report in measure.json, and in `runs show`
    saved = json.loads(Path(m["file"]).read_text())
    assert saved["pairs"] == pairs and Path(m["file"]).parent.name == rec["id"]
    shown = s.ok("runs", "show", rec["id"]).out
    assert "measure:     measured: base" in shown
    assert "introduced:   2: test_suite::test_intro, test_suite::test_tree (passes over one " \
           "tree" in shown
    assert "one tree:  yes" in shown
    assert '"<the measure-base driver>", "saphan-measure-base"' in shown
    # the working tree is left as it was: nothing of the measurement shows
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_text_report_and_exit_zero_when_nothing_is_introduced(saphan_sqlite: Saphan,
                                                              tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, _ = python_repo(tmp_path)
    r = s("measure-base", "--machine", "here", "--slot", "s1", "--workdir", str(repo),
          "--base", base, "--", *PYTEST, "-k", "not intro and not tree", timeout=600)
    assert r.code == 0, r.err
    assert "fixed:        1: test_suite::test_fix" in r.out
    assert "pre-existing: 1: test_suite::test_pre" in r.out


def test_a_moved_branch_is_base_not_measured_with_both_shas(saphan_sqlite: Saphan,
                                                            tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, head = python_repo(tmp_path)
    # the order was written when `release` named base; it has moved since
    git(repo, "branch", "release", base)
    git(repo, "branch", "-f", "release", head)
    r, rec = _measure(s, ("--workdir", str(repo)), "release", "--expect", base[:12])
    assert r.code == 4, r.err
    m = rec["measure"]
    assert m["result"] == "base not measured"
    assert m["base"]["expected"] == base and m["base"]["measured"] == head
    assert m["base"]["checked_out"] == "origin/release" and not m["base"]["verified"]
    assert f"is {head}, but the order named {base}" in m["why"]
    assert "pairs" not in m and "phases" not in m  # no per-test verdicts at all
    assert [st["step"] for st in m["steps"]][-1] == "verify"
    assert not (repo / m["order"]["scratch"]).exists()
    shown = s.ok("runs", "show", rec["id"]).out
    assert "base not measured" in shown and base in shown and head in shown


def test_an_unignored_scratch_is_refused_before_anything_is_cloned(saphan_sqlite: Saphan,
                                                                   tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, _ = python_repo(tmp_path)
    r, rec = _measure(s, ("--workdir", str(repo)), base, "--scratch", "build/base")
    assert r.code == 3, r.err
    assert rec["refusal"]["class"] == "scratch-not-ignored"
    assert "`/build/base/`" in rec["refusal"]["remediation"]
    assert "refused [scratch-not-ignored]" in r.err
    assert not (repo / "build").exists()
    steps = (Path(rec["return_path"]) / "measure-steps").read_text()
    assert steps == "fresh 0\ntoplevel 0\nignored 1\n"
    # ignored by the repository, the same scratch is measured
    (repo / ".git" / "info" / "exclude").write_text("/build/\n")
    r, rec = _measure(s, ("--workdir", str(repo)), base, "--scratch", "build/base")
    assert rec["measure"]["result"] == "measured", r.err
    assert not (repo / "build").exists()  # what the clone made above the scratch too


def test_an_existing_scratch_path_is_never_cloned_over(saphan_sqlite: Saphan,
                                                       tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, _ = python_repo(tmp_path)
    (repo / ".git" / "info" / "exclude").write_text("/keep/\n")
    (repo / "keep").mkdir()
    (repo / "keep" / "mine.txt").write_text("the operator's\n")
    r = s("measure-base", "--machine", "here", "--slot", "s1", "--workdir", str(repo),
          "--base", base, "--scratch", "keep", "--", *PYTEST)
    assert r.code == 2 and "already exists" in r.err, r.err
    assert (repo / "keep" / "mine.txt").read_text() == "the operator's\n"


def test_repo_mode_measures_in_a_new_worktree(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, head = python_repo(tmp_path)
    r, rec = _measure(s, ("--repo", str(repo)), base)
    m = rec["measure"]
    assert m["result"] == "measured", r.err
    assert m["repository"] == str(repo.resolve()) and m["head"]["commit"] == head
    assert m["working_tree"] == rec["worktree"]["path"]
    assert m["pairs"]["fixed"] == ["test_suite::test_fix"]
    assert rec["worktree"]["import"]["result"] != "refused"


def test_a_plain_command_is_one_item_labelled_exit_status(saphan_sqlite: Saphan,
                                                          tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, _ = python_repo(tmp_path)
    r, rec = _measure(s, ("--workdir", str(repo)), base, test=("sh", "-c", "test -e marker"))
    m = rec["measure"]
    assert m["result"] == "measured", r.err
    assert m["order"]["outcomes_from"].startswith("the command's exit status only")
    assert m["pairs"]["introduced"] == ["sh -c test -e marker (exit status)"]
    assert r.code == 1


def test_cargo_per_test_outcomes_from_libtest_json(saphan_sqlite: Saphan,
                                                   tmp_path: Path) -> None:
    cargo = shutil.which("cargo")
    require(cargo is not None, "cargo on PATH")
    assert cargo is not None
    s = saphan_sqlite
    _local(s)
    repo, base, _ = cargo_repo(tmp_path)
    env = s.env(CARGO_NET_OFFLINE="true", CARGO_TERM_COLOR="never")
    r = s("measure-base", "--machine", "here", "--slot", "s1", "--workdir", str(repo),
          "--base", base, "--json", "--", cargo, "test", "--offline", "-q", timeout=900,
          env=env)
    rec = json.loads(r.out)
    m = rec["measure"]
    assert m["result"] == "measured", (r.err[-3000:], m)
    assert m["order"]["test"] == [cargo, "test", "--offline", "-q"]
    assert rec["argv"][-9:] == ["test", "--no-fail-fast", "--offline", "-q", "--", "-Z",
                                "unstable-options", "--format", "json"]
    assert m["pairs"]["pre-existing"] == ["tests::pre"]
    assert m["pairs"]["introduced"] == ["tests::intro"]
    assert m["pairs"]["fixed"] == ["tests::fixed"]
    assert m["pairs"]["passing"] == ["tests::keep"]
    assert os.path.isdir(repo / "target")  # head's own build stays; the scratch's went
    assert m["one_tree"]["holds"]


# -- review: the base run must be the base's, and a broken head must be seen ------


def _commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def test_the_working_trees_pytest_config_and_conftest_do_not_reach_the_base(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo = tmp_path / "cfg"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "test_calc.py").write_text(
        "import os\n\ndef test_rounding():\n    assert os.environ.get('CALC_MODE', 'exact')"
        " == 'exact'\n\ndef test_keep():\n    assert True\n")
    base = _commit_all(repo, "base")
    # head: a pytest.ini (rootdir found above the scratch) and a conftest.py
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "conftest.py").write_text("import os\nos.environ['CALC_MODE'] = 'fast'\n")
    _commit_all(repo, "head")
    r, rec = _measure(s, ("--workdir", str(repo)), base)
    m = rec["measure"]
    assert m["result"] == "measured", r.err
    assert m["pairs"]["introduced"] == ["test_calc::test_rounding"], m["pairs"]
    assert m["pairs"]["passing"] == ["test_calc::test_keep"]
    assert m["pairs"]["only-base"] == m["pairs"]["only-head"] == []
    assert r.code == 1


def test_an_editable_install_into_the_tree_is_base_not_isolated(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    import site
    import sysconfig

    s = saphan_sqlite
    _local(s)
    repo = tmp_path / "editable"
    (repo / "src" / "calc").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "src" / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 2) == 4\n")
    base = _commit_all(repo, "base")
    (repo / "src" / "calc" / "__init__.py").write_text("def add(a, b):\n    return a * b + 1\n")
    _commit_all(repo, "head")
    # an environment with pytest and the project installed editable (the .pth
    # `pip install -e .` writes for a src layout)
    venv = tmp_path / "venv"
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv),
                                                       "platbase": str(venv)}))
    here = [p for p in (*site.getsitepackages(), sysconfig.get_path("purelib"))
            if (Path(p) / "pytest").is_dir()]
    (purelib / "outer.pth").write_text(here[0] + "\n")
    (purelib / "__editable__.calc-0.0.pth").write_text(str(repo / "src") + "\n")
    py = str(venv / "bin" / "python")
    r, rec = _measure(s, ("--workdir", str(repo)), base,
                      test=(py, "-m", "pytest", "-q", "-p", "no:cacheprovider"))
    m = rec["measure"]
    assert m["result"] == "base not isolated", (r.err[-2000:], m)
    assert m["base"]["imports_from_working_tree"] == [str(repo / "src")]
    assert "pairs" not in m and r.code == 4


def test_a_collection_error_at_head_is_not_exit_zero(saphan_sqlite: Saphan,
                                                     tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    repo, base, _ = python_repo(tmp_path)
    with (repo / "test_suite.py").open("a") as f:
        f.write("\ndef broken(:\n")
    r, rec = _measure(s, ("--workdir", str(repo)), base)
    m = rec["measure"]
    assert m["result"] == "measured" and r.code == 1, r.err
    assert any(a.startswith("the head run did not complete: pytest exit 2")
               for a in m["attention"])
