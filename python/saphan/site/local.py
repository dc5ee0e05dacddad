"""The local site: a run on this host.

Before the seat (``inspect``): the working directory exists (or the
repository a worktree will be made from resolves), lies apart from every
workspace, and the tool's adapter is prepared (tools/registry.py). After it:
``prepare`` composes the boundary from the one derived Policy (bubblewrap,
Seatbelt, the local Landlock boundary, or the tool's own sandbox), ``start``
runs it and collects what the run left, ``settle`` releases what the run held
and settles a --repo worktree. The pipeline (run/pipeline.py) finalises the
row whatever happens: a normal exit, a refusal at composition, Ctrl-C or
SIGTERM or SIGHUP to saphan (forwarded to the child first), an unexpected
error. Only SIGKILL leaves a live row (the jail dies with saphan), and the
next saphan command recovers it (run/live.reconcile; conflict handling on the
slot, capacity.py, too).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.confine import environment, network, nofollow, protected
from saphan.confine.compose import Boundary, compose_landlock_local, compose_local
from saphan.confine.grants import (
    LinkedWorktree,
    derive,
    make_run_dirs,
    verify_linked_worktree,
)
from saphan.confine.policy import Policy
from saphan.errors import Interrupted, NotGrantable, PlantedLink, UserError
from saphan.run import request as requests
from saphan.run.end import RunEnd
from saphan.site import launcher_status
from saphan.store.rows import Slot
from saphan.tools import AGENT_TOOLS
from saphan.tools.binaries import check_pin
from saphan.transport import local

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.egress.cut import Cut
    from saphan.liveness import RemoteCheck
    from saphan.measure.order import Order
    from saphan.run.view import Escaped, View
    from saphan.tools.adapter import Adapter, CommandAdapter
    from saphan.tools.instruction import Request as AgentRequest
    from saphan.tools.permission_class import PermissionClass
    from saphan.transport.local import Finished
    from saphan.worktrees import RepoSpec

#: What each mechanism does not restrict, written into every record it enforces
#: (:func:`not_restricted`: network egress joins the list unless it was cut).
NOT_RESTRICTED = {
    "bubblewrap": ("reads (anything this user can read, except the read denials listed)",),
    "seatbelt": ("reads (except the read denials listed)",),
    "landlock": (
        "reads (Landlock grants reading everywhere; the read denials listed are kept by the "
        "outer bubblewrap)",
        "metadata changes (chmod, chown, timestamps, xattrs) outside the writable set, which "
        "Landlock does not cover at any level",
    ),
}
NETWORK_NOT_RESTRICTED = "network egress (no egress policy declared)"


def not_restricted(mechanism: str, network: str) -> str | None:
    """The record's note on what ``mechanism`` leaves open (None: not one of
    the engine's own; a vendor boundary says its own)."""
    parts = list(NOT_RESTRICTED.get(mechanism, ()))
    if not parts:
        return None
    if network not in ("off", "egress"):
        parts.insert(1, NETWORK_NOT_RESTRICTED)
    listed = (" and ".join(parts) if len(parts) <= 2
              else ", ".join(parts[:-1]) + ", and " + parts[-1])
    return "not restricted by this boundary: " + listed


