"""The escape battery shared by every boundary's tests.

Each attempt is a shell snippet run from inside the boundary, in a working
directory that is a git repository's main worktree, with a sibling directory
``../outside`` holding ``victim.txt``. The caller asserts each attempt was
refused (or, for a documented residual, that it still succeeds) and that the
outside file is byte-for-byte unchanged.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

#: content writes outside the set: refused by every boundary
CONTENT = {
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
    "git_worktree_dir": "mkdir -p .git/worktrees/x",
    "git_config": "echo '[core]' >> .git/config",
    "new_dev": "echo x > /dev/saphan-escape",
    # Through the root of any ancestor outside the jail's mount namespace
    # (bubblewrap's own parent, saphan): /proc/<pid>/root is that process's
    # view of the filesystem — the host's, where nothing is read-only.
    "proc_root_ancestor": (
        "v=$(cd ../outside && pwd)/victim.txt; p=$PPID; "
        "while [ \"$p\" -gt 1 ]; do echo x 2>/dev/null > /proc/$p/root$v && exit 0; "
        "p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); done; exit 1"
    ),
}

#: metadata changes: refused by a read-only mount, NOT by Landlock (residual)
METADATA = {
    "chmod": "chmod 777 ../outside/victim.txt",
    "touch_mtime": "touch -d 2001-01-01 ../outside/victim.txt",
}


def script(attempts: dict[str, str]) -> str:
    return "\n".join(
        f"( {cmd} ) 2>/dev/null && echo 'ESCAPED {name}' || echo 'REFUSED {name}'"
        for name, cmd in attempts.items()
    ) + "\necho inside > inside.txt && echo 'INSIDE ok'"


def make_repo_and_victim(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                    "commit", "-q", "--allow-empty", "-m", "0"], check=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious contents\n" * 100)
    return repo, outside


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()
