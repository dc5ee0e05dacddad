"""Per-run git worktrees, made and removed OUTSIDE the boundary.

``saphan run --repo PATH`` gives each run a linked worktree on its own
namespaced branch ``saphan/<run-id>`` under ``$SAPHAN_HOME/worktrees/``. The
branch is namespaced so the derived grants (confine/grants.py) can give it a
narrow ref grant and the run can commit; inside the boundary ``git worktree
add`` is refused by the kernel, which is why the engine makes it beforehand.

The scratch directory ``.saphan/`` is ignored through the repository's
``info/exclude`` (shared by its worktrees), never by editing tracked files.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from saphan.errors import UserError

BRANCH_NAMESPACE = "saphan"
EXCLUDE_LINE = ".saphan/"


@dataclass(frozen=True)
class RepoSpec:
    toplevel: str
    common_dir: str
    base: str  # the commit the worktree starts from (full SHA)
    base_ref: str


def _git(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def resolve_repo(repo: str, base_ref: str | None) -> RepoSpec:
    """Validate ``--repo``/``--base`` before anything is reserved or written."""
    path = os.path.abspath(os.path.expanduser(repo))
    top = _git("-C", path, "rev-parse", "--path-format=absolute", "--show-toplevel",
               "--git-common-dir")
    if top.returncode != 0:
        raise UserError(f"--repo {repo}: not a git repository ({top.stderr.strip()})")
    toplevel, common = top.stdout.splitlines()[:2]
    ref = base_ref or "HEAD"
    base = _git("-C", toplevel, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if base.returncode != 0:
        raise UserError(f"--base {ref}: no such commit in {toplevel}; give a branch, tag or SHA")
    return RepoSpec(os.path.realpath(toplevel), os.path.realpath(common), base.stdout.strip(), ref)


def branch_for(run_id: str) -> str:
    return f"{BRANCH_NAMESPACE}/{run_id}"


def create(spec: RepoSpec, path: str, run_id: str) -> str:
    """Make the worktree at ``path`` on ``saphan/<run_id>``; returns the branch."""
    branch = branch_for(run_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    made = _git("-C", spec.toplevel, "worktree", "add", "-q", "-b", branch, path, spec.base)
    if made.returncode != 0:
        raise RuntimeError(f"git worktree add failed: {made.stderr.strip()}")
    ignore_scratch(spec.common_dir)
    return branch


def ignore_scratch(common_dir: str) -> None:
    """Add ``.saphan/`` to info/exclude once (the repository's, not a tracked file)."""
    info = os.path.join(common_dir, "info")
    os.makedirs(info, exist_ok=True)
    exclude = os.path.join(info, "exclude")
    try:
        with open(exclude) as f:
            if EXCLUDE_LINE in (line.strip() for line in f):
                return
    except FileNotFoundError:
        pass
    with open(exclude, "a") as f:
        f.write(f"\n# saphan's per-run scratch directory\n{EXCLUDE_LINE}\n")


def head(path: str) -> str | None:
    out = _git("-C", path, "rev-parse", "HEAD")
    return out.stdout.strip() if out.returncode == 0 else None


def remove(spec: RepoSpec, path: str) -> None:
    """Remove the worktree (the branch and its commits stay in the repository)."""
    out = _git("-C", spec.toplevel, "worktree", "remove", "--force", path)
    if out.returncode != 0:
        raise RuntimeError(f"git worktree remove failed: {out.stderr.strip()}")
