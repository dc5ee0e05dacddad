"""Policy -> bubblewrap argv (the Linux control-plane boundary).

Order is the security property, and bubblewrap applies its arguments in order:
1. ``--ro-bind / /``: everything read-only (recursively, submounts too);
2. ``--bind D D`` for each writable directory and literal;
3. ``--ro-bind D D`` for read-only carve-outs inside a writable directory;
4. read denials LAST (``--ro-bind /dev/null FILE``, ``--tmpfs DIR`` then
   ``--remount-ro DIR``): a later bind at the same path would override an
   earlier denial, so a denial must be the last word about its path.
Capabilities are dropped so root inside cannot remount its way out; the jail
gets its own user namespace even when saphan runs as root (else bubblewrap's
parent process is a way out through /proc/<pid>/root — measured); no PID
namespace (the design keeps /proc shared), the session is new (no TIOCSTI
into the operator's terminal) and the jail dies with its parent.
"""

from __future__ import annotations

import os

from saphan.confine.policy import Policy


def render(policy: Policy, bwrap: str = "bwrap") -> list[str]:
    """The whole boundary: bubblewrap enforces writes and read denials."""
    argv = [bwrap, "--ro-bind", "/", "/"]
    for d in policy.writable_dirs:
        argv += ["--bind", d, d]
    for lit in policy.writable_literals:
        # The ro-bind of / is nodev: a device is usable only when bound again
        # with --dev-bind (absent devices, e.g. no /dev/tty, are skipped).
        argv += ["--dev-bind-try" if lit.startswith("/dev/") else "--bind", lit, lit]
    argv += _carve_outs_and_denials(policy)
    return argv + _tail(policy)


def render_outer(policy: Policy, bwrap: str = "bwrap") -> list[str]:
    """Only the carve-outs and read denials, around a boundary that enforces
    writes by other means (saphan-launcher's Landlock domain on the local
    Landlock lane). Landlock grants reads everywhere and cannot make a
    directory read-only inside a writable one; the mount namespace can.
    """
    argv = [bwrap, "--dev-bind", "/", "/"]
    argv += _carve_outs_and_denials(policy)
    return argv + _tail(policy)


def _carve_outs_and_denials(policy: Policy) -> list[str]:
    argv: list[str] = []
    for d in policy.readonly_dirs:
        argv += ["--ro-bind", d, d]
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
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--chdir", policy.workdir,
    ]
    if policy.scratch_dir:
        argv += ["--setenv", "TMPDIR", policy.scratch_dir]
    argv.append("--")
    return argv
