"""Per-run worktrees: made outside the boundary, committed to from inside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import Saphan

pytestmark = pytest.mark.usefixtures("bwrap_available")

GIT_ENV = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
           "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "README").write_text("hello\n")
    _git(r, "add", "README")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "base")
    return r


@pytest.fixture
def s(saphan_sqlite: Saphan) -> Saphan:
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    return saphan_sqlite


def test_run_commits_on_its_branch_visible_from_main_repo(s: Saphan, repo: Path) -> None:
    base = _git(repo, "rev-parse", "HEAD").strip()
    script = ("echo change > f.txt && mkdir -p $TMPDIR && echo t > $TMPDIR/x && git add f.txt && "
              "git commit -q -m 'from the run' && git status --porcelain")
    r = s("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
          script, env=s.env(**GIT_ENV))
    assert r.code == 0, r.err
    assert r.out.strip() == ""  # scratch dir ignored: a clean status after the commit
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    wt = rec["worktree"]
    assert wt["branch"] == f"saphan/{rec['id']}"
    assert wt["base"] == base and wt["kept"] is True
    assert Path(wt["path"]).is_dir()
    log = _git(repo, "log", "--format=%s", wt["branch"])
    assert log.splitlines()[0] == "from the run"
    assert _git(repo, "rev-parse", wt["branch"]).strip() == wt["head_after"]
    assert ".saphan-run/" in (repo / ".git" / "info" / "exclude").read_text()
    # the main worktree was not touched
    assert _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "rev-parse", "HEAD").strip() == base
    # nothing in the record claims a commit was impossible
    assert not any("cannot commit" in n for n in rec["notes"])


def test_remove_worktree_keeps_the_branch(s: Saphan, repo: Path) -> None:
    r = s("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--remove-worktree",
          "--", "sh", "-c", "echo x > y && git add y && git commit -q -m run",
          env=s.env(**GIT_ENV))
    assert r.code == 0, r.err
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["worktree"]["kept"] is False
    assert not Path(rec["worktree"]["path"]).exists()
    assert _git(repo, "log", "--format=%s", "-1", rec["worktree"]["branch"]).strip() == "run"
    assert rec["worktree"]["path"] not in _git(repo, "worktree", "list")


def test_worktree_add_inside_the_boundary_is_refused(s: Saphan, repo: Path) -> None:
    r = s("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--",
          "git", "worktree", "add", "-q", "../nested", "-b", "nested")
    assert r.code == 1
    assert "Read-only file system" in r.err or "Operation not permitted" in r.err, r.err
    assert "nested" not in _git(repo, "worktree", "list")


def test_bad_base_and_conflicting_flags_write_nothing(s: Saphan, repo: Path,
                                                      tmp_path: Path) -> None:
    for args, needle in [
        (["--repo", str(repo), "--base", "no-such-ref"], "--base no-such-ref: no such commit"),
        (["--repo", str(tmp_path)], "not a git repository"),
        (["--repo", str(repo), "--workdir", str(tmp_path)], "not both"),
        (["--workdir", str(tmp_path), "--base", "HEAD"], "--base needs --repo"),
    ]:
        r = s("run", "--machine", "here", "--slot", "s1", *args, "--", "true")
        assert r.code == 2, (args, r.err)
        assert needle in r.err
    assert s.ok("runs", "list", "--json").json() == []
    assert not (s.home / "worktrees").exists()
    assert _git(repo, "branch", "--list", "saphan/*") == ""


def test_not_carried_names_uncommitted_changes(tmp_path: Path) -> None:
    """What a --repo run's worktree will not have (through the CLI:
    tests/test_cli_verbs.py)."""
    import subprocess

    from saphan.worktrees import not_carried, resolve_repo

    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a",
                    "commit", "-q", "--allow-empty", "-m", "b"], check=True)
    assert not_carried(resolve_repo(str(repo), None)) is None
    for i in range(7):
        (repo / f"f{i}").write_text("x")
    line = not_carried(resolve_repo(str(repo), None), shown=5)
    assert line is not None and "has 7 uncommitted change(s)" in line
    assert "f0 (??)" in line and line.endswith("and 2 more; commit them first to give them to "
                                               "the run")