class LocalSite:
    """One run on this host. ``repo`` makes a detached worktree at ``workdir``
    (a path under the workspace) from that repository; ``request`` carries an
    agent slot's task (or a command slot's permission class)."""

    kind = "local"

    def __init__(self, ctx: Context, slot: Slot, command: list[str], *, workdir: str,
                 mode: str, stream: bool = True, boundary: str | None = None,
                 repo: str | os.PathLike[str] | None = None, base_ref: str | None = None,
                 keep_worktree: bool = True, request: AgentRequest | None = None,
                 view: bool = False, measure: Order | None = None) -> None:
        self.ctx, self.slot, self.command = ctx, slot, command
        #: a measure-base order: the command is its driver (measure/collect.py)
        self.measure = measure
        #: show a claude or codex run's output one line per step (run/view.py)
        self.view = view
        self.workdir, self.mode, self.stream = workdir, mode, stream
        self.boundary_choice, self.repo_arg, self.base_ref = boundary, repo, base_ref
        self.keep_worktree, self.request = keep_worktree, request
        self.adapter: Adapter | None = None
        self.repo: RepoSpec | None = None
        # what prepare() makes and settle() releases
        self.boundary: Boundary | None = None
        self.was_dumpable = False
        self.wt_git_dir: str | None = None
        self.linked: LinkedWorktree | None = None
        self.allowed: tuple[str, ...] = ()
        self.extra_protected: tuple[str, ...] = ()
        self.before: Any = None
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.secret: bytes | None = None
        #: the class's network posture as this path enforces it (confine/network.py)
        self.network = "open"
        self.network_lever: str | None = None
        #: the run's egress cut and door (egress/cut.py), when it declares a policy
        self.cut: Cut | None = None
        self.run_dir = Path()
        self.out_dir = Path()

    # -- before the seat -----------------------------------------------------------
    def inspect(self, base: dict[str, Any]) -> None:
        """The working directory (or the repository), and the tool's adapter."""
        ctx, wd = self.ctx, self.workdir
        if self.repo_arg is not None:
            from saphan import worktrees

            self.repo = worktrees.resolve_repo(os.fspath(self.repo_arg), self.base_ref)
            left = worktrees.not_carried(self.repo)
            if left is not None:
                _warn(self.stream, left)
        if self.repo is None and not os.path.isdir(wd):
            raise refusals.workdir_missing(
                f"the working directory {wd} does not exist on {self.slot.machine}",
                f"create it (`mkdir -p {wd}`) or pass an existing --workdir",
            )
        requests.check_workdir_apart(ctx, wd)
        run_id = base["id"]
        if self.measure is not None:
            self.command = self._measure_command(run_id)
        if self.request is not None and self.slot.tool in AGENT_TOOLS:
            from saphan.tools.launch import prepare

            adapter: Adapter = prepare(ctx, self.slot.tool, self.request, workdir=wd,
                                       run_id=run_id, confinement=self.mode,
                                       run_dir=ctx.workspace.run_dir(run_id), slot=self.slot)
            base["agent"] = adapter.binary.as_record()
        else:
            command = _command_adapter(self.request, self.command, wd, run_id, self.mode)
            adapter = command
            base["agent"] = {"path": command.binary.path, "sha256": command.binary.sha256}
            base["argv"] = list(command.command)
        self.adapter = adapter
        pc = adapter.instruction.permission_class
        self.cut = _cut(self.request, pc, adapter, self._mechanism(adapter))
        if self.cut is not None:
            self.network, self.network_lever = "egress", self.cut.network_note()
        else:
            self.network, self.network_lever = network.posture(
                pc.network if pc is not None else None, tool=adapter.tool,
                mechanism=self._mechanism(adapter))
        from saphan.tools import auth  # the seat's credential against its endpoint

        target = auth.target_for(adapter)  # None for a command slot
        if target is not None and self.cut is not None:
            target = self.cut.auth_target(target)
        if target is not None:
            cfg = self.ctx.config
            base["auth"] = auth.check(target, where=self.slot.machine, token_url=(
                cfg.claude_token_url if adapter.tool == "claude" else
                cfg.codex_token_url if adapter.tool == "codex" else None))

    def _measure_command(self, run_id: str) -> list[str]:
        """The measure-base driver's argv; a scratch path already there is
        refused before the seat (saphan never clones over what it did not make)."""
        from saphan.measure import collect

        order = self.measure
        assert order is not None
        wd = os.path.realpath(self.workdir)
        there = os.path.join(wd, order.scratch)
        try:
            found = nofollow.lexists_plain(there) if self.repo is None else None
        except OSError as e:  # a component is a file, or unreadable
            raise UserError(f"the scratch path {there} cannot be used: {e.strerror}; give "
                            "another --scratch") from None
        if found is not None:
            raise UserError(f"the scratch path {there} already exists; saphan clones only into "
                            "a new path (remove it, or give another --scratch)")
        return collect.command(order, out=str(self.ctx.workspace.run_dir(run_id) / "out"),
                               repository=self.repo.toplevel if self.repo is not None else wd,
                               workdir=wd, far=False)

    def _mechanism(self, adapter: Adapter) -> str:
        """What will confine the run (before the seat: nothing is composed yet)."""
        if adapter.tool == "codex" or (adapter.tool == "claude" and self.mode == "vendor"):
            return f"vendor:{adapter.tool}"
        if self.boundary_choice == "landlock":
            return "landlock"
        return {"Linux": "bubblewrap", "Darwin": "seatbelt"}.get(platform.system(), "none")

    def liveness(self) -> RemoteCheck | None:
        return None  # a holder here is read from this host's /proc

    # -- after the seat ------------------------------------------------------------
    def prepare(self, record: dict[str, Any]) -> None:
        """Compose: the derived Policy, rendered by the chosen boundary; the
        adapter's argv (checked by its guard) and environment."""
        ctx, slot, wd, adapter = self.ctx, self.slot, self.workdir, self._adapter()
        ws = ctx.workspace
        run_id = record["id"]
        agent = record.get("agent") or {}
        if slot.agent_sha256 is not None:
            record["agent"] = {**agent, "pinned_sha256": slot.agent_sha256}
            # Before anything is made for the run: a pinned slot runs only that binary.
            check_pin(slot.machine, slot.name, slot.agent_sha256, str(agent.get("path")),
                      str(agent.get("sha256")))
        self.run_dir = run_dir = ws.run_dir(run_id)
        self.out_dir = out_dir = run_dir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        pc = adapter.instruction.permission_class
        self.allowed = allowed = pc.writable_protected if pc is not None else ()
        repo = self.repo
        if repo is not None:
            from saphan import worktrees

            # Outside the boundary, before it: the kernel would refuse this inside.
            branch = worktrees.create(repo, wd, run_id)
            record["worktree"] = {"repo": repo.toplevel, "path": wd, "branch": branch,
                                  "base": repo.base, "base_ref": repo.base_ref}
            self.linked = linked = _verified_worktree(wd, repo.common_dir)
            self.wt_git_dir = linked.git_dir
            exclude_note = worktrees.ignore_scratch(repo.common_dir)
            hooks = worktrees.tree_hooks_dir(repo)
            if hooks is not None and hooks not in protected.NAMES:
                self.extra_protected = (hooks,)
        else:
            linked = None
            exclude_note = None
            if nofollow.lexists_plain(os.path.join(wd, ".git")) == "dir":
                from saphan import worktrees

                exclude_note = worktrees.ignore_scratch(os.path.join(wd, ".git"))
        self.before = protected.snapshot(wd, self.extra_protected)
        policy = derive(
            wd,
            return_path=str(out_dir),
            session_dirs=adapter.session_dirs(),
            read_denials=(str(ws.key_path), str(ws.config_path), *_identity_files(ctx),
                          *_store_paths(ctx), *adapter.read_denials(),
                          *(self.cut.read_denials() if self.cut is not None else ())),
            hidden_dirs=_hidden_workspaces(ws.home),
            readonly_paths=(*protected.carve_outs(wd, allowed, self.extra_protected),
                            *adapter.exposed_paths()),
            worktree=linked,
            network=self.network,
        )
        if self.cut is not None:
            # the class too, whether or not it names the policy: its network
            # posture decides whether the door answers CONNECT at all
            self.cut.check_apart(policy.writable_dirs, pc.source if pc is not None else None)
            self.cut.door_dir = str(run_dir / "door")
            os.mkdir(self.cut.door_dir, 0o700)
            policy = replace(policy, door_dir=self.cut.door_dir)
            self.adapter = adapter = self.cut.adapter(adapter)
        _check_hidden_pinned(policy)
        if exclude_note is not None:
            policy = replace(policy, notes=(*policy.notes, exclude_note))
        if policy.workdir != os.path.abspath(wd):
            # Named through a link (which an earlier run may have planted):
            # what is granted is the resolved directory, and the operator hears it.
            via = (f"the working directory {wd} resolves through a symbolic link to "
                   f"{policy.workdir}; that directory is what this run may write")
            policy = replace(policy, notes=(*policy.notes, via))
            _warn(self.stream, via)
        vendor = adapter.vendor_boundary(policy)
        if vendor is not None and self.cut is not None:
            from saphan.confine.compose import cut_around

            vendor = cut_around(vendor, policy)
        if vendor is not None:
            boundary = vendor
        elif self.boundary_choice == "landlock":
            boundary = _compose_landlock(ctx, slot.machine, policy, adapter.binary.sha256)
        else:
            boundary = compose_local(policy, run_dir=str(run_dir))
        self.boundary = boundary
        _make_run_dirs(policy, objects=linked is not None)
        argv = adapter.argv(policy)
        record.update(
            {
                "enforced_by": boundary.record(),
                "policy": policy.as_record(),
                "writable": policy.writable_set(),
                "notes": [*policy.notes, not_restricted(boundary.mechanism, policy.network)
                          or boundary.extra["not_restricted"]],
                "network": {"open": "not restricted",
                            "off": f"off: {self.network_lever}"}.get(
                                policy.network, str(self.network_lever)),
                "return_path": str(out_dir),
                "boundary_argv": boundary.prefix,
            }
        )
        record.update({"argv": argv, **adapter.record(policy)})
        self.argv = [*boundary.prefix, *argv]
        adapter.guard(self.argv, agent_at=len(boundary.prefix))
        built = environment.build(
            os.environ,
            allow=adapter.env_allowed(),
            set_vars={**adapter.env_set(), "TMPDIR": policy.scratch_dir, "SAPHAN_RUN_ID": run_id,
                      "SAPHAN_RETURN_PATH": str(out_dir), **dict(policy.setenv)},
        )
        record["environment"] = {"passed": list(built.passed), "set": list(built.set)}
        self.env = adapter.environment(built.env)
        self.secret = adapter.stdin_bytes()
        if self.cut is not None:
            self.env = self.cut.environment(self.env)
            record["environment"]["set"] = sorted({*record["environment"]["set"],
                                                   *self.cut.variables()})
            record["egress"] = self.cut.record()
            # Last: listening before the jail starts (its bridge connects once
            # at start), stopped by settle() whatever happens after this.
            self.cut.start(str(run_dir / "egress.log"))

    def start(self, record: dict[str, Any], end: RunEnd) -> None:
        """Run it; every process of the run is gone when this returns."""
        adapter, boundary, wd = self._adapter(), self._boundary(), self.workdir
        if self.secret is not None or (self.cut is not None and self.cut.secrets):
            # This process holds the key (or an egress route's secret) (and maybe the operator's export of
            # it): while the run lasts, no same-user process may read its
            # memory or environ. Restored when the run ends.
            self.was_dumpable = local.set_dumpable(False)
        limit = adapter.time_limit()
        made = None
        if self.measure is not None:
            from saphan.measure import scratch

            # what the clone will create: the run's, removed after it if left
            try:
                made = scratch.first_missing(wd, self.measure.scratch)
            except (PlantedLink, OSError):
                made = None  # reached through a link: saphan removes nothing there
        view: View | Escaped | None = None
        if self.stream and (sys.stdout.isatty() or sys.stderr.isatty()):
            from saphan.run.view import escaped_for_tool, for_tool

            # the view, or the raw streams with what reaches a terminal
            # escaped: every tool's, a command's included (the run writes them)
            view = ((for_tool(adapter.tool, workdir=os.path.realpath(wd)) if self.view
                     else None) or escaped_for_tool(adapter.tool))
        try:
            finished = local.run(
                self.argv, cwd=wd, run_dir=str(self.run_dir), env=self.env,
                stream=self.stream, stdin_path=adapter.stdin_path,
                stdin_bytes=self.secret, time_limit=limit, status_fd=boundary.status_fd,
                lifeline_fd=boundary.lifeline_fd,
                pass_fds=boundary.fds, term_out=view.out if view else None,
                term_err=view.err if view else None,
            )
        except Interrupted as e:
            # Interrupted, the run still ended under its launcher: what the
            # launcher confirmed (or not) is recorded all the same.
            if boundary.status_fd is not None:
                path = str(self.run_dir / "status.log")
                record["output"] = {"status": path}
                said = RunEnd()
                said.exit_code = e.exit_code
                with suppress(refusals.Refusal):
                    self._apply_status(path, record, said)
                # what the launcher reported: the command's status, or none
                # when it started nothing
                e.exit_code = said.exit_code
            raise
        finally:
            if view is not None:
                # what was left of a line, and the summary; a terminal that is
                # gone (a hangup) loses them, the logs keep every byte
                with suppress(OSError, ValueError):
                    view.finish()
        # Every process of the run is gone here (its PID namespace ended with
        # it, or the launcher reaped what was left): only now is it recorded.
        end.exited(finished.exit_code)
        self._collect(finished, record, end, limit)
        if self.measure is not None:
            from saphan.measure import collect

            record["measure"] = collect.local(
                self.measure, out_dir=str(self.out_dir), workdir=os.path.realpath(wd),
                repository=(self.repo.toplevel if self.repo is not None
                            else os.path.realpath(wd)), run_dir=str(self.run_dir),
                exit_code=end.exit_code, made=made)

    def _collect(self, finished: Finished, record: dict[str, Any], end: RunEnd,
                 limit: float | None) -> None:
        adapter, wd = self._adapter(), self.workdir
        record["output"] = {"stdout": finished.stdout_path, "stderr": finished.stderr_path}
        if finished.status_path is not None:
            record["output"]["status"] = finished.status_path
            self._apply_status(finished.status_path, record, end)
        # the command's status as the launcher reported it (_apply_status)
        facts = adapter.after_exit(finished.stdout_path, end.exit_code)
        notes = facts.pop("notes", [])
        record.update(facts)
        if notes:
            record["notes"] = [*record["notes"], *notes]
        end.outcome = adapter.outcome(facts) or end.outcome
        if finished.killed_at_limit:
            end.outcome = "time-limit-killed"
            record["notes"] = [*record["notes"], (
                f"the engine killed the run at its time limit ({limit or 0:.0f} s): the tool "
                "had not ended within its own budget")]
        try:
            changes = protected.changes(self.before,
                                        protected.snapshot(wd, self.extra_protected))
        except (OSError, RecursionError, ValueError) as e:
            changes = [{"name": "(protected files)", "what": "unverified",
                        "detail": f"the snapshot after the run failed: {e}"}]
        if self.linked is not None:
            # A checkout holds no nested repository: one the run made would run
            # its own config for whoever later works in that directory.
            changes += [{"name": n, "what": "nested-git"} for n in _nested_git(wd)]
        if changes:
            record["protected_changes"] = changes
            _warn(self.stream, "this run changed files other tools load or execute: "
                  + protected.summarize(changes))

    def _apply_status(self, path: str, record: dict[str, Any], end: RunEnd) -> None:
        """The launcher's status lines held against what was composed; a
        status file that cannot be read confirms nothing."""
        boundary = self._boundary()
        try:
            with open(path, "rb") as f:
                lines = launcher_status.lines_of(f.read(launcher_status.LIMIT))
        except OSError as e:
            lines = []
            record["notes"] = [*record.get("notes", []),
                               f"the launcher's status file {path} could not be read: {e}"]
        landlock = boundary.mechanism == "landlock"
        launcher_status.apply(lines, launcher_status.Expected(
            landlock=landlock,
            writable=tuple(boundary.policy.writable_set()) if landlock else (),
            abi=boundary.extra.get("abi") if landlock else None,
            # the jail's first process: the launcher (Landlock) or its reaper
            self_sha256=(boundary.executable_sha256 if landlock
                         else (boundary.extra.get("reaper") or {}).get("sha256")),
        ), record, end)

    def interrupted(self, e: Interrupted) -> str:
        return str(e)

    def settle(self, record: dict[str, Any], end: RunEnd) -> bool:
        """Close the boundary's descriptors, restore dumpability, settle the
        worktree. A local run's row never stays live past this."""
        if self.boundary is not None:
            self.boundary.close()
        if self.cut is not None:
            summary = self.cut.stop()
            if summary is not None and "egress" in record:
                record["egress"]["door"]["summary"] = summary
        if self.was_dumpable:
            local.set_dumpable(True)
        repo = self.repo
        if repo is not None and "worktree" in record:
            try:
                _settle_worktree(record["worktree"], repo, self.workdir, self.keep_worktree,
                                 git_dir=self.wt_git_dir, run_dir=str(self.run_dir),
                                 run_id=record["id"], allowed=self.allowed,
                                 extra=self.extra_protected, stream=self.stream)
            except Exception as e:  # the row is finalised whatever happened here
                record["worktree"]["settle_error"] = f"{type(e).__name__}: {e}"
                _warn(self.stream, f"the run's worktree could not be settled: {e}")
        return False

    def _boundary(self) -> Boundary:
        if self.boundary is None:
            raise RuntimeError("LocalSite.prepare() composes the boundary before the start")
        return self.boundary

    def _adapter(self) -> Adapter:
        if self.adapter is None:
            raise RuntimeError("LocalSite.inspect() prepares the adapter before the seat")
        return self.adapter


