"""site/far_agent.py: which far binary, the checks on what the runner
measured, and what crosses the channel (the end-to-end runs on real sshd
hosts are tests/integration/sshd/test_far_agents.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from saphan.context import Context
from saphan.refusals import Refusal
from saphan.site import far, far_agent
from saphan.site.far import Preflight
from saphan.store.rows import Machine, Slot
from saphan.tools.binaries import AgentBinary
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.instruction import Instruction


@pytest.fixture
def ctx(engine_ctx: Context) -> Context:
    """A real workspace, on each store (tests/conftest.py)."""
    return engine_ctx


FAR = Machine("far1", "ssh", "u", "10.0.0.1", 22, None, "ssh-ed25519 AAAA")


def test_a_runtime_tool_is_never_looked_up_on_the_far_path(ctx: Context) -> None:
    with pytest.raises(Refusal) as e:
        far_agent.binary_path(ctx, Slot("far1", "cl", "claude", None), FAR)
    assert e.value.cls == "agent-binary-missing"
    assert "--agent-path" in e.value.remediation and "PATH" in e.value.message
    got = far_agent.binary_path(ctx, Slot("far1", "cl", "claude", None,
                                          agent_path="/opt/c/claude"), FAR)
    assert got == "/opt/c/claude"


def test_codex_without_a_delivery_or_a_path_is_refused(ctx: Context) -> None:
    assert ctx.store.add_machine(FAR)
    with pytest.raises(Refusal) as e:
        far_agent.binary_path(ctx, Slot("far1", "cx", "codex", None), FAR)
    assert e.value.cls == "agent-binary-missing"
    assert "machine deliver far1 --agent codex" in e.value.remediation


def _pf(**raw: str) -> Preflight:
    return Preflight({k: v for k, v in raw.items()})


def test_the_runners_measurement_is_what_is_recorded() -> None:
    pf = _pf(agent_path="/opt/c/claude", agent_real="/opt/c/claude", agent_sha256="a" * 64,
             agent_version="2.1.197 (Claude Code)")
    b = far_agent.far_binary("claude", "far1", "/opt/c/claude", pf, "/w")
    assert b == AgentBinary("claude", "/opt/c/claude", "a" * 64, "2.1.197 (Claude Code)")
    with pytest.raises(Refusal) as e:
        far_agent.far_binary("claude", "far1", "/opt/c/claude",
                             _pf(agent_missing="/opt/c/claude"), "/w")
    assert e.value.cls == "agent-binary-missing" and "far1" in e.value.message
    # an agent the run could replace is not run
    inside = _pf(agent_path="/w/bin/claude", agent_real="/w/bin/claude", agent_sha256="a" * 64)
    with pytest.raises(Refusal) as e:
        far_agent.far_binary("claude", "far1", "/w/bin/claude", inside, "/w")
    assert e.value.cls == "workdir-unsafe"
    linked = _pf(agent_path="/opt/c/claude", agent_real="/w/claude", agent_sha256="a" * 64)
    with pytest.raises(Refusal):
        far_agent.far_binary("claude", "far1", "/opt/c/claude", linked, "/w")


def test_the_key_crosses_in_the_frame_and_this_hosts_paths_do_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/root/here-only")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-run")
    adapter = ClaudeAdapter(AgentBinary("claude", "/opt/c/claude", "a" * 64, "v"),
                            Instruction(prompt_path="/far/runs/R/prompt.txt", workdir="/w"),
                            "engine", "01RUN", endpoint="http://127.0.0.1:9",
                            far_machine="far1")
    keep, sent = far_agent.frame_env(adapter, "01RUN")
    assert sent["ANTHROPIC_API_KEY"] == "sk-secret"
    assert sent["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert sent["SAPHAN_RUN_ID"] == "01RUN"
    assert "CLAUDE_CONFIG_DIR" not in sent and "CLAUDE_CONFIG_DIR" in keep
    assert "AWS_SECRET_ACCESS_KEY" not in sent and "AWS_SECRET_ACCESS_KEY" not in keep
    assert "PATH" in keep and "HOME" in keep
    frame = far.frame(keep=keep, env=sent, stdin=b"the task")
    assert frame.startswith(far.FRAME_MAGIC) and frame.endswith(b"stdin 8\nthe taskend\n")
    assert b"env ANTHROPIC_API_KEY 9\nsk-secret" in frame
    with pytest.raises(ValueError):
        far.frame(env={"BAD NAME": "x"})
