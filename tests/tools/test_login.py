"""A seat's login file (tools/login.py and the auth pre-flight's use of it):
read without following links, refreshed outside the jail when its token is
due — against a scripted token endpoint on loopback — and written back in
place, owner-only; a refused grant is agent-auth-rejected before any seat."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_servers import MessagesServer, TokenServer

from saphan.refusals import Refusal
from saphan.tools import auth, login
from saphan.tools.binaries import AgentBinary
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.codex import CodexAdapter
from saphan.tools.instruction import Instruction


@pytest.fixture(autouse=True)
def _homes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
                 "OPENAI_API_KEY", "CODEX_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for d in ("claude-home", "codex-home"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude-home"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))


def _claude_login(tmp_path: Path, *, expires_in: float, refresh: str | None = "ref-1") -> Path:
    p = tmp_path / "claude-home" / ".credentials.json"
    o: dict[str, Any] = {"accessToken": "acc-1", "expiresAt": int((time.time() + expires_in)
                                                                   * 1000),
                         "scopes": ["user:inference", "user:profile"],
                         "subscriptionType": "max"}
    if refresh is not None:
        o["refreshToken"] = refresh
    p.write_text(json.dumps({"claudeAiOauth": o, "other": {"kept": True}}))
    p.chmod(0o600)
    return p


def _jwt(exp: float) -> str:
    def part(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")
    return f"{part({'alg': 'none'})}.{part({'exp': int(exp)})}.sig"


def _claude(tmp_path: Path, endpoint: str) -> ClaudeAdapter:
    return ClaudeAdapter(AgentBinary("claude", "/opt/claude", "0" * 64, "test"),
                         Instruction(prompt_path=str(tmp_path / "p"), workdir=str(tmp_path)),
                         "engine", "01R", endpoint=endpoint)


def _codex(tmp_path: Path) -> CodexAdapter:
    return CodexAdapter(AgentBinary("codex", "/opt/codex", "0" * 64, "test"),
                        Instruction(prompt_path=str(tmp_path / "p"), workdir=str(tmp_path)),
                        "vendor", "01R")


def _sent(srv: MessagesServer) -> dict[str, str]:
    return {k.lower(): v for k, v in srv.get_headers[-1].items()}


@pytest.fixture
def models() -> Iterator[MessagesServer]:
    with MessagesServer([]) as srv:
        yield srv


def test_an_expired_claude_token_is_refreshed_here_and_written_back(
        tmp_path: Path, models: MessagesServer) -> None:
    p = _claude_login(tmp_path, expires_in=-60)
    with TokenServer([(200, {"access_token": "acc-2", "refresh_token": "ref-2",
                             "expires_in": 3600, "scope": "user:inference"})]) as tok:
        target = auth.target_for(_claude(tmp_path, models.base_url))
        assert target is not None
        rec = auth.check(target, where="here", token_url=tok.url)
    # the tool's own grant, with the scopes the file holds
    assert tok.bodies == [{"grant_type": "refresh_token", "refresh_token": "ref-1",
                           "client_id": login.CLAUDE_CLIENT_ID,
                           "scope": "user:inference user:profile"}]
    data = json.loads(p.read_text())
    o = data["claudeAiOauth"]
    assert (o["accessToken"], o["refreshToken"], o["scopes"]) == ("acc-2", "ref-2",
                                                                  ["user:inference"])
    assert o["expiresAt"] / 1000 > time.time() + 3000
    assert o["subscriptionType"] == "max" and data["other"] == {"kept": True}
    assert p.stat().st_mode & 0o777 == 0o600 and not p.is_symlink()
    assert [x for x in os.listdir(p.parent) if x.startswith(".")] == [".credentials.json"]
    # then the new token was checked against the endpoint, as Claude presents it
    assert _sent(models)["authorization"] == "Bearer acc-2"
    assert rec["result"] == "accepted" and rec["login"]["refresh"] == f"refreshed at {tok.url}"
    for secret in ("acc-1", "acc-2", "ref-1", "ref-2"):
        assert secret not in json.dumps(rec)


def test_a_refused_grant_is_agent_auth_rejected_and_the_file_is_left(
        tmp_path: Path, models: MessagesServer) -> None:
    p = _claude_login(tmp_path, expires_in=10)  # within the margin: due
    before = p.read_bytes()
    with TokenServer([(400, {"error": "invalid_grant"})]) as tok:
        target = auth.target_for(_claude(tmp_path, models.base_url))
        assert target is not None
        with pytest.raises(Refusal) as e:
            auth.check(target, where="here", token_url=tok.url)
    assert e.value.cls == "agent-auth-rejected"
    assert "login session is dead" in e.value.message and "invalid_grant" in e.value.message
    assert "claude /login" in e.value.remediation
    assert "ref-1" not in e.value.render()
    assert p.read_bytes() == before
    assert models.get_headers == []  # nothing sent to the endpoint


def test_an_unreachable_token_endpoint_leaves_the_token_and_says_so(
        tmp_path: Path, models: MessagesServer) -> None:
    _claude_login(tmp_path, expires_in=-1)
    target = auth.target_for(_claude(tmp_path, models.base_url))
    assert target is not None
    rec = auth.check(target, where="here", token_url="http://127.0.0.1:9/v1/oauth/token")
    assert rec["login"]["refresh"].startswith("not refreshed: ")
    assert _sent(models)["authorization"] == "Bearer acc-1"  # checked as it is


def test_a_current_token_is_not_refreshed_and_a_rejected_one_is_refused(tmp_path: Path) -> None:
    _claude_login(tmp_path, expires_in=3600)
    with TokenServer([]) as tok, MessagesServer([], reject_auth=True) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        with pytest.raises(Refusal) as e:
            auth.check(target, where="here", token_url=tok.url)
    assert tok.bodies == []
    assert e.value.cls == "agent-auth-rejected"


def test_a_session_ended_or_a_linked_login_file_is_agent_auth_missing(tmp_path: Path,
                                                                      models: MessagesServer
                                                                      ) -> None:
    p = tmp_path / "claude-home" / ".credentials.json"
    p.write_text(json.dumps({"claudeAiOauth": {"accessToken": "", "refreshToken": ""}}))
    target = auth.target_for(_claude(tmp_path, models.base_url))
    assert target is not None
    with pytest.raises(Refusal) as e:
        auth.check(target, where="here")
    assert e.value.cls == "agent-auth-missing" and "session was ended" in e.value.message
    real = tmp_path / "elsewhere.json"
    _claude_login(tmp_path, expires_in=3600).rename(real)
    p.symlink_to(real)
    with pytest.raises(Refusal) as e:
        login.read("claude", str(p))
    assert e.value.cls == "agent-auth-missing" and "follows no link" in e.value.message


def test_a_due_codex_login_is_refreshed_and_not_sent_to_the_endpoint(tmp_path: Path) -> None:
    p = tmp_path / "codex-home" / "auth.json"
    p.write_text(json.dumps({"OPENAI_API_KEY": None, "last_refresh": "2026-01-01T00:00:00Z",
                             "tokens": {"access_token": _jwt(time.time() - 10),
                                        "refresh_token": "cref-1", "id_token": "id-1",
                                        "account_id": "acct"}}))
    p.chmod(0o600)
    fresh = _jwt(time.time() + 3600)
    with TokenServer([(200, {"access_token": fresh, "refresh_token": "cref-2"})]) as tok:
        target = auth.target_for(_codex(tmp_path))
        assert target is not None
        rec = auth.check(target, where="here", token_url=tok.url)
    assert tok.bodies == [{"client_id": login.CODEX_CLIENT_ID, "grant_type": "refresh_token",
                           "refresh_token": "cref-1", "scope": "openid profile email"}]
    data = json.loads(p.read_text())
    assert data["tokens"]["access_token"] == fresh
    assert data["tokens"]["refresh_token"] == "cref-2" and data["tokens"]["id_token"] == "id-1"
    assert data["tokens"]["account_id"] == "acct" and data["last_refresh"] > "2026-01-01"
    assert rec["result"].startswith("accepted: the login token is current")
    assert rec["status"] is None  # nothing was sent to the endpoint


def test_a_login_file_changed_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    p = _claude_login(tmp_path, expires_in=-1)
    seat = login.read("claude", str(p))
    # the tool refreshed it itself between saphan's read and its write
    _claude_login(tmp_path, expires_in=7200, refresh="ref-tool")
    with TokenServer([(200, {"access_token": "acc-2", "expires_in": 3600})]) as tok:
        after, note = login.refreshed(seat, tok.url)
    assert note == "refreshed elsewhere meanwhile; read again"
    assert json.loads(p.read_text())["claudeAiOauth"]["refreshToken"] == "ref-tool"
    assert after.refresh == "ref-tool"


def test_two_refreshes_of_one_seat_take_turns(tmp_path: Path) -> None:
    """A refresh token is spent once: the second saphan waits for the
    first's lock, then reads the file the first wrote (and finds it fresh)."""
    import threading

    p = _claude_login(tmp_path, expires_in=-1)
    place = login.Here()
    entered = threading.Event()

    def hold() -> None:
        with place.lock(str(p)):
            entered.set()
            time.sleep(0.5)

    th = threading.Thread(target=hold)
    th.start()
    entered.wait(5)
    t0 = time.monotonic()
    with place.lock(str(p)):
        waited = time.monotonic() - t0
    th.join()
    assert waited >= 0.4


