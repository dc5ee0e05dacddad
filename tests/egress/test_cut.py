"""The cut of one run (egress/cut.py), without a jail: where a policy is
refused by name, what the jail's environment holds (the door with the run's
token, never a route's real secret), and a route that must lead where the
slot says. The cut on real runs: tests/egress/test_cut_runs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from saphan import Refusal
from saphan.egress import cut
from saphan.egress.policy import parse

SECRET = "sk-real-secret-0123456789abcdef"
POLICY: dict[str, Any] = {
    "schema": 1, "name": "p",
    "allow": [{"host": "api.github.com", "ports": [443]}],
    "routes": [{"name": "anthropic", "tool": "claude", "upstream": "https://api.anthropic.com",
                "header": "x-api-key", "secret_env": "ANTHROPIC_API_KEY"}],
}


def _cut(tool: str = "claude", **kw: Any) -> cut.Cut:
    made = cut.Cut(parse(POLICY), tool=tool, **kw)
    made.read_secrets({"ANTHROPIC_API_KEY": SECRET})
    return made


@pytest.mark.parametrize(("tool", "mechanism", "where", "cls"), [
    ("command", "landlock", "local", "egress-unsupported-lane"),
    ("claude", "landlock", "local", "egress-unsupported-lane"),
    ("loop", "ssh", "SSH machine far1", "egress-unsupported-lane"),
    ("command", "ssh", "SSH machine far1", "egress-unsupported-lane"),
    ("claude", "vendor:claude", "local", "egress-unsupported-tool"),
    ("command", "seatbelt", "local", "egress-uncuttable"),
])
def test_a_path_without_a_network_lever_is_refused_by_name(tool: str, mechanism: str,
                                                           where: str, cls: str) -> None:
    with pytest.raises(Refusal) as e:
        cut.refuse_unless_cuttable(tool=tool, mechanism=mechanism, where=where)
    assert e.value.cls == cls
    assert "egress policy" in e.value.message and e.value.remediation


@pytest.mark.parametrize("tool", ["command", "claude", "loop"])
def test_bubblewrap_on_the_control_plane_is_cuttable(tool: str) -> None:
    cut.refuse_unless_cuttable(tool=tool, mechanism="bubblewrap", where="local")
    # Codex confines itself; saphan cuts around it (a Linux network namespace)
    cut.refuse_unless_cuttable(tool="codex", mechanism="vendor:codex", where="local")


def test_the_jail_gets_the_door_with_its_token_and_a_placeholder_never_the_secret() -> None:
    c = _cut()
    c.key_var = "ANTHROPIC_API_KEY"  # as Cut.adapter() sets it for a Claude route
    env = c.environment({"PATH": "/usr/bin", "ANTHROPIC_API_KEY": SECRET, "OPENAI_API_KEY": "o",
                         "ANTHROPIC_AUTH_TOKEN": "x", "OTHER": f"prefix-{SECRET}-suffix",
                         "NO_PROXY": "*", "HTTPS_PROXY": "http://corp:8080"})
    proxy = f"http://saphan:{c.token}@127.0.0.1:{cut.DOOR_PORT}"
    assert all(env[v] == proxy for v in cut.PROXY_VARS)
    assert env["NO_PROXY"] == "" and env["no_proxy"] == ""
    assert env["ANTHROPIC_API_KEY"] == c.placeholder != SECRET
    assert "ANTHROPIC_AUTH_TOKEN" not in env and "OTHER" not in env
    assert "OPENAI_API_KEY" not in env  # every provider variable goes
    assert SECRET not in repr(env) and SECRET not in repr(c)
    assert c.token not in repr(c) and c.placeholder not in repr(c)
    assert set(c.variables()) == {*cut.PROXY_VARS, *cut.NO_PROXY_VARS, "ANTHROPIC_API_KEY",
                                  cut.PLACEHOLDER_VAR}
    assert env[cut.PLACEHOLDER_VAR] == c.placeholder
    rec = c.record()
    assert rec["agent_credential"] == cut.NO_PROVIDER_KEY
    assert SECRET not in repr(rec) and c.token not in repr(rec)


def test_a_stored_claude_key_the_jail_can_read_is_named_on_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    c = _cut()
    assert c.stored_keys() == []
    (tmp_path / ".claude.json").write_text(json.dumps({"primaryApiKey": "sk-ant-stored"}))
    [note] = c.stored_keys()
    assert "primaryApiKey" in note and "sk-ant-stored" not in note
    assert c.record()["agent_credential_readable"] == [note]
    assert _cut("command").stored_keys() == []


def test_two_runs_get_different_tokens_and_placeholders() -> None:
    a, b = _cut(), _cut()
    assert a.token != b.token and a.placeholder != b.placeholder
    assert len(a.token) >= 32 and a.placeholder.startswith("saphan-placeholder-")


def test_a_tool_no_route_serves_keeps_its_variables_and_only_gets_the_proxies() -> None:
    c = _cut("command")
    env = c.environment({"PATH": "/usr/bin", "GH_TOKEN": "ghp_notaroutesecret"})
    assert env["GH_TOKEN"] == "ghp_notaroutesecret" and "ANTHROPIC_API_KEY" not in env
    assert "agent_credential" not in c.record()


def test_a_class_saying_network_off_leaves_the_door_only_its_routes() -> None:
    c = _cut(routes_only=True)
    assert "only the credential routes" in c.network_note()
    assert c.record()["connect"].startswith("none")
    assert "api.github.com:443" in _cut().network_note()
