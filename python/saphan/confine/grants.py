"""Derive a run's grants from facts a run cannot forge. Nothing here is typed
by an operator, so nothing can be mis-declared; nothing here trusts what a
run could have written.

The writable set (SPEC.md §2):
- the working directory (the operator's path, resolved);
- the run's return path and the tool's session leaf (saphan's own paths);
- for a ``--repo`` run only, the per-worktree git dir of the linked worktree
  saphan itself just made — after checking it is genuine: the workdir's
  ``.git`` is a regular file naming ``<common>/worktrees/<name>``, git's
  back-link ``<gitdir>/gitdir`` names this workdir's ``.git``, and the git
  dir's ``commondir`` leads back to the repository the operator named.
  Its ``commondir``, ``gitdir``, ``locked`` and ``config.worktree`` and the
  workdir's ``.git`` file stay read-only; the repository itself (objects,
  refs, config, hooks) is read-only whole. The run writes new objects into
  its own object directory (``.saphan-run/objects``, the repository's store
  as a read-only alternate) and commits on a detached HEAD in its git dir;
  after the run saphan imports the commits (worktrees.import_run).

A plain ``--workdir`` run gets no git grant at all, whatever ``.git`` its
working directory holds: a ``.git`` there — real or planted by an earlier
run — stays read-only, and the record says why the run cannot commit.

Every granted directory is resolved and must then be a real directory with
no symbolic link at any component: rust/core's check (``check_grant_dir``),
the same rule saphan-launcher applies to its policy on the Landlock boundary.
A path that fails it is not granted and the record says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from saphan.confine import nofollow
from saphan.confine.policy import DEVICE_LITERALS, Policy
from saphan.errors import NotGrantable, PlantedLink

#: the per-run scratch tree inside the working directory; a name no
#: workspace uses (the default workspace is ``~/.saphan``)
RUN_DIR_NAME = ".saphan-run"
SCRATCH = os.path.join(RUN_DIR_NAME, "tmp")
OBJECTS = os.path.join(RUN_DIR_NAME, "objects")

#: files in a linked worktree's git dir that git interprets as pointers or
#: state; read-only inside the jail when they exist
PROTECTED_GIT_FILES = ("commondir", "gitdir", "locked", "config.worktree")




def check_dir(path: str) -> str:
    """``path`` if it may be granted: absolute, normalised, a real directory,
    no symbolic link at any component (rust/core decides, for both boundaries)."""
    from saphan import _native

    why = _native.check_grant_dir(path)
    if why is not None:
        raise NotGrantable(why)
    return path


@dataclass(frozen=True)
class LinkedWorktree:
    """A linked worktree saphan made, verified from git's own back-links."""

    workdir: str
    dot_git: str  # <workdir>/.git, a regular file
    git_dir: str  # <common>/worktrees/<name>
    common_dir: str


def verify_linked_worktree(workdir: str, common_dir: str) -> LinkedWorktree:
    """The worktree at ``workdir`` of the repository whose common dir is
    ``common_dir`` — or NotGrantable naming the fact that does not hold."""
    wd = check_dir(os.path.realpath(workdir))
    common = check_dir(os.path.realpath(common_dir))
    dot_git = os.path.join(wd, ".git")
    if nofollow.lexists_plain(dot_git) != "file":
        raise NotGrantable(f"{dot_git} is not a regular file (a linked worktree's pointer)")
    try:
        pointer = nofollow.read_small(dot_git).decode("utf-8").strip()
        if not pointer.startswith("gitdir: "):
            raise NotGrantable(f"{dot_git} does not say `gitdir: PATH`")
        git_dir = pointer.removeprefix("gitdir: ").strip()
        if not os.path.isabs(git_dir) or os.path.normpath(git_dir) != git_dir:
            raise NotGrantable(f"{dot_git} names {git_dir!r}, not an absolute normalised path")
        check_dir(git_dir)
        if os.path.dirname(git_dir) != os.path.join(common, "worktrees"):
            raise NotGrantable(f"{dot_git} names {git_dir}, which is not a worktree of {common}")
        back = nofollow.read_small(os.path.join(git_dir, "gitdir")).decode("utf-8").strip()
        if back != dot_git:
            raise NotGrantable(
                f"git's back-link {git_dir}/gitdir names {back!r}, not this workdir's {dot_git}")
        cdir = nofollow.read_small(os.path.join(git_dir, "commondir")).decode("utf-8").strip()
        if os.path.normpath(os.path.join(git_dir, cdir)) != common:
            raise NotGrantable(f"{git_dir}/commondir leads to {cdir!r}, not to {common}")
    except (PlantedLink, OSError, UnicodeDecodeError) as e:
        raise NotGrantable(str(e)) from None
    return LinkedWorktree(wd, dot_git, git_dir, common)


