"""The SSH site: a run on a machine reached over SSH.

The boundary is Landlock, applied on the far machine by the delivered
saphan-launcher, and composed only behind the gate on that machine's signed
row (confine/landlock_gate.py).

Before the seat (``inspect``):
1. the gate on the machine's row, and the delivered launcher's row;
2. the preflight dial (site/far.preflight), one round trip: the far working
   directory exists and resolves; the installed launcher is the one
   delivered and the one that measured the row (``digest-mismatch``); the
   agent's far path and SHA-256; for a Claude slot, this run's own session
   leaf, re-derived and checked here (``session-dir-foreign``).

After it:
3. ``prepare``: the Policy from those answers — never from a local
   derivation of a far path — rendered by confine/landlock.render into the
   launcher's one JSON value: the far workdir (and session leaf) writable,
   reads everywhere;
4. ``start``: the launcher is re-hashed on the far side just before it
   starts; output streams back live; the far process becomes the seat's
   holder (pid, start time, boot id), read over the transport by conflict
   handling; the record gets what enforced (the far launcher's path, digest,
   version, the ABI, the policy verbatim), the far confirmation line, the
   exit status.

The row is finalised whatever happens after the reservation — an exit, a
refusal, Ctrl-C or SIGTERM (the far process is hung up first and its exit
status collected), an error — with one exception that follows SPEC.md §1
rather than the local site: when the connection is lost after the far
process started, nothing here can say whether it still runs, so ``settle``
keeps the row live with the far process as its holder, and conflict handling
decides (unreachable counts as alive: refuse rather than double-book).
"""

from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.confine import landlock
from saphan.confine.landlock_gate import FACT_KIND as LANDLOCK_FACT
from saphan.confine.landlock_gate import gate_row
from saphan.confine.policy import Policy
from saphan.errors import Interrupted, TransportError, UserError
from saphan.run.end import RunEnd
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso
from saphan.tools.binaries import check_pin

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import RemoteCheck
    from saphan.site.far import Preflight

#: What the remote boundary does not restrict, written into every record.
NOT_RESTRICTED = (
    "not restricted by this boundary: reads (Landlock grants reading everywhere on the far "
    "machine: anything its user can read, the run can read), network egress (no egress "
    "policy declared), metadata changes (chmod, chown, timestamps, xattrs) outside the "
    "writable set, which Landlock does not cover at any level, and anything inside the far "
    "working directory — including its own .git, which Landlock cannot hold read-only "
    "inside a granted tree"
)

_HOLDER_LINE = "saphan-far-holder: "
_LAUNCHER_MISMATCH = "saphan-far: launcher-digest-mismatch "
_CONFIRMATION = "saphan-launcher: landlock "


