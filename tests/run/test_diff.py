"""run/diff.py: a --repo run's branch against its base, read from the main
repository with real git over real repositories (a linked worktree made as
saphan makes it, the run's commit imported onto saphan/<run-id>): the patch,
records that name nothing to read, a missing branch, the byte limit, and a
repository and worktree configured to run programs (external diff, textconv,
hooks, fsmonitor) that never run."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from saphan.ids import new_run_id
from saphan.run import diff as diffmod
from saphan.run.diff import DIFF_LIMIT, branch_diff

COMMIT = ("-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@dataclass
class Run:
    repo: Path
    worktree: Path
    run_id: str
    base: str
    head: str
    record: dict[str, Any]


def _make_run(tmp_path: Path, content: bytes = b"hello\nfrom the run\n") -> Run:
    """A repository with a base commit, and a run's worktree (where saphan
    puts it) whose commit is on saphan/<run-id>, as an imported run's is."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("hello\n")
    _git(repo, "add", "README")
    _git(repo, *COMMIT, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    run_id = new_run_id()
    wt = tmp_path / "home" / "worktrees" / run_id
    wt.parent.mkdir(parents=True)
    _git(repo, "worktree", "add", "-q", "--detach", str(wt), base)
    (wt / "README").write_bytes(content)
    _git(wt, *COMMIT, "commit", "-q", "--allow-empty", "-am", "from the run")
    head = _git(wt, "rev-parse", "HEAD").strip()
    branch = f"saphan/{run_id}"
    _git(repo, "update-ref", f"refs/heads/{branch}", head, "")
    record = {"id": run_id, "worktree": {
        "repo": str(repo), "path": str(wt), "branch": branch, "base": base, "base_ref": "HEAD",
        "head_after": head, "kept": True,
        "import": {"result": "imported", "branch": branch, "base": base, "head": head,
                   "commits": 1}}}
    return Run(repo, wt, run_id, base, head, record)


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return _make_run(tmp_path)


def _with(run: Run, **worktree: Any) -> dict[str, Any]:
    return {**run.record, "worktree": {**run.record["worktree"], **worktree}}


def test_the_imported_branch_against_its_base(run: Run) -> None:
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text is not None
    assert "+from the run\n" in got.text
    assert got.text.startswith("diff --git a/README b/README\n")
    assert (got.base, got.head, got.truncated) == (run.base, run.head, False)
    assert f"saphan/{run.run_id}: {run.base[:12]}..{run.head[:12]}" in got.note
    assert f"{len(got.text.encode())} bytes of diff" in got.note
    assert "\n" not in got.note


def test_a_run_without_repo_has_no_diff() -> None:
    assert branch_diff({"id": new_run_id(), "outcome": "success"}, signature="valid") is None
    assert branch_diff({"id": new_run_id(), "worktree": None}, signature="valid") is None


@pytest.mark.parametrize("signature", ["invalid", "missing", "foreign", "pending"])
def test_a_record_that_does_not_verify_is_not_read(run: Run, signature: str) -> None:
    rec = _with(run, repo="/nonexistent/repository")
    got = branch_diff(rec, signature=signature)
    assert got is not None
    assert got.text is None and got.base is None and got.head is None
    assert got.note.startswith(f"the diff is not read: the record does not verify ({signature})")
    if signature == "pending":
        assert "the run is live" in got.note
    # the same record, verified, is read (from the record's repository: here none)
    read = branch_diff(rec, signature="valid")
    assert read is not None and "cannot be read" in read.note


@pytest.mark.parametrize(("field", "value", "says"), [
    ("base", "HEAD", "is not a full commit id"),
    ("base", "abc123", "is not a full commit id"),
    ("base", "g" * 40, "is not a full commit id"),
    ("base", None, "is not a full commit id"),
    ("branch", "main", "not saphan/"),
    ("branch", "saphan/01ARZ3NDEKTSV4RRFFQ69G5FAV", "not saphan/"),
    ("repo", "repo", "is not an absolute path"),
    ("repo", None, "is not an absolute path"),
    ("repo", "/a\0b", "is not an absolute path"),
    ("path", "/a\0b", "is not an absolute <worktrees>/"),
    ("path", "worktrees/x", "is not an absolute <worktrees>/"),
])
def test_a_field_that_does_not_check_is_named(run: Run, field: str, value: Any,
                                              says: str) -> None:
    got = branch_diff(_with(run, **{field: value}), signature="valid")
    assert got is not None and got.text is None
    assert says in got.note and got.note.startswith("the diff is not read")


def test_a_record_without_a_run_id_is_not_read(run: Run) -> None:
    got = branch_diff({**run.record, "id": "../../etc"}, signature="valid")
    assert got is not None and got.text is None and "is not a run id" in got.note


def test_git_is_never_run_in_the_run_s_worktree(run: Run, tmp_path: Path) -> None:
    """The worktree (and any other run's place under worktrees/) as the
    repository is refused before git starts; one with a planted git dir
    whose configuration runs a program proves it."""
    marker = tmp_path / "ran"
    planted = run.worktree / "planted.git"
    subprocess.run(["git", "init", "-q", "--bare", str(planted)], check=True)
    with (planted / "config").open("a") as f:
        f.write(f"[core]\n\tfsmonitor = touch {marker}\n\thooksPath = /nonexistent\n"
                f"[diff]\n\texternal = touch {marker}\n")
    os.unlink(run.worktree / ".git")
    (run.worktree / ".git").write_text(f"gitdir: {planted}\n")
    other = run.worktree.parent / new_run_id()
    other.mkdir()
    (run.worktree / "sub").mkdir()
    for repo in (run.worktree, run.worktree / "sub", other, run.worktree.parent):
        got = branch_diff(_with(run, repo=str(repo)), signature="valid")
        assert got is not None and got.text is None
        assert "where a run can write; git is never run there" in got.note, got.note
    # the same record naming the main repository: read from there, nothing run
    main = branch_diff(run.record, signature="valid")
    assert main is not None and "+from the run" in str(main.text)
    assert not marker.exists()


def test_a_repository_named_through_a_link_is_refused(run: Run, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(run.repo)
    got = branch_diff(_with(run, repo=str(link)), signature="valid")
    assert got is not None and got.text is None
    assert "is not a directory (a link or a file)" in got.note
    # a link to the worktree, one level up: resolved, and refused as the worktree
    (tmp_path / "up").symlink_to(run.worktree.parent)
    got = branch_diff(_with(run, repo=str(tmp_path / "up" / run.run_id)), signature="valid")
    assert got is not None and "where a run can write" in got.note


def test_a_directory_that_is_not_the_repository_s_top_level(run: Run, tmp_path: Path) -> None:
    (run.repo / "sub").mkdir()
    got = branch_diff(_with(run, repo=str(run.repo / "sub")), signature="valid")
    assert got is not None and got.text is None
    assert "is not a repository's top level" in got.note
    plain = tmp_path / "plain"
    plain.mkdir()
    got = branch_diff(_with(run, repo=str(plain)), signature="valid")
    assert got is not None and got.text is None
    assert got.note.startswith(f"the diff is not read: git could not read {plain} as a repository")


@pytest.mark.parametrize(("imported", "says"), [
    ({"result": "refused", "why": "the run's commits change protected paths"},
     "were not imported onto saphan/"),
    ({"result": "unchanged"}, "the run made no commits"),
    (None, "the record holds no import onto saphan/"),
    ({"result": "other"}, "the import's result is 'other'"),
])
def test_a_branch_not_imported_is_said(run: Run, imported: dict[str, Any] | None,
                                       says: str) -> None:
    rec = _with(run, **{"import": imported})
    if imported is None:
        del rec["worktree"]["import"]
    got = branch_diff(rec, signature="valid")
    assert got is not None and got.text is None and got.base == run.base
    assert says in got.note
    if imported and imported.get("why"):
        assert got.note.endswith(": the run's commits change protected paths")


def test_a_deleted_branch_is_said(run: Run) -> None:
    _git(run.repo, "update-ref", "-d", f"refs/heads/saphan/{run.run_id}")
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text is None and got.head is None
    assert got.note == (f"the branch saphan/{run.run_id} is not in {run.repo} (deleted or pruned "
                        "since the run)")


def test_a_base_missing_from_the_repository_names_git_s_error(run: Run) -> None:
    got = branch_diff(_with(run, base="0123456789" * 4), signature="valid")
    assert got is not None and got.text is None and got.head == run.head
    assert got.note.startswith(f"git could not diff saphan/{run.run_id} against its base")
    assert "0123456789" in got.note and "\n" not in got.note  # git's own words, one line


def test_commits_that_change_nothing_are_an_empty_diff(tmp_path: Path) -> None:
    run = _make_run(tmp_path, b"hello\n")  # the base's README again: an empty commit
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text == "" and not got.truncated
    assert got.note.endswith(": no difference")


def test_a_branch_moved_since_the_import_is_said(run: Run) -> None:
    _git(run.worktree, *COMMIT, "commit", "-q", "--allow-empty", "-m", "later")
    later = _git(run.worktree, "rev-parse", "HEAD").strip()
    _git(run.repo, "update-ref", f"refs/heads/saphan/{run.run_id}", later)
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.head == later and "+from the run" in str(got.text)
    assert f"moved since the import of {run.head[:12]}" in got.note


def test_the_diff_is_cut_at_the_limit(tmp_path: Path) -> None:
    run = _make_run(tmp_path, b"".join(b"line %d of the run\n" % i for i in range(5000)))
    whole = branch_diff(run.record, signature="valid")
    assert whole is not None and whole.text is not None and not whole.truncated
    assert len(whole.text.encode()) > 50_000
    got = branch_diff(run.record, limit=1000, signature="valid")
    assert got is not None and got.text is not None and got.truncated
    assert len(got.text.encode()) <= 1000 and got.text.endswith("\n")
    assert whole.text.startswith(got.text)
    assert f"cut at {len(got.text.encode())} bytes (limit 1000)" in got.note
    assert DIFF_LIMIT == 1 << 20


def test_undecodable_bytes_are_replaced_within_the_limit(tmp_path: Path) -> None:
    """Each undecodable byte becomes U+FFFD (three bytes): still at most
    ``limit`` bytes of text."""
    run = _make_run(tmp_path, b"\xff\xfe" * 300 + b"\n")
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text is not None and "\ufffd" in got.text
    assert not got.truncated
    small = branch_diff(run.record, limit=len(got.text.encode()) - 100, signature="valid")
    assert small is not None and small.text is not None and small.truncated
    assert len(small.text.encode()) <= len(got.text.encode()) - 100


def test_configured_programs_never_run(run: Run, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's own configuration names an external diff, a diff
    driver with a command and a textconv (selected for every path by
    info/attributes, by a committed .gitattributes, and by one in the
    dashboard's working directory), hooks and an fsmonitor: the diff is
    read and none of them runs."""
    marker = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\ncat \"$1\" 2>/dev/null\nexit 0\n")
    script.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("reference-transaction", "post-checkout", "pre-commit", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    (run.repo / ".git" / "info").mkdir(exist_ok=True)
    (run.repo / ".git" / "info" / "attributes").write_text("* diff=evil\n")
    (run.worktree / ".gitattributes").write_text("* diff=evil\n")
    _git(run.worktree, "add", ".gitattributes")
    _git(run.worktree, *COMMIT, "commit", "-q", "-m", "attrs")
    head = _git(run.worktree, "rev-parse", "HEAD").strip()
    _git(run.repo, "update-ref", f"refs/heads/saphan/{run.run_id}", head)
    _git(run.repo, "config", "diff.external", str(script))
    _git(run.repo, "config", "diff.evil.command", str(script))
    _git(run.repo, "config", "diff.evil.textconv", str(script))
    _git(run.repo, "config", "core.hooksPath", str(hooks))
    _git(run.repo, "config", "core.fsmonitor", str(script))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / ".gitattributes").write_text("* diff=evil\n")
    monkeypatch.chdir(elsewhere)
    assert not marker.exists()
    # the setup is live: git left to itself runs the driver
    subprocess.run(["git", "--git-dir", str(run.repo / ".git"), "diff", run.base, head],
                   check=True, capture_output=True)
    assert marker.exists()
    marker.unlink()
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text is not None, got
    assert "+from the run\n" in got.text and "+* diff=evil\n" in got.text
    assert got.head == head
    assert not marker.exists()


def test_a_diff_over_its_time_is_stopped(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffmod, "DIFF_TIME_LIMIT", 0.0)
    got = branch_diff(run.record, signature="valid")
    assert got is not None and got.text is None
    assert got.note.startswith(f"the diff is not read: git could not read {run.repo}")
    assert got.note.endswith("it took over 0 s (stopped)")
