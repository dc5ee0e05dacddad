"""A run's request, validated before anything is written (UserError: exit 2).

What the operator asked must fit the slot (an agent slot takes a task, a
command slot a command line), a command slot's permission class must allow
the command, and the working directory must lie apart from every saphan
workspace. Nothing here reserves, records or creates anything but the
workspace registry entry.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

from saphan.errors import UserError
from saphan.tools import AGENT_TOOLS

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store.rows import Machine, Slot
    from saphan.tools import permission_class
    from saphan.tools.instruction import Request as AgentRequest


def check_fits(
    s: Slot, m: Machine, command: list[str], request: AgentRequest | None, boundary: str | None
) -> None:
    """An agent slot takes a task, never a command line; a command slot the reverse."""
    loop_flags = [] if request is None else [
        flag for flag, value in (("--lane", request.lane), ("--max-turns", request.max_turns))
        if value is not None]
    if s.tool in AGENT_TOOLS:
        if command:
            raise UserError(
                f"slot {s.name!r} runs {s.tool}, whose command line saphan composes: give the "
                "task with --prompt TEXT or --prompt-file FILE, not a command after `--`"
            )
        if request is None:
            raise UserError(f"slot {s.name!r} runs {s.tool}: give the task with --prompt TEXT "
                            "or --prompt-file FILE")
        from saphan.tools.registry import supports

        if not supports(s.tool, m.transport):
            raise UserError(f"{s.tool} runs on --local machines in this build; machine "
                            f"{m.name!r} is reached over SSH")
        if s.tool == "codex" and boundary is not None:
            raise UserError("Codex confines itself (the engine's boundary cannot nest around "
                            "its sandbox); drop --boundary for a codex slot")
        from saphan.fleet.slots import MAX_SECONDS_RANGE, MAX_TURNS_RANGE

        for flag, value, (lo, hi) in (("--max-seconds", request.max_seconds, MAX_SECONDS_RANGE),
                                      ("--max-turns", request.max_turns, MAX_TURNS_RANGE)):
            if value is not None and value < lo:
                raise UserError(f"{flag} {value} is below {lo}")
            if value is not None and value > hi:
                raise UserError(f"{flag} {value} is out of range; give {lo}..{hi}")
        if s.tool == "loop":
            if request.model is not None:
                raise UserError("a loop slot runs the model its lane names; drop --model "
                                "(see `saphan lane list`, or choose another lane with --lane)")
            if request.resume is not None:
                raise UserError("the built-in loop keeps no sessions, so there is nothing to "
                                "--resume; start a new run with the task")
        elif request.lane is not None:
            raise UserError(f"--lane: only for loop slots; slot {s.name!r} runs {s.tool}")
        elif request.max_turns is not None and s.tool != "claude":
            raise UserError(f"--max-turns: for loop and claude slots; slot {s.name!r} runs "
                            f"{s.tool}, which has no turn budget (give --max-seconds S)")
        return
    if request is not None and (request.prompt is not None or request.prompt_file is not None
                                or request.model is not None or request.resume is not None
                                or request.max_seconds is not None or loop_flags):
        raise UserError(f"slot {s.name!r} runs tool {s.tool!r}: --prompt, --prompt-file, "
                        "--model, --resume, --lane and --max-* are for agent slots "
                        "(claude, codex, loop)")
    if not command:
        raise UserError("nothing to run: give the command after `--`")


def command_class(path: str, argv0: str, workdir: str | None = None, *,
                  far: bool = False) -> permission_class.PermissionClass:
    """A command slot's permission class: the command's base name, exact
    token; and its write scope, which must cover the working directory (on
    an SSH machine the path as given, normalised: SshSite checks the far
    resolved one again after the preflight)."""
    from saphan.tools import permission_class

    pc = permission_class.load(path)
    if not pc.allows(argv0):
        raise UserError(
            f"permission class {pc.source} allows the commands "
            f"{', '.join(pc.commands) or '(none)'} (exact base name); "
            f"{os.path.basename(argv0)!r} is not one of them"
        )
    if workdir is not None:
        check_scope(pc, workdir, far=far)
    return pc


def check_scope(pc: permission_class.PermissionClass, workdir: str, *, far: bool = False) -> None:
    """The class's write scope covers ``workdir`` (resolved here; on a far
    machine, a path that machine resolved)."""
    if not pc.write_scope:
        return
    wd = posixpath.normpath(workdir)
    covered = (any(wd == s or wd.startswith(s.rstrip("/") + "/") for s in pc.write_scope)
               if far else pc.scope_covers(workdir))
    if not covered:
        raise UserError(
            f"permission class {pc.source} allows work only inside "
            f"{', '.join(pc.write_scope)}, and the working directory is "
            f"{wd if far else os.path.realpath(workdir)}; run inside its write scope or use "
            "another class")


def check_workdir_apart(ctx: Context, wd: str) -> None:
    """A run's writable tree must not hold the workspace (store, key, records).

    Were it so, the run could rewrite saphan's own database and records;
    the boundary would still hold, but it would guard the wrong things.
    """
    from saphan.workspace import register_workspace, registered_workspaces

    real_wd = os.path.realpath(wd)
    home = os.path.realpath(ctx.workspace.home)
    register_workspace(ctx.workspace.home)  # workspaces made before the registry
    for other in (os.path.realpath(os.path.expanduser("~/.saphan")), *registered_workspaces()):
        if other != home and _within(real_wd, other):
            raise UserError(
                f"the working directory {real_wd} lies inside the saphan workspace {other}; "
                "a run there could read its key and rewrite its store and records: use a "
                "directory outside it")
    # Per-run worktrees live in $SAPHAN_HOME/worktrees/, apart from the store.
    if _within(real_wd, os.path.join(home, "worktrees")) and real_wd != os.path.join(
        home, "worktrees"
    ):
        return
    if _within(home, real_wd) or _within(real_wd, home):
        raise UserError(
            f"the working directory {real_wd} overlaps the saphan workspace {home}; a run "
            "there could rewrite saphan's own store and records: use a directory outside it"
        )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
