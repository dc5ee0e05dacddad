"""Derive a run's grants from its working directory. Nothing here is typed by
an operator, so nothing can be mis-declared.

Version control (SPEC.md §2):
- a linked worktree gets its private git dir (index, HEAD, logs/HEAD), the
  common objects dir, and — only when its branch is namespaced
  (``refs/heads/<ns>/…``) — ``refs/heads/<ns>`` and ``logs/refs/heads/<ns>``
  (created here, before the jail, if missing);
- a non-namespaced branch gets no ref grant: bubblewrap cannot grant a
  not-yet-existing lock file without its parent directory, and the engine
  grants nothing rather than something wider. The record says the run cannot
  commit;
- the main worktree's ``.git`` stays read-only inside a writable working tree.

Symbolic links are resolved before any rule is built: a rule naming a link
would grant nothing for the file the agent actually opens.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from saphan.confine.policy import DEVICE_LITERALS, Policy

SCRATCH = os.path.join(".saphan", "tmp")


@dataclass(frozen=True)
class GitLayout:
    toplevel: str
    git_dir: str
    common_dir: str
    branch: str | None  # full ref name, None when detached

    @property
    def linked(self) -> bool:
        return self.git_dir != self.common_dir


def git_layout(workdir: str) -> GitLayout | None:
    try:
        out = subprocess.run(
            ["git", "-C", workdir, "rev-parse", "--path-format=absolute", "--show-toplevel",
             "--git-dir", "--git-common-dir", "--symbolic-full-name", "HEAD"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) < 3:
        return None
    branch = lines[3] if len(lines) > 3 and lines[3].startswith("refs/heads/") else None
    real = os.path.realpath
    return GitLayout(real(lines[0]), real(lines[1]), real(lines[2]), branch)


def derive(
    workdir: str,
    *,
    return_path: str | None = None,
    session_dirs: tuple[str, ...] = (),
    read_denials: tuple[str, ...] = (),
) -> Policy:
    """The Policy for a run in ``workdir`` (which must exist)."""
    wd = os.path.realpath(workdir)
    writable = [wd]
    readonly: list[str] = []
    notes: list[str] = []
    if return_path:
        writable.append(os.path.realpath(return_path))
    writable.extend(os.path.realpath(d) for d in session_dirs)

    layout = git_layout(wd)
    if layout is not None:
        if layout.linked:
            writable.append(layout.git_dir)
            writable.append(os.path.join(layout.common_dir, "objects"))
            notes.append(
                "the shared object store is writable (residual: neither sandbox language "
                "can express append-only)"
            )
            ns = _namespace(layout.branch)
            if ns is None:
                notes.append(
                    f"this run cannot commit: branch {layout.branch or '(detached HEAD)'} "
                    "is not namespaced, and a narrow ref grant cannot be expressed"
                )
            else:
                for base in ("refs/heads", "logs/refs/heads"):
                    d = os.path.join(layout.common_dir, base, ns)
                    os.makedirs(d, exist_ok=True)
                    writable.append(d)
        elif _within(layout.git_dir, wd):
            readonly.append(layout.git_dir)
            notes.append(
                f"{layout.git_dir} stays read-only: this is the main worktree; "
                "run with --repo to get a linked worktree that can commit"
            )

    scratch = os.path.join(wd, SCRATCH)
    return Policy(
        workdir=wd,
        writable_dirs=tuple(_dedupe(writable)),
        writable_literals=DEVICE_LITERALS,
        readonly_dirs=tuple(readonly),
        read_denials=tuple(_dedupe(os.path.realpath(p) for p in read_denials if os.path.lexists(p))),
        scratch_dir=scratch,
        notes=tuple(notes),
    )


def _namespace(branch: str | None) -> str | None:
    """``refs/heads/saphan/01J…`` -> ``saphan``; a top-level branch has none."""
    if branch is None:
        return None
    rest = branch[len("refs/heads/") :]
    head, sep, _ = rest.partition("/")
    return head if sep else None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _dedupe(paths: object) -> list[str]:
    seen: list[str] = []
    for p in paths:  # type: ignore[attr-defined]
        if p not in seen:
            seen.append(p)
    return seen
