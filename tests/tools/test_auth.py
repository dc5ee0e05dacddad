"""tools/auth.py: the auth pre-flight, against the real scripted servers of
model_servers.py (real HTTP on 127.0.0.1), and a `saphan run` end to end:
a rejected key refuses the run before its seat, with nothing posted.

The key's value is never in a record, a repr or a refusal's text."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from model_servers import ChatCompletionsServer, MessagesServer, ResponsesServer

from conftest import Saphan
from saphan.lanes import Lane
from saphan.loop.adapter import interpreter
from saphan.refusals import Refusal
from saphan.tools import auth, claude
from saphan.tools.adapter import CommandAdapter
from saphan.tools.binaries import AgentBinary
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.codex import CodexAdapter, Provider
from saphan.tools.instruction import Instruction
from saphan.transport.ssh import Completed

KEY = "sk-ant-preflight-" + "7" * 24
ALL_KEYS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
            "OPENAI_API_KEY", "CODEX_API_KEY", "SAPHAN_TEST_KEY")
RECORD_KEYS = {"endpoint", "url", "credential", "status", "result", "checked_from"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No key variable and no login file unless a test sets one."""
    for name in ALL_KEYS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "claude-home").mkdir()
    (tmp_path / "codex-home").mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude-home"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))


def _instruction(tmp_path: Path) -> Instruction:
    return Instruction(prompt_path=str(tmp_path / "prompt.txt"), workdir=str(tmp_path))


def _claude(tmp_path: Path, endpoint: str | None) -> ClaudeAdapter:
    return ClaudeAdapter(AgentBinary("claude", "/opt/claude", "0" * 64, "test"),
                         _instruction(tmp_path), "engine", "01R", endpoint=endpoint)


def _codex(tmp_path: Path, provider: Provider | None) -> CodexAdapter:
    return CodexAdapter(AgentBinary("codex", "/opt/codex", "0" * 64, "test"),
                        _instruction(tmp_path), "vendor", "01R", provider=provider)


def _no_key_anywhere(key: str, *things: object) -> None:
    for thing in things:
        text = thing if isinstance(thing, str) else repr(thing)
        assert key not in text, text
        if isinstance(thing, dict):
            assert key not in json.dumps(thing), thing


def _refusal_text(r: Refusal) -> str:
    return f"{r.render()}\n{r.message}\n{r.remediation}\n{r!r}\n{r}"


# -- claude ----------------------------------------------------------------------------

@pytest.mark.parametrize(("variable", "expected"), [
    ("ANTHROPIC_API_KEY", {"x-api-key": KEY}),
    ("ANTHROPIC_AUTH_TOKEN", {"authorization": f"Bearer {KEY}"}),
    ("CLAUDE_CODE_OAUTH_TOKEN", {"authorization": f"Bearer {KEY}",
                                 "anthropic-beta": "oauth-2025-04-20"}),
])
def test_claude_accepted_with_each_credential_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, expected: dict[str, str],
) -> None:
    monkeypatch.setenv(variable, KEY)
    with MessagesServer([]) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url + "/"))
        assert target is not None
        rec = auth.check(target, where="here")
    assert rec == {"endpoint": srv.base_url + "/", "url": f"{srv.base_url}/v1/models",
                   "credential": variable, "status": 200, "result": "accepted",
                   "checked_from": "here"}
    assert srv.paths == ["GET /v1/models"] and srv.requests == []
    got = {k.lower(): v for k, v in srv.get_headers[0].items()}
    assert got["anthropic-version"] == "2023-06-01"
    for name, value in expected.items():
        assert got[name] == value
    if variable != "ANTHROPIC_API_KEY":
        assert "x-api-key" not in got
    _no_key_anywhere(KEY, rec, target, str(target))


def test_the_first_variable_set_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "sk-oauth-other-value")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    target = auth.target_for(_claude(tmp_path, None))
    assert target is not None
    assert target.credential == "ANTHROPIC_API_KEY"
    assert target.endpoint == claude.DEFAULT_ENDPOINT == "https://api.anthropic.com"
    assert target.url == "https://api.anthropic.com/v1/models"
    assert target.headers["x-api-key"] == KEY and "Authorization" not in target.headers