def derive(
    workdir: str,
    *,
    return_path: str | None = None,
    session_dirs: tuple[str, ...] = (),
    read_denials: tuple[str, ...] = (),
    hidden_dirs: tuple[str, ...] = (),
    readonly_paths: tuple[str, ...] = (),
    worktree: LinkedWorktree | None = None,
    network: str = "open",
) -> Policy:
    """The Policy for a run in ``workdir`` (which must exist).

    ``network`` is the posture confine/network.py decided the run's path
    enforces: ``off`` (the renderers cut it) or ``open`` (no claim).

    ``worktree`` is the verified linked worktree of a ``--repo`` run; any
    other run gets no git grant. ``readonly_paths`` are protected entries to
    keep read-only (confine/protected.py). ``hidden_dirs`` are hidden whole
    before the grants are bound (saphan's workspaces).
    """
    wd = check_dir(os.path.realpath(workdir))
    writable = [wd]
    readonly: list[str] = []
    notes: list[str] = []
    setenv: list[tuple[str, str]] = []
    for extra in (return_path, *session_dirs):
        if extra is None:
            continue
        try:
            writable.append(check_dir(os.path.realpath(extra)))
        except NotGrantable as e:
            notes.append(f"not granted: {e}")

    if worktree is not None:
        writable.append(check_dir(worktree.git_dir))
        readonly.append(worktree.dot_git)
        readonly.extend(
            p for p in (os.path.join(worktree.git_dir, n) for n in PROTECTED_GIT_FILES)
            if nofollow.lexists_plain(p) == "file"
        )
        setenv += [
            ("GIT_OBJECT_DIRECTORY", os.path.join(wd, OBJECTS)),
            ("GIT_ALTERNATE_OBJECT_DIRECTORIES", os.path.join(worktree.common_dir, "objects")),
        ]
        notes.append(
            f"git: commits land on this run's detached HEAD in {worktree.git_dir} and new "
            f"objects in {os.path.join(wd, OBJECTS)}; the repository {worktree.common_dir} "
            "(objects, refs, config, hooks) is read-only; saphan imports the run's commits "
            "onto its branch after the run, through git's verified transfer"
        )
    else:
        dot_git = os.path.join(wd, ".git")
        kind = nofollow.lexists_plain(dot_git)
        if kind in ("dir", "file"):
            readonly.append(dot_git)
            notes.append(
                f"{dot_git} stays read-only and this run cannot commit: only a --repo run "
                "(a worktree saphan makes) gets git grants"
            )
        elif kind is not None:
            notes.append(
                f"{dot_git} is not a plain file or directory ({kind}); it gets no grant and "
                "this run cannot commit"
            )
    readonly.extend(p for p in readonly_paths if p not in readonly)

    return Policy(
        workdir=wd,
        writable_dirs=tuple(dict.fromkeys(writable)),
        writable_literals=DEVICE_LITERALS,
        readonly_dirs=tuple(readonly),
        hidden_dirs=tuple(dict.fromkeys(hidden_dirs)),
        read_denials=tuple(dict.fromkeys(
            os.path.realpath(p) for p in read_denials
            if os.path.lexists(p) and not any(_within(os.path.realpath(p), h)
                                              for h in hidden_dirs))),
        scratch_dir=os.path.join(wd, SCRATCH),
        setenv=tuple(setenv),
        notes=tuple(notes),
        network=network,
    )


def make_run_dirs(policy: Policy, *, objects: bool) -> None:
    """Create the scratch dir (and, for a --repo run, the object directory)
    inside the working directory, never through a planted link; raises
    PlantedLink naming it."""
    nofollow.makedirs(policy.workdir, SCRATCH)
    if objects:
        for sub in ("info", "pack"):
            nofollow.makedirs(policy.workdir, os.path.join(OBJECTS, sub))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
