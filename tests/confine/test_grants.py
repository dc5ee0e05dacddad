"""Grants derived from facts a run cannot forge (confine/grants.py): the
writable set, the git grant of a --repo worktree verified from git's own
back-links, what stays read-only, and the run's scratch directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from saphan.confine.grants import (
    NotGrantable,
    check_dir,
    derive,
    make_run_dirs,
    verify_linked_worktree,
)
from saphan.confine.policy import DEVICE_LITERALS
from saphan.errors import PlantedLink


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    _git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "0",
         cwd=repo)
    return repo


# -- the grant rule ------------------------------------------------------------------

def test_grant_rule_refuses_a_symlink_component(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(NotGrantable, match="link"):
        check_dir(str(tmp_path / "link" / "sub"))
    assert check_dir(str(real / "sub")) == str(real / "sub")


@pytest.mark.parametrize("what", ["missing", "file", "relative"])
def test_grant_rule_refuses_what_is_not_an_absolute_real_directory(tmp_path: Path,
                                                                  what: str) -> None:
    (tmp_path / "file").write_text("x")
    path = {"missing": str(tmp_path / "missing"), "file": str(tmp_path / "file"),
            "relative": "relative/dir"}[what]
    with pytest.raises(NotGrantable):
        check_dir(path)


# -- the writable set -------------------------------------------------------------------

def test_symlinks_resolved_before_rules(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    policy = derive(str(link))
    assert policy.workdir == str(real)
    assert str(link) not in policy.writable_dirs


def test_a_plain_workdir_gets_itself_the_devices_and_its_scratch_dir(tmp_path: Path) -> None:
    policy = derive(str(tmp_path))
    assert policy.workdir == str(tmp_path)
    assert policy.writable_dirs == (str(tmp_path),)
    assert policy.writable_literals == DEVICE_LITERALS
    assert policy.scratch_dir == str(tmp_path / ".saphan-run" / "tmp")
    assert policy.readonly_dirs == policy.setenv == policy.notes == ()


def test_a_missing_workdir_is_not_granted(tmp_path: Path) -> None:
    with pytest.raises(NotGrantable):
        derive(str(tmp_path / "missing"))


def test_return_path_and_session_dirs_are_granted_once_each(tmp_path: Path) -> None:
    wd, out, sess = tmp_path / "wd", tmp_path / "out", tmp_path / "sess"
    for d in (wd, out, sess):
        d.mkdir()
    policy = derive(str(wd), return_path=str(out), session_dirs=(str(sess), str(out)))
    assert policy.writable_dirs == (str(wd), str(out), str(sess))


def test_an_extra_dir_that_fails_the_rule_is_left_out_and_noted(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (tmp_path / "file").write_text("x")
    policy = derive(str(wd), return_path=str(tmp_path / "file"),
                    session_dirs=(str(tmp_path / "gone"),))
    assert policy.writable_dirs == (str(wd),)
    assert len(policy.notes) == 2
    assert all(n.startswith("not granted: ") for n in policy.notes)


def test_read_denials_are_resolved_deduplicated_and_only_what_exists(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    key = tmp_path / "record.key"
    key.write_text("k")
    (tmp_path / "key-link").symlink_to(key)
    hidden = tmp_path / "ws"
    hidden.mkdir()
    (hidden / "config.toml").write_text("c")
    policy = derive(str(wd), read_denials=(str(key), str(tmp_path / "key-link"),
                                           str(tmp_path / "missing"), str(hidden / "config.toml")),
                    hidden_dirs=(str(hidden), str(hidden)))
    # The link's target once; the missing path nothing; a path under a hidden
    # directory is hidden already.
    assert policy.read_denials == (str(key),)
    assert policy.hidden_dirs == (str(hidden),)


def test_protected_paths_stay_read_only_once(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    envrc = str(repo / ".envrc")
    policy = derive(str(repo), readonly_paths=(envrc, str(repo / ".git"), envrc))
    assert policy.readonly_dirs == (str(repo / ".git"), envrc)


# -- git -------------------------------------------------------------------------------

def test_main_worktree_git_dir_stays_read_only(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    policy = derive(str(repo))
    assert policy.readonly_dirs == (str(repo / ".git"),)
    assert not any(".git" in d for d in policy.writable_dirs)
    assert any("cannot commit" in n for n in policy.notes)


def test_a_git_link_in_the_workdir_gets_no_grant_and_is_noted(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / ".git").symlink_to(repo / ".git")
    policy = derive(str(wd))
    assert policy.writable_dirs == (str(wd),)
    assert policy.readonly_dirs == ()
    assert [n for n in policy.notes if "not a plain file or directory (link)" in n]


def test_repo_worktree_grants_its_git_dir_only(tmp_path: Path) -> None:
    """A --repo worktree (detached, made by saphan): its own git dir writable,
    git's pointers read-only, the repository read-only whole, new objects in
    the run's own object directory."""
    repo = _repo(tmp_path)
    wt = tmp_path / "wt"
    _git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    common = repo / ".git"
    policy = derive(str(wt), worktree=verify_linked_worktree(str(wt), str(common)))
    gd = common / "worktrees" / "wt"
    assert set(policy.writable_dirs) == {str(wt), str(gd)}
    assert set(policy.readonly_dirs) == {str(wt / ".git"), str(gd / "commondir"),
                                         str(gd / "gitdir")}
    assert dict(policy.setenv) == {
        "GIT_OBJECT_DIRECTORY": str(wt / ".saphan-run" / "objects"),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(common / "objects"),
    }
    assert not any(str(common / "objects") == d or "refs" in d for d in policy.writable_dirs)