def test_an_endpoint_with_no_model_listing_is_accepted(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with MessagesServer([], models_status=404) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        rec = auth.check(target, where="here")
    assert rec["status"] == 404 and rec["result"].startswith("accepted"), rec
    assert "was not rejected" in rec["result"]


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_key_is_refused_naming_the_variable_not_its_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: int,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    kw: dict[str, Any] = {"reject_auth": True} if status == 401 else {"models_status": 403}
    with MessagesServer([], **kw) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        with pytest.raises(Refusal) as e:
            auth.check(target, where="here")
    r = e.value
    assert r.cls == "agent-auth-rejected"
    assert f"HTTP {status}" in r.message and "ANTHROPIC_API_KEY" in r.message
    assert srv.base_url in r.message and "claude" in r.message
    assert "ANTHROPIC_API_KEY" in r.remediation and "log" in r.remediation
    assert srv.paths == ["GET /v1/models"]
    _no_key_anywhere(KEY, _refusal_text(r))


def test_reject_auth_answers_posts_too_in_the_protocols_shape() -> None:
    import urllib.error
    import urllib.request

    with MessagesServer([], reject_auth=True) as srv:
        req = urllib.request.Request(srv.base_url + "/v1/messages", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 401
        assert json.loads(e.value.read())["error"]["type"] == "authentication_error"
    with ResponsesServer([], reject_auth=True) as srv2:
        req = urllib.request.Request(srv2.base_url + "/v1/responses", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 401 and "error" in json.loads(e.value.read())


def test_no_credential_at_all_is_agent_auth_missing(tmp_path: Path) -> None:
    target = auth.target_for(_claude(tmp_path, "http://127.0.0.1:9"))
    assert target is not None and target.missing
    with pytest.raises(Refusal) as e:
        auth.check(target, where="here")
    r = e.value
    assert r.cls == "agent-auth-missing"
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        assert name in r.message
    login = os.path.join(os.path.realpath(tmp_path / "claude-home"), ".credentials.json")
    assert login in r.message
    assert "ANTHROPIC_API_KEY" in r.remediation and "log claude in" in r.remediation


def test_a_login_files_token_is_checked_as_claude_presents_it(tmp_path: Path) -> None:
    """A current OAuth session in the seat's login file: no refresh, and its
    token goes to the endpoint as Claude Code sends it (Bearer, with the
    OAuth beta header); the record names the file, never the token."""
    import time

    login = tmp_path / "claude-home" / ".credentials.json"
    login.write_text(json.dumps({"claudeAiOauth": {
        "accessToken": "tok-in-the-file", "refreshToken": "ref-in-the-file",
        "expiresAt": int((time.time() + 3600) * 1000)}}))
    login.chmod(0o600)
    with MessagesServer([]) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None and not target.missing
        assert target.login_file == os.path.realpath(login)
        rec = auth.check(target, where="here")
    assert rec["result"] == "accepted" and rec["status"] == 200
    assert rec["login"]["file"] == os.path.realpath(login)
    assert rec["login"]["refresh"] == "not due"
    sent = {k.lower(): v for k, v in srv.get_headers[-1].items()}
    assert sent["authorization"] == "Bearer tok-in-the-file"
    assert sent["anthropic-beta"] == auth.ANTHROPIC_OAUTH_BETA
    assert "tok-in-the-file" not in json.dumps(rec) and "ref-in-the-file" not in json.dumps(rec)



def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_endpoint_is_not_checked_and_not_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    target = auth.target_for(_claude(tmp_path, f"http://127.0.0.1:{_closed_port()}"))
    assert target is not None
    rec = auth.check(target, where="here")
    assert set(rec) == RECORD_KEYS and rec["status"] is None
    assert rec["result"].startswith("not checked: ") and "could not be reached" in rec["result"]
    _no_key_anywhere(KEY, rec)


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_error_is_not_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       status: int) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with MessagesServer([], models_status=status) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        rec = auth.check(target, where="here")
    assert rec["status"] == status and rec["result"] == (
        f"not checked: {srv.base_url} answered HTTP {status}")


class _Redirect:
    """A server whose every GET redirects to ``to`` (where the key must not go)."""

    def __init__(self, to: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", to)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_a: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> _Redirect:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_redirect_is_not_followed_so_the_key_goes_nowhere_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with MessagesServer([]) as elsewhere, _Redirect(elsewhere.base_url + "/v1/models") as redir:
        target = auth.target_for(_claude(tmp_path, redir.base_url))
        assert target is not None
        rec = auth.check(target, where="here")
        assert elsewhere.paths == []
    assert rec["status"] == 302 and rec["result"].startswith("not checked"), rec


def test_a_key_with_a_line_break_is_not_sent(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY + "\r\nx-injected: 1")
    with MessagesServer([]) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        rec = auth.check(target, where="here")
    assert srv.paths == [] and rec["result"].startswith("not checked: ")
    _no_key_anywhere(KEY, rec)


# -- codex -----------------------------------------------------------------------------

def test_codex_pinned_provider_uses_its_env_key(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("SAPHAN_TEST_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    with ResponsesServer([]) as srv:
        target = auth.target_for(_codex(tmp_path, Provider(srv.base_url + "/v1",
                                                           "SAPHAN_TEST_KEY")))
        assert target is not None
        rec = auth.check(target, where="here")
    assert rec["credential"] == "SAPHAN_TEST_KEY" and rec["url"] == f"{srv.base_url}/v1/models"
    assert rec["result"] == "accepted" and srv.paths == ["GET /v1/models"]
    assert srv.get_headers[0]["Authorization"] == f"Bearer {KEY}"
    _no_key_anywhere(KEY, rec, target)


def test_codex_pinned_provider_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SAPHAN_TEST_KEY", KEY)
    with ResponsesServer([], reject_auth=True) as srv:
        target = auth.target_for(_codex(tmp_path, Provider(srv.base_url + "/v1",
                                                           "SAPHAN_TEST_KEY")))
        assert target is not None
        with pytest.raises(Refusal) as e:
            auth.check(target, where="here")
    assert e.value.cls == "agent-auth-rejected" and "SAPHAN_TEST_KEY" in e.value.message
    _no_key_anywhere(KEY, _refusal_text(e.value))


def test_codex_builtin_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    target = auth.target_for(_codex(tmp_path, None))
    assert target is not None
    assert (target.endpoint, target.url, target.credential) == (
        "https://api.openai.com/v1", "https://api.openai.com/v1/models", "OPENAI_API_KEY")
    assert target.headers == {"Authorization": f"Bearer {KEY}"}


def test_codex_login_file_or_missing(tmp_path: Path) -> None:
    adapter = _codex(tmp_path, Provider("http://127.0.0.1:9/v1", "SAPHAN_TEST_KEY"))
    target = auth.target_for(adapter)
    assert target is not None and target.missing
    with pytest.raises(Refusal) as e:
        auth.check(target, where="here")
    assert e.value.cls == "agent-auth-missing"
    assert "SAPHAN_TEST_KEY" in e.value.message
    assert str(tmp_path / "codex-home" / "auth.json") in e.value.message
    # `codex login --with-api-key`: the key in the login file is checked as a key
    (tmp_path / "codex-home" / "auth.json").write_text('{"OPENAI_API_KEY": "sk-in-file"}')
    with ResponsesServer([]) as srv:
        adapter = _codex(tmp_path, None)
        target = auth.target_for(adapter)
        assert target is not None and target.login_file is not None
        from dataclasses import replace

        rec = auth.check(replace(target, url=f"{srv.base_url}/v1/models"), where="here")
    assert rec["status"] == 200 and rec["login"]["kind"] == "api-key"
    assert {k.lower(): v for k, v in srv.get_headers[-1].items()}["authorization"] == \
        "Bearer sk-in-file"
    assert "sk-in-file" not in json.dumps(rec)


# -- loop and command ------------------------------------------------------------------

def test_loop_checks_the_lane_as_its_client_sends(tmp_path: Path) -> None:
    from saphan.loop.adapter import LoopAdapter

    secret = b"sk-lane-" + b"5" * 24
    with ChatCompletionsServer([]) as srv:
        lane = Lane("L", srv.base_url + "/v1/", "m", "/keys/l.key", "LANE_KEY")
        adapter = LoopAdapter(interpreter(), _instruction(tmp_path), "engine", "01R",
                              lane=lane, secret=secret)
        target = auth.target_for(adapter)
        assert target is not None
        rec = auth.check(target, where="here")
    assert srv.paths == ["GET /v1/models"]
    assert srv.get_headers[0]["Authorization"] == f"Bearer {secret.decode()}"
    assert rec["result"] == "accepted" and "lane L" in rec["credential"]
    _no_key_anywhere(secret.decode(), rec, target)


def test_a_command_slot_checks_nothing(tmp_path: Path) -> None:
    adapter = CommandAdapter(AgentBinary("command", "/bin/true", "0" * 64, ""),
                             _instruction(tmp_path), "engine", "01R", command=("/bin/true",))
    assert auth.target_for(adapter) is None


# -- far_check's script, run here (tests/integration/sshd/test_far_auth.py: over SSH) --

class _HereRunner:
    """Runs a far script with this host's /bin/sh (the far machine's stand-in)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.scripts: list[str] = []

    @property
    def name(self) -> str:
        return "stand-in"

    def run(self, script: str, *, stdin: bytes | None = None,
            timeout: float | None = None) -> Completed:
        self.scripts.append(script)
        env = dict(os.environ) if self.path is None else {"PATH": self.path}
        p = subprocess.run(["/bin/sh", "-c", script], input=stdin, capture_output=True,
                           timeout=timeout, env=env, check=False)
        return Completed(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def curl() -> Iterator[None]:
    import shutil

    from conftest import require

    require(shutil.which("curl") is not None, "curl (the far side of the auth pre-flight)")
    yield


@pytest.mark.usefixtures("curl")
def test_far_check_script_with_curl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    runner = _HereRunner()
    with MessagesServer([]) as srv:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        rec = auth.far_check(runner, target, where="far")
    assert rec["result"] == "accepted" and rec["status"] == 200 and rec["checked_from"] == "far"
    assert srv.get_headers[0]["x-api-key"] == KEY
    assert KEY not in runner.scripts[0] and "-H @-" in runner.scripts[0]
    with MessagesServer([], reject_auth=True) as srv, pytest.raises(Refusal) as e:
        target = auth.target_for(_claude(tmp_path, srv.base_url))
        assert target is not None
        auth.far_check(runner, target, where="far")
    assert e.value.cls == "agent-auth-rejected"
    target = auth.target_for(_claude(tmp_path, f"http://127.0.0.1:{_closed_port()}"))
    assert target is not None
    rec = auth.far_check(runner, target, where="far")
    assert rec["result"].startswith("not checked: ") and rec["status"] is None
    _no_key_anywhere(KEY, rec, *runner.scripts)


def test_far_check_without_curl_is_not_checked(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    target = auth.target_for(_claude(tmp_path, "http://127.0.0.1:9"))
    assert target is not None
    rec = auth.far_check(_HereRunner(str(empty)), target, where="far")
    assert rec["result"] == "not checked: curl is not on stand-in's PATH"


def test_far_check_missing_credential_is_refused_without_a_connection(tmp_path: Path) -> None:
    runner = _HereRunner()
    target = auth.target_for(_claude(tmp_path, "http://127.0.0.1:9"))
    assert target is not None
    with pytest.raises(Refusal) as e:
        auth.far_check(runner, target, where="far")
    assert e.value.cls == "agent-auth-missing" and runner.scripts == []


# -- end to end: `saphan run` ----------------------------------------------------------

@pytest.mark.slow
def test_a_rejected_key_refuses_the_run_before_its_seat(saphan_sqlite: Saphan, claude_bin: str,
                                                        tmp_path: Path) -> None:
    """The endpoint answers 401: exit 3, `agent-auth-rejected`, no seat taken,
    and the server got the pre-flight's GET only — nothing was posted."""
    s = saphan_sqlite
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    with MessagesServer([("text", "never")], reject_auth=True) as srv:
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cl", "--tool", "claude", "--endpoint", srv.base_url)
        env = s.env(HOME=str(home), ANTHROPIC_API_KEY=KEY, SAPHAN_CLAUDE_BIN=claude_bin,
                    CLAUDE_CONFIG_DIR=str(home / ".claude"))
        r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd), "--prompt", "go",
              env=env, timeout=120)
        paths = list(srv.paths)
    assert r.code == 3, (r.code, r.err)
    assert "refused [agent-auth-rejected]:" in r.err and "ANTHROPIC_API_KEY" in r.err
    assert paths == ["GET /v1/models"], paths
    rec = s.ok("runs", "show", "last", "--json", env=env).json()
    assert rec["refusal"]["class"] == "agent-auth-rejected"
    assert rec["session_ordinal"] is None  # refused before any seat
    assert rec["outcome"] == "refused"
    _no_key_anywhere(KEY, r.err, r.out, json.dumps(rec))


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_a_loop_run_records_its_preflight(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    key = tmp_path / "keys" / "lane.key"
    key.parent.mkdir()
    secret = "sk-test-" + "4" * 24
    key.write_text(secret + "\n")
    key.chmod(0o600)
    with ChatCompletionsServer([("calls", [("finish", {"summary": "ok"})])]) as srv:
        s.ok("lane", "add", "L", "--base-url", f"{srv.base_url}/v1", "--model", "m1",
             "--credential-file", str(key))
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        wd = tmp_path / "wd"
        wd.mkdir()
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd), "--prompt",
              "task", "--json", timeout=60)
        paths = list(srv.paths)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert rec["auth"] == {"endpoint": f"{srv.base_url}/v1", "url": f"{srv.base_url}/v1/models",
                           "credential": f"lane L's credential file ({key})", "status": 200,
                           "result": "accepted", "checked_from": "here"}
    assert paths[0] == "GET /v1/models" and paths[1] == "POST /v1/chat/completions"
    _no_key_anywhere(secret, r.out, r.err)
