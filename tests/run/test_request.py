"""run/request.py: a run's request validated before anything is written —
it fits the slot, a command slot's class allows the command, and the working
directory lies apart from every saphan workspace. A bad request is a
UserError (exit 2) and leaves no row, no run directory, no store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.refusals import Refusal
from saphan.run.request import check_fits, check_scope, check_workdir_apart, command_class
from saphan.store.rows import Machine, Slot
from saphan.tools.instruction import Request
from saphan.workspace import Workspace, registered_workspaces

LOCAL = Machine("here", "local")
FAR = Machine("far", "ssh", "agent", "10.0.0.2", 22)


def _slot(tool: str) -> Slot:
    return Slot("here", "s1", tool, None)


# -- the request fits the slot ------------------------------------------------------------

@pytest.mark.parametrize(("tool", "machine", "command", "request_", "boundary"), [
    ("command", LOCAL, ["make"], None, None),
    ("command", FAR, ["make"], None, "landlock"),
    ("command", LOCAL, ["make"], Request(permission_class="/c.json"), None),
    ("claude", LOCAL, [], Request(prompt="t", model="m1", resume="01R"), "landlock"),
    ("claude", LOCAL, [], Request(prompt="t", max_turns=3), None),
    ("codex", LOCAL, [], Request(prompt_file="/task.md"), None),
    ("loop", LOCAL, [], Request(prompt="t", lane="a", max_turns=1, max_seconds=1), None),
])
def test_requests_that_fit(tool: str, machine: Machine, command: list[str],
                           request_: Request | None, boundary: str | None) -> None:
    check_fits(_slot(tool), machine, command, request_, boundary)


@pytest.mark.parametrize(("tool", "machine", "command", "request_", "boundary", "needle"), [
    ("claude", LOCAL, ["claude", "-p"], Request(prompt="t"), None,
     "slot 's1' runs claude, whose command line saphan composes: give the task with --prompt"),
    ("codex", LOCAL, [], None, None, "slot 's1' runs codex: give the task with --prompt TEXT"),
    ("codex", LOCAL, [], Request(prompt="t"), "landlock", "drop --boundary for a codex slot"),
    ("loop", LOCAL, [], Request(prompt="t", model="m"), None, "drop --model"),
    ("loop", LOCAL, [], Request(prompt="t", resume="01R"), None, "nothing to --resume"),
    ("loop", LOCAL, [], Request(prompt="t", max_turns=0), None, "--max-turns 0 is below 1"),
    ("loop", LOCAL, [], Request(prompt="t", max_seconds=-5), None,
     "--max-seconds -5 is below 1"),
    ("claude", LOCAL, [], Request(prompt="t", lane="a", max_turns=3), None,
     "--lane: only for loop slots; slot 's1' runs claude"),
    ("codex", LOCAL, [], Request(prompt="t", max_turns=3), None,
     "--max-turns: for loop and claude slots; slot 's1' runs codex, which has no turn budget"),
    ("command", LOCAL, ["make"], Request(prompt="t"), None,
     "slot 's1' runs tool 'command': --prompt, --prompt-file, --model, --resume, --lane and "
     "--max-* are for agent slots"),
    ("command", LOCAL, ["make"], Request(max_seconds=10), None, "are for agent slots"),
    ("command", LOCAL, [], None, None, "nothing to run: give the command after `--`"),
])
def test_requests_that_do_not_fit(tool: str, machine: Machine, command: list[str],
                                  request_: Request | None, boundary: str | None,
                                  needle: str) -> None:
    with pytest.raises(UserError) as info:
        check_fits(_slot(tool), machine, command, request_, boundary)
    assert needle in str(info.value)


# -- a command slot's permission class ---------------------------------------------------------

def test_the_class_allows_the_commands_base_name_exactly(tmp_path: Path) -> None:
    path = tmp_path / "class.json"
    path.write_text(json.dumps({"schema": 2, "allowed_commands": ["git", "make"]}))
    assert command_class(str(path), "/usr/bin/git").commands == ("git", "make")
    assert command_class(str(path), "make").source == str(path)
    for argv0 in ("gitk", "/usr/bin/git-lfs", "gi", "sh"):
        with pytest.raises(UserError) as info:
            command_class(str(path), argv0)
        assert str(info.value) == (
            f"permission class {path} allows the commands git, make (exact base name); "
            f"{argv0.rsplit('/', 1)[-1]!r} is not one of them")


def test_a_class_allowing_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.json"
    path.write_text(json.dumps({"schema": 2}))
    with pytest.raises(UserError, match=r"allows the commands \(none\)"):
        command_class(str(path), "true")


def test_a_command_class_holds_the_workdir_to_its_write_scope(tmp_path: Path) -> None:
    """Review: a command slot's class ignored `write_scope`, here and on SSH."""
    inside, outside = tmp_path / "scope" / "wd", tmp_path / "other"
    inside.mkdir(parents=True)
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": 2, "allowed_commands": ["true"],
                                "write_scope": [str(tmp_path / "scope")]}))
    assert command_class(str(path), "true", str(inside)).write_scope
    for wd in (outside, tmp_path / "link", tmp_path / "scope-sibling"):
        with pytest.raises(UserError, match=r"allows work only inside .*; run inside its "
                                            "write scope"):
            command_class(str(path), "true", str(wd))
    # far paths: compared as that machine gave them, normalised, never resolved here
    pc = command_class(str(path), "true", f"{tmp_path}/scope/x/../wd", far=True)
    with pytest.raises(UserError, match=f"the working directory is {tmp_path}/other;"):
        check_scope(pc, f"{tmp_path}/scope/../other", far=True)
    check_scope(pc, f"{tmp_path}/scope", far=True)


