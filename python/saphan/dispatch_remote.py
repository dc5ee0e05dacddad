"""Reserve, compose, dispatch and record a run on a machine reached over SSH.

The boundary is Landlock, applied on the far machine by the delivered
saphan-launcher, and composed only behind the gate on that machine's signed
row (confine/landlock_gate.py). The steps after the reservation:

1. the gate on FAR's row, and the delivered launcher's row;
2. the preflight dial (saphan.remote.preflight), one round trip: the far
   working directory exists and resolves; the installed launcher is the one
   delivered and the one that measured the row (``digest-mismatch``); the
   agent's far path and SHA-256; for a Claude slot, this run's own session
   leaf, re-derived and checked here (``session-dir-foreign``);
3. the Policy from those answers — never from a local derivation of a far
   path — rendered by confine/landlock.render into the launcher's one JSON
   value: the far workdir (and session leaf) writable, reads everywhere;
4. the run: the launcher is re-hashed on the far side just before it starts;
   output streams back live; the far process becomes the seat's holder
   (pid, start time, boot id), read over the transport by conflict handling;
5. the record: what enforced (the far launcher's path, digest, version, the
   ABI, the policy verbatim), the far confirmation line, the exit status.

The row is finalised whatever happens after the reservation — an exit, a
refusal, Ctrl-C or SIGTERM (the far process is hung up first and its exit
status collected), an error — with one exception that follows SPEC.md §1
rather than the local site: when the connection is lost after the far
process started, nothing here can say whether it still runs, so the row
stays live with the far process as its holder, and conflict handling
decides (unreachable counts as alive: refuse rather than double-book).
"""

from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan.confine import landlock
from saphan.confine.landlock_gate import FACT_KIND as LANDLOCK_FACT
from saphan.confine.landlock_gate import gate_row
from saphan.confine.policy import Policy
from saphan.errors import TransportError, UserError
from saphan.liveness import Holder
from saphan.refusals import Refusal
from saphan.run import record as recorder
from saphan.run.record import RunEnd
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso
from saphan.tools.binaries import check_pin

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.records import RunRecord
    from saphan.remote import Preflight

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


def run_remote(
    ctx: Context,
    slot: Slot,
    machine: Machine,
    base: dict[str, Any],
    argv: list[str],
    *,
    workdir: str | os.PathLike[str] | None,
    repo: object,
    holder: Holder,
    boundary: str | None,
    stream: bool,
) -> RunRecord:
    """The remote branch of :meth:`Engine.run`, after the cast."""
    name = machine.name
    if repo is not None:
        raise UserError(
            f"--repo makes a worktree on this machine; for SSH machine {name!r} give "
            "--workdir /absolute/path/on/that/machine"
        )
    if boundary not in (None, "landlock"):
        raise UserError(f"--boundary {boundary!r} is unknown; omit it or use `landlock`")
    wd = os.fspath(workdir) if workdir is not None else ""
    if not wd.startswith("/"):
        raise UserError(
            f"a run on SSH machine {name!r} needs --workdir with an absolute path on that "
            f"machine (got {wd or 'none'})"
        )
    wd = posixpath.normpath(wd)
    base.update({"workdir": wd, "argv": argv})
    base["transport"] = {"kind": "ssh", "address": machine.address()}
    from saphan.run.reserve import reserve

    ordinal = reserve(ctx, slot, base, wd, holder, remote=ctx.remote_liveness(machine))
    base["session_ordinal"] = ordinal
    return execute_remote(ctx, slot, machine, base, argv, wd, stream=stream)


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