class SshSite:
    """One run on machine ``machine``, reached over SSH."""

    kind = "ssh"

    def __init__(self, ctx: Context, slot: Slot, machine: Machine, command: list[str], *,
                 workdir: str, stream: bool = True) -> None:
        self.ctx, self.slot, self.machine, self.command = ctx, slot, machine, command
        self.workdir, self.stream = workdir, stream
        self.far: _Far | None = None
        self.policy_json = ""
        self.seen: dict[str, Any] = {}
        self.leave_live = False

    @staticmethod
    def far_workdir(machine: Machine, workdir: str | os.PathLike[str] | None) -> str:
        """The far working directory: absolute on that machine, normalised."""
        wd = os.fspath(workdir) if workdir is not None else ""
        if not wd.startswith("/"):
            raise UserError(
                f"a run on SSH machine {machine.name!r} needs --workdir with an absolute path "
                f"on that machine (got {wd or 'none'})"
            )
        return posixpath.normpath(wd)

    # -- before the seat -----------------------------------------------------------
    def inspect(self, base: dict[str, Any]) -> None:
        """The gate on the machine's row, then the one preflight dial."""
        base["transport"] = {"kind": "ssh", "address": self.machine.address()}
        self.far = _inspect(self.ctx, self.slot, self.machine, base, self.command,
                            self.workdir)

    def liveness(self) -> RemoteCheck | None:
        return self.ctx.remote_liveness(self.machine)

    # -- after the seat ------------------------------------------------------------
    def prepare(self, record: dict[str, Any]) -> None:
        """The Policy from the preflight's answers, rendered for the launcher."""
        from saphan.site import far as far_side

        far, name, slot = self._far(), self.machine.name, self.slot
        self.ctx.workspace.run_dir(record["id"]).mkdir(parents=True, exist_ok=True)
        pf = far.pf
        rwd = pf.get("workdir") or self.workdir
        writable = [rwd]
        notes: list[str] = []
        if slot.tool == "claude":
            if pf.get("session_dir") is not None:
                leaf = far_side.verify_session_dir(name, pf)
                writable.append(leaf)
                notes.append(f"session directory {leaf} on {name} is writable: this run can be "
                             "resumed")
            else:
                notes.append(
                    f"this run cannot be resumed: the preflight on {name} could not resolve its "
                    f"session directory ({pf.get('session_unresolved') or 'no answer'}), so no "
                    "session directory was granted"
                )
        policy = Policy(
            workdir=rwd,
            writable_dirs=tuple(dict.fromkeys(writable)),
            writable_literals=pf.devices,
            scratch_dir=posixpath.join(rwd, ".saphan-run", "tmp"),
            notes=tuple(notes),
        )
        self.policy_json = landlock.render(policy, agent_sha256=far.agent_sha)
        record.update({
            "enforced_by": {
                "mechanism": "landlock", "version": f"abi {far.level}", "abi": far.level,
                "machine": name, "executable": far.delivered["path"],
                "executable_sha256": far.launcher_sha,
                "launcher_version": pf.get("launcher_version"),
                "policy_json": self.policy_json,
            },
            "policy": policy.as_record(),
            "writable": policy.writable_set(),
            "notes": [*policy.notes, NOT_RESTRICTED],
        })

    def start(self, record: dict[str, Any], end: RunEnd) -> None:
        """The far script over the connection; output streams back live."""
        from saphan.site import far as far_side

        far, name, seen, run_id = self._far(), self.machine.name, self.seen, record["id"]
        run_dir = self.ctx.workspace.run_dir(run_id)

        def watch(raw: bytes) -> bool:
            line = raw.decode(errors="replace")
            if line.startswith(_HOLDER_LINE):
                try:
                    pid_s, ticks_s, boot = line[len(_HOLDER_LINE):].split()
                    pid, ticks = int(pid_s), int(ticks_s)
                except ValueError:
                    return True  # not the far script's line: leave it in view
                seen.update({"pid": pid, "start_ticks": ticks, "boot_id": boot})
                self.ctx.store.set_holder(
                    run_id, (far_side.holder_host(self.machine), pid, ticks, boot))
                return False
            if line.startswith(_LAUNCHER_MISMATCH):
                seen["launcher_sha256_at_start"] = line[len(_LAUNCHER_MISMATCH):].strip()
                return False
            if line.startswith(_CONFIRMATION) and "confirmation" not in seen:
                seen["confirmation"] = line
            return True

        script = run_script(
            launcher=far.delivered["path"], launcher_sha256=far.launcher_sha,
            policy_json=self.policy_json, argv=far.argv, run_id=run_id,
        )
        try:
            finished = far.conn.stream(script, run_dir=str(run_dir), stream=self.stream,
                                       on_stderr_line=watch)
        except TransportError:
            self.leave_live = "pid" in seen
            raise
        finally:
            if seen:
                record["far_process"] = {k: v for k, v in seen.items() if k != "confirmation"}
            record["enforced_by"]["confirmation"] = seen.get("confirmation")
            record["output"] = {"stdout": str(run_dir / "stdout.log"),
                                "stderr": str(run_dir / "stderr.log")}
        if "launcher_sha256_at_start" in seen:
            raise refusals.digest_mismatch(
                f"the launcher at {far.delivered['path']} on {name} hashed to "
                f"{seen['launcher_sha256_at_start']} as the run started, not the delivered "
                f"{far.launcher_sha}; nothing was started",
                f"deliver it again: `saphan machine deliver {name}`, then `saphan machine "
                f"probe-confinement {name}`; investigate {name} if it recurs",
            )
        end.exited(finished.exit_code)

    def interrupted(self, e: Interrupted) -> str:
        return f"{e}: the far process on {self.machine.name} was hung up (SIGHUP)"

    def settle(self, record: dict[str, Any], end: RunEnd) -> bool:
        """True when the connection was lost while the far process ran: nothing
        here can say whether it still runs, so its row stays live."""
        if self.leave_live:
            record["notes"] = [*record.get("notes", []), (
                f"the connection to {self.machine.name} was lost at {now_iso()} while the far "
                f"process (pid {self.seen.get('pid')}) ran; the seat stays held by it until "
                "conflict handling finds it dead or `saphan runs finalize` ends it"
            )]
        return self.leave_live

    def _far(self) -> _Far:
        if self.far is None:
            raise RuntimeError("SshSite.inspect() dials the far machine before the seat")
        return self.far


