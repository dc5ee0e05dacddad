"""The measure-base driver (measure/driver.py) run directly by /bin/sh on
fixture repositories — the script the confined run executes, without the
boundary around it: its steps and files, its exits, values that are never
interpreted as shell text, the default scratch's rule, and the scratch
removed on every path out (a signal included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from measure.repos import git, python_repo
from saphan.measure import driver

PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")


def _run(out: Path, repo: Path, *, base: str, scratch: str = ".saphan-run/base-t",
         expect: str | None = None, kind: str = "pytest", add_rule: bool = False,
         test: tuple[str, ...] = PYTEST) -> tuple[int, dict[str, str]]:
    out.mkdir(exist_ok=True)
    argv = driver.argv(out=str(out), repository=str(repo), workdir=str(repo), scratch=scratch,
                       base=base, expect=expect, kind=kind, add_rule=add_rule, test=test)
    done = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=300)
    files = {p.name.removeprefix("measure-"): p.read_text(errors="replace")
             for p in out.iterdir() if p.name.startswith("measure-")}
    return done.returncode, files


def _ignore(repo: Path, rule: str = "/.saphan-run/") -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text(rule + "\n")


def test_every_step_and_file_of_a_measurement(tmp_path: Path) -> None:
    repo, base, head = python_repo(tmp_path)
    _ignore(repo)
    (repo / ".saphan-run").mkdir()
    code, files = _run(tmp_path / "out", repo, base=base[:7])
    assert code == driver.MEASURED
    assert files["steps"].splitlines() == [
        "fresh 0", "toplevel 0", "ignored 0", "expected 0", "clone 0", "checkout 0", "verify 0", "paths 0",
        "base 1", "head 1", "removed 0", "final 1"]
    # the base run's import paths: this interpreter's, the scratch first
    paths = files["paths"].split("\0")
    assert paths[0] == str(repo / ".saphan-run" / "base-t") and sys.prefix in " ".join(paths)
    assert files["expected"].strip() == files["measured"].strip() == base
    assert files["head"].strip() == head and files["target"].strip() == base[:7]
    for phase in ("base", "head", "final"):
        assert "<testsuite" in files[f"{phase}.xml"]
    # the clone borrowed the objects: no second object store was written
    assert not (repo / ".saphan-run" / "base-t").exists()
    assert sorted(os.listdir(repo / ".saphan-run")) == []


def test_values_are_parameters_never_shell_text(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    weird = "odd $(touch PWNED) `touch PWNED2` ;x"
    _ignore(repo, f"/{weird}/")
    code, files = _run(tmp_path / "out", repo, base=base, scratch=weird, kind="exit",
                       test=("sh", "-c", "test \"$1\" = 'a b$(c)'", "sh", "a b$(c)"))
    assert code == driver.MEASURED, files
    assert files["steps"].splitlines()[-1] == "final 0"
    assert not list(tmp_path.rglob("PWNED*"))


def test_a_scratch_git_does_not_ignore_ends_before_the_clone(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    code, files = _run(tmp_path / "out", repo, base=base, scratch="build/base")
    assert code == driver.NOT_IGNORED
    assert files["steps"] == "fresh 0\ntoplevel 0\nignored 1\n"
    assert not (repo / "build").exists()


def test_the_default_rule_is_added_only_when_asked(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    exclude = repo / ".git" / "info" / "exclude"
    before = exclude.read_text()
    code, _ = _run(tmp_path / "out1", repo, base=base, add_rule=False, kind="exit",
                   test=("true",))
    assert code == driver.NOT_IGNORED and exclude.read_text() == before
    code, files = _run(tmp_path / "out2", repo, base=base, add_rule=True, kind="exit",
                       test=("true",))
    assert code == driver.MEASURED, files
    assert exclude.read_text().splitlines()[-1] == driver.DEFAULT_RULE


def test_the_rule_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.unlink()
    exclude.symlink_to(victim)
    code, files = _run(tmp_path / "out", repo, base=base, add_rule=True, kind="exit",
                       test=("true",))
    assert code == driver.NOT_IGNORED, files
    assert victim.read_text() == "untouched\n"


def test_an_existing_scratch_path_is_left_alone(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    _ignore(repo, "/keep/")
    (repo / "keep").mkdir()
    (repo / "keep" / "mine").write_text("mine\n")
    code, files = _run(tmp_path / "out", repo, base=base, scratch="keep")
    assert code == driver.SCRATCH_EXISTS and files["steps"] == "fresh 1\n"
    assert (repo / "keep" / "mine").read_text() == "mine\n"


def test_a_branch_only_the_remote_holds_and_one_that_moved(tmp_path: Path) -> None:
    repo, base, head = python_repo(tmp_path)
    _ignore(repo)
    git(repo, "branch", "release", head)
    code, files = _run(tmp_path / "out1", repo, base="release", kind="exit", test=("true",))
    assert code == driver.MEASURED
    assert files["target"].strip() == "origin/release" and files["measured"].strip() == head
    code, files = _run(tmp_path / "out2", repo, base="release", expect=base[:8], kind="exit",
                       test=("true",))
    assert code == driver.NOT_MEASURED
    assert files["expected"].strip() == base and files["measured"].strip() == head
    assert "base" not in files["steps"].split()  # no test ran
    assert not (repo / ".saphan-run" / "base-t").exists()


def test_an_unknown_base_or_sha_measures_nothing(tmp_path: Path) -> None:
    repo, _, _ = python_repo(tmp_path)
    _ignore(repo)
    code, files = _run(tmp_path / "out1", repo, base="no-such-branch", kind="exit",
                       test=("true",))
    assert code == driver.NOT_MEASURED and files["steps"].splitlines()[-1] == "expected 1"
    code, files = _run(tmp_path / "out2", repo, base="main", expect="0000000", kind="exit",
                       test=("true",))
    assert code == driver.NOT_MEASURED and files["expected"].strip() == ""
    assert not (repo / ".saphan-run").exists()


def test_a_signal_mid_suite_removes_the_scratch(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    _ignore(repo)
    out = tmp_path / "out"
    out.mkdir()
    argv = driver.argv(out=str(out), repository=str(repo), workdir=str(repo),
                       scratch=".saphan-run/base-sig", base=base, expect=None, kind="exit",
                       add_rule=False, test=("sleep", "30"))
    p = subprocess.Popen(argv, cwd=repo, start_new_session=True)
    scratch = repo / ".saphan-run" / "base-sig"
    deadline = time.monotonic() + 30
    while not (scratch / "marker").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (scratch / "marker").exists()  # checked out at base, the suite sleeping
    # as the launcher does: the signal to the run's process group
    os.killpg(p.pid, signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    assert not scratch.exists()


# -- review, second round --------------------------------------------------------------


def test_of_two_runs_given_one_scratch_one_claims_it(tmp_path: Path) -> None:
    # review: both saw the path free; the loser's cleanup removed the winner's clone
    repo, base, _ = python_repo(tmp_path)
    _ignore(repo, "/scr/")
    outs = [tmp_path / "o1", tmp_path / "o2"]
    procs = []
    for out in outs:
        out.mkdir()
        argv = driver.argv(out=str(out), repository=str(repo), workdir=str(repo),
                           scratch="scr/x", base=base, expect=None, kind="exit",
                           add_rule=False, test=("sh", "-c", "sleep 1; test -e marker"))
        procs.append(subprocess.Popen(argv, cwd=repo))
    codes = sorted(p.wait(timeout=60) for p in procs)
    assert codes == [driver.MEASURED, driver.SCRATCH_EXISTS], codes
    steps = sorted(((o / "measure-steps").read_text() for o in outs), key=len)
    assert steps[0] == "fresh 1\n" and steps[1].endswith("final 1\n")
    assert not (repo / "scr").exists()  # the winner removed it and the parent it made


def test_a_subdirectory_of_a_repository_is_not_a_working_tree_top(tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    code, files = _run(tmp_path / "out", repo / "pkg", base=base, scratch="s", kind="exit",
                       test=("true",))
    assert code == driver.NOT_MEASURED
    assert files["steps"] == "fresh 0\ntoplevel 1\n"
    assert not (repo / "pkg" / "s").exists()


def test_a_command_named_relative_to_the_tree_is_the_trees_at_base_too(
        tmp_path: Path) -> None:
    # review: `.venv/bin/python` did not exist in the scratch clone (exit 127)
    repo, base, _ = python_repo(tmp_path)
    _ignore(repo, "/.saphan-run/\n/tools/")
    (repo / "tools").mkdir()
    (repo / "tools" / "check").write_text("#!/bin/sh\ntest -e marker\n")
    (repo / "tools" / "check").chmod(0o755)
    code, files = _run(tmp_path / "out", repo, base=base, kind="exit", test=("tools/check",))
    assert code == driver.MEASURED
    assert files["steps"].splitlines()[-4:] == ["base 0", "head 1", "removed 0", "final 1"]


def test_the_base_keeps_its_own_pytest_toml_and_head_ignores_the_scratch(
        tmp_path: Path) -> None:
    repo, base, _ = python_repo(tmp_path)
    _ignore(repo)
    # head: norecursedirs without '.*' (review: head collected the scratch clone)
    (repo / "pytest.ini").write_text("[pytest]\nnorecursedirs = build\n")
    git(repo, "add", "pytest.ini")
    git(repo, "commit", "-q", "-m", "ini")
    # base: its own pytest.toml (pytest 9) selecting one test
    git(repo, "checkout", "-q", base)
    (repo / "pytest.toml").write_text('[pytest]\naddopts = ["-k", "keep"]\n')
    git(repo, "add", "pytest.toml")
    git(repo, "commit", "-q", "-m", "toml")
    base2 = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    (repo / ".saphan-run").mkdir()
    code, files = _run(tmp_path / "out", repo, base=base2)
    assert code == driver.MEASURED, files.get("steps")
    assert files["base.xml"].count("<testcase ") == 1 and 'name="test_keep"' in files["base.xml"]
    assert files["head.xml"].count("<testcase ") == 5
    assert 'classname=".saphan-run' not in files["head.xml"]
