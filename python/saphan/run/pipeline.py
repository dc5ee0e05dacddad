"""One run, on one screen: cast → reserve → compose → dispatch → record.

    request   run/request.py      what was asked fits the slot (nothing written)
    cast      here                the named machine and slot; the tool can go there
    reserve   capacity.py         one of the slot's ordinals, in the database
    compose   confine/, tools/    the boundary from one Policy, the tool's argv
    dispatch  dispatch.py (this host), dispatch_remote.py (SSH)
    record    run/record.py       the only writer of every outcome

Every "cannot" after the request is valid is a Refusal recorded on the run's
row before it is raised (run/record.refused before a seat is held; the
dispatcher's finish once one is).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from saphan import __version__
from saphan.errors import UserError
from saphan.ids import new_run_id
from saphan.refusals import Refusal
from saphan.run import record as recorder
from saphan.run import request as requests
from saphan.run.reserve import reserve
from saphan.timefmt import now_iso
from saphan.tools import AGENT_TOOLS, DISPATCHABLE

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.records import RunRecord
    from saphan.tools.adapter import CommandAdapter
    from saphan.tools.launch import Request as AgentRequest


def run(
    ctx: Context,
    machine: str,
    slot: str,
    argv: Sequence[str],
    *,
    workdir: str | os.PathLike[str] | None = None,
    stream: bool = True,
    boundary: str | None = None,
    repo: str | os.PathLike[str] | None = None,
    base_ref: str | None = None,
    keep_worktree: bool = True,
    request: AgentRequest | None = None,
) -> RunRecord:
    """The five steps for every run shape (a local command, a local agent or
    loop, a remote command). See :meth:`saphan.Engine.run` for the arguments."""
    from saphan.config import confinement_mode
    from saphan.liveness import current_holder

    command = list(argv)
    if not command and request is None:
        raise UserError("nothing to run: give the command after `--`")
    config = ctx.config
    holder = current_holder()
    run_id = new_run_id()
    if repo is not None and workdir is not None:
        raise UserError("give --repo or --workdir, not both (--repo makes the working directory)")
    if repo is None and base_ref is not None:
        raise UserError("--base needs --repo")
    if repo is not None:
        wd = str(ctx.workspace.home / "worktrees" / run_id)
    else:
        wd = os.path.abspath(workdir if workdir is not None else os.getcwd())
    base: dict[str, Any] = {
        "id": run_id, "machine": machine, "slot": slot, "argv": command, "workdir": wd,
        "saphan_version": __version__, "requested_at": now_iso(),
    }
    # run.confinement is checked before any other branch of any run.
    try:
        mode = confinement_mode(config)
    except Refusal as refusal:
        recorder.refused(ctx, base, "unknown", holder, refusal)
        raise

    # -- cast: the named slot, if the tool can run there ------------------------
    s = ctx.slot(machine, slot)
    m = ctx.machine(machine)
    base["tool"] = s.tool
    base["confinement_setting"] = mode
    try:
        # Custody now: a run whose record could not be signed does not start.
        ctx.record_key()
    except Refusal as refusal:
        recorder.refused(ctx, base, s.tool, holder, refusal)
        raise
    if s.tool not in DISPATCHABLE:
        raise UserError(
            f"slot {slot!r} runs tool {s.tool!r}, which this build of saphan cannot dispatch "
            f"yet (it dispatches: {', '.join(DISPATCHABLE)}); use a --tool command slot"
        )
    if boundary not in (None, "landlock"):
        raise UserError(f"--boundary {boundary!r} is unknown; omit it or use `landlock`")
    requests.check_fits(s, m, command, request, boundary)

    if m.transport == "ssh":
        from saphan.dispatch_remote import run_remote

        if request is not None and request.permission_class is not None:
            requests.command_class(request.permission_class, command[0])
        return run_remote(ctx, s, m, base, command, workdir=workdir, repo=repo,
                          holder=holder, boundary=boundary, stream=stream)

    spec = None
    if repo is not None:
        from saphan import worktrees

        spec = worktrees.resolve_repo(os.fspath(repo), base_ref)
    if spec is None and not os.path.isdir(wd):
        missing = Refusal(
            "workdir-missing",
            f"the working directory {wd} does not exist on {machine}",
            f"create it (`mkdir -p {wd}`) or pass an existing --workdir",
        )
        recorder.refused(ctx, base, s.tool, holder, missing)
        raise missing
    requests.check_workdir_apart(ctx, wd)

    # -- compose what only the tool can (an agent's adapter), before the seat ----
    from saphan.dispatch import execute_local

    if request is not None and s.tool in AGENT_TOOLS:
        from saphan.tools.launch import prepare

        try:
            adapter = prepare(ctx, s.tool, request, workdir=wd, run_id=run_id,
                              confinement=mode, run_dir=ctx.workspace.run_dir(run_id))
        except Refusal as refusal:
            recorder.refused(ctx, base, s.tool, holder, refusal)
            raise
        base["agent"] = adapter.binary.as_record()
    else:
        adapter = _command_adapter(request, command, wd, run_id, mode)
        base["agent"] = {"path": adapter.binary.path, "sha256": adapter.binary.sha256}
        base["argv"] = list(adapter.command)

    # -- reserve ---------------------------------------------------------------------
    base["session_ordinal"] = reserve(ctx, s, base, wd, holder)

    # -- compose, dispatch, record (the dispatcher finishes the row whatever happens)
    return execute_local(
        ctx, s, base, wd, stream=stream, boundary_choice=boundary,
        repo=spec, keep_worktree=keep_worktree,
        adapter=adapter,
    )


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
        pc = requests.command_class(request.permission_class, command[0])
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
