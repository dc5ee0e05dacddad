"""Pick the mechanism that enforces a Policy on this control-plane host.

Fail closed: no bubblewrap on Linux, no sandbox-exec on macOS, or any other
operating system is the refusal ``confinement-unavailable`` — never a warning
followed by an unconfined run. On Linux the chosen bubblewrap is also tried
once (``bwrap --ro-bind / / --unshare-user -- true``) so a host whose kernel
forbids the namespaces it needs is refused here, not discovered half-way through a run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from dataclasses import dataclass, field, replace
from typing import Any

from saphan import refusals
from saphan.confine import bwrap, landlock, seatbelt
from saphan.confine.policy import Policy


@dataclass(frozen=True)
class Boundary:
    mechanism: str  # "bubblewrap" | "seatbelt"
    version: str
    executable: str
    executable_sha256: str
    prefix: list[str]
    policy: Policy
    extra: dict[str, Any] = field(default_factory=dict)
    #: the descriptor (in the child) saphan-launcher writes its control lines
    #: to; None when no launcher runs inside (Seatbelt, Codex's own sandbox)
    status_fd: int | None = None
    #: descriptors the prefix names (``--bind-fd``): inherited by the child,
    #: closed by :meth:`close` once it has started
    fds: tuple[int, ...] = ()
    #: the descriptor (in the child) of saphan's lifeline to the launcher;
    #: None when no launcher runs inside
    lifeline_fd: int | None = None

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def record(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "version": self.version,
            "executable": self.executable,
            "executable_sha256": self.executable_sha256,
            **self.extra,
        }


def compose_local(policy: Policy, *, run_dir: str) -> Boundary:
    system = platform.system()
    if system == "Linux":
        return _bubblewrap(policy)
    if system == "Darwin":
        return _seatbelt(policy, run_dir)
    raise refusals.confinement_unavailable(
        f"this control plane runs on {system or 'an unrecognised OS'}, where saphan "
        "has no write boundary",
        "run saphan's control plane on Linux (bubblewrap) or macOS (Seatbelt)",
    )


def find_bwrap() -> str | None:
    """bubblewrap from the trusted system directories only (confine/trusted.py)."""
    from saphan.confine import trusted

    return trusted.find("bwrap")


@dataclass(frozen=True)
class _Bwrap:
    exe: str
    version: str
    sha256: str


def usable_bwrap(*, unshare_net: bool = False, egress: bool = False) -> _Bwrap:
    """bubblewrap from the trusted directories that can create a sandbox
    here, or the refusal. The trial runs ``true`` by its trusted path: by
    name, a PATH without /usr/bin failed it as if namespaces were off.

    With ``unshare_net``, a second trial adds ``--unshare-net`` (what a
    ``network: off`` run gets): a host that makes user namespaces but no
    network namespace (``user.max_net_namespaces=0``: bwrap says ENOSPC) is
    the refusal ``network-posture-unenforceable``, naming the setting — or,
    for a run with an egress policy (``egress``), ``egress-uncuttable``."""
    from saphan import _native
    from saphan.confine import trusted

    exe = find_bwrap()
    if exe is None:
        raise refusals.confinement_unavailable(
            "bubblewrap (bwrap) is not installed on this control plane with safe custody in "
            f"{', '.join(trusted.TRUSTED_DIRS)}, so no write boundary can be composed (saphan "
            "never takes it from PATH, where a run could have planted one)",
            "install it: `apt-get install bubblewrap` (Debian/Ubuntu) or "
            "`dnf install bubblewrap` (Fedora/RHEL); it must be root-owned, mode 0755",
        )
    sandbox = [exe, "--ro-bind", "/", "/", "--unshare-user", "--unshare-pid", "--proc", "/proc",
               "--cap-drop", "ALL"]
    true = trusted.find("true") or "true"
    net = None
    try:
        version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
        # A cut run tries the sandbox it gets (with --unshare-net) first: it
        # passing proves the plain one too (one trial fewer on every cut
        # run); only a failure runs the plain trial, to name which refusal.
        if unshare_net:
            net = subprocess.run([*sandbox, "--unshare-net", "--", true], capture_output=True,
                                 text=True, timeout=30, check=False)
        trial = net if net is not None and net.returncode == 0 else subprocess.run(
            [*sandbox, "--", true], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise refusals.confinement_unavailable(
            f"{exe} could not be started: {e}",
            "reinstall bubblewrap and check that `bwrap --ro-bind / / -- true` succeeds",
        ) from None
    if trial.returncode != 0:
        raise refusals.confinement_unavailable(
            f"{exe} cannot create a sandbox on this host: {trial.stderr.strip()}",
            "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`, "
            "or on Ubuntu allow bwrap in AppArmor), then check that "
            "`bwrap --ro-bind / / -- true` succeeds",
        )
    if net is not None and net.returncode != 0:
        refuse = (refusals.egress_uncuttable if egress
                  else refusals.network_posture_unenforceable)
        raise refuse(
            f"{exe} creates a sandbox on this host, but not one with a network namespace of "
            f"its own (--unshare-net, what every `network: off` run and every run with an "
            f"egress policy gets): {net.stderr.strip()}",
            "allow network namespaces: `sysctl -w user.max_net_namespaces=15000` (0 forbids "
            "them; a container's runtime may forbid them too), then check that "
            "`bwrap --ro-bind / / --unshare-user --unshare-net -- true` succeeds; until then "
            "every `network: off` run (a class's default when it names no network) and every "
            "run with an egress policy here is refused",
        )
    return _Bwrap(exe, version.removeprefix("bubblewrap ").strip() or "unknown",
                  _native.sha256_file(exe))


#: the child's descriptor for saphan-launcher's control lines (a pipe only
#: saphan reads; the launcher closes it before the command starts, so nothing
#: the run prints can pass for a launcher line)
STATUS_FD = 3
#: the child's descriptor for saphan's lifeline (transport/local._Lifeline):
#: the launcher passes on the signals saphan writes there, and ends the run
#: when it ends (saphan died, or the boundary process did)
LIFELINE_FD = 4
#: what every local launcher is given after its digest: the two descriptors
LAUNCHER_FDS = ["--status-fd", str(STATUS_FD), "--lifeline-fd", str(LIFELINE_FD)]


@dataclass(frozen=True)
class _Reaper:
    path: str
    sha256: str


def usable_reaper() -> _Reaper:
    """saphan-launcher as the jail's first process (``reap``), after its
    custody is measured here, outside the jail's user namespace — inside it a
    root-owned file shows as the overflow uid and the launcher cannot tell
    (so ``reap`` leaves its custody to this check). Its digest is recorded;
    its version is not asked for (one process fewer on every run)."""
    from saphan import _native, launcher

    path = launcher.path()
    if path is None:
        raise refusals.confinement_unavailable(
            "saphan-launcher is not installed with this saphan, so no run can be reaped "
            "(every process of a run ends with it) or confined by Landlock",
            "reinstall saphan (ci/setup builds and packages the launcher): "
            "`saphan launcher path` must print its path",
        )
    shape = ("the launcher must be root- or your own, 0755, in a directory only its owner "
             "can write")
    try:
        found = _native.check_binary_custody(path)
    except OSError as e:
        raise refusals.custody_binary_unsafe(
            f"saphan-launcher (the jail's reaper): the custody of {path} cannot be "
            f"measured ({e})",
            f"reinstall saphan; {shape}",
        ) from None
    if found is not None:
        raise refusals.custody_binary_unsafe(
            f"saphan-launcher (the jail's reaper): {found['message']}",
            f"{found['remediation']}; {shape}",
        )
    return _Reaper(path, _native.sha256_file(path))


def grant_fds(dirs: tuple[str, ...]) -> dict[str, int]:
    """A descriptor per writable directory, opened by rust/core's grant walk
    (no link at any component) — the directories bubblewrap then binds by
    descriptor. A directory that no longer passes (swapped for a link since
    the policy was derived) is the refusal, naming it."""
    import fcntl

    from saphan import _native

    fds: dict[str, int] = {}
    try:
        for d in dirs:
            try:
                raw = _native.open_grant_dir(d)
            except ValueError as e:
                raise refusals.workdir_unsafe(
                    f"{e} (it passed when the run's policy was derived: something changed it "
                    "since — a concurrent run in an enclosing directory?)",
                    f"look at {d}; run again once nothing else writes there",
                ) from None
            # Above the descriptors a child is given by number (0-2, the
            # launcher's status descriptor 3).
            fds[d] = fcntl.fcntl(raw, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(raw)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def reaper_prefix() -> tuple[list[str], dict[str, Any]]:
    """``saphan-launcher reap`` as a command's supervisor (no confinement of
    its own): it kills and counts what the command leaves behind. For a tool
    that confines itself (Codex), so its helpers never outlive the run."""
    reaper = usable_reaper()
    return ([reaper.path, "reap", "--expect-sha256", reaper.sha256, *LAUNCHER_FDS, "--"],
            {"reaper": {"executable": reaper.path, "sha256": reaper.sha256}})


def bridge_args(policy: Policy) -> list[str]:
    """An egress run's bridge: the jail's first process listens on the
    jail's loopback and carries each connection to the door's socket."""
    if policy.network != "egress":
        return []
    from saphan.confine.policy import DOOR_PORT

    return ["--bridge", f"127.0.0.1:{DOOR_PORT}={policy.door_socket}"]


def cut_around(boundary: Boundary, policy: Policy) -> Boundary:
    """A tool that confines itself (Codex), cut: the same boundary inside a
    bubblewrap that adds namespaces — its own network (only loopback, the
    door's bridge on it), user and PID — and hides saphan's workspaces and
    the read denials, the rest of the filesystem as it is (the tool's own
    sandbox keeps the writes, as without a cut): bwrap.render_cut_around."""
    b = usable_bwrap(unshare_net=True, egress=True)
    if boundary.prefix[-1:] != ["--"]:
        raise RuntimeError("a vendor boundary's prefix ends with its reaper's `--`")
    outer = bwrap.render_cut_around(policy, b.exe)
    return replace(boundary, prefix=[*outer, *boundary.prefix[:-1], *bridge_args(policy), "--"],
                   extra={**boundary.extra, "network_cut_by": {
                       "mechanism": "bubblewrap", "version": b.version, "executable": b.exe,
                       "executable_sha256": b.sha256,
                       "what": "a network namespace around the codex process: only loopback, "
                               "the door's bridge on it"}})


def _bubblewrap(policy: Policy) -> Boundary:
    b = usable_bwrap(unshare_net=policy.network != "open", egress=policy.network == "egress")
    reaper = usable_reaper()
    fds = grant_fds(policy.writable_dirs)
    return Boundary(
        mechanism="bubblewrap",
        version=b.version,
        executable=b.exe,
        executable_sha256=b.sha256,
        prefix=[*bwrap.render(policy, b.exe, fds), reaper.path, "reap",
                "--expect-sha256", reaper.sha256, *LAUNCHER_FDS,
                *bridge_args(policy), "--"],
        policy=policy,
        extra={"reaper": {"executable": reaper.path, "sha256": reaper.sha256}},
        status_fd=STATUS_FD,
        lifeline_fd=LIFELINE_FD,
        fds=tuple(fds.values()),
    )


def compose_landlock_local(
    policy: Policy,
    *,
    level: int,
    launcher_path: str,
    launcher_version: str,
    launcher_sha256: str,
    agent_sha256: str,
) -> Boundary:
    """The Landlock boundary on this machine: saphan-launcher enforces the writes.

    The write set travels to the launcher as its one JSON value; what Landlock
    cannot express (read denials, the read-only main .git) is kept by an outer
    bubblewrap that only carves those out — so every jail on the control plane
    still hides the workspace key and config.
    """
    write_policy = replace(policy, read_denials=(), readonly_dirs=(), hidden_dirs=())
    policy_json = landlock.render(write_policy, agent_sha256=agent_sha256)
    extra: dict[str, Any] = {"abi": level, "policy_json": policy_json}
    # The outer bubblewrap is always there: it hides the workspaces, keeps the
    # carve-outs and read denials, and gives the jail its own PID namespace.
    b = usable_bwrap()
    fds = grant_fds(tuple(d for d in policy.writable_dirs
                          if any(d == h or d.startswith(h.rstrip("/") + "/")
                                 for h in policy.hidden_dirs)))
    outer = bwrap.render_outer(policy, b.exe, fds)
    extra["read_denials_and_carve_outs_by"] = {
        "mechanism": "bubblewrap", "version": b.version, "executable": b.exe,
        "executable_sha256": b.sha256,
    }
    return Boundary(
        mechanism="landlock",
        version=f"abi {level}",
        executable=launcher_path,
        executable_sha256=launcher_sha256,
        prefix=[*outer, launcher_path, "exec", "--expect-sha256", launcher_sha256,
                *LAUNCHER_FDS, "--policy", policy_json, "--"],
        policy=policy,
        extra={"launcher_version": launcher_version, **extra},
        status_fd=STATUS_FD,
        lifeline_fd=LIFELINE_FD,
        fds=tuple(fds.values()),
    )


def _seatbelt(policy: Policy, run_dir: str) -> Boundary:
    from saphan import _native

    exe = "/usr/bin/sandbox-exec"
    if not os.path.exists(exe):
        raise refusals.confinement_unavailable(
            f"{exe} is missing on this macOS host",
            "restore the system's sandbox-exec (it ships with macOS); saphan never runs "
            "an agent unconfined",
        )
    profile_path = os.path.join(run_dir, "seatbelt.sb")
    with open(profile_path, "w") as f:
        f.write(seatbelt.render(policy))
    return Boundary(
        mechanism="seatbelt",
        version=platform.mac_ver()[0] or "unknown",
        executable=exe,
        executable_sha256=_native.sha256_file(exe),
        prefix=seatbelt.argv(policy, profile_path),
        policy=policy,
        extra={"profile": profile_path},
    )