def _cut(request: AgentRequest | None, pc: PermissionClass | None, adapter: Adapter,
         mechanism: str) -> Cut | None:
    """The run's egress cut (None: it declares no policy), checked before the
    seat: refused where it cannot be enforced, its secrets read."""
    named = request.egress_policy if request is not None else None
    by_class = pc.egress_policy if pc is not None else None
    if named is not None and by_class is not None \
            and os.path.realpath(named) != os.path.realpath(by_class):
        raise UserError(f"--egress-policy {named} and the permission class's egress_policy "
                        f"{by_class} differ; give one (the class's applies without the option)")
    path = named or by_class
    if path is None:
        return None
    from saphan.egress import cut, policy

    cut.refuse_unless_cuttable(tool=adapter.tool, mechanism=mechanism, where="local")
    made = cut.Cut(policy.load(path), tool=adapter.tool,
                   routes_only=pc is not None and pc.network == "off")
    if made.routes_only and adapter.tool in ("claude", "loop") and made.route is None:
        raise refusals.network_posture_unenforceable(
            f"the permission class says `network: off`, so the door of egress policy {path} "
            f"serves only its credential routes, and none serves the {adapter.tool} agent: it "
            "could not reach its model endpoint",
            f'add a route with "tool": "{adapter.tool}" to the policy (`saphan egress check '
            f'{path}`), or say `"network": "open"` in the class (the door then also answers '
            "the policy's allow-list)",
        )
    made.check_route(adapter)
    made.read_secrets(os.environ)
    return made


