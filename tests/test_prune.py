"""prune.py: `saphan worktrees prune` through the real CLI: kept worktrees of
ended runs removed, empty saphan/* branches deleted, a branch with commits
kept, live runs untouched, links never followed, --older-than and
--dry-run honoured."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Saphan, saphan_exe


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def _branches(repo: Path) -> list[str]:
    return _git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/saphan").split()


def _setup(s: Saphan, tmp_path: Path) -> Path:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty",
         "-m", "base")
    return repo


def _run(s: Saphan, repo: Path, *args: str) -> str:
    r = s("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--json", *args)
    assert r.code == 0, r.err
    return str(json.loads(r.out)["id"])


@pytest.mark.usefixtures("bwrap_available")
def test_prune_removes_what_ended_runs_left_and_keeps_commits(saphan_sqlite: Saphan,
                                                              tmp_path: Path) -> None:
    s = saphan_sqlite
    repo = _setup(s, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    empty = _run(s, repo, "--", "sh", "-c", f"ln -s {outside} link")  # a link left behind
    committed = _run(s, repo, "--", "sh", "-c",
                     "echo x > f && git add f && git -c user.email=a@b -c user.name=a "
                     "commit -qm c")
    removed = _run(s, repo, "--remove-worktree", "--", "true")
    wt = s.home / "worktrees"
    assert sorted(os.listdir(wt)) == sorted([empty, committed])
    assert len(_branches(repo)) == 3
    # --older-than: everything ended just now, so nothing yet
    assert s.ok("worktrees", "prune", "--older-than", "1h").out == "nothing to prune\n"
    # --dry-run: says, does nothing
    dry = s.ok("worktrees", "prune", "--dry-run", "--json").json()
    assert {(a["action"], a["kind"], a["run"]) for a in dry} == {
        ("would-remove", "worktree", empty), ("would-delete", "branch", empty),
        ("would-remove", "worktree", committed), ("kept", "branch", committed),
        ("would-delete", "branch", removed)}
    assert len({tuple(sorted(a)) for a in dry}) == 1  # one key set
    assert sorted(os.listdir(wt)) == sorted([empty, committed]) and len(_branches(repo)) == 3
    text = s.ok("worktrees", "prune").out
    assert f"removed worktree {wt / empty} (run {empty}" in text
    assert f"kept branch saphan/{committed} (run {committed}; 1 commit(s) beyond its base)" in text
    assert os.listdir(wt) == []
    assert _branches(repo) == [f"saphan/{committed}"]  # the branch with a commit stays
    assert (outside / "keep.txt").read_text() == "not the run's"  # the link was not followed
    assert _git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    # again: nothing left but the branch with commits, said so
    again = s.ok("worktrees", "prune", "--json").json()
    assert [(a["action"], a["target"]) for a in again] == [("kept", f"saphan/{committed}")]
    for bad in ("x", "-1", "3651d"):
        r = s("worktrees", "prune", "--older-than", bad)
        assert r.code == 2 and "--older-than" in r.err


@pytest.mark.usefixtures("bwrap_available")
def test_prune_leaves_live_runs_links_and_checked_out_branches(saphan_sqlite: Saphan,
                                                                tmp_path: Path) -> None:
    s = saphan_sqlite
    repo = _setup(s, tmp_path)
    done = _run(s, repo, "--", "true")
    p = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--repo",
                          str(repo), "--", "sleep", "3"], env=s.env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (live := s.ok("runs", "list", "--state", "running", "--json").json()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        live_id = live[0]["id"]
        # the ended run's worktree replaced by a link: left alone, its branch too
        wt = s.home / "worktrees"
        target = tmp_path / "elsewhere"
        target.mkdir()
        os.rename(wt / done, tmp_path / "moved")
        os.symlink(target, wt / done)
        out = s.ok("worktrees", "prune", "--json").json()
        assert [(a["action"], a["kind"]) for a in out] == [("kept", "worktree"),
                                                             ("kept", "branch")]
        assert "not a directory" in out[0]["why"]
        assert (wt / live_id).is_dir() and target.is_dir()  # the live run's worktree stays
    finally:
        p.wait(timeout=60)
    # a branch checked out by the operator is never deleted
    os.unlink(wt / done)
    _git(repo, "worktree", "prune")
    _git(repo, "switch", "-q", f"saphan/{done}")
    out = s.ok("worktrees", "prune", "--json").json()
    mine = [a for a in out if a["run"] == done]
    assert [(a["action"], a["kind"]) for a in mine] == [("kept", "branch")]
    assert "checked out" in mine[0]["why"]
    assert f"saphan/{done}" in _branches(repo)