@dataclass
class _Far:
    """What the gate and the preflight dial established, before the seat."""

    level: int
    delivered: dict[str, Any]
    conn: Any
    pf: Preflight
    launcher_sha: str
    argv: list[str]
    agent_sha: str


def _inspect(ctx: Context, slot: Slot, machine: Machine, base: dict[str, Any],
             argv: list[str], wd: str) -> _Far:
    """The gate on the machine's row, then one dial: the far workdir, the
    launcher and the command, each checked. What was learned goes into
    ``base`` (the run's record), so a refusal's record carries it."""
    from saphan.site import far as far_side

    name = machine.name
    level, value = gate_row(name, ctx.verified_fact(name, LANDLOCK_FACT))
    delivered = _delivered(ctx, name)
    conn = ctx.ssh(machine)
    pf = far_side.preflight(conn, workdir=wd, launcher_path=delivered["path"],
                            tool=slot.tool, agent=argv[0])
    base["preflight"] = pf.as_record()
    if pf.get("workdir_missing") is not None:
        raise refusals.workdir_missing(
            f"the working directory {wd} does not exist on {name} (the preflight could not "
            "enter it there)",
            f"create it on {name} (`mkdir -p {wd}` as {machine.ssh_user}) or pass an "
            "existing --workdir",
        )
    launcher_sha = _check_launcher(name, pf, delivered, value)
    _check_workdir_apart(name, pf)
    agent_path, agent_sha = _agent(name, pf, argv[0], wd)
    argv = [agent_path, *argv[1:]]
    base["argv"] = argv
    base["agent"] = {"path": agent_path, "sha256": agent_sha, "resolved_on": name}
    if slot.agent_sha256 is not None:
        base["agent"]["pinned_sha256"] = slot.agent_sha256
        check_pin(name, slot.name, slot.agent_sha256, agent_path, agent_sha, far=True)
    return _Far(level, delivered, conn, pf, launcher_sha, argv, agent_sha)


def _delivered(ctx: Context, name: str) -> dict[str, Any]:
    from saphan.site.far import FACT_KIND

    fact = ctx.verified_fact(name, FACT_KIND)
    if fact is None:
        raise refusals.confinement_unavailable(
            f"no delivered saphan-launcher is recorded for {name}, so nothing there can apply "
            "a Landlock domain",
            f"deliver it and measure: `saphan machine deliver {name} --probe`",
        )
    return fact[0]