def _prepare(ctx: Context, slot: Slot, machine: Machine, base: dict[str, Any],
             argv: list[str], wd: str) -> _Far:
    """The gate on the machine's row, then one dial: the far workdir, the
    launcher and the command, each checked. What was learned goes into
    ``base`` (the run's record), so a refusal's record carries it."""
    from saphan import remote

    name = machine.name
    level, value = gate_row(name, ctx.verified_fact(name, LANDLOCK_FACT))
    delivered = _delivered(ctx, name)
    conn = ctx.ssh(machine)
    pf = remote.preflight(conn, workdir=wd, launcher_path=delivered["path"],
                          tool=slot.tool, agent=argv[0])
    base["preflight"] = pf.as_record()
    if pf.get("workdir_missing") is not None:
        raise Refusal(
            "workdir-missing",
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


def execute_remote(
    ctx: Context,
    slot: Slot,
    machine: Machine,
    base: dict[str, Any],
    argv: list[str],
    wd: str,
    *,
    stream: bool = True,
) -> RunRecord:
    from saphan import remote

    run_id = base["id"]
    name = machine.name
    record: dict[str, Any] = {**base, "started_at": now_iso(), "enforced_by": None}
    end = RunEnd()
    far: dict[str, Any] = {}
    leave_live = False
    discarded = False
    try:
        try:
            prepared = _prepare(ctx, slot, machine, record, argv, wd)
        except UserError:
            # The far dial found the request bad (no such command there):
            # nothing ran, so no row stays (and nothing is recorded).
            discarded = True
            recorder.discarded(ctx, run_id)
            raise
        run_dir = ctx.workspace.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        level, delivered, conn, pf = (prepared.level, prepared.delivered, prepared.conn,
                                      prepared.pf)
        launcher_sha, argv, agent_sha = prepared.launcher_sha, prepared.argv, prepared.agent_sha
        rwd = pf.get("workdir") or wd
        writable = [rwd]
        notes: list[str] = []
        if slot.tool == "claude":
            if pf.get("session_dir") is not None:
                leaf = remote.verify_session_dir(name, pf)
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
        policy_json = landlock.render(policy, agent_sha256=agent_sha)
        record.update({
            "enforced_by": {
                "mechanism": "landlock", "version": f"abi {level}", "abi": level,
                "machine": name, "executable": delivered["path"],
                "executable_sha256": launcher_sha,
                "launcher_version": pf.get("launcher_version"), "policy_json": policy_json,
            },
            "policy": policy.as_record(),
            "writable": policy.writable_set(),
            "notes": [*policy.notes, NOT_RESTRICTED],
        })
        recorder.running(ctx, record)

        def watch(raw: bytes) -> bool:
            line = raw.decode(errors="replace")
            if line.startswith(_HOLDER_LINE):
                try:
                    pid_s, ticks_s, boot = line[len(_HOLDER_LINE):].split()
                    pid, ticks = int(pid_s), int(ticks_s)
                except ValueError:
                    return True  # not the far script's line: leave it in view
                far.update({"pid": pid, "start_ticks": ticks, "boot_id": boot})
                ctx.store.set_holder(run_id, (remote.holder_host(machine), pid, ticks, boot))
                return False
            if line.startswith(_LAUNCHER_MISMATCH):
                far["launcher_sha256_at_start"] = line[len(_LAUNCHER_MISMATCH):].strip()
                return False
            if line.startswith(_CONFIRMATION) and "confirmation" not in far:
                far["confirmation"] = line
            return True

        script = run_script(
            launcher=delivered["path"], launcher_sha256=launcher_sha, policy_json=policy_json,
            argv=argv, run_id=run_id,
        )
        try:
            finished = conn.stream(script, run_dir=str(run_dir), stream=stream,
                                   on_stderr_line=watch)
        except TransportError:
            leave_live = "pid" in far
            raise
        finally:
            if far:
                record["far_process"] = {k: v for k, v in far.items() if k != "confirmation"}
            record["enforced_by"]["confirmation"] = far.get("confirmation")
            record["output"] = {"stdout": str(run_dir / "stdout.log"),
                                "stderr": str(run_dir / "stderr.log")}
        if "launcher_sha256_at_start" in far:
            raise Refusal(
                "digest-mismatch",
                f"the launcher at {delivered['path']} on {name} hashed to "
                f"{far['launcher_sha256_at_start']} as the run started, not the delivered "
                f"{launcher_sha}; nothing was started",
                f"deliver it again: `saphan machine deliver {name}`, then `saphan machine "
                f"probe-confinement {name}`; investigate {name} if it recurs",
            )
        end.exited(finished.exit_code)
    except BaseException as e:
        end.absorb(e, record,
                   lambda intr: f"{intr}: the far process on {name} was hung up (SIGHUP)")
        raise
    finally:
        if leave_live:
            record["notes"] = [*record.get("notes", []), (
                f"the connection to {name} was lost at {now_iso()} while the far process "
                f"(pid {far.get('pid')}) ran; the seat stays held by it until conflict handling "
                "finds it dead or `saphan runs finalize` ends it"
            )]
            recorder.still_running(ctx, record)
        elif not discarded:
            recorder.finished(ctx, record, end)
    return ctx.run_record(run_id)


def _delivered(ctx: Context, name: str) -> dict[str, Any]:
    from saphan.remote import FACT_KIND

    fact = ctx.verified_fact(name, FACT_KIND)
    if fact is None:
        raise Refusal(
            "confinement-unavailable",
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
        raise Refusal(
            "digest-mismatch",
            f"the delivered launcher {delivered['path']} is missing or unreadable on {name}",
            f"deliver it again: `saphan machine deliver {name} --probe`",
        )
    if far != delivered["sha256"]:
        raise Refusal(
            "digest-mismatch",
            f"the launcher at {delivered['path']} on {name} has sha256 {far} (measured there), "
            f"but sha256 {delivered['sha256']} was delivered",
            f"deliver it again: `saphan machine deliver {name} --probe`; investigate {name} "
            "if it recurs",
        )
    if far != row.get("launcher_sha256"):
        raise Refusal(
            "digest-mismatch",
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
        raise Refusal(
            "workdir-unsafe",
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
