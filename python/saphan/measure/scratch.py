"""What saphan itself sees of the working tree after a measure-base run:
whether the scratch clone is gone, and the git directories below the tree.

The driver removes the scratch before its final run (measure/driver.py); this
is the check from outside the boundary, after every process of the run has
ended. A scratch the driver made (its ``fresh`` step saw the path free) but
could not remove — the run was killed, or timed out — is removed here, never
through a link: on this host from descriptors opened without following one
(confine/nofollow.py), on a runner by a script that refuses a link at every
component. What existed before the run is never removed.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import stat
from typing import TYPE_CHECKING, Any

from saphan.confine import nofollow
from saphan.errors import PlantedLink

if TYPE_CHECKING:
    from saphan.transport.ssh import SSHConnection

#: at most this many entries are looked at for git directories below the tree
WALK_LIMIT = 200_000
#: at most this many git directories are named
NAMED = 50


def check_local(workdir: str, scratch: str, *, remove: str | None) -> dict[str, Any]:
    """``{"scratch_present", "removed_by_saphan", "git_dirs_below"}`` for the
    tree at ``workdir``; ``remove``: the first component of the scratch path
    saphan saw absent before the run — the scratch is removed if it is there
    (the run made it), then each directory above it up to ``remove`` if it
    is empty (another run's scratch beside it stays)."""
    wd = os.path.realpath(workdir)
    out: dict[str, Any] = {"scratch_present": False, "removed_by_saphan": False}
    try:
        out["scratch_present"] = _lexists(wd, scratch)
        if remove is not None and out["scratch_present"]:
            _remove(wd, scratch)
            out["removed_by_saphan"] = True
            out["scratch_present"] = _lexists(wd, scratch)
        if remove is not None and remove != scratch:
            out["removed_by_saphan"] |= _rmdir_up(wd, posixpath.dirname(scratch), remove)
    except (PlantedLink, OSError) as e:
        out.update(scratch_present=True, check_error=f"{type(e).__name__}: {e}")
    out["git_dirs_below"] = git_dirs_below(wd)
    return out


def first_missing(workdir: str, scratch: str) -> str | None:
    """The first component of ``scratch`` not there in ``workdir`` (what a
    clone into it creates), or None when the whole path exists."""
    wd = os.path.realpath(workdir)
    parts = scratch.split("/")
    for i in range(1, len(parts) + 1):
        rel = "/".join(parts[:i])
        if not _lexists(wd, rel):
            return rel
    return None


def _lexists(wd: str, rel: str) -> bool:
    """Whether ``wd/rel`` exists, no component followed through a link (a
    link on the way is PlantedLink; a component missing: False)."""
    parent, leaf = posixpath.split(rel)
    try:
        with nofollow.open_dir(os.path.join(wd, parent) if parent else wd) as fd:
            os.stat(leaf, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _rmdir_up(wd: str, rel: str, top: str) -> bool:
    """Remove the empty directories ``rel``, its parent, … up to ``top``
    (never through a link); whether one was removed."""
    removed = False
    while rel and (rel == top or rel.startswith(top + "/")):
        parent, leaf = posixpath.split(rel)
        try:
            with nofollow.open_dir(os.path.join(wd, parent) if parent else wd) as fd:
                os.rmdir(leaf, dir_fd=fd)
        except OSError:
            break  # not empty (another run's scratch beside), or gone
        removed = True
        rel = parent
    return removed


def _remove(wd: str, rel: str) -> None:
    parent, leaf = posixpath.split(rel)
    with nofollow.open_dir(os.path.join(wd, parent) if parent else wd) as fd:
        st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(leaf, dir_fd=fd)
        else:
            os.unlink(leaf, dir_fd=fd)


def git_dirs_below(wd: str) -> list[str]:
    """Every ``.git`` below the top of ``wd`` (its own ``.git`` and saphan's
    ``.saphan-run/tmp`` skipped; links never followed), at most :data:`NAMED`."""
    found: list[str] = []
    seen = 0
    errors: list[OSError] = []
    for root, dirs, files in os.walk(wd, followlinks=False, onerror=errors.append):
        rel = os.path.relpath(root, wd)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
            files = [f for f in files if f != ".git"]  # a linked worktree's own gitfile
        elif rel == ".saphan-run":
            dirs[:] = [d for d in dirs if d != "tmp"]
        for name in [*dirs, *files]:
            seen += 1
            if name.casefold() == ".git":
                found.append(os.path.normpath(os.path.join(rel, name)))
        dirs[:] = [d for d in dirs if d.casefold() != ".git"]
        if seen > WALK_LIMIT or len(found) >= NAMED:
            found.append(f"(stopped looking after {seen} entries)")
            break
    if errors:
        found.append(f"(not looked into: {len(errors)} director"
                     f"{'y' if len(errors) == 1 else 'ies'}, e.g. {errors[0]})")
    return found


_FAR_CHECK = """\
unset CDPATH
cd -P -- {wd} || exit 3
p={parent}
set -f
IFS=/
how=
for c in $p; do
  if [ -L "$c" ]; then how="link $c"; break; fi
  cd -P -- "./$c" 2>/dev/null || {{ how=absent; break; }}
done
unset IFS
if [ -n "$how" ]; then echo "$how"
elif [ -e ./{leaf} ] || [ -L ./{leaf} ]; then
  if [ -n "{remove}" ]; then
    if [ -L ./{leaf} ] || [ ! -d ./{leaf} ]; then rm -f -- ./{leaf}; else rm -rf -- ./{leaf}; fi
    if [ -e ./{leaf} ] || [ -L ./{leaf} ]; then echo present; else echo removed; fi
  else echo present; fi
else echo absent; fi
cd -P -- {wd} && find . -path ./.git -prune -o -path ./.saphan-run/tmp -prune \\
  -o -name .git -print 2>/dev/null | head -n {named}
exit 0
"""


def check_far(conn: SSHConnection, workdir: str, scratch: str, *,
              remove: bool) -> dict[str, Any]:
    """:func:`check_local` on a runner, over ``conn`` (after the run)."""
    from saphan.errors import TransportError

    parent_rel, leaf = posixpath.split(scratch)
    script = _FAR_CHECK.format(wd=shlex.quote(workdir), parent=shlex.quote(parent_rel),
                               leaf=shlex.quote(leaf), remove="yes" if remove else "",
                               named=NAMED)
    try:
        done = conn.run(script)
    except TransportError as e:
        return {"scratch_present": True, "removed_by_saphan": False,
                "check_error": f"the runner could not be asked: {e}", "git_dirs_below": []}
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    first = lines[0] if lines else ""
    out: dict[str, Any] = {"scratch_present": first not in ("absent", "removed"),
                           "removed_by_saphan": first == "removed",
                           "git_dirs_below": [ln.removeprefix("./") for ln in lines[1:]]}
    if done.exit_code != 0 or first not in ("absent", "removed", "present"):
        out["check_error"] = (f"the check on the runner ended {done.exit_code}: "
                              f"{first or done.err.strip() or 'no answer'}")
    return out