def test_a_malformed_class_is_a_refusal(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(Refusal) as info:
        command_class(str(path), "git")
    assert info.value.cls == "policy-invalid"


# -- the working directory lies apart from every workspace --------------------------------------

@pytest.fixture
def ws_ctx(workspace: Workspace) -> Context:
    """A context over the workspace only: request checks never open the store."""
    return Context(workspace)


def _apart(ctx: Context, wd: Path) -> None:
    check_workdir_apart(ctx, str(wd))


def test_a_workdir_outside_every_workspace(ws_ctx: Context, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    _apart(ws_ctx, wd)
    assert str(ws_ctx.workspace.home) in registered_workspaces()
    assert not ws_ctx.workspace.sqlite_path.exists()  # nothing but the registry was written
    assert list(ws_ctx.workspace.runs_dir.iterdir()) == []


@pytest.mark.parametrize("where", ["home", "runs", "parent", "link", "worktrees-root"])
def test_a_workdir_overlapping_the_workspace(ws_ctx: Context, tmp_path: Path,
                                             where: str) -> None:
    home = ws_ctx.workspace.home
    wd = {"home": home, "runs": home / "runs", "parent": tmp_path,
          "link": tmp_path / "link", "worktrees-root": home / "worktrees"}[where]
    if where == "link":
        wd.symlink_to(home / "runs")
    wd.mkdir(exist_ok=True)
    with pytest.raises(UserError) as info:
        _apart(ws_ctx, wd)
    assert f"the working directory {wd.resolve()} overlaps the saphan workspace {home}" in str(
        info.value)


def test_a_runs_own_worktree_is_allowed(ws_ctx: Context) -> None:
    wt = ws_ctx.workspace.home / "worktrees" / "01RUN"
    wt.mkdir(parents=True)
    _apart(ws_ctx, wt)


def test_a_workdir_inside_another_workspace(ws_ctx: Context, tmp_path: Path) -> None:
    other = Workspace(tmp_path / "other-ws")
    other.init()
    wd = other.home / "runs"
    with pytest.raises(UserError) as info:
        _apart(ws_ctx, wd)
    assert (f"the working directory {wd} lies inside the saphan workspace {other.home}; a run "
            "there could read its key") in str(info.value)
    # Its worktrees are no exception: they are another workspace's.
    (other.home / "worktrees" / "01X").mkdir(parents=True)
    with pytest.raises(UserError, match="lies inside the saphan workspace"):
        _apart(ws_ctx, other.home / "worktrees" / "01X")


def test_the_default_workspace_is_apart_even_unregistered(
        ws_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = tmp_path / "me"
    default = me / ".saphan" / "runs"
    default.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(me))
    with pytest.raises(UserError, match=f"lies inside the saphan workspace {me / '.saphan'}"):
        _apart(ws_ctx, default)
