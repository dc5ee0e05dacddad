"""One Policy, three renderings: they must grant and deny the same paths."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from saphan.confine import bwrap, landlock, seatbelt
from saphan.confine.grants import NotGrantable, check_dir, derive, verify_linked_worktree
from saphan.confine.policy import DEVICE_LITERALS, Policy

POLICY = Policy(
    workdir="/w/repo",
    writable_dirs=("/w/repo", "/ws/runs/R/out", "/w/.git/worktrees/r"),
    writable_literals=DEVICE_LITERALS,
    readonly_dirs=("/w/repo/.git",),
    read_denials=("/ws/record.key", "/ws/config.toml"),
    scratch_dir="/w/repo/.saphan-run/tmp",
)


def _bwrap_sets(argv: list[str]) -> tuple[set[str], set[str], list[str]]:
    writable, readonly, order = set(), set(), []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--bind", "--dev-bind-try", "--bind-try"):
            writable.add(argv[i + 2])
            order.append("w")
            i += 3
        elif a == "--ro-bind" and argv[i + 1] == "/dev/null":
            order.append("deny:" + argv[i + 2])
            i += 3
        elif a == "--ro-bind":
            if argv[i + 2] != "/":
                readonly.add(argv[i + 2])
                order.append("ro")
            i += 3
        else:
            i += 1
    return writable, readonly, order


def _seatbelt_rules(profile: str) -> list[tuple[str, set[str]]]:
    """(rule head, paths) per top-level rule, in order."""
    rules = []
    for block in re.split(r"\n(?=\()", profile.strip()):
        head = block.splitlines()[0].strip()
        rules.append((head, set(re.findall(r'\((?:subpath|literal) "([^"]+)"\)', block))))
    return rules


def test_bwrap_and_seatbelt_grant_the_same_set() -> None:
    argv = bwrap.render(POLICY, "/usr/bin/bwrap")
    b_writable, b_readonly, _order = _bwrap_sets(argv)
    rules = dict(_seatbelt_rules(seatbelt.render(POLICY))[2:])
    assert b_writable == rules["(allow file-write*"] == set(POLICY.writable_set())
    assert b_readonly == rules["(deny file-write*"] == set(POLICY.readonly_dirs)


def test_read_denials_come_last_in_both() -> None:
    argv = bwrap.render(POLICY, "/usr/bin/bwrap")
    _, _, order = _bwrap_sets(argv)
    denials = [o for o in order if o.startswith("deny:")]
    assert order[-len(denials):] == denials
    assert {d[5:] for d in denials} == set(POLICY.read_denials)
    profile = seatbelt.render(POLICY).rstrip().splitlines()
    last_rule = "\n".join(profile[profile.index("(deny file-read* file-write*"):])
    for path in POLICY.read_denials:
        assert f'"{path}"' in last_rule
    # nothing after the denial block
    assert profile[-1].endswith(")")


def test_seatbelt_golden() -> None:
    assert seatbelt.render(POLICY) == (
        '(version 1)\n'
        '(allow default)\n'
        '(deny file-write*)\n'
        '(allow file-write*\n'
        '    (subpath "/w/repo")\n'
        '    (subpath "/ws/runs/R/out")\n'
        '    (subpath "/w/.git/worktrees/r")\n'
        '    (literal "/dev/null")\n'
        '    (literal "/dev/tty")\n'
        '    (literal "/dev/zero")\n'
        '    (literal "/dev/random")\n'
        '    (literal "/dev/urandom"))\n'
        '(deny file-write*\n'
        '    (subpath "/w/repo/.git"))\n'
        '(deny file-read* file-write*\n'
        '    (subpath "/ws/record.key")\n'
        '    (subpath "/ws/config.toml"))\n'
    )


def test_landlock_rendering_carries_the_same_writable_set() -> None:
    plain = Policy(workdir="/w", writable_dirs=("/w", "/o"), scratch_dir="/w/.saphan-run/tmp")
    value = json.loads(landlock.render(plain))
    assert value == {"version": 1, "workdir": "/w", "readable": "everything",
                     "writable": ["/w", "/o", *DEVICE_LITERALS]}
    argv = bwrap.render(plain, "bwrap")
    assert _bwrap_sets(argv)[0] == set(value["writable"])


def test_landlock_refuses_what_it_cannot_express() -> None:
    with pytest.raises(landlock.Inexpressible, match="read denials"):
        landlock.render(POLICY)


def test_symlinks_resolved_before_rules(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    policy = derive(str(link))
    assert policy.workdir == str(real)
    assert str(link) not in policy.writable_dirs


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


def test_main_worktree_git_dir_stays_read_only(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    policy = derive(str(repo))
    assert policy.readonly_dirs == (str(repo / ".git"),)
    assert not any(".git" in d for d in policy.writable_dirs)


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


def test_a_workdir_run_gets_no_git_grant_whatever_its_git(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wt = tmp_path / "wt2"
    _git("worktree", "add", "-q", "-b", "saphan/feature", str(wt), cwd=repo)
    policy = derive(str(wt))
    assert policy.writable_dirs == (str(wt),)
    assert policy.readonly_dirs == (str(wt / ".git"),)
    assert any("cannot commit" in n for n in policy.notes)


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


def test_grant_rule_refuses_a_symlink_component(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(NotGrantable, match="link"):
        check_dir(str(tmp_path / "link" / "sub"))
    assert check_dir(str(real / "sub")) == str(real / "sub")


def test_a_later_grant_cannot_re_expose_a_read_denial(tmp_path: Path) -> None:
    """The secret sits inside a writable directory; the denial still wins."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap missing (ci/setup installs it)")
    wd = tmp_path / "wd"
    wd.mkdir()
    secret = wd / "secret.key"
    secret.write_text("TOPSECRET\n")
    policy = derive(str(wd), read_denials=(str(secret),))
    argv = bwrap.render(policy, "bwrap")
    assert argv.index(str(secret)) > max(i for i, a in enumerate(argv) if a in ("--bind", "--bind-fd"))
    p = subprocess.run([*argv, "sh", "-c", f"cat {secret}; echo x > {secret}"],
                       capture_output=True, text=True)
    assert "TOPSECRET" not in p.stdout
    assert secret.read_text() == "TOPSECRET\n"