def test_hostile_numbers_and_echoed_tokens_do_not_crash_or_leak(tmp_path: Path,
                                                               models: MessagesServer) -> None:
    # an expiry that is not a sane number is no expiry (never a crash)
    for bad in (float("1e400"), 10 ** 400, "soon", True, -5):
        p = tmp_path / "claude-home" / ".credentials.json"
        p.write_text(json.dumps({"claudeAiOauth": {"accessToken": "a", "expiresAt": bad}})
                     if not isinstance(bad, float) else
                     '{"claudeAiOauth": {"accessToken": "a", "expiresAt": 1e400}}')
        assert login.read("claude", str(p)).expires_at is None
    assert login._jwt_exp(_jwt(10 ** 400)) is None
    # a refusal's text that echoes the refresh token, even cut, is withheld
    _claude_login(tmp_path, expires_in=-1, refresh="R" * 40 + "-secret-refresh-token")
    echo = "invalid_grant for " + "R" * 40 + "-secret-refresh-token"
    with TokenServer([(400, {"error": echo})]) as tok:
        target = auth.target_for(_claude(tmp_path, models.base_url))
        assert target is not None
        with pytest.raises(Refusal) as e:
            auth.check(target, where="here", token_url=tok.url)
    assert "RRRRRRRRRRRR" not in e.value.render()
    # an absurd expires_in is not written as an expiry
    p = _claude_login(tmp_path, expires_in=-1)
    with TokenServer([(200, {"access_token": "acc-9", "expires_in": 1e300})]) as tok:
        seat, note = login.refreshed(login.read("claude", str(p)), tok.url)
    assert note.startswith("refreshed at") and seat.access == "acc-9"
    assert [x for x in os.listdir(p.parent) if x.startswith(".")] == [".credentials.json"]
