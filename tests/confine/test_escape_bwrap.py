"""Escape battery: from inside the bubblewrap boundary, try to write outside.

Each attempt must be refused AND the outside file must be byte-for-byte
unchanged. The jail runs as root here (the CI machine's user) with every
capability dropped, which is the harder case.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from conftest import Saphan

pytestmark = pytest.mark.usefixtures("bwrap_available")


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def jail(saphan_sqlite: Saphan, tmp_path: Path) -> tuple[Saphan, Path, Path]:
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                    "commit", "-q", "--allow-empty", "-m", "0"], check=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious contents\n" * 100)
    return saphan_sqlite, repo, outside


ATTEMPTS = {
    "tmp": "echo x > /tmp/saphan-escape-$$",
    "var_tmp": "echo x > /var/tmp/saphan-escape-$$",
    "home": "echo x > $HOME/saphan-escape-$$",
    "sibling": "echo x > ../outside/new.txt",
    "overwrite": "echo x > ../outside/victim.txt",
    "o_trunc": ": > ../outside/victim.txt",
    "truncate": "truncate -s 0 ../outside/victim.txt",
    "append": "echo x >> ../outside/victim.txt",
    "symlink": "ln -s ../outside/victim.txt link && echo x > link",
    "hardlink": "ln ../outside/victim.txt hl && echo x > hl",
    "rename_out": "echo x > f && mv f ../outside/moved.txt",
    "rename_in": "mv ../outside/victim.txt stolen.txt",
    "unlink": "rm -f ../outside/victim.txt",
    "chmod": "chmod 777 ../outside/victim.txt",
    "touch_mtime": "touch -d 2001-01-01 ../outside/victim.txt",
    "git_worktree_dir": "mkdir -p .git/worktrees/x",
    "git_config": "echo '[core]' >> .git/config",
    "remount": "mount -o remount,rw /",
    "new_dev": "echo x > /dev/saphan-escape",
}


def test_every_escape_is_refused_and_outside_unchanged(jail: tuple[Saphan, Path, Path]) -> None:
    s, repo, outside = jail
    victim = outside / "victim.txt"
    before = _digest(victim)
    before_mode = victim.stat().st_mode
    before_mtime = victim.stat().st_mtime_ns
    git_config = (repo / ".git" / "config").read_bytes()
    script = "\n".join(
        f"( {cmd} ) 2>/dev/null && echo 'ESCAPED {name}' || echo 'REFUSED {name}'"
        for name, cmd in ATTEMPTS.items()
    ) + "\necho inside > inside.txt && echo 'INSIDE ok'"
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(repo), "--",
          "sh", "-c", script)
    assert r.code == 0, r.err
    lines = set(r.out.splitlines())
    for name in ATTEMPTS:
        assert f"REFUSED {name}" in lines, f"escape {name!r} succeeded:\n{r.out}"
    assert "INSIDE ok" in lines
    assert _digest(victim) == before
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
