"""Escape battery: from inside the bubblewrap boundary, try to write outside.

Each attempt must be refused AND the outside file must be byte-for-byte
unchanged. The jail runs as root here (the CI machine's user) with every
capability dropped, which is the harder case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import escapes
from conftest import Saphan

pytestmark = pytest.mark.usefixtures("bwrap_available")


@pytest.fixture
def jail(saphan_sqlite: Saphan, tmp_path: Path) -> tuple[Saphan, Path, Path]:
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    repo, outside = escapes.make_repo_and_victim(tmp_path)
    return saphan_sqlite, repo, outside


ATTEMPTS = {**escapes.CONTENT, **escapes.METADATA, "remount": "mount -o remount,rw /"}


def test_every_escape_is_refused_and_outside_unchanged(jail: tuple[Saphan, Path, Path]) -> None:
    s, repo, outside = jail
    victim = outside / "victim.txt"
    before = escapes.digest(victim)
    before_mode = victim.stat().st_mode
    before_mtime = victim.stat().st_mtime_ns
    git_config = (repo / ".git" / "config").read_bytes()
    script = escapes.script(ATTEMPTS)
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(repo), "--",
          "sh", "-c", script)
    assert r.code == 0, r.err
    lines = set(r.out.splitlines())
    for name in ATTEMPTS:
        assert f"REFUSED {name}" in lines, f"escape {name!r} succeeded:\n{r.out}"
    assert "INSIDE ok" in lines
    assert escapes.digest(victim) == before
    assert victim.stat().st_mode == before_mode
    assert victim.stat().st_mtime_ns == before_mtime
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert not (repo / ".git" / "worktrees").exists()
    assert (repo / ".git" / "config").read_bytes() == git_config
    assert not list(Path("/tmp").glob("saphan-escape-*"))
    assert not list(Path("/var/tmp").glob("saphan-escape-*"))


def test_git_worktree_add_is_refused_inside_the_boundary(jail: tuple[Saphan, Path, Path]) -> None:
    s, repo, _ = jail
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(repo), "--",
          "git", "worktree", "add", "-q", "wt", "-b", "x")
    assert r.code == 1
    assert "could not create" in r.err or "Read-only file system" in r.err, r.err
    assert not (repo / ".git" / "worktrees").exists()
