"""An agent tool on a runner over SSH: which binary, which adapter, what
crosses the channel.

The SSH site (site/ssh.py) runs every tool through the same far script and
the same delivered launcher; what differs for an agent is decided here,
before the seat, from the far machine's own answers (the preflight dial,
site/far.py) — never from a resolution made on this host:

    binary_path   where the agent is on the runner: the slot's --agent-path
                  (absolute; nothing is looked up on the far PATH), else for
                  Codex the native binary `machine deliver --agent codex`
                  installed; a tool that needs a runtime (Claude Code on
                  Node, the loop's Python) has no default
    far_binary    the preflight's measurement of it (path, SHA-256 and
                  --version, re-resolved on the runner at every run)
    adapter       the tool's adapter with the far paths: the far working
                  directory as the runner resolved it, the far session leaf
                  (Claude), the far CODEX_HOME and the configuration files
                  read there (Codex)
    frame_env     what the agent gets in its environment: names kept from
                  the far environment, and values sent from here on the
                  channel (the provider key among them) — see far.frame
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.errors import UserError
from saphan.fleet.facts import AGENT_FACT_PREFIX
from saphan.tools.binaries import AgentBinary

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.site.far import Preflight
    from saphan.store.rows import Machine, Slot
    from saphan.tools.adapter import Adapter
    from saphan.tools.instruction import Request

#: the tools whose single executable saphan can deliver to a runner
DELIVERABLE = ("codex", "loop")


def agent_fact_kind(tool: str) -> str:
    return AGENT_FACT_PREFIX + tool


def binary_path(ctx: Context, slot: Slot, machine: Machine) -> str:
    """The agent's absolute path on the runner, or the refusal
    ``agent-binary-missing`` saying how to give one."""
    if slot.agent_path is not None:
        return slot.agent_path
    name = machine.name
    if slot.tool in DELIVERABLE and slot.tool != "loop":
        fact = ctx.verified_fact(name, agent_fact_kind(slot.tool))
        if fact is not None and isinstance(fact[0].get("path"), str):
            return str(fact[0]["path"])
        raise refusals.agent_binary_missing(
            f"no {slot.tool} binary is delivered to {name}, and slot {slot.name} names no "
            "--agent-path",
            f"deliver it (`saphan machine deliver {name} --agent {slot.tool}`), or give its "
            f"absolute path there: `saphan slot set {name} {slot.name} --agent-path PATH`")
    what = {"claude": "Claude Code (it runs on its own runtime)",
            "loop": "the loop's Python (with saphan installed)"}.get(slot.tool, slot.tool)
    raise refusals.agent_binary_missing(
        f"slot {slot.name} on {name} runs {slot.tool}, and names no --agent-path: saphan "
        f"does not look {what} up on {name}'s PATH",
        f"give its absolute path on {name}: `saphan slot set {name} {slot.name} "
        "--agent-path PATH`")


def zipapp_path(ctx: Context, slot: Slot, machine: Machine) -> str | None:
    """A loop slot's delivered zipapp on the runner (loop/zipapp.py), or the
    refusal ``agent-binary-missing`` (None: not a loop slot)."""
    if slot.tool != "loop":
        return None
    fact = ctx.verified_fact(machine.name, agent_fact_kind("loop"))
    if fact is not None and isinstance(fact[0].get("path"), str):
        return str(fact[0]["path"])
    raise refusals.agent_binary_missing(
        f"the loop is not delivered to {machine.name} (its zipapp: saphan's own modules, run "
        "by the slot's Python)",
        f"deliver it: `saphan machine deliver {machine.name} --agent loop`")


def check_zipapp(ctx: Context, name: str, path: str, pf: Preflight) -> str:
    """The delivered zipapp as the runner digested it this run: the one the
    signed row names (``digest-mismatch`` otherwise)."""
    got = pf.get("also_sha256")
    fact = ctx.verified_fact(name, agent_fact_kind("loop"))
    want = fact[0].get("sha256") if fact is not None else None
    if got is None or not re.fullmatch(r"[0-9a-f]{64}", got):
        raise refusals.agent_binary_missing(
            f"the loop's zipapp {path} is missing or unreadable on {name}",
            f"deliver it again: `saphan machine deliver {name} --agent loop`")
    if got != want:
        raise refusals.digest_mismatch(
            f"the loop's zipapp {path} on {name} has sha256 {got} (measured there), but "
            f"sha256 {want} was delivered",
            f"deliver it again: `saphan machine deliver {name} --agent loop`; investigate "
            f"{name} if it recurs")
    return got


def far_binary(tool: str, name: str, path: str, pf: Preflight, workdir: str) -> AgentBinary:
    """The agent binary as the runner measured it this run."""
    if pf.get("agent_path") is None or pf.get("agent_missing") is not None:
        raise refusals.agent_binary_missing(
            f"the {tool} binary {path} is not an executable file on {name}",
            f"install it there, or point the slot at it (`saphan slot set {name} SLOT "
            "--agent-path PATH`)" + (f"; or deliver it: `saphan machine deliver {name} "
                                     f"--agent {tool}`" if tool in DELIVERABLE else ""))
    digest = pf.get("agent_sha256")
    if digest is None or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise refusals.digest_mismatch(
            f"the {tool} binary {path} on {name} could not be digested there",
            f"make it readable by the far user, and give {name} sha256sum or shasum")
    real = pf.get("agent_real") or path
    for p in (path, real):
        if p == workdir or p.startswith(workdir.rstrip("/") + "/"):
            raise refusals.workdir_unsafe(
                f"the {tool} binary {p} on {name} lies inside the run's working directory "
                f"{workdir}: a run could replace what the next run executes",
                "install the agent outside every working directory")
    version = pf.get("agent_version") or "(its --version printed nothing there)"
    return AgentBinary(tool, path, digest, version)


def adapter(ctx: Context, slot: Slot, machine: Machine, request: Request, pf: Preflight, *,
            binary: AgentBinary, run_id: str, confinement: str, control_dir: str,
            leaf: str | None = None, session_env: str | None = None,
            zipapp: str | None = None) -> tuple[Adapter, str]:
    """The run's adapter for the runner (before the seat): the request with
    the slot's defaults, the far paths, the checks made on what the runner
    reported. ``control_dir``: the run's far control directory (resolved),
    where the per-run files the agent reads are written; ``leaf``: Claude
    Code's session leaf there, verified (None: not resolved). Returns the
    adapter and the prompt (sent on the channel as the agent's stdin)."""
    from saphan.tools import launch
    from saphan.tools.instruction import Instruction

    name, tool = machine.name, slot.tool
    got = launch.settle(tool, request, slot)
    rwd = pf.get("workdir") or ""
    pc = got.permission_class
    if pc is not None:
        from saphan.run.request import check_scope

        check_scope(pc, rwd, far=True)
    resume = _resume(ctx, tool, request.resume, machine, rwd, pf) if request.resume else None
    instruction = Instruction(prompt_path=posixpath.join(control_dir, "prompt.txt"),
                              workdir=rwd, model=got.model, permission_class=pc,
                              resume=resume)
    from saphan.tools.adapter import DEFAULT_AGENT_MAX_SECONDS

    limit = got.max_seconds or DEFAULT_AGENT_MAX_SECONDS
    made: Adapter
    if tool == "claude":
        from saphan.tools import claude

        claude.preflight(got.endpoint, got.model, far_managed=[
            (p, None if t is None else t.encode()) for p, t in
            pf.files.get("claude_managed_file", [])])
        _config_home_apart(name, pf, rwd)
        made = claude.ClaudeAdapter(
            binary, instruction, confinement, run_id, max_seconds=limit,
            max_turns=got.max_turns, endpoint=got.endpoint, far_machine=name,
            far_managed=tuple(p for p, _ in pf.files.get("claude_managed_file", [])),
            far_leaf=leaf, far_session_env=session_env)
    elif tool == "codex":
        from saphan.tools import codex
        from saphan.tools.launch import _codex_provider

        for path, text in pf.files.get("codex_system_file", []):
            codex.check_system_file(path, None if text is None else text.encode(), name)
        home = pf.get("codex_home_real") or pf.get("codex_home") or ""
        try:
            codex.check_home_apart(home, (rwd,))
        except UserError as e:
            raise UserError(f"on {name}: {e}") from None
        servers: tuple[str, ...] = ()
        for path, text in pf.files.get("codex_user_config", []):
            servers = codex.mcp_servers_of(f"{path} on {name}",
                                           None if text is None else text.encode())
        made = codex.CodexAdapter(
            binary, instruction, confinement, run_id,
            provider=_codex_provider(ctx, got.endpoint), max_seconds=limit,
            mcp_servers=servers, far_machine=name, far_home=pf.get("codex_home"))
    elif tool == "loop":
        from saphan.loop.adapter import DEFAULT_MAX_SECONDS, DEFAULT_MAX_TURNS, LoopAdapter

        lane, keys, hidden, scrub = launch._lane(ctx, request)
        # this run's own return directory, made new by the far script
        # (site/ssh.run_script): no earlier run's result can stand in for its
        out_dir = posixpath.join(rwd, ".saphan-run", run_id)
        made = LoopAdapter(
            binary, instruction, "engine", run_id, lane=lane, secret=keys[lane.name],
            scrub_values=tuple(keys.values()), hidden=hidden, scrub_env=scrub,
            spec_path=posixpath.join(control_dir, "loop-spec.json"), out_dir=out_dir,
            max_turns=got.max_turns or DEFAULT_MAX_TURNS,
            max_seconds=got.max_seconds or DEFAULT_MAX_SECONDS,
            far_machine=name, far_zipapp=zipapp, far_prompt=got.prompt)
    else:
        raise UserError(f"{tool} does not run on SSH machines in this build")
    launch._refuse_credentials(made)
    return made, got.prompt


def _config_home_apart(name: str, pf: Preflight, rwd: str) -> None:
    """Claude Code's far configuration home must not lie in the working
    directory: the run could leave settings there for the next run."""
    home = pf.get("config_home_real") or pf.get("config_home") or ""
    if home and (home == rwd or home.startswith(rwd.rstrip("/") + "/")):
        raise UserError(
            f"Claude Code's configuration directory {home} on {name} (CLAUDE_CONFIG_DIR, else "
            f"~/.claude there) is inside the working directory {rwd}, which the run may "
            "write: it could leave settings, hooks or MCP servers there for the next run. Run "
            "in another working directory")


def _resume(ctx: Context, tool: str, run_ref: str, machine: Machine, rwd: str,
            pf: Preflight) -> Any:
    """``--resume RUN`` on a far slot: that run's session, on the same
    machine, in the same far working directory, its transcript unchanged
    (digested on the runner by this run's preflight)."""
    from saphan.tools import claude
    from saphan.tools.instruction import Resume
    from saphan.tools.launch import verified_previous

    previous = verified_previous(ctx, tool, run_ref)
    prev_id = str(previous["id"])
    if previous.get("machine") != machine.name:
        raise UserError(f"--resume {run_ref}: run {prev_id} ran on machine "
                        f"{previous.get('machine')!r}; its session is there: resume it on a "
                        "slot of that machine")
    was = ((previous.get("preflight") or {}).get("workdir")
           or str(previous.get("workdir") or ""))
    if was != rwd:
        raise UserError(f"--resume {run_ref}: run {prev_id} worked in {was} on "
                        f"{machine.name}; resume it in the same working directory "
                        f"(--workdir {was})")
    session = str((previous.get("agent_session") or {}).get("id"))
    if tool == "claude":
        if not claude.is_uuid(session):
            raise UserError(f"--resume {run_ref}: run {prev_id} recorded the Claude Code "
                            f"session {session!r}, which is not a UUID; start a new run")
        recorded = (previous.get("claude_transcript") or {}).get("sha256")
        if not isinstance(recorded, str) or not recorded:
            raise UserError(f"--resume {run_ref}: run {prev_id} recorded no digest of its "
                            "Claude Code transcript, so saphan cannot tell that the history "
                            "it would send is the one that run left; start a new run")
        now = pf.get("transcript_sha256")
        if now != recorded:
            why = (f"has SHA-256 {now}" if now else
                   f"cannot be read there ({pf.get('transcript_unreadable') or 'no answer'})")
            raise UserError(
                f"--resume {run_ref}: run {prev_id}'s Claude Code transcript on "
                f"{machine.name} {why}, and the run recorded {recorded} when it ended. "
                "Another run in the same working directory could have written it; if a "
                "later run resumed this session, resume that run instead; otherwise start a "
                "new run")
    return Resume(run_id=prev_id, session_id=session)


def run_session(ctx: Context, tool: str, request: Request, run_id: str) -> str | None:
    """The Claude Code session a far run will have — the one it resumes, or
    the one minted from its run id — for its preflight (None: not Claude
    Code, or a resumed run that recorded no UUID: refused later, by
    :func:`adapter`)."""
    if tool != "claude":
        return None
    from saphan.tools import claude

    if request.resume is None:
        return claude.run_session_id(run_id)
    found = ctx.run_record(request.resume)
    session = str((found.data.get("agent_session") or {}).get("id"))
    return session if claude.is_uuid(session) else None


def auth_check(adapter: Adapter, pf: Preflight, conn: Any, name: str,
               token_url: str | None = None) -> dict[str, Any] | None:
    """The auth pre-flight for a far run, made from the runner (its curl):
    the key from saphan's environment (it is what crosses the channel), else
    the far seat's own login file (as the dial found it there: read over the
    connection, refreshed from here when due and written back there, its
    token checked from the runner: tools/login.py), else
    ``agent-auth-missing``; a 401/403 is ``agent-auth-rejected``."""
    from dataclasses import replace

    from saphan.tools import auth

    target = auth.target_for(adapter)
    if target is None:
        return None
    if not target.headers:
        # this host's login file says nothing about the runner's
        far_login = pf.get("login_file")
        target = replace(
            target, login_file=far_login,
            login_path=far_login or f"the {adapter.tool} login file in the far seat's "
                                    f"configuration home on {name}",
            credential=(f"the seat's login file {far_login} on {name}" if far_login
                        else " or ".join(target.looked_for)))
    return auth.far_login_check(conn, target, where=name, token_url=token_url)


def frame_env(adapter: Adapter, run_id: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The far agent's environment: the names it keeps from the far
    environment (the base allow-list, plus the tool's configuration home
    variable there), and the values sent from here (the adapter's own, the
    tool's credentials and the permission class's, from saphan's
    environment). Names only are recorded."""
    from saphan.confine.environment import BASE, LOCALE, NEVER

    keep: list[str] = [*BASE, *LOCALE]
    if adapter.tool == "claude":
        keep.append("CLAUDE_CONFIG_DIR")
    sent: dict[str, str] = {}
    local_config = {"CLAUDE_CONFIG_DIR", "CODEX_HOME"}  # name this host's paths
    for name in adapter.env_allowed():
        if name in NEVER or name in local_config:
            continue
        value = os.environ.get(name)
        if value is not None:
            sent[name] = value
    sent.update(adapter.env_set())
    far_home = getattr(adapter, "far_home", None)
    if adapter.tool == "codex" and far_home:
        sent["CODEX_HOME"] = str(far_home)
    sent["SAPHAN_RUN_ID"] = run_id
    return tuple(dict.fromkeys(keep)), sent
