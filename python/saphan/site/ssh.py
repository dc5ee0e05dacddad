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
import re
import shlex
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.confine import landlock
from saphan.confine.environment import BASE, LOCALE
from saphan.confine.landlock_gate import FACT_KIND as LANDLOCK_FACT
from saphan.confine.landlock_gate import gate_row
from saphan.confine.policy import Policy
from saphan.errors import Interrupted, TransportError, UserError
from saphan.refusals import Refusal
from saphan.run.end import RunEnd
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso
from saphan.tools import AGENT_TOOLS
from saphan.tools.binaries import check_pin

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import RemoteCheck
    from saphan.measure.order import Order
    from saphan.run.view import Escaped, View
    from saphan.site.far import Preflight
    from saphan.tools.adapter import Adapter
    from saphan.tools.instruction import Request as AgentRequest
    from saphan.tools.permission_class import PermissionClass

#: What the remote boundary does not restrict, written into every record.
NOT_RESTRICTED = (
    "not restricted by this boundary: reads (Landlock grants reading everywhere on the far "
    "machine: anything its user can read, the run can read), network egress (no egress "
    "policy declared), metadata changes (chmod, chown, timestamps, xattrs) outside the "
    "writable set, which Landlock does not cover at any level, anything inside the far "
    "working directory — including its own .git, which Landlock cannot hold read-only "
    "inside a granted tree — and delegation: a process of the far user outside the run "
    "(a tmux server, a D-Bus session bus, an ssh-agent) reached through a path unix socket "
    "acts outside the domain on the run's behalf (measured: a tmux server wrote outside "
    "the working directory). Signals to processes outside the run and abstract unix "
    "sockets are scoped only where the confirmation lists them (Landlock ABI 6 and up); "
    "run remote work under a dedicated account with no user services"
)

#: seconds between two reads of a far holder followed after a lost connection
FOLLOW_INTERVAL = 1.0