def _command_adapter(request: AgentRequest | None, command: list[str], wd: str,
                     run_id: str, mode: str) -> CommandAdapter:
    """A command slot's adapter: argv[0] resolved and digested, its permission
    class (if any) loaded and checked — all before the seat."""
    from saphan import _native
    from saphan.tools.adapter import CommandAdapter
    from saphan.tools.binaries import AgentBinary
    from saphan.tools.instruction import Instruction

    pc = None
    if request is not None and request.permission_class is not None:
        pc = requests.command_class(request.permission_class, command[0], wd)
    path = _resolve_command(command[0])
    return CommandAdapter(
        AgentBinary("command", path, _native.sha256_file(path), ""),
        Instruction(prompt_path="", workdir=os.path.realpath(wd), permission_class=pc),
        mode, run_id, command=(path, *command[1:]),
    )


def _resolve_command(argv0: str) -> str:
    resolved = shutil.which(argv0, path=os.environ.get("PATH"))
    if resolved is None:
        raise UserError(f"command {argv0!r} not found on PATH; give its absolute path")
    return os.path.abspath(resolved)


def _compose_landlock(ctx: Context, machine: str, policy: Policy, agent_sha256: str) -> Boundary:
    """The gate, then the launcher that measured the row, then the composition."""
    from saphan import launcher
    from saphan.confine.landlock_gate import FACT_KIND, gate_row

    level, value = gate_row(machine, ctx.verified_fact(machine, FACT_KIND))
    ident = launcher.identity()
    if ident is None:
        raise refusals.confinement_unavailable(
            "saphan-launcher is not installed on this machine, so no Landlock domain can "
            "be applied",
            "reinstall saphan (ci/setup builds and packages the launcher), then "
            f"`saphan machine probe-confinement {machine}`",
        )
    if ident.sha256 != value.get("launcher_sha256"):
        raise refusals.digest_mismatch(
            f"the launcher at {ident.path} has SHA-256 {ident.sha256}, but machine {machine}'s "
            f"Landlock level was measured with {value.get('launcher_sha256')}",
            f"re-measure with the installed launcher: `saphan machine probe-confinement {machine}`",
        )
    return compose_landlock_local(
        policy, level=level, launcher_path=ident.path, launcher_version=ident.version,
        launcher_sha256=ident.sha256, agent_sha256=agent_sha256,
    )


