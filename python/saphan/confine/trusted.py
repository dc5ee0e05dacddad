"""The system tools saphan itself runs outside any jail: bubblewrap and git.

They are never looked up on the inherited PATH. A run may write a
directory on the operator's PATH (a workdir that is $HOME, a project whose
venv or node_modules/.bin is on PATH), and a `bwrap` planted there would be
the boundary of every later run (measured: a fake bwrap that just exec'd
its command, recorded as "enforced_by: bubblewrap"), a `git` planted there
would run unconfined inside saphan's own worktree steps. So a tool is taken
only from the fixed system directories below, and only when rust/core's
custody clauses hold for it (owned by root or this account, writable by
neither group nor others, in a directory only its owner can write) and it
is owned by root when saphan runs as root.
"""

from __future__ import annotations

import os

from saphan import refusals

#: where system packages install bubblewrap and git; nothing a run can write
TRUSTED_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")

_found: dict[str, str | None] = {}


def find(name: str) -> str | None:
    """The real path of ``name`` in :data:`TRUSTED_DIRS` whose custody holds,
    or None. (Cached per process.)"""
    if name not in _found:
        _found[name] = _search(name)
    return _found[name]


def _search(name: str) -> str | None:
    from saphan import _native

    for d in TRUSTED_DIRS:
        path = os.path.join(d, name)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = os.path.realpath(path)
        try:
            if _native.check_binary_custody(real) is not None:
                continue
            if os.geteuid() == 0 and os.stat(real).st_uid != 0:
                continue
        except OSError:
            continue
        return real
    return None


def require(name: str, package: str, purpose: str) -> str:
    """``name`` from the trusted directories, or the refusal naming them."""
    path = find(name)
    if path is None:
        raise refusals.confinement_unavailable(
            f"no `{name}` with safe custody in {', '.join(TRUSTED_DIRS)} ({purpose}); saphan "
            "never takes it from PATH, where a run could have planted one",
            f"install it from the system's packages (`apt-get install {package}`), owned by "
            "root, mode 0755",
        )
    return path
