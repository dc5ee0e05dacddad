"""The jail's environment is an allow-list (confine/environment.py): what
passes from saphan's environment, what never does, what saphan sets, and
each adapter's declared names — checked on the dict and in a real child
process's environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from saphan.confine import environment
from saphan.confine.environment import BASE, build
from saphan.lanes import Lane
from saphan.loop.adapter import LoopAdapter
from saphan.tools.adapter import Adapter
from saphan.tools.binaries import AgentBinary
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.codex import CodexAdapter, Provider
from saphan.tools.instruction import Instruction
from saphan.tools.permission_class import parse

#: an operator's shell, as saphan inherits it
SHELL: dict[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/op", "USER": "op", "LOGNAME": "op",
    "LANG": "C.UTF-8", "TERM": "xterm-256color", "TZ": "UTC",
    "LC_ALL": "C.UTF-8", "LC_CTYPE": "C.UTF-8", "LC-BAD": "x",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent.sock", "SSH_AGENT_PID": "42",
    "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_ACCESS_KEY_ID": "AKIA0000",
    "GITHUB_TOKEN": "ghp_secret", "SAPHAN_HOME": "/home/op/.saphan",
    "SAPHAN_CLAUDE_BIN": "/opt/claude", "SAPHAN_RUN_ID": "01OUTERRUN",
    "TMPDIR": "/tmp/op-tmp", "LD_PRELOAD": "/home/op/hook.so", "PYTHONPATH": "/home/op/py",
    "ANTHROPIC_API_KEY": "sk-ant-op", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
    "CLAUDE_CONFIG_DIR": "/home/op/.claude-seat", "OPENAI_API_KEY": "sk-openai-op",
    "CODEX_HOME": "/home/op/.codex-seat", "SEAT_KEY": "sk-seat", "LANE_KEY": "sk-lane",
}
RUN_VARS = {"TMPDIR": "/wd/.saphan-run/tmp", "SAPHAN_RUN_ID": "01RUN",
            "SAPHAN_RETURN_PATH": "/ws/runs/01RUN/out"}
NEVER_HERE = ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID",
              "GITHUB_TOKEN", "SAPHAN_HOME", "SAPHAN_CLAUDE_BIN", "LD_PRELOAD", "PYTHONPATH",
              "LC-BAD")


def test_only_the_base_and_locales_pass_by_default() -> None:
    e = build(SHELL, set_vars=RUN_VARS)
    assert e.passed == tuple(sorted([*BASE, "LC_ALL", "LC_CTYPE"]))
    assert e.set == ("SAPHAN_RETURN_PATH", "SAPHAN_RUN_ID", "TMPDIR")
    assert set(e.env) == {*e.passed, *e.set}
    for name in NEVER_HERE:
        assert name not in e.env, name
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CLAUDE_CONFIG_DIR", "CODEX_HOME"):
        assert name not in e.env, name  # a tool's own names pass only when its adapter says
    assert e.env["LC_ALL"] == "C.UTF-8" and e.env["PATH"] == SHELL["PATH"]


def test_saphan_sets_tmpdir_and_its_own_names_never_inherited() -> None:
    e = build(SHELL, set_vars=RUN_VARS)
    assert e.env["TMPDIR"] == "/wd/.saphan-run/tmp"  # never the operator's /tmp/op-tmp
    assert e.env["SAPHAN_RUN_ID"] == "01RUN"  # never an outer run's id
    assert "TMPDIR" not in e.passed and "SAPHAN_RUN_ID" not in e.passed
    bare = build(SHELL)
    assert "TMPDIR" not in bare.env and "SAPHAN_RUN_ID" not in bare.env
    assert not any(k.startswith("SAPHAN_") for k in bare.env)
    # Another saphan setting passes only when named (a pinned provider's key may be one).
    assert build(SHELL, allow=("SAPHAN_CLAUDE_BIN",)).env["SAPHAN_CLAUDE_BIN"] == "/opt/claude"


def test_allowed_names_pass_when_set_and_set_vars_win() -> None:
    e = build(SHELL, allow=("GITHUB_TOKEN", "NOT_SET_ANYWHERE"),
              set_vars={"LANG": "en_US.UTF-8"})
    assert e.env["GITHUB_TOKEN"] == "ghp_secret" and "NOT_SET_ANYWHERE" not in e.env
    assert e.env["LANG"] == "en_US.UTF-8"  # what saphan sets wins over the source
    assert "LANG" in e.set and "LANG" not in e.passed and "GITHUB_TOKEN" in e.passed


def test_the_record_holds_names_never_values() -> None:
    e = build(SHELL, allow=("ANTHROPIC_API_KEY",), set_vars=RUN_VARS)
    rec = e.as_record()
    assert rec == {"passed": list(e.passed), "set": list(e.set)}
    assert "ANTHROPIC_API_KEY" in rec["passed"] and "sk-ant-op" not in repr(rec)


@pytest.mark.parametrize("bad", ["", "A-B", "1X", "A=B", "A B", "X\x00", "ÄPFEL", "$HOME"])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        build(SHELL, allow=(bad,))
    with pytest.raises(ValueError, match="not an environment variable name"):
        build(SHELL, set_vars={bad: "x"})


@pytest.mark.parametrize("name", ["SSH_AUTH_SOCK", "TMPDIR", "SAPHAN_HOME", "SAPHAN_RUN_ID",
                                  "SAPHAN_RETURN_PATH"])
def test_names_that_never_pass_cannot_be_allowed(name: str) -> None:
    with pytest.raises(ValueError, match="never passed"):
        build(SHELL, allow=(name,))


def test_a_set_value_with_a_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        build(SHELL, set_vars={"TMPDIR": "/wd\x00/x"})


def test_a_real_child_sees_exactly_the_built_environment() -> None:
    """What the child process gets, read back from its own environment."""
    source = {**os.environ, **SHELL, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    e = build(source, allow=("GITHUB_TOKEN",), set_vars=RUN_VARS)
    out = subprocess.run(["env", "-0"], env=e.env, capture_output=True, check=True).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if item)
    assert seen == e.env
    assert "SSH_AUTH_SOCK" not in seen and "SAPHAN_HOME" not in seen


# -- each adapter's declared names ---------------------------------------------

def _instruction(tmp_path: Path, credentials: tuple[str, ...] = ()) -> Instruction:
    pc = parse({"schema": 2, "credentials": list(credentials)}) if credentials else None
    return Instruction(prompt_path=str(tmp_path / "prompt.txt"), workdir=str(tmp_path),
                       permission_class=pc)


def _binary(tool: str) -> AgentBinary:
    return AgentBinary(tool, f"/opt/{tool}", "0" * 64, "test")


def _claude(tmp_path: Path, credentials: tuple[str, ...] = ()) -> ClaudeAdapter:
    return ClaudeAdapter(_binary("claude"), _instruction(tmp_path, credentials), "engine", "01R")


def _codex(tmp_path: Path, provider: Provider | None = None) -> CodexAdapter:
    return CodexAdapter(_binary("codex"), _instruction(tmp_path), "vendor", "01R",
                        provider=provider)


def _loop(tmp_path: Path, credentials: tuple[str, ...] = ()) -> LoopAdapter:
    lane = Lane("local", "http://127.0.0.1:9/v1", "m", str(tmp_path / "k"),
                credential_env="LANE_KEY")
    return LoopAdapter(_binary("loop"), _instruction(tmp_path, credentials), "engine", "01R",
                       lane=lane, secret=b"sk-lane", scrub_env=("LANE_KEY",),
                       scrub_values=(b"sk-lane",))


def _adapters(tmp_path: Path) -> list[Adapter]:
    return [_claude(tmp_path), _codex(tmp_path), _codex(tmp_path, Provider("https://x/v1", "K")),
            _loop(tmp_path)]


def test_no_adapter_allows_a_name_that_never_passes(tmp_path: Path) -> None:
    for adapter in _adapters(tmp_path):
        allowed = adapter.env_allowed()
        assert "SSH_AUTH_SOCK" not in allowed and "TMPDIR" not in allowed
        assert not any(environment.never_passed(n) for n in allowed), adapter.tool
        assert all(environment.valid_name(n) for n in allowed)
        e = build(SHELL, allow=allowed, set_vars=RUN_VARS)  # never raises for an adapter
        assert "SSH_AUTH_SOCK" not in e.env and "AWS_SECRET_ACCESS_KEY" not in e.env


def test_claude_code_gets_its_documented_names(tmp_path: Path) -> None:
    allowed = _claude(tmp_path).env_allowed()
    assert set(allowed) == {"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                            "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CONFIG_DIR"}
    e = build(SHELL, allow=allowed, set_vars=RUN_VARS)
    # The config dir must match the one the engine granted the session leaf under.
    assert e.env["CLAUDE_CONFIG_DIR"] == "/home/op/.claude-seat"
    assert "OPENAI_API_KEY" not in e.env and "CODEX_HOME" not in e.env
    # The endpoint is never taken from saphan's environment: the slot's is set.
    assert "ANTHROPIC_BASE_URL" not in e.env
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL",
                 "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
        assert name not in allowed  # each selects a model


def test_claude_code_gets_its_endpoint_and_sub_agent_model_from_saphan(tmp_path: Path) -> None:
    slot = ClaudeAdapter(_binary("claude"), _instruction(tmp_path), "engine", "01R",
                         endpoint="http://127.0.0.1:7/gw")
    assert slot.env_set() == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:7/gw",
                              "CLAUDE_CODE_SUBAGENT_MODEL": "claude-opus-4-8[1m]"}
    source = {**SHELL, "CLAUDE_CODE_SUBAGENT_MODEL": "claude-haiku-4-5"}
    e = build(source, allow=slot.env_allowed(), set_vars={**slot.env_set(), **RUN_VARS})
    assert e.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7/gw"  # not SHELL's :9
    assert e.env["CLAUDE_CODE_SUBAGENT_MODEL"] == "claude-opus-4-8[1m]"
    assert {"ANTHROPIC_BASE_URL", "CLAUDE_CODE_SUBAGENT_MODEL"} <= set(e.set)
    assert "ANTHROPIC_BASE_URL" not in e.passed
    # No endpoint on the slot: none is set, and saphan's own is not passed either.
    e = build(SHELL, allow=_claude(tmp_path).env_allowed(),
              set_vars={**_claude(tmp_path).env_set(), **RUN_VARS})
    assert "ANTHROPIC_BASE_URL" not in e.env


def test_codex_gets_its_home_and_only_the_pinned_providers_key(tmp_path: Path) -> None:
    builtin = _codex(tmp_path).env_allowed()
    # OPENAI_BASE_URL is not passed: codex 0.169 does not read it (measured), and a run
    # with it set and no endpoint of its own is refused (tools/codex.py)
    assert set(builtin) == {"CODEX_HOME", "OPENAI_API_KEY", "CODEX_API_KEY"}
    pinned = _codex(tmp_path, Provider("http://127.0.0.1:9/v1", "SEAT_KEY")).env_allowed()
    assert set(pinned) == {"CODEX_HOME", "SEAT_KEY"}
    e = build(SHELL, allow=pinned, set_vars=RUN_VARS)
    assert e.env["SEAT_KEY"] == "sk-seat" and e.env["CODEX_HOME"] == "/home/op/.codex-seat"
    assert "OPENAI_API_KEY" not in e.env and "ANTHROPIC_API_KEY" not in e.env


def test_the_permission_classs_credentials_are_added(tmp_path: Path) -> None:
    adapter = _claude(tmp_path, credentials=("GITHUB_TOKEN",))
    assert "GITHUB_TOKEN" in adapter.env_allowed()
    assert build(SHELL, allow=adapter.env_allowed()).env["GITHUB_TOKEN"] == "ghp_secret"


def test_the_loop_gets_the_base_only_and_still_scrubs_by_value(tmp_path: Path) -> None:
    loop = _loop(tmp_path, credentials=("GITHUB_TOKEN",))
    assert loop.env_allowed() == ()  # not even a class's credentials: its key is on a pipe
    # A base variable that happens to hold the lane's key is scrubbed too.
    source = {**SHELL, "LC_PAPER": "x-sk-lane-x"}
    built = build(source, allow=loop.env_allowed(), set_vars=RUN_VARS)
    assert "LC_PAPER" in built.env and "LANE_KEY" not in built.env
    final = loop.environment(built.env)
    assert "LC_PAPER" not in final and "GITHUB_TOKEN" not in final
    assert set(final) == set(built.env) - {"LC_PAPER"}
    assert not any("sk-lane" in v for v in final.values())


def test_only_real_locale_categories_pass() -> None:
    """`LC_*` is how ssh's AcceptEnv carries arbitrary values: only the locale
    categories pass, by name (LC_GITHUB_TOKEN reached the jail before)."""
    source = {**SHELL, "LC_GITHUB_TOKEN": "ghp_x", "LC_AWS_SECRET_ACCESS_KEY": "s",
              "LC_TIME": "C.UTF-8"}
    e = build(source)
    assert "LC_GITHUB_TOKEN" not in e.env and "LC_AWS_SECRET_ACCESS_KEY" not in e.env
    assert e.env["LC_TIME"] == "C.UTF-8"
