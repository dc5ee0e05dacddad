"""tools/auth.far_check: the auth pre-flight made FROM a far machine, over
saphan's own SSH connection, with the far machine's curl, against a real
scripted model server bound on the control plane's veth address (host_addr,
which the far host reaches).

The key crosses on the far script's stdin: the server got it, and while curl
was waiting for the answer no process's command line held it, nor the
environment of any process in the far view."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from integration.sshd.conftest import Remote
from saphan import Engine
from saphan.refusals import Refusal
from saphan.tools import auth
from saphan.tools.binaries import AgentBinary
from saphan.tools.claude import ClaudeAdapter
from saphan.tools.instruction import Instruction
from saphan.transport.ssh import Completed
from tools.model_servers import MessagesServer

KEY = "sk-ant-far-preflight-" + "9" * 24


def _holders(key: str, far_mnt: str) -> list[str]:
    """Every process (but this one) whose command line holds ``key``, and
    every far-view process whose environment does."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if key.encode() in f.read():
                    found.append(f"{pid} cmdline")
            if os.readlink(f"/proc/{pid}/ns/mnt") == far_mnt:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if key.encode() in f.read():
                        found.append(f"{pid} environ")
        except OSError:
            continue
    return found


class _Watching(MessagesServer):
    """Answers a models GET only after looking at every process (curl is
    alive, waiting for this answer)."""

    def __init__(self, host: str, far_mnt: str, **kw: Any) -> None:
        super().__init__([], host=host, **kw)
        self.far_mnt = far_mnt
        self.seen: list[list[str]] = []

    def on_get(self, h: BaseHTTPRequestHandler) -> None:
        self.seen.append(_holders(KEY, self.far_mnt))
        super().on_get(h)


class _Recording:
    """The far machine's connection, keeping every script it is given."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.scripts: list[str] = []

    @property
    def name(self) -> str:
        return str(self.conn.name)

    def run(self, script: str, *, stdin: bytes | None = None,
            timeout: float | None = None) -> Completed:
        self.scripts.append(script)
        done: Completed = self.conn.run(script, stdin=stdin, timeout=timeout)
        return done


@pytest.fixture
def engine(far: Remote) -> Iterator[Engine]:
    far.add("far1")
    e = Engine(far.s.home)
    try:
        yield e
    finally:
        e.close()


def _target(tmp_path: Path, endpoint: str) -> auth.Target:
    adapter = ClaudeAdapter(AgentBinary("claude", "/opt/claude", "0" * 64, "test"),
                            Instruction(prompt_path=str(tmp_path / "p"), workdir=str(tmp_path)),
                            "engine", "01R", endpoint=endpoint)
    target = auth.target_for(adapter)
    assert target is not None
    return target


def test_far_check_from_the_far_host(far: Remote, engine: Engine, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    h = far.host("far1")
    far_mnt = os.readlink(f"/proc/{h.view_pid}/ns/mnt")
    conn = _Recording(engine.ssh(engine.machine("far1")))
    with _Watching(h.host_addr, far_mnt) as srv:
        rec = auth.far_check(conn, _target(tmp_path, srv.base_url), where="far1")
        headers = [{k.lower(): v for k, v in x.items()} for x in srv.get_headers]
        seen = list(srv.seen)
    assert rec == {"endpoint": srv.base_url, "url": f"{srv.base_url}/v1/models",
                   "credential": "ANTHROPIC_API_KEY", "status": 200, "result": "accepted",
                   "checked_from": "far1"}
    assert srv.paths == ["GET /v1/models"]
    assert headers[0]["x-api-key"] == KEY and headers[0]["anthropic-version"] == "2023-06-01"
    assert headers[0]["user-agent"].startswith("curl/")  # asked by the far curl
    assert seen == [[]], seen  # no command line, no far environment held the key
    assert len(conn.scripts) == 1 and KEY not in conn.scripts[0]
    assert KEY not in json.dumps(rec)


def test_far_check_rejected_and_unreachable(far: Remote, engine: Engine, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    h = far.host("far1")
    conn = engine.ssh(engine.machine("far1"))
    with MessagesServer([], host=h.host_addr, reject_auth=True) as srv:
        with pytest.raises(Refusal) as e:
            auth.far_check(conn, _target(tmp_path, srv.base_url), where="far1")
        assert srv.paths == ["GET /v1/models"]
    r = e.value
    assert r.cls == "agent-auth-rejected" and "HTTP 401" in r.message
    assert "from far1" in r.message and KEY not in r.render()
    # The server bound on the control plane's loopback: not reachable from far1.
    with MessagesServer([]) as here_only:
        rec = auth.far_check(conn, _target(tmp_path, here_only.base_url), where="far1")
        assert here_only.paths == []
    assert rec["status"] is None and rec["result"].startswith("not checked: "), rec
    assert KEY not in json.dumps(rec)