def _settle_worktree(info: dict[str, Any], repo: RepoSpec, wd: str, keep: bool, *,
                     git_dir: str | None, run_dir: str, run_id: str,
                     allowed: tuple[str, ...], extra: tuple[str, ...], stream: bool) -> None:
    """Import the run's commits (worktrees.import_run), record where its
    branch is; remove the worktree unless kept."""
    from saphan import worktrees

    if git_dir is not None:
        imported = worktrees.import_run(repo, git_dir, wd, run_dir, run_id,
                                        allowed_protected=allowed, extra_protected=extra)
        info["import"] = imported
        info["head_after"] = imported.get("head", repo.base)
        if imported["result"] == "refused":
            _warn(stream, f"the run's commits were NOT imported onto {info['branch']}: "
                          f"{imported['why']}")
    else:
        info["head_after"] = None
    info["kept"] = keep
    if not keep:
        try:
            worktrees.remove(repo, wd)
        except RuntimeError as e:
            info["kept"] = True
            info["remove_error"] = str(e)


def _verified_worktree(wd: str, common_dir: str) -> LinkedWorktree:
    try:
        return verify_linked_worktree(wd, common_dir)
    except NotGrantable as e:
        raise refusals.workdir_unsafe(
            f"the worktree saphan just made at {wd} is not a genuine linked worktree of "
            f"{common_dir}: {e}; no git grant is made from it",
            "check the repository for links planted in its .git (`find <repo>/.git -type l`) "
            "and run again",
        ) from None


