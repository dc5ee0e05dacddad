"""tools/adapter.py: what the dispatcher asks of a tool adapter — the base
defaults every agent adapter starts from (the prompt on stdin, the argv guard
on the composed command line, the record of model, class and resume) and the
`command` slot's adapter, which composes nothing and is held to the bypass
check only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from saphan.confine.policy import Policy
from saphan.refusals import Refusal
from saphan.tools import claude
from saphan.tools.adapter import Adapter, CommandAdapter, first_json_event
from saphan.tools.binaries import AgentBinary
from saphan.tools.instruction import Instruction, Resume
from saphan.tools.permission_class import parse

BINARY = AgentBinary("claude", "/opt/claude", "a" * 64, "2.1.197")
POLICY = Policy(workdir="/wd", writable_dirs=("/wd",))
PC = parse({"schema": 2, "name": "ci", "allowed_commands": ["git"],
            "credentials": ["GH_TOKEN", "NPM_TOKEN"]}, source="/classes/ci.json")


@dataclass(frozen=True)
class Composed(Adapter):
    """The smallest agent adapter: the base class's behaviour, an argv given."""

    line: tuple[str, ...] = ()
    tool = "claude"
    allowed_argv = claude.ALLOWED_ARGV

    def argv(self, policy: Policy) -> list[str]:
        return list(self.line)


def _instruction(**kw: Any) -> Instruction:
    return Instruction(prompt_path="/runs/R/prompt.txt", workdir="/wd", **kw)


def test_the_base_hands_the_prompt_file_on_stdin_and_adds_nothing() -> None:
    a = Composed(BINARY, _instruction(), "engine", "R")
    assert a.stdin_path == "/runs/R/prompt.txt" and a.stdin_bytes() is None
    assert a.session_dirs() == a.read_denials() == a.exposed_paths() == ()
    assert a.env_allowed() == ()
    env = {"PATH": "/usr/bin", "HOME": "/h"}
    assert a.environment(env) == env
    assert a.vendor_boundary(POLICY) is None
    assert a.after_run("/nonexistent") == {} and a.outcome({"x": 1}) is None
    assert a.after_exit("/nonexistent", -9) == {}  # after_run, by default
    assert a.credential_refused("ANTHROPIC_BASE_URL") is None  # the base refuses none
    assert a.time_limit() is None


def test_the_class_credentials_are_what_a_run_may_take() -> None:
    a = Composed(BINARY, _instruction(permission_class=PC), "engine", "R")
    assert a.env_allowed() == ("GH_TOKEN", "NPM_TOKEN")


def test_the_record_names_model_class_and_resume() -> None:
    assert Composed(BINARY, _instruction(), "engine", "R").record(POLICY) == {
        "model": "(the tool's default)"}
    a = Composed(BINARY, _instruction(model="m1", permission_class=PC,
                                      resume=Resume("01PREV", "sess-9")), "engine", "R")
    assert a.record(POLICY) == {"model": "m1", "permission_class": PC.as_record(),
                                "resumes": {"run": "01PREV", "session": "sess-9"}}


def test_the_guard_checks_the_composed_line_with_the_instructions_model() -> None:
    ok = ["/opt/claude", "-p", "--permission-mode", "plan", "--model", "m1"]
    Composed(BINARY, _instruction(model="m1"), "engine", "R").guard(ok)
    cases: list[tuple[Instruction, list[str], str]] = [
        (_instruction(model="m1"), [*ok, "--dangerously-skip-permissions"], "bypass-token"),
        (_instruction(model="m1"), [*ok[:-1], "m2"], "model-substitution"),
        (_instruction(), ok, "model-substitution"),  # no model named: none may be selected
        (_instruction(model="m1"), [*ok, "--continue"], "session-resumption"),
        (_instruction(model="m1", resume=Resume("01PREV", "sess-9")), ok,
         "session-resumption"),  # asked to resume, and the line does not
    ]
    for instruction, argv, cls in cases:
        with pytest.raises(Refusal) as info:
            Composed(BINARY, instruction, "engine", "R").guard(argv)
        assert info.value.cls == cls, (argv, info.value)
    Composed(BINARY, _instruction(model="m1", resume=Resume("01PREV", "sess-9")),
             "engine", "R").guard([*ok, "--resume", "sess-9"])


def test_an_agent_adapter_without_an_allow_list_cannot_launch() -> None:
    @dataclass(frozen=True)
    class Undeclared(Adapter):
        tool = "claude"

        def argv(self, policy: Policy) -> list[str]:
            return ["/opt/claude", "-p"]

    with pytest.raises(ValueError, match="declares no allow-list"):
        Undeclared(BINARY, _instruction(), "engine", "R").guard(["/opt/claude", "-p"])


def test_a_command_slot_runs_the_operators_line_as_given() -> None:
    line = ("/usr/bin/claude", "--add-dir", "/", "--model", "x", "--continue")
    a = CommandAdapter(BINARY, _instruction(permission_class=PC), "engine", "R", command=line)
    assert a.tool == "command"
    assert a.argv(POLICY) == list(line)
    a.guard(list(line))  # no allow-list, model or session check on the operator's line
    with pytest.raises(Refusal) as info:  # but the bypass tokens, whichever tool's
        a.guard([*line, "--dangerously-skip-permissions"])
    assert info.value.cls == "bypass-token"
    assert a.stdin_path is None  # /dev/null: there is no prompt
    assert a.record(POLICY) == {}
    assert a.env_allowed() == ("GH_TOKEN", "NPM_TOKEN")


def test_an_adapter_without_argv_cannot_be_made() -> None:
    with pytest.raises(TypeError):
        Adapter(BINARY, _instruction(), "engine", "R")  # type: ignore[abstract]


def test_first_json_event(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"\n".join([
        b"starting up",
        b'{"type": "system", "session_id": "not-this"',  # cut short: not JSON
        b"[1, 2, 3]",
        b'  {"type": "noise"}  ',
        b'{"type": "system", "subtype": "init", "session_id": "s-1"}',
        b'{"type": "system", "subtype": "init", "session_id": "s-2"}',
        b"\xff\xfe binary",
    ]) + b"\n")

    def init(event: dict[str, Any]) -> bool:
        return event.get("subtype") == "init"

    assert first_json_event(str(log), init) == {"type": "system", "subtype": "init",
                                                "session_id": "s-1"}
    assert first_json_event(str(log), lambda e: e.get("type") == "noise") == {"type": "noise"}
    assert first_json_event(str(log), lambda e: False) is None
    assert first_json_event(str(tmp_path / "absent.log"), init) is None
    log.write_text(json.dumps({"subtype": "init"}))  # no newline at the end
    assert first_json_event(str(log), init) == {"subtype": "init"}
