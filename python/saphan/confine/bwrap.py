"""Policy -> bubblewrap argv (the Linux control-plane boundary).

Order is the security property, and bubblewrap applies its arguments in order:
1. ``--ro-bind / /``: everything read-only (recursively, submounts too);
2. ``--tmpfs D`` for each hidden directory (saphan's workspaces): the jail
   sees an empty directory there, so the run's own paths below it can be
   bound again and nothing else of it is reachable;
3. ``--bind D D`` for each writable directory and literal;
4. ``--ro-bind P P`` for read-only carve-outs inside a writable directory,
   then ``--remount-ro`` of each hidden directory's tmpfs;
5. read denials LAST (``--ro-bind /dev/null FILE``, ``--tmpfs DIR`` then
   ``--remount-ro DIR``): a later bind at the same path would override an
   earlier denial, so a denial must be the last word about its path.
Capabilities are dropped so root inside cannot remount its way out; the jail
gets its own user namespace even when saphan runs as root (else bubblewrap's
parent process is a way out through /proc/<pid>/root — measured) and its own
PID namespace with a fresh /proc: nothing inside can see or signal a process
outside, and when the command ends the namespace ends with everything in it.
The session is new (no TIOCSTI into the operator's terminal) and the jail
dies with its parent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from saphan.confine.policy import Policy

#: no descriptors: every writable directory is bound by path
NO_FDS: Mapping[str, int] = {}


def render(policy: Policy, bwrap: str = "bwrap", fds: Mapping[str, int] = NO_FDS) -> list[str]:
    """The whole boundary: bubblewrap enforces writes and read denials.

    ``fds`` maps writable directories to descriptors saphan opened after the
    grant check (compose.py): bound with ``--bind-fd``, so what is bound is
    the directory that was checked even if its path is swapped for a link
    before bubblewrap runs."""
    early, late = _hidden_split(policy)
    argv = [bwrap, "--ro-bind", "/", "/", *_hide(early)]
    for d in policy.writable_dirs:
        argv += _bind(d, fds)
    argv += _hide(late)
    argv += _bind_back(policy, late, fds)
    if policy.door_dir:
        # The egress door's socket (in the hidden run directory): read-only
        # is enough to connect to a socket, and nothing of the jail's can be
        # put in its place.
        argv += ["--ro-bind", policy.door_dir, policy.door_dir]
    argv += _devices(policy)
    argv += _carve_outs_and_denials(policy)
    return argv + _tail(policy)


def render_outer(policy: Policy, bwrap: str = "bwrap",
                 fds: Mapping[str, int] = NO_FDS) -> list[str]:
    """Only the hiding, carve-outs and read denials, around a boundary that
    enforces writes by other means (saphan-launcher's Landlock domain on the
    local Landlock boundary). Landlock grants reads everywhere and cannot make a
    directory read-only inside a writable one; the mount namespace can.
    """
    # `--bind`, not `--dev-bind`: writes are Landlock's to refuse, but device
    # nodes must stay unusable — with them a jailed root read the disk under a
    # hidden workspace (record.key, measured) and other terminals' ptys.
    argv = [bwrap, "--bind", "/", "/", *_hide(policy.hidden_dirs)]
    # Writes are Landlock's to refuse; these binds only bring the run's own
    # paths back from under a hidden workspace.
    argv += _bind_back(policy, policy.hidden_dirs, fds)
    argv += _devices(policy)
    argv += _carve_outs_and_denials(policy)
    return argv + _tail(policy)


def render_cut_around(policy: Policy, bwrap: str = "bwrap") -> list[str]:
    """Namespaces around a tool that confines itself (Codex) on an egress
    run: the filesystem as it is (its own sandbox keeps the writes), except
    saphan's workspaces hidden (the run's own paths bound back, the door's
    directory read-only: nothing of the tool's rewrites the run's audit log
    or record) and the read denials; a network namespace of its own (the
    door's bridge on its loopback), its own user and PID namespaces, a new
    session (no TIOCSTI into the operator's terminal). Capabilities are
    dropped but for the three the tool's own sandbox needs to map its uids
    inside (SETUID, SETGID, SETFCAP: measured with Codex's bubblewrap): with
    all of them (saphan as root) the tool could unmount the hiding and the
    denials, or ptrace the launcher (review: measured)."""
    argv = [bwrap, "--bind", "/", "/", *_hide(policy.hidden_dirs)]
    argv += _bind_back(policy, policy.hidden_dirs, NO_FDS)
    if policy.door_dir:
        argv += ["--ro-bind", policy.door_dir, policy.door_dir]
    argv += ["--dev-bind", "/dev", "/dev"]
    for d in policy.hidden_dirs:
        argv += ["--remount-ro", d]
    for path in policy.read_denials:
        argv += (["--tmpfs", path, "--remount-ro", path] if os.path.isdir(path)
                 else ["--ro-bind", "/dev/null", path])
    return [*argv, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--cap-add", "CAP_SETFCAP", "--unshare-user", "--unshare-pid", "--unshare-net",
            "--proc", "/proc", "--die-with-parent", "--new-session", "--chdir", policy.workdir,
            "--"]


def _devices(policy: Policy) -> list[str]:
    """The bind of / is nodev: a device is usable only when bound again with
    --dev-bind (absent devices, e.g. no /dev/tty, are skipped)."""
    argv: list[str] = []
    for lit in policy.writable_literals:
        argv += ["--dev-bind-try" if lit.startswith("/dev/") else "--bind", lit, lit]
    return argv


def _hidden_split(policy: Policy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Hidden dirs to mount before the writable binds, and those inside a
    writable dir (a workspace under the workdir), mounted after them — a bind
    of the workdir would otherwise cover the hiding tmpfs."""
    late = tuple(h for h in policy.hidden_dirs
                 if any(_within(h, w) and h != w for w in policy.writable_dirs))
    return tuple(h for h in policy.hidden_dirs if h not in late), late


def _bind(d: str, fds: Mapping[str, int]) -> list[str]:
    fd = fds.get(d)
    return ["--bind", d, d] if fd is None else ["--bind-fd", str(fd), d]


def _bind_back(policy: Policy, hidden: tuple[str, ...], fds: Mapping[str, int]) -> list[str]:
    argv: list[str] = []
    for d in policy.writable_dirs:
        if any(_within(d, h) for h in hidden):
            argv += _bind(d, fds)
    return argv


def _hide(dirs: tuple[str, ...]) -> list[str]:
    argv: list[str] = []
    for d in dirs:
        argv += ["--perms", "0700", "--tmpfs", d]
    return argv


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _carve_outs_and_denials(policy: Policy) -> list[str]:
    argv: list[str] = []
    for d in policy.readonly_dirs:
        argv += ["--ro-bind", d, d]
    for d in policy.hidden_dirs:
        argv += ["--remount-ro", d]
    for path in policy.read_denials:
        if os.path.isdir(path):
            argv += ["--tmpfs", path, "--remount-ro", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]
    return argv


def _tail(policy: Policy) -> list[str]:
    argv = [
        # A user namespace of its own, also when saphan runs as root (where
        # bubblewrap would otherwise create none): without it the jail's uid 0
        # and bubblewrap's own parent process — outside the mount namespace,
        # capabilities dropped, dumpable — pass the kernel's ptrace check on
        # each other, and /proc/<that pid>/root is the host's whole filesystem,
        # read AND write. Across user namespaces that check fails.
        "--unshare-user",
        # Its own PID namespace and /proc: no process inside can see or
        # signal one outside, and none outlives the run (the namespace ends
        # when its first process does; saphan-launcher reaps and counts).
        "--unshare-pid",
        # `network: off` (confine/network.py) and an egress policy
        # (egress/cut.py): a network namespace of its own, holding only
        # loopback (bubblewrap brings it up); an egress run's way out is the
        # door's socket bound above.
        *(("--unshare-net",) if policy.network in ("off", "egress") else ()),
        "--proc", "/proc",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--chdir", policy.workdir,
    ]
    if policy.scratch_dir:
        argv += ["--setenv", "TMPDIR", policy.scratch_dir]
    for name, value in policy.setenv:
        argv += ["--setenv", name, value]
    argv.append("--")
    return argv