def _make_run_dirs(policy: Policy, *, objects: bool) -> None:
    try:
        make_run_dirs(policy, objects=objects)
    except PlantedLink as e:
        raise refusals.workdir_unsafe(
            f"saphan's scratch directory cannot be made in {policy.workdir}: {e}",
            f"remove {e.path} (an earlier run may have planted it) and run again",
        ) from None


def _hidden_workspaces(home: Any) -> tuple[str, ...]:
    """Every saphan workspace this account knows — this one, the default
    ``~/.saphan``, each registered one (workspace.registry_path) — and the
    registry itself: the jail sees none of them (the run's own paths in this
    one are bound back), so no run reads another workspace's key or rewrites
    its records, nor drops a workspace from the registry."""
    from saphan.workspace import registered_workspaces, registry_path

    out = [os.path.realpath(home)]
    for other in (os.path.expanduser("~/.saphan"), *registered_workspaces()):
        real = os.path.realpath(other)
        if real not in out and os.path.isdir(real):
            out.append(real)
    reg_dir = os.path.realpath(registry_path().parent)
    if os.path.isdir(reg_dir) and not any(
            reg_dir == h or reg_dir.startswith(h.rstrip("/") + "/") for h in out):
        out.append(reg_dir)
    return tuple(out)


def _nested_git(wd: str, limit: int = 200_000) -> list[str]:
    """Every ``.git`` below the top of a worktree (links never followed;
    saphan's own .saphan-run skipped; at most ``limit`` entries looked at)."""
    found: list[str] = []
    seen = 0
    for root, dirs, files in os.walk(wd, followlinks=False):
        rel = os.path.relpath(root, wd)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in (".git", ".saphan-run")]
        for name in [*dirs, *files]:
            seen += 1
            if rel == "." and name == ".git":
                continue  # the worktree's own pointer (a file, read-only in the jail)
            if name.casefold().rstrip(". ") == ".git":
                found.append(os.path.normpath(os.path.join(rel, name)))
        dirs[:] = [d for d in dirs if d.casefold().rstrip(". ") != ".git"]
        if seen > limit:
            found.append(f"(stopped looking after {limit} entries)")
            break
    return found


