"""From what the operator asked (``saphan run --prompt … --model …``) to an
adapter holding an :class:`~saphan.tools.instruction.Instruction`.

Everything here happens before the seat is reserved, so a bad request costs
nothing: the prompt is written to the run's directory (the adapter hands it
to the tool on stdin), the permission class is loaded and checked against
the working directory, the binary is resolved and digested, and an explicit
``--resume RUN`` is turned into that run's recorded tool session — the only
way any run continues a session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.tools import binaries, claude, permission_class
from saphan.tools.adapter import Adapter
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.codex import CodexAdapter, Provider
from saphan.tools.instruction import Instruction, Request, Resume

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.lanes import Lane
    from saphan.store.rows import Slot


@dataclass(frozen=True)
class Settled:
    """A request with the slot's run defaults applied, checked (nothing written)."""

    prompt: str
    model: str | None
    max_turns: int | None
    max_seconds: int | None
    permission_class: permission_class.PermissionClass | None
    #: the slot's endpoint (checked again here: the store's row is not signed)
    endpoint: str | None


def settle(tool: str, request: Request, slot: Slot | None, *,
           check_env: bool = True) -> Settled:
    """The task, the model and budgets (the request's, else the slot's), the
    permission class — the part of preparing a run that is the same on every
    site. ``check_env``: the class's credentials must be set in saphan's
    environment (they are passed to the agent at launch)."""
    if (request.prompt is None) == (request.prompt_file is None):
        raise UserError("an agent slot needs the task: give exactly one of --prompt TEXT or "
                        "--prompt-file FILE")
    if request.prompt_file is not None:
        try:
            prompt = Path(request.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--prompt-file {request.prompt_file}: cannot read it ({e})") from None
    else:
        assert request.prompt is not None
        prompt = request.prompt
    if not prompt.strip():
        raise UserError("the prompt is empty; give the task with --prompt or --prompt-file")
    if request.model is not None:
        from saphan.endpoints import check_model

        check_model(request.model)
    if request.max_turns is not None and tool == "codex":
        raise UserError("--max-turns: Codex CLI has no turn budget; give --max-seconds S")
    model = request.model or (slot.model if slot is not None else None)
    max_turns = request.max_turns or (slot.max_turns if slot is not None else None)
    max_seconds = request.max_seconds or (slot.max_seconds if slot is not None else None)
    pc = permission_class.load(request.permission_class) if request.permission_class else None
    if check_env and pc is not None and tool != "loop":
        missing = [v for v in pc.credentials if not os.environ.get(v)]
        if missing:
            raise UserError(
                f"permission class {pc.source} needs credential(s) {', '.join(missing)}, which "
                "are not set in saphan's environment; export them (the engine passes them to "
                "the agent at launch and records only their names)"
            )
    endpoint = slot.endpoint if slot is not None else None
    if endpoint is not None:
        from saphan.endpoints import check_endpoint

        check_endpoint(endpoint)
    return Settled(prompt, model, max_turns, max_seconds, pc, endpoint)


def prepare(
    ctx: Context, tool: str, request: Request, *, workdir: str, run_id: str,
    confinement: str, run_dir: Path, slot: Slot | None = None,
) -> Adapter:
    """The run's adapter. What ``request`` leaves unsaid comes from the
    slot's run defaults (fleet/slots.py), then the tool's own defaults."""
    got = settle(tool, request, slot)
    prompt, model, pc = got.prompt, got.model, got.permission_class
    max_turns, max_seconds = got.max_turns, got.max_seconds
    if tool == "claude":  # its endpoint and the models it pins are the only ones
        claude.preflight(got.endpoint, model)
    wd = os.path.realpath(workdir)
    if pc is not None and pc.write_scope and not pc.scope_covers(wd):
        raise UserError(
            f"permission class {pc.source} allows work only inside "
            f"{', '.join(pc.write_scope)}, and the working directory is {wd}; run inside its "
            "write scope or use another class"
        )
    if tool == "claude":  # a run must not write the next one's configuration
        claude.refuse_config_home_in(wd)
    resume = _resume(ctx, tool, request.resume, wd) if request.resume else None
    if tool == "loop":
        from saphan.loop.adapter import interpreter

        lane_parts = _lane(ctx, request)
        binary = interpreter(slot.agent_path if slot is not None else None)
        if slot is not None and slot.agent_path is not None:
            # the Python the lane's key is handed to: never one a run could replace
            binaries.check_outside(tool, (slot.agent_path, os.path.realpath(binary.path)), wd)
    else:
        binary = binaries.identify(
            tool, slot.agent_path if slot is not None else None, workdir=wd,
            pinned=(slot.machine, slot.name, slot.agent_sha256) if slot is not None else None)
    run_dir.mkdir(parents=True, exist_ok=True)
    prompt_path = run_dir / "prompt.txt"
    prompt_path.write_text(prompt, encoding="utf-8")
    instruction = Instruction(prompt_path=str(prompt_path), workdir=wd, model=model,
                              permission_class=pc, resume=resume)
    from saphan.tools.adapter import DEFAULT_AGENT_MAX_SECONDS

    limit = max_seconds or DEFAULT_AGENT_MAX_SECONDS
    endpoint = got.endpoint
    if tool == "claude":
        cl = ClaudeAdapter(binary, instruction, confinement, run_id, max_seconds=limit,
                           max_turns=max_turns, endpoint=endpoint)
        _refuse_credentials(cl)
        return cl
    if tool == "codex":
        cx = CodexAdapter(binary, instruction, confinement, run_id,
                          provider=_codex_provider(ctx, endpoint),
                          max_seconds=limit).checked((str(run_dir),))
        _refuse_credentials(cx)
        return cx
    if tool == "loop":
        from saphan.loop.adapter import DEFAULT_MAX_SECONDS, DEFAULT_MAX_TURNS, LoopAdapter

        lane, keys, hidden, scrub = lane_parts
        return LoopAdapter(
            binary, instruction, confinement, run_id, lane=lane, secret=keys[lane.name],
            scrub_values=tuple(keys.values()),
            hidden=hidden, scrub_env=scrub, spec_path=str(run_dir / "loop-spec.json"),
            out_dir=str(run_dir / "out"),
            max_turns=max_turns or DEFAULT_MAX_TURNS,
            max_seconds=max_seconds or DEFAULT_MAX_SECONDS,
        )
    raise UserError(f"tool {tool!r} has no adapter in this build")


def _refuse_credentials(adapter: Adapter) -> None:
    """A permission class's credential the tool itself reads (it reaches the
    tool's process, outside any sandbox of the tool's) is refused before the seat."""
    pc = adapter.instruction.permission_class
    if pc is None:
        return
    for name in pc.credentials:
        why = adapter.credential_refused(name)
        if why is not None:
            raise UserError(
                f"permission class {pc.source} names credential "
                f"{name}, which {adapter.tool} reads itself: {why}; remove {name} from the "
                "class's credentials")


def _lane(ctx: Context, request: Request) -> tuple[Lane, dict[str, bytes], tuple[str, ...],
                                                   tuple[str, ...]]:
    """The run's lane and every lane's key (read here, outside any jail, under
    custody), what the jail must hide (every lane's credential file and the
    lanes file), and every lane's credential variable (scrubbed by name)."""
    from saphan import lanes

    file = ctx.lanes_path
    declared = lanes.load(file)
    lane = lanes.choose(declared, request.lane)
    keys = lanes.read_all(declared, lane)
    hidden = (str(file), *dict.fromkeys(
        os.path.realpath(x.credential_file) for x in declared.values()
        if os.path.lexists(x.credential_file)))
    scrub = tuple(dict.fromkeys(x.credential_env for x in declared.values()))
    return lane, keys, hidden, scrub


def verified_previous(ctx: Context, tool: str, run_ref: str) -> dict[str, Any]:
    """The record of the run ``--resume RUN`` names: signed by this
    workspace and unchanged, and of the same tool."""
    found = ctx.run_record(run_ref)
    if found.signature != "valid":
        # The session a run continues is taken from this record: only one
        # this workspace signed, unchanged, may choose it.
        from saphan import refusals

        raise refusals.record_signature_invalid(
            f"--resume {run_ref}: the record of run {found.id} does not verify (signature "
            f"{found.signature}), so nothing in it may choose the session this run continues",
            f"`saphan runs show {found.id}` shows why; resume a run whose record verifies, or "
            "start a new one")
    previous = found.data
    if previous.get("tool") != tool:
        raise UserError(f"--resume {run_ref}: run {previous['id']} ran tool "
                        f"{previous.get('tool')!r}, this slot runs {tool!r}")
    return previous


def _resume(ctx: Context, tool: str, run_ref: str, workdir: str) -> Resume:
    previous = verified_previous(ctx, tool, run_ref)
    if (previous.get("transport") or {}).get("kind") == "ssh":
        raise UserError(f"--resume {run_ref}: run {previous['id']} ran on SSH machine "
                        f"{previous.get('machine')!r}; its session is there: resume it on a "
                        "slot of that machine")
    session = (previous.get("agent_session") or {}).get("id")
    if not session:
        raise UserError(f"--resume {run_ref}: run {previous['id']} recorded no {tool} session "
                        "(it did not start one), so there is nothing to continue")
    was = os.path.realpath(str(previous.get("workdir") or ""))
    if was != workdir:
        raise UserError(f"--resume {run_ref}: run {previous['id']} worked in {was}; resume it "
                        f"in the same working directory (--workdir {was})")
    if tool == "claude":
        _check_claude_session(str(previous["id"]), run_ref, str(session), previous, workdir)
    return Resume(run_id=str(previous["id"]), session_id=str(session))


def _check_claude_session(run_id: str, run_ref: str, session: str, previous: dict[str, Any],
                          workdir: str) -> None:
    """The recorded Claude Code session is a UUID (it names a directory
    saphan creates and grants, ``session-env/<id>``), and its transcript is
    the one that run left: the session leaf is shared by every run in the
    working directory, so another run could have rewritten it."""
    if not claude.is_uuid(session):
        raise UserError(f"--resume {run_ref}: run {run_id} recorded the Claude Code session "
                        f"{session!r}, which is not a UUID (Claude Code names its sessions by "
                        "UUID), so it is not resumed; start a new run")
    recorded = (previous.get("claude_transcript") or {}).get("sha256")
    if not isinstance(recorded, str) or not recorded:
        raise UserError(f"--resume {run_ref}: run {run_id} recorded no digest of its Claude "
                        "Code transcript, so saphan cannot tell that the history it would send "
                        "is the one that run left; start a new run")
    from saphan.errors import PlantedLink

    path = claude.transcript_path(workdir, session)
    try:
        now = claude.transcript_sha256(path)
    except (OSError, ValueError, PlantedLink) as e:
        raise UserError(f"--resume {run_ref}: run {run_id}'s Claude Code transcript {path} "
                        f"cannot be read ({e}); start a new run") from None
    if now != recorded:
        raise UserError(
            f"--resume {run_ref}: run {run_id}'s Claude Code transcript {path} has SHA-256 "
            f"{now}, and the run recorded {recorded} when it ended: it changed since. Another "
            "run in the same working directory could have written it (the session directory "
            "is shared by every run there). If a later run resumed this session, resume that "
            "run instead; otherwise start a new run")


def _codex_provider(ctx: Context, endpoint: str | None) -> Provider | None:
    """The provider Codex is pinned to: the slot's endpoint, else the
    workspace's ``[codex]`` table, else None (Codex's built-in ``openai``)."""
    cfg = ctx.config
    base_url = endpoint or cfg.codex_base_url
    if base_url is None:
        return None
    return Provider(base_url=base_url, env_key=cfg.codex_env_key or "OPENAI_API_KEY")