def _check_launcher(name: str, pf: Preflight, delivered: dict[str, Any],
                    row: dict[str, Any]) -> str:
    """The far launcher must be the delivered one AND the one that measured."""
    far = pf.get("launcher_sha256")
    if far is None:
        raise refusals.digest_mismatch(
            f"the delivered launcher {delivered['path']} is missing or unreadable on {name}",
            f"deliver it again: `saphan machine deliver {name} --probe`",
        )
    if far != delivered["sha256"]:
        raise refusals.digest_mismatch(
            f"the launcher at {delivered['path']} on {name} has sha256 {far} (measured there), "
            f"but sha256 {delivered['sha256']} was delivered",
            f"deliver it again: `saphan machine deliver {name} --probe`; investigate {name} "
            "if it recurs",
        )
    if far != row.get("launcher_sha256"):
        raise refusals.digest_mismatch(
            f"the launcher at {delivered['path']} on {name} has sha256 {far}, but {name}'s "
            f"Landlock level was measured with {row.get('launcher_sha256')}",
            f"re-measure with the installed launcher: `saphan machine probe-confinement {name}`",
        )
    return far


def _check_workdir_apart(name: str, pf: Preflight) -> None:
    """The far working directory must not hold the launcher that confines it.

    Were it so, a run could replace the launcher for the runs after it (the
    digest checks would then refuse them: a denial of service, not an
    escape — but the boundary's own program belongs outside its grant).
    """
    rwd, ldir = pf.get("workdir") or "", pf.get("launcher_dir_real") or ""
    if ldir and (ldir == rwd or ldir.startswith(rwd.rstrip("/") + "/")):
        raise refusals.workdir_unsafe(
            f"the working directory {rwd} on {name} contains saphan's launcher directory "
            f"{ldir}; a run there could replace the program that confines it",
            "use a working directory outside it",
        )


def _agent(name: str, pf: Preflight, argv0: str, wd: str) -> tuple[str, str]:
    path, digest = pf.get("agent_path"), pf.get("agent_sha256")
    if path is None or digest is None:
        raise UserError(
            f"command {argv0!r} not found on {name} (its PATH, from {wd}); give its absolute "
            "path on that machine"
        )
    return path, digest


def run_script(*, launcher: str, launcher_sha256: str, policy_json: str, argv: list[str],
               run_id: str) -> str:
    """The far side of a run, for /bin/sh.

    The channel's stdin is the lifeline: it is moved to fd 3 and watched by
    a subshell; when it reaches EOF (saphan closed it on Ctrl-C/SIGTERM, or
    saphan or the connection died) the far process group is hung up. The
    launcher is hashed again right before it starts, and the far process's
    pid, start time (field 22 of /proc/PID/stat) and boot id are reported on
    stderr so the seat's holder is the far process. ``setsid`` (when present)
    gives the launcher and its agent their own process group to hang up.
    """
    q = shlex.quote
    cmd = " ".join(q(a) for a in [launcher, "exec", "--policy", policy_json, "--", *argv])
    return f"""\
L={q(launcher)}
SAPHAN_RUN_ID={q(run_id)}
export SAPHAN_RUN_ID
s=$(sha256sum < "$L") || s=unreadable
s=${{s%% *}}
if [ "$s" != {q(launcher_sha256)} ]; then
  printf '{_LAUNCHER_MISMATCH}%s\\n' "$s" >&2
  exit 125
fi
exec 3<&0 </dev/null
if command -v setsid >/dev/null 2>&1; then
  setsid {cmd} 3<&- &
else
  {cmd} 3<&- &
fi
c=$!
t=$(sed 's/.*) //' "/proc/$c/stat" | cut -d' ' -f20)
b=$(cat /proc/sys/kernel/random/boot_id)
printf '{_HOLDER_LINE}%s %s %s\\n' "$c" "$t" "$b" >&2
( read -r _ <&3 || :; kill -HUP -- "-$c" 2>/dev/null || kill -HUP "$c" 2>/dev/null ) \\
  </dev/null >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$c"
s=$?
kill "$w" 2>/dev/null
exit "$s"
"""