class SshSite:
    """One run on machine ``machine``, reached over SSH."""

    kind = "ssh"

    def __init__(self, ctx: Context, slot: Slot, machine: Machine, command: list[str], *,
                 workdir: str, stream: bool = True,
                 permission: PermissionClass | None = None,
                 request: AgentRequest | None = None, mode: str = "engine",
                 view: bool = False, egress_policy: str | None = None,
                 measure: Order | None = None) -> None:
        self.ctx, self.slot, self.machine, self.command = ctx, slot, machine, command
        #: a measure-base order: the command is its driver (measure/collect.py)
        self.measure = measure
        #: an egress policy the run declared (refused here: no network lever)
        self.egress_policy = egress_policy
        self.workdir, self.stream = workdir, stream
        #: the command's permission class (its network posture, its write scope)
        self.permission = permission
        #: an agent slot's task, and run.confinement; show a claude or codex
        #: run's output one line per step (run/view.py)
        self.request, self.mode, self.view = request, mode, view
        #: an agent slot's adapter, made with the far paths (site/far_agent.py)
        self.adapter: Adapter | None = None
        self.far: _Far | None = None
        #: the launcher's policy (None: the launcher only supervises — Codex)
        self.policy_json: str | None = ""
        #: an agent run's: its task, its argv, Claude Code's verified session leaf
        self.prompt = ""
        self.argv: list[str] = []
        self.leaf: str | None = None
        self.session_env: str | None = None
        self.loop_spec = b""
        self.seen: dict[str, Any] = {}
        self.leave_live = False
        #: hung up, the far run could not be seen ended (the row stays live)
        self.hung_up = False
        #: this workspace's far install directory (far.install_dir)
        self.root = ""

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
        from saphan.confine import network
        from saphan.site import far as far_side

        base["transport"] = {"kind": "ssh", "address": self.machine.address()}
        self._no_egress_policy()
        self.root = far_side.install_dir(self.ctx.record_key())
        if self.slot.tool in AGENT_TOOLS:
            self._inspect_agent(base)
            self._resolved(base)
            return
        pc = self.permission
        network.posture(pc.network if pc is not None else None, tool=self.slot.tool,
                        mechanism="ssh")
        if self.measure is not None:
            self.command = self._measure_command(base["id"], self.workdir)
        self.far = far = _inspect(self.ctx, self.slot, self.machine, base, self.command,
                                  self.workdir)
        self._resolved(base)
        if self.measure is not None:
            # the driver names the directory the far machine resolved
            far.argv = [far.argv[0], *self._measure_command(base["id"], self.workdir)[1:]]
            base["argv"] = far.argv
        if pc is not None:
            from saphan.run.request import check_scope

            # The far machine resolved the working directory: held to the scope again.
            check_scope(pc, far.pf.get("workdir") or self.workdir, far=True)

    def _measure_command(self, run_id: str, wd: str) -> list[str]:
        from saphan.measure import collect

        assert self.measure is not None
        return collect.command(self.measure, out=posixpath.join(wd, ".saphan-run", run_id),
                               repository=wd, workdir=wd, far=True)

    def _no_egress_policy(self) -> None:
        """A run here that declares an egress policy (by option, or by its
        permission class) is refused: the launcher has no network lever."""
        request, pc = self.request, self.permission
        declared = self.egress_policy
        if declared is None and pc is None and request is not None \
                and request.permission_class is not None:
            from saphan.tools import permission_class

            pc = permission_class.load(request.permission_class)
        declared = declared or (pc.egress_policy if pc is not None else None)
        if declared is not None:
            from saphan.egress.cut import refuse_unless_cuttable

            refuse_unless_cuttable(tool=self.slot.tool, mechanism="ssh",
                                   where=f"SSH machine {self.machine.name}")

    def _inspect_agent(self, base: dict[str, Any]) -> None:
        """An agent slot: its far binary (never looked up on the far PATH),
        the gate and the dial, then the adapter from the far answers."""
        from saphan.confine import network
        from saphan.site import far_agent

        ctx, slot, machine, name = self.ctx, self.slot, self.machine, self.machine.name
        if self.request is None:
            raise UserError(f"slot {slot.name!r} runs {slot.tool}: give the task with "
                            "--prompt TEXT or --prompt-file FILE")
        path = far_agent.binary_path(ctx, slot, machine)
        zipapp = far_agent.zipapp_path(ctx, slot, machine)
        session = far_agent.run_session(ctx, slot.tool, self.request, base["id"])
        self.far = far = _inspect(ctx, slot, machine, base, [path], self.workdir,
                                  agent=True, session=session,
                                  resuming=self.request.resume is not None, also=zipapp)
        rwd = far.pf.get("workdir") or self.workdir
        binary = far_agent.far_binary(slot.tool, name, path, far.pf, rwd)
        base["agent"] = {**binary.as_record(), "resolved_on": name}
        if slot.agent_sha256 is not None:
            base["agent"]["pinned_sha256"] = slot.agent_sha256
            check_pin(name, slot.name, slot.agent_sha256, path, binary.sha256, far=True)
        if zipapp is not None:
            base["agent"]["zipapp"] = {
                "path": zipapp, "sha256": far_agent.check_zipapp(ctx, name, zipapp, far.pf)}
        if slot.tool == "claude" and far.pf.get("session_dir") is not None:
            from saphan.site import far as far_side

            # before the seat: a leaf that is not this run's own is refused
            self.leaf = far_side.verify_session_dir(name, far.pf)
            if session is not None and far.pf.get("session_env_dir") is not None:
                self.session_env = far_side.verify_session_env(name, far.pf, session)
        self.adapter, self.prompt = far_agent.adapter(
            ctx, slot, machine, self.request, far.pf, binary=binary, run_id=base["id"],
            confinement=self.mode, control_dir=self._control_dir(base["id"]), leaf=self.leaf,
            session_env=self.session_env, zipapp=zipapp)
        adapter = self.adapter
        base["argv"] = []
        pc = adapter.instruction.permission_class
        network.posture(pc.network if pc is not None else None, tool=slot.tool,
                        mechanism="vendor:codex" if slot.tool == "codex" else "ssh")
        cfg = self.ctx.config
        checked = far_agent.auth_check(adapter, far.pf, far.conn, name, token_url=(
            cfg.claude_token_url if slot.tool == "claude" else
            cfg.codex_token_url if slot.tool == "codex" else None))
        if checked is not None:
            base["auth"] = checked

    def _resolved(self, base: dict[str, Any]) -> None:
        """From here on the run's working directory is the one the far
        machine resolved (``pwd -P``): the seat's row carries it, so live
        runs are compared by where they really work (:meth:`_exclusive`)."""
        rwd = self._far().pf.get("workdir")
        if rwd:
            base["workdir_given"] = self.workdir
            self.workdir = base["workdir"] = rwd

    def _exclusive(self, run_id: str) -> None:
        """After the seat: no other live run on this machine may work in
        this directory, inside it or around it, nor (Claude Code) share its
        session leaf — it could rewrite what this run's agent reads or is
        granted while it runs (the transcript a resume checked, the .git
        Codex's profile names). Checked against every live row after this
        run's own was written: of two runs reserved at once, at least one
        sees the other (``workdir-busy``)."""
        from saphan.tools.session_key import session_key

        mine = self.workdir

        def within(path: str, root: str) -> bool:
            return path == root or path.startswith(root.rstrip("/") + "/")

        for other in self.ctx.store.live_runs_on(self.machine.name):
            if other.id == run_id or not other.workdir:
                continue
            theirs = other.workdir
            why = None
            if within(mine, theirs) or within(theirs, mine):
                why = (f"works in {theirs}" + ("" if theirs == mine else
                       (", around it" if within(mine, theirs) else ", inside it")))
            elif (self.slot.tool == "claude" and other.tool == "claude"
                  and session_key(theirs) == session_key(mine)):
                why = f"works in {theirs}, whose Claude Code session leaf is this run's"
            if why is not None:
                raise refusals.workdir_busy(
                    f"the working directory {mine} on {self.machine.name} is busy: live run "
                    f"{other.id} (slot {other.slot}) {why}; either run could rewrite what the "
                    "other's agent reads or is granted",
                    f"wait for run {other.id} to end (`saphan runs show {other.id}`), or work "
                    "in a directory of its own; if its holder is gone, `saphan runs finalize "
                    f"{other.id}`")

    def _control_dir(self, run_id: str) -> str:
        """The run's far control directory, as the far machine resolves it."""
        far = self._far()
        install = far.pf.get("install_real") or posixpath.join(
            far.pf.get("home_real") or "~", ".saphan")
        return posixpath.join(install, self.root.split("/", 1)[1], "runs", run_id)

    def liveness(self) -> RemoteCheck | None:
        return self.ctx.remote_liveness(self.machine)

    # -- after the seat ------------------------------------------------------------
    def prepare(self, record: dict[str, Any]) -> None:
        """The Policy from the preflight's answers, rendered for the launcher
        (or, for Codex, into its own sandbox's pinned settings)."""
        far, name, slot = self._far(), self.machine.name, self.slot
        self._exclusive(record["id"])
        self.ctx.workspace.run_dir(record["id"]).mkdir(parents=True, exist_ok=True)
        pf = far.pf
        rwd = pf.get("workdir") or self.workdir
        writable = [rwd]
        notes: list[str] = []
        if slot.tool == "claude" and not self._vendor():
            if self.leaf is not None:
                writable.append(self.leaf)
                notes.append(f"session directory {self.leaf} on {name} is writable: this run "
                             "can be resumed")
                if self.session_env is not None:
                    writable.append(self.session_env)
                else:
                    notes.append(f"Claude Code's session-env directory for this session on "
                                 f"{name} could not be made "
                                 f"({pf.get('session_env_unresolved') or 'no answer'}): its "
                                 "shell commands may fail")
            else:
                notes.append(
                    f"this run cannot be resumed: the preflight on {name} could not resolve its "
                    f"session directory ({pf.get('session_unresolved') or 'no answer'}), so no "
                    "session directory was granted"
                )
        if slot.tool == "codex" and pf.get("git_dir") == posixpath.join(rwd, ".git"):
            # Codex's sandbox holds .git read-only unless it is named writable;
            # under the far Landlock boundary it is writable anyway (docs)
            writable.append(posixpath.join(rwd, ".git"))
        # Codex's own sandbox can hide the runs' far control directories from
        # its commands (not the install: its sandbox helper is the delivered
        # codex itself, exec'd from there — measured)
        runs = posixpath.dirname(self._control_dir(record["id"]))
        policy = Policy(
            workdir=rwd,
            writable_dirs=tuple(dict.fromkeys(writable)),
            writable_literals=pf.devices,
            scratch_dir=posixpath.join(rwd, ".saphan-run", "tmp"),
            hidden_dirs=(runs,) if slot.tool == "codex" else (),
            notes=tuple(notes),
        )
        adapter = self.adapter
        if adapter is None:
            self.policy_json = landlock.render(policy, agent_sha256=far.agent_sha)
            record.update(self._landlock_record(policy))
            return
        self.argv = argv = adapter.argv(policy)
        adapter.guard(argv)
        if adapter.tool == "loop":
            from saphan.loop.adapter import LoopAdapter

            assert isinstance(adapter, LoopAdapter)
            self.loop_spec = adapter.spec_bytes(policy)
        if self._vendor():
            self.policy_json = None
            record.update(self._vendor_record(policy))
        else:
            self.policy_json = landlock.render(policy, agent_sha256=adapter.binary.sha256)
            record.update(self._landlock_record(policy))
        record.update({"argv": argv, **adapter.record(policy)})
        from saphan.site import far_agent

        keep, sent = far_agent.frame_env(adapter, record["id"])
        record["environment"] = {"kept_from_far": list(keep),
                                 "set": sorted({*sent, "TMPDIR"}),
                                 "channel": "values crossed the SSH channel's stdin into the "
                                            "launcher (--stdin-frame), never a command line, "
                                            "a far file or the far environment"}

    def _vendor(self) -> bool:
        """The agent confines itself (Codex; Claude Code under run.confinement = vendor)."""
        return self.adapter is not None and (
            self.slot.tool == "codex" or (self.slot.tool == "claude" and self.mode == "vendor"))

    def _landlock_record(self, policy: Policy) -> dict[str, Any]:
        far, name = self._far(), self.machine.name
        return {
            "enforced_by": {
                "mechanism": "landlock", "version": f"abi {far.level}", "abi": far.level,
                "machine": name, "executable": far.delivered["path"],
                "executable_sha256": far.launcher_sha,
                "launcher_version": far.pf.get("launcher_version"),
                "policy_json": self.policy_json,
            },
            "policy": policy.as_record(),
            "writable": policy.writable_set(),
            "notes": [*policy.notes, NOT_RESTRICTED],
            # confine/network.py refused `off` before the seat: nothing here cuts it
            "network": "not restricted",
        }

    def _vendor_record(self, policy: Policy) -> dict[str, Any]:
        """What a vendor-confined far run records: the tool's sandbox, what
        was pinned, and that the engine claims nothing (nothing it composed
        confines the agent; its launcher only supervises the run's processes)."""
        far, name, adapter = self._far(), self.machine.name, self.adapter
        assert adapter is not None
        binary = adapter.binary
        out: dict[str, Any] = {
            "mechanism": f"vendor:{adapter.tool}", "version": binary.version,
            "machine": name, "executable": binary.path, "executable_sha256": binary.sha256,
            "engine_claim": "none: the engine makes no claim that the agent is confined; "
                            f"{adapter.tool}'s own sandbox is what confines the commands it "
                            "runs (not the tool's own process or its helpers)",
            "supervised_by": {"executable": far.delivered["path"], "verb": "reap",
                              "executable_sha256": far.launcher_sha},
        }
        if adapter.tool == "codex":
            from saphan.tools import codex

            assert isinstance(adapter, codex.CodexAdapter)
            settings = codex.settings(policy, run_id=adapter.run_id, model=adapter.model,
                                      network=adapter.network, provider=adapter.provider,
                                      credentials=adapter.credentials,
                                      mcp_servers=adapter.mcp_servers)
            out.update({
                "enforced": f"the vendor's sandbox (Codex CLI's own, on {name}'s kernel), not "
                            "the engine's",
                "landlock_measured": {"abi": far.level, "why": "Codex's sandbox needs the "
                                      "runner's Landlock: composed only behind the same gate"},
                "pinned_settings": [f"{k}={v}" for k, v in settings],
                "validated_by": "--strict-config",
            })
            note = codex.NOT_RESTRICTED
        else:
            from saphan.tools import claude

            note = claude.VENDOR_NOTE
        return {"enforced_by": out, "policy": policy.as_record(),
                "writable": [] if adapter.tool != "codex" else policy.writable_set(),
                "notes": [*policy.notes, note], "network": "not restricted"}

    def start(self, record: dict[str, Any], end: RunEnd) -> None:
        """The far script over the connection; output streams back live.

        Nothing the far process prints is interpreted: its holder (pid, start
        time, boot id) and the launcher's control lines are read from files
        in the run's far control directory, over channels of their own
        (far.install_dir; the Landlock domain keeps it unwritable)."""
        from saphan.site import far as far_side

        far, run_id = self._far(), record["id"]
        run_dir = self.ctx.workspace.run_dir(run_id)
        adapter = self.adapter
        files: list[tuple[str, bytes]] = []
        rwd = far.pf.get("workdir") or self.workdir
        if adapter is None:
            keep: tuple[str, ...] = (*BASE, *LOCALE)
            sent: dict[str, str] = {"SAPHAN_RUN_ID": run_id}
            stdin: bytes | None = None
            limit: float | None = None
        else:
            from saphan.site import far_agent

            keep, sent = far_agent.frame_env(adapter, run_id)
            if self.policy_json is None:  # supervised only: the launcher sets no TMPDIR
                sent["TMPDIR"] = posixpath.join(rwd, ".saphan-run", "tmp")
            stdin = self.prompt.encode()
            limit = adapter.time_limit()
            if adapter.tool == "claude":
                from saphan.tools import claude

                files.append((claude.SETTINGS_FILE, claude.settings_bytes()))
            elif adapter.tool == "loop":
                # the loop's stdin is its key; its task is in the spec
                stdin = adapter.stdin_bytes()
                files.append(("loop-spec.json", self.loop_spec))
            (run_dir / "prompt.txt").write_text(self.prompt, encoding="utf-8")
        if files:
            # on channels of their own: no far command line holds them
            far_side.write_run_files(far.conn, self.root, run_id, files)
        script = run_script(
            launcher=far.delivered["path"], launcher_sha256=far.launcher_sha,
            policy_json=self.policy_json, argv=self.argv if adapter is not None else far.argv,
            run_id=run_id, root=self.root, precreated=bool(files),
            scratch_in=rwd if adapter is not None and self.policy_json is None else None,
            return_in=rwd if (adapter is not None and adapter.tool == "loop")
            or self.measure is not None else None,
        )
        record["output"] = {"stdout": str(run_dir / "stdout.log"),
                            "stderr": str(run_dir / "stderr.log")}
        view: View | Escaped | None = None
        if self.stream and (sys.stdout.isatty() or sys.stderr.isatty()):
            from saphan.run.view import escaped_for_tool, for_tool

            # what the far run writes reaches a terminal escaped (or as the view)
            tool = self.slot.tool
            view = ((for_tool(tool, workdir=rwd) if self.view else None)
                    or escaped_for_tool(tool))
        try:
            finished = far.conn.stream(script, run_dir=str(run_dir), stream=self.stream,
                                       on_started=lambda: self._read_holder(record),
                                       stdin=far_side.frame(keep=keep, env=sent, stdin=stdin),
                                       time_limit=limit,
                                       term_out=view.out if view else None,
                                       term_err=view.err if view else None)
        except TransportError as lost:
            if "pid" not in self.seen:
                raise
            # The far process was started and may run on: follow it over a new
            # connection, or leave its seat held (never freed on doubt).
            self._follow(record, end, lost)
            return
        except Interrupted as e:
            if e.exit_code is None and "pid" in self.seen:
                # Hung up, it did not end within the grace (a command that
                # ignores SIGHUP): it is ended there before it is recorded
                # ended, or its row stays live (review: a far run outlived its
                # record and its seat was handed out again).
                self._end_far_tree(record)
            # What the far launcher reported is the command's status (or
            # none, when it started nothing or said nothing), never the SSH
            # channel's: as for a local run (site/local.py)
            said = RunEnd()
            said.exit_code = e.exit_code
            self._collect_status(record, said, required=False)
            e.exit_code = said.exit_code
            raise
        finally:
            if view is not None:
                with suppress(OSError, ValueError):
                    view.finish()
        end.exited(finished.exit_code)
        self._collect_status(record, end)
        if self.measure is not None:
            from saphan.measure import collect

            record["measure"] = collect.far(
                self.measure, far.conn, out_dir=posixpath.join(rwd, ".saphan-run", run_id),
                workdir=rwd, repository=rwd, run_dir=str(run_dir),
                exit_code=end.exit_code)
        if adapter is not None:
            self._collect_agent(record, end, finished.stdout_path, end.exit_code,
                                killed_at=limit if finished.killed_at_limit else None)
        far_side.forget_run(far.conn, self.root, run_id)

    def _collect_agent(self, record: dict[str, Any], end: RunEnd, stdout_path: str,
                       exit_code: int | None, *, killed_at: float | None) -> None:
        """What the agent's output says (read here, from the streamed log),
        and for Claude Code its transcript, digested on the runner."""
        from saphan.site import far as far_side

        adapter = self.adapter
        assert adapter is not None
        facts = adapter.after_exit(stdout_path, exit_code)
        notes = facts.pop("notes", [])
        record.update(facts)
        if notes:
            record["notes"] = [*record.get("notes", []), *notes]
        end.outcome = adapter.outcome(facts) or end.outcome
        if killed_at is not None:
            end.outcome = "time-limit-killed"
            record["notes"] = [*record.get("notes", []), (
                f"the engine hung the run up at its time limit ({killed_at:.0f} s): the tool "
                "had not ended within its own budget")]
        if adapter.tool == "loop":
            from saphan.loop.adapter import LoopAdapter

            assert isinstance(adapter, LoopAdapter)
            # the run's own return directory (made new for it): read, then removed
            raw = far_side.read_run_file(self._far().conn, adapter.out_dir, "loop-result.json",
                                         remove=True)
            facts = adapter.facts_from(raw)
            record.update(facts)
            end.outcome = adapter.outcome(facts) or end.outcome
        if adapter.tool == "claude" and self.leaf is not None:
            session = getattr(adapter, "session_id", "")
            record["claude_transcript"] = far_side.transcript_sha256(
                self._far().conn, self.leaf, str(session))

    def _read_holder(self, record: dict[str, Any]) -> None:
        """The far process, as the far script wrote it before the launcher
        started: the seat's holder from here on."""
        from saphan.site import far as far_side

        far, run_id = self._far(), record["id"]
        pid, ticks, boot = far_side.read_holder(far.conn, self.root, run_id)
        self.seen.update({"pid": pid, "start_ticks": ticks, "boot_id": boot})
        record["far_process"] = dict(self.seen)
        self.ctx.store.set_holder(run_id, (far_side.holder_host(self.machine), pid, ticks, boot))

    def _end_far_tree(self, record: dict[str, Any], wait: float = 10.0) -> None:
        """SIGKILL the far launcher's children (it then ends the rest of the
        tree and itself) and wait for the holder to be gone; if it cannot be
        seen gone, the row stays live with it as its holder (``settle``)."""
        from saphan.liveness import Holder
        from saphan.site import far as far_side

        far = self._far()
        holder = Holder(far_side.holder_host(self.machine), int(self.seen["pid"]),
                        int(self.seen["start_ticks"]), str(self.seen["boot_id"]))
        try:
            sent = far_side.signal_holder(far.conn, holder, "KILL", children=True)
            deadline = time.monotonic() + wait
            while True:
                verdict = far_side.holder_liveness(far.conn, holder)
                if verdict.state == "dead":
                    record["notes"] = [*record.get("notes", []), (
                        f"the far run did not end when hung up; saphan ended it on "
                        f"{self.machine.name} ({sent}) before recording it")]
                    return
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        except TransportError:
            pass
        self.leave_live = self.hung_up = True

    def _collect_status(self, record: dict[str, Any], end: RunEnd, *,
                        conn: Any = None, required: bool = True) -> list[str]:
        """The launcher's status file, held against what was sent."""
        from saphan.site import far as far_side
        from saphan.site import launcher_status

        far = self._far()
        try:
            raw = far_side.read_status(conn or far.conn, self.root, record["id"])
        except TransportError as e:
            if required:
                raise
            record["notes"] = [*record.get("notes", []), f"the launcher's status on "
                               f"{self.machine.name} could not be read: {e}"]
            return []
        lines = launcher_status.lines_of(raw)
        record["output"]["status_far"] = lines
        confined = self.policy_json is not None
        launcher_status.apply(lines, launcher_status.Expected(
            landlock=confined, writable=tuple(record["writable"]) if confined else (),
            abi=far.level if confined else None, self_sha256=far.launcher_sha,
        ), record, end, where=self.machine.name)
        return lines

    def _follow(self, record: dict[str, Any], end: RunEnd, lost: TransportError) -> None:
        """The connection was lost while the far process ran: dial again and
        wait for it to end, then record what its launcher reported. If the
        machine cannot be reached, the row stays live (``settle``)."""
        from saphan.liveness import Holder
        from saphan.site import far as far_side
        from saphan.site import launcher_status

        name = self.machine.name
        at = now_iso()
        record["connection_lost"] = {"at": at, "error": str(lost)}
        self.leave_live = True
        holder = Holder(far_side.holder_host(self.machine), int(self.seen["pid"]),
                        int(self.seen["start_ticks"]), str(self.seen["boot_id"]))
        try:
            conn = self.ctx.ssh(self.machine)
            while True:
                verdict = far_side.holder_liveness(conn, holder)
                if verdict.state == "dead":
                    break
                if verdict.state == "unknown":
                    raise TransportError(name, verdict.evidence)
                time.sleep(FOLLOW_INTERVAL)
            lines = self._collect_status(record, end, conn=conn)
        except TransportError as e:
            record["connection_lost"]["follow_error"] = str(e)
            return
        self.leave_live = False
        code = launcher_status.exit_code(lines)
        if code is None:
            end.outcome = "failed"
            record["notes"] = [*record.get("notes", []), (
                f"the connection to {name} was lost at {at}; the far process has ended since, "
                "but its launcher reported no exit status")]
        else:
            end.exited(code)
            record["notes"] = [*record.get("notes", []), (
                f"the connection to {name} was lost at {at}; saphan dialled again and waited "
                "for the far process to end: output it wrote after the loss is not in this "
                "record")]
        far_side.forget_run(conn, self.root, record["id"])

    def interrupted(self, e: Interrupted) -> str:
        return f"{e}: the far process on {self.machine.name} was hung up (SIGHUP)"

    def settle(self, record: dict[str, Any], end: RunEnd) -> bool:
        """True when the far process may still run and nothing here could
        follow it: its row stays live, recorded as connection-lost."""
        if self.leave_live and "connection_lost" not in record and self.hung_up:
            record["notes"] = [*record.get("notes", []), (
                f"the far process (pid {self.seen.get('pid')}) on {self.machine.name} did not "
                "end when hung up, nor could saphan see it gone after SIGKILL: the seat stays "
                "held by it until conflict handling finds it dead or `saphan runs cancel ID` "
                "ends it there")]
        elif self.leave_live:
            # The row stays live, so its outcome is not decided yet (the
            # signed record holds the row's columns): connection_lost says why.
            record.setdefault("connection_lost", {"at": now_iso()})["followed"] = False
            record["notes"] = [*record.get("notes", []), (
                f"the connection to {self.machine.name} was lost while the far process "
                f"(pid {self.seen.get('pid')}) ran, and it could not be followed; the seat "
                "stays held by it until conflict handling finds it dead (read on that "
                "machine by pid, start time and boot id) or `saphan runs cancel ID` ends it "
                "there"
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
             argv: list[str], wd: str, *, agent: bool = False,
             session: str | None = None, resuming: bool = False,
             also: str | None = None) -> _Far:
    """The gate on the machine's row, then one dial: the far workdir, the
    launcher and the command, each checked. What was learned goes into
    ``base`` (the run's record), so a refusal's record carries it.
    ``agent``: argv[0] is an agent tool's absolute path, checked by the
    caller (site/far_agent.far_binary); ``session``: the Claude Code
    session this run has (``resuming``: its transcript is digested there)."""
    from saphan.site import far as far_side

    name = machine.name
    # Every tool, Codex included: its own sandbox needs the runner's Landlock.
    level, value = gate_row(name, ctx.verified_fact(name, LANDLOCK_FACT))
    delivered = _delivered(ctx, name)
    conn = ctx.ssh(machine)
    pf = far_side.preflight(conn, workdir=wd, launcher_path=delivered["path"],
                            tool=slot.tool, agent=argv[0], session=session,
                            resuming=resuming, also=also,
                            launcher_sha256=delivered.get("sha256"), pin=slot.agent_sha256)
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
    if agent:
        return _Far(level, delivered, conn, pf, launcher_sha, list(argv),
                    pf.get("agent_sha256") or "")
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
    if far is None and pf.get("digest_tool_missing") is not None:
        raise refusals.digest_mismatch(
            f"{name} has no SHA-256 tool (neither sha256sum nor shasum is on its PATH), so "
            f"the launcher {delivered['path']} cannot be verified there",
            f"install coreutils (sha256sum) or perl's shasum on {name}",
        )
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
    """The far working directory, as it resolves there, must not be what a
    run must never hold in its writable set (``workdir-unsafe``, by name):

    - ``/``, the far user's $HOME itself, or a temporary root (/tmp,
      /var/tmp, /dev/shm, $TMPDIR) itself: a grant of everything;
    - anything under ``~/.ssh`` or holding it: the run could append to
      authorized_keys (measured) or rewrite the client config;
    - the install directory ``~/.saphan`` (the launcher, each run's control
      directory), inside or around it: a run could replace the program that
      confines it, or forge another run's holder and status.
    """
    rwd = pf.get("workdir") or ""

    def within(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")

    def refuse(what: str, fix: str) -> Refusal:
        return refusals.workdir_unsafe(f"the working directory {rwd} on {name} {what}", fix)

    elsewhere = "use a directory of its own for the run (e.g. ~/work/<project>)"
    if rwd == "/":
        raise refuse("is the root directory: every file the far user can write would be "
                     "writable", elsewhere)
    home = pf.get("home_real")
    if home and rwd == home:
        raise refuse(f"is the far user's home directory itself ({home}): its shell "
                     "start-up files, ~/.ssh and saphan's install would be writable", elsewhere)
    if rwd in pf.tmp_roots:
        raise refuse("is a temporary root itself, shared with every process of the machine",
                     f"{elsewhere}, or a directory under {rwd}")
    for key, what in (("ssh_real", "the far user's SSH directory"),
                      ("install_real", "saphan's install directory (the launcher, every "
                                       "run's control files)"),
                      ("launcher_dir_real", "saphan's launcher directory")):
        guarded = pf.get(key)
        if not guarded:
            continue
        if within(rwd, guarded):
            raise refuse(f"lies inside {what} {guarded}", elsewhere)
        if within(guarded, rwd):
            raise refuse(f"contains {what} {guarded}; a run there could rewrite it",
                         elsewhere)


def _agent(name: str, pf: Preflight, argv0: str, wd: str) -> tuple[str, str]:
    path, digest = pf.get("agent_path"), pf.get("agent_sha256")
    if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise refusals.digest_mismatch(
            f"{argv0!r} on {name} could not be digested there (the answer was not a SHA-256)",
            f"make it readable by the far user on {name}")
    if path is None or digest is None:
        raise UserError(
            f"command {argv0!r} not found on {name} (its PATH, from {wd}); give its absolute "
            "path on that machine"
        )
    return path, digest


def run_script(*, launcher: str, launcher_sha256: str, policy_json: str | None,
               argv: list[str], run_id: str, root: str, precreated: bool = False,
               scratch_in: str | None = None, return_in: str | None = None) -> str:
    """The far side of a run, for /bin/sh.

    1. the run's control directory (<root>/runs/<run id>, made new, owner
       only), outside every grant — or, ``precreated``, the one
       :func:`saphan.site.far.write_run_files` made with the files the agent
       reads there (never a secret, never on a command line);
    2. ``scratch_in`` (a working directory, for a run whose launcher does not
       make its scratch directory: Codex, supervised by ``reap``): its
       ``.saphan-run/tmp``; ``return_in``: the run's own return directory
       there, ``.saphan-run/<run id>``, made new (the loop's result) — each
       without going through a link;
    3. the holder: this shell's pid, start time (field 22 of /proc/PID/stat)
       and boot id, written there BEFORE anything of the run starts — the
       shell then execs the launcher, which keeps its pid and start time;
    4. the launcher (``exec`` with a policy: the Landlock domain; ``reap``
       without: supervision only), which proves its own digest
       (``--expect-sha256``: it hashes /proc/self/exe, the file actually
       running) before it reads anything of the channel, then reads the
       run's frame from stdin (``--stdin-frame``, far.frame: the command's
       environment, its secrets, its stdin — never on a command line, in a
       file or in the launcher's own environment), and keeps the rest of the
       channel's stdin as the lifeline: a ``stop`` line (Ctrl-C/SIGTERM to
       saphan) hangs the run up (the launcher forwards SIGHUP to the
       command, then kills what is left); a lifeline that only ends (a lost
       connection, saphan gone) stops nothing: the run goes on and its
       holder keeps the seat. Every control line goes to ``status`` (fd 4).

    The script's own tools come from the system's directories
    (transport/ssh.sh); the far user's PATH, its relative entries dropped,
    is what the launcher (and so a ``keep PATH`` of the frame) gets.
    """
    q = shlex.quote
    d = f'"$HOME"/{q(root)}/runs/{q(run_id)}'
    verb = "exec" if policy_json is not None else "reap"
    opts = ["--expect-sha256", launcher_sha256, "--status-fd", "4", "--stdin-frame"]
    if policy_json is not None:
        opts += ["--policy", policy_json]
    cmd = " ".join(q(a) for a in [launcher, verb, *opts, "--", *argv])
    made = ('[ -d "$D" ] && [ ! -L "$D" ] || {\n'
            '  echo "saphan-far: the run\'s control directory $D is not there" >&2; exit 125; }'
            if precreated else
            f'mkdir -p "$HOME"/{q(root)}/runs && mkdir "$D" || {{\n'
            '  echo "saphan-far: cannot create the run\'s control directory $D" >&2; exit 125; }')
    dirs = ""
    for base, leaf, what in ((scratch_in, "tmp", "scratch"), (return_in, run_id, "return")):
        if base is None:
            continue
        # the scratch may be there from an earlier run; a return directory is new
        last = ("{ [ -d tmp ] || mkdir tmp; }" if leaf == "tmp" else f"mkdir -- {q(leaf)}")
        dirs += f"""\
( cd -P -- {q(base)} && [ ! -L .saphan-run ] && {{ [ -d .saphan-run ] || mkdir .saphan-run; }} \\
  && cd -P .saphan-run && [ ! -L {q(leaf)} ] && {last} ) || {{
  echo "saphan-far: cannot make the {what} directory {q(base)}/.saphan-run/{q(leaf)}" >&2; exit 125; }}
"""
    return f"""\
set -u
umask 077
KP=
saved_ifs=$IFS; IFS=:; set -f
for e in ${{UP:-}}; do case $e in /*) KP=${{KP:+$KP:}}$e ;; esac; done
IFS=$saved_ifs; set +f
D={d}
{made}
{dirs}t=$(sed 's/.*) //' "/proc/$$/stat" | cut -d' ' -f20)
b=$(cat /proc/sys/kernel/random/boot_id)
printf '%s %s %s\\n' "$$" "$t" "$b" > "$D/holder.tmp" && mv -f "$D/holder.tmp" "$D/holder" || exit 125
PATH=${{KP:-/usr/bin:/bin}} exec {cmd} 4>"$D/status"
"""