def _check_hidden_pinned(policy: Policy) -> None:
    """A workspace (or the registry) inside the working directory is hidden by
    a mount on its own path, which the run cannot rename — but it could
    rename a directory between the workdir and it, and plant its own
    workspace where the operator's was (measured). Allowed only when the
    hidden directory is a direct child of the workdir, or lies below a
    protected entry held read-only (``.local`` in a HOME): both are mount
    points the run cannot move."""
    wd = policy.workdir
    for hidden in policy.hidden_dirs:
        if not hidden.startswith(wd.rstrip("/") + "/"):
            continue
        first = os.path.join(wd, os.path.relpath(hidden, wd).split("/", 1)[0])
        if os.path.dirname(hidden) == wd or first in policy.readonly_dirs:
            continue
        raise refusals.workdir_unsafe(
            f"the working directory {wd} holds saphan's {hidden} below {first}, which a run "
            "could move aside and replace with a workspace (or registry) of its own",
            f"run in a directory that does not contain {hidden}, or move that workspace out "
            "of the working directory",
        )


def _store_paths(ctx: Context) -> tuple[str, ...]:
    """The store's sockets and client credential files (store/reach.py)."""
    from saphan.store.reach import client_paths

    return client_paths(ctx.config.database_url, ctx.workspace.sqlite_path)


def _identity_files(ctx: Context) -> tuple[str, ...]:
    """Every SSH machine's private key: unreadable inside every jail."""
    return tuple(m.identity_file for m in ctx.machines() if m.identity_file)


def _warn(stream: bool, message: str) -> None:
    """A line for the operator's terminal; what a run chose (file names, git's
    messages about its objects) never reaches it as control characters."""
    print(f"saphan: {protected.printable(message)}", file=sys.stderr, flush=True)