def test_a_locked_worktrees_lock_file_stays_read_only_too(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wt = tmp_path / "wt"
    _git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    _git("worktree", "lock", str(wt), cwd=repo)
    common = repo / ".git"
    policy = derive(str(wt), worktree=verify_linked_worktree(str(wt), str(common)))
    assert str(common / "worktrees" / "wt" / "locked") in policy.readonly_dirs


def test_a_workdir_run_gets_no_git_grant_whatever_its_git(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wt = tmp_path / "wt2"
    _git("worktree", "add", "-q", "-b", "saphan/feature", str(wt), cwd=repo)
    policy = derive(str(wt))
    assert policy.writable_dirs == (str(wt),)
    assert policy.readonly_dirs == (str(wt / ".git"),)
    assert any("cannot commit" in n for n in policy.notes)


def test_a_genuine_worktree_verifies_with_its_paths(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wt = tmp_path / "wt"
    _git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    got = verify_linked_worktree(str(wt), str(repo / ".git"))
    assert (got.workdir, got.dot_git, got.git_dir, got.common_dir) == (
        str(wt), str(wt / ".git"), str(repo / ".git" / "worktrees" / "wt"), str(repo / ".git"))


@pytest.mark.parametrize("layout", ["relative-link", "back-link-elsewhere", "commondir-elsewhere",
                                    "gitdir-outside-common", "dot-git-link"])
def test_worktree_lookalikes_are_not_verified(tmp_path: Path, layout: str) -> None:
    """What a run can plant in its workdir never verifies as a worktree."""
    repo = _repo(tmp_path)
    common = repo / ".git"
    wt = tmp_path / "wt"
    _git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    gd = common / "worktrees" / "wt"
    if layout == "relative-link":
        fake = wt / ".x"
        fake.mkdir()
        (fake / "worktrees").symlink_to("../../..")
        (wt / ".git").write_text(f"gitdir: {fake}/worktrees/wt\n")
    elif layout == "back-link-elsewhere":
        (gd / "gitdir").write_text(f"{tmp_path}/other/.git\n")
    elif layout == "commondir-elsewhere":
        (gd / "commondir").write_text(f"{tmp_path}\n")
    elif layout == "gitdir-outside-common":
        (wt / ".git").write_text(f"gitdir: {tmp_path}\n")
    else:
        (wt / ".git").unlink()
        (wt / ".git").symlink_to(gd)
    with pytest.raises(NotGrantable):
        verify_linked_worktree(str(wt), str(common))


@pytest.mark.parametrize(("pointer", "needle"), [
    ("not a pointer\n", "does not say `gitdir: PATH`"),
    ("gitdir: ../repo/.git/worktrees/wt\n", "not an absolute normalised path"),
    ("\xff\xfe", "utf-8"),
])
def test_a_malformed_pointer_is_named(tmp_path: Path, pointer: str, needle: str) -> None:
    repo = _repo(tmp_path)
    wt = tmp_path / "wt"
    _git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    (wt / ".git").write_bytes(pointer.encode("latin-1"))
    with pytest.raises(NotGrantable, match=needle):
        verify_linked_worktree(str(wt), str(repo / ".git"))


# -- the run's own directories -------------------------------------------------------------

def test_run_dirs_are_made_inside_the_workdir(tmp_path: Path) -> None:
    policy = derive(str(tmp_path))
    make_run_dirs(policy, objects=False)
    assert (tmp_path / ".saphan-run" / "tmp").is_dir()
    assert not (tmp_path / ".saphan-run" / "objects").exists()
    make_run_dirs(policy, objects=True)  # again: existing directories are fine
    for sub in ("info", "pack"):
        assert (tmp_path / ".saphan-run" / "objects" / sub).is_dir()


def test_run_dirs_are_never_made_through_a_planted_link(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    policy = derive(str(wd))
    os.symlink(outside, wd / ".saphan-run")
    with pytest.raises(PlantedLink, match=r"\.saphan-run is a symbolic link"):
        make_run_dirs(policy, objects=True)
    assert list(outside.iterdir()) == []
