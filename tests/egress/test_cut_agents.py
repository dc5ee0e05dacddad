"""Agents behind the door: a real Claude Code (the pinned version) and
saphan's loop reach their scripted model servers only through the run's
egress door and its credential route. Inside the jail the agent holds a
per-run placeholder: no process's environment or command line, and no
byte of the agent process's writable memory, holds the real key — which the
scripted server receives. The servers speak TLS on the veth address (a
route's upstream is https; saphan trusts the test CA by SSL_CERT_FILE)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan
from egress.tls import ScratchCA, make_ca
from tools.model_servers import ChatCompletionsServer, MessagesServer, ResponsesServer

pytestmark = [pytest.mark.usefixtures("bwrap_available"), pytest.mark.slow]

REAL = "sk-ant-real-provider-key-0123456789abcdef"
LANE_REAL = "sk-lane-real-provider-key-9876543210fedcba"


def _probe(secret: str) -> str:
    """Counts, from inside the jail, of the processes whose environment or
    command line holds ``secret`` (split in the probe's own text)."""
    half = len(secret) // 2
    return ("K=\"$(printf '%s%s' '" + secret[:half] + "' '" + secret[half:] + "')\"; "
            "e=0; c=0; for p in /proc/[0-9]*; do "
            "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qF -- \"$K\" && e=$((e+1)); "
            "tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qF -- \"$K\" && c=$((c+1)); done; "
            "echo \"environ=$e cmdline=$c procs=$(ls -d /proc/[0-9]* | wc -l)\"; "
            "env | grep -c -- \"$K\" | sed 's/^/env=/'; "
            "echo proxy=${HTTPS_PROXY:+set}; sleep 4")


class MemoryWatch:
    """Once the agent has asked its model once, reads every writable mapping
    of each process whose command line contains ``marker`` (as root, from
    outside the jail) and counts ``secret`` and the agent's own placeholder
    (from its environ: proof the dump saw the agent's memory)."""

    def __init__(self, marker: str, secret: str, asked: Any, key_var: str):
        self.marker, self.secret, self.asked = marker, secret.encode(), asked
        self.key_var = key_var
        self.found: dict[str, int] = {}
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryWatch:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.thread.join(timeout=60)

    def _watch(self) -> None:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not self.asked():
            time.sleep(0.1)
        time.sleep(0.5)
        for pid in _pids(self.marker):
            placeholder = _environ(pid).get(self.key_var)
            mem = _dump(pid)
            self.found = {"pids": self.found.get("pids", 0) + 1,
                          "secret": self.found.get("secret", 0) + mem.count(self.secret),
                          "placeholder": self.found.get("placeholder", 0)
                          + (mem.count(placeholder.encode()) if placeholder else 0),
                          "bytes": self.found.get("bytes", 0) + len(mem)}


def _pids(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "sh -c" not in cmd:
            out.append(int(d.name))
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)


def _dump(pid: int) -> bytes:
    chunks: list[bytes] = []
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
                if m is None or not m.group(3).startswith("rw"):
                    continue
                start, end = int(m.group(1), 16), int(m.group(2), 16)
                if end - start > 1 << 30:
                    continue
                try:
                    mem.seek(start)
                    chunks.append(mem.read(end - start))
                except OSError:
                    continue
    except OSError:
        pass
    return b"".join(chunks)


@pytest.fixture
def ca(tmp_path: Path, upstream_addr: str) -> ScratchCA:
    return make_ca(tmp_path / "ca", upstream_addr)


def test_claude_reaches_its_model_only_through_the_door_and_never_holds_the_key(
        saphan_sqlite: Saphan, claude_bin: str, upstream_addr: str, ca: ScratchCA,
        tmp_path: Path) -> None:
    s = saphan_sqlite
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    # (Claude Code's Bash tool runs a script file; it refuses inline shell syntax)
    script = [("write", str(wd / "probe.sh"), _probe(REAL) + "\n"), ("shell", "sh probe.sh"),
              ("text", "finished")]
    with MessagesServer(script, host=upstream_addr, tls=ca.server_context()) as srv:
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cl", "--tool", "claude", "--endpoint", srv.base_url)
        pol = tmp_path / "egress.json"
        pol.write_text(json.dumps({"schema": 1, "routes": [
            {"name": "anthropic", "tool": "claude", "upstream": srv.base_url,
             "header": "x-api-key", "secret_env": "ANTHROPIC_API_KEY"}]}))
        pc = tmp_path / "class.json"
        pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["sh"], "network": "open"}))
        env = s.env(HOME=str(home), ANTHROPIC_API_KEY=REAL, SSL_CERT_FILE=ca.ca_file,
                    SAPHAN_CLAUDE_BIN=claude_bin)
        with MemoryWatch(claude_bin, REAL, lambda: bool(srv.requests),
                         "ANTHROPIC_API_KEY") as watch:
            r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd),
                  "--prompt", "probe", "--model", "claude-scripted", "--egress-policy",
                  str(pol), "--permission-class", str(pc), "--json", env=env, timeout=240)
        results = "\n".join(srv.tool_results())
        headers = list(srv.headers)
        paths = list(srv.paths)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    # the scripted server got the real key, from the door, on every request
    assert headers and all(h.get("x-api-key") == REAL for h in headers)
    assert all(p.startswith("POST /v1/messages") for p in paths if p.startswith("POST"))
    # inside the jail: no environment, no command line, no variable holds it
    assert "environ=0 cmdline=0" in results and "env=0" in results, results
    assert "proxy=set" in results
    # the agent's own memory: its placeholder is there, the real key is not
    assert watch.found.get("pids", 0) >= 1, watch.found
    assert watch.found["placeholder"] >= 1, watch.found
    assert watch.found["secret"] == 0, watch.found
    assert rec["egress"]["agent_credential"].startswith("the agent was given no provider key")
    assert "agent_credential_readable" not in rec["egress"]
    assert rec["endpoint"].startswith("http://127.0.0.1:3128/anthropic")
    assert rec["auth"]["credential"].startswith("egress route anthropic")
    summary = rec["egress"]["door"]["summary"]
    assert summary["allowed"] >= 2, summary
    # what Claude Code tried to reach on its own (the pinned version: its
    # default API host, by CONNECT) was denied; the route itself never was
    assert not any(h.startswith(upstream_addr) for h in summary["denied_hosts"]), summary
    assert REAL not in json.dumps(rec)
    assert REAL not in Path(summary["audit_log"]).read_text()


def test_codex_is_cut_around_its_own_sandbox_and_never_holds_the_key(
        saphan_sqlite: Saphan, codex_bin: str, codex_home: str, upstream_addr: str,
        ca: ScratchCA, tmp_path: Path) -> None:
    """Codex confines itself; saphan cuts around it: a network namespace
    whose only way out is the door, its provider pointed at the door's route
    with the placeholder. Its sandbox still confines the model's commands
    (a write outside refused)."""
    s = saphan_sqlite
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    script = [("shell", f"echo x > {outside} || echo refused-outside"),
              ("shell", _probe(REAL)), ("text", "done")]
    with ResponsesServer(script, host=upstream_addr, tls=ca.server_context()) as srv:
        base = f"{srv.base_url}/v1"
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cx", "--tool", "codex", "--endpoint", base)
        pol = tmp_path / "egress.json"
        pol.write_text(json.dumps({"schema": 1, "routes": [
            {"name": "openai", "tool": "codex", "upstream": base, "header": "authorization",
             "prefix": "Bearer ", "secret_env": "OPENAI_API_KEY"}]}))
        env = s.env(CODEX_HOME=codex_home, HOME=str(home), OPENAI_API_KEY=REAL,
                    SSL_CERT_FILE=ca.ca_file, SAPHAN_CODEX_BIN=codex_bin)
        with MemoryWatch(codex_bin, REAL, lambda: bool(srv.requests),
                         "OPENAI_API_KEY") as watch:
            r = s("run", "--machine", "here", "--slot", "cx", "--workdir", str(wd),
                  "--prompt", "probe", "--model", "scripted-model", "--egress-policy",
                  str(pol), "--json", env=env, timeout=240)
        outputs = "\n".join(srv.outputs())
        headers = [{k.lower(): v for k, v in h.items()} for h in srv.headers]
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert headers and all(h.get("authorization") == f"Bearer {REAL}" for h in headers)
    assert "refused-outside" in outputs and outside.read_text() == "original\n"
    assert "environ=0 cmdline=0" in outputs and "env=0" in outputs, outputs
    assert watch.found.get("pids", 0) >= 1, watch.found
    assert watch.found["placeholder"] >= 1 and watch.found["secret"] == 0, watch.found
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "vendor:codex"
    assert enforced["network_cut_by"]["mechanism"] == "bubblewrap"
    assert "--unshare-net" in rec["boundary_argv"]
    assert rec["egress"]["agent_credential"].startswith("the agent was given no provider key")
    assert any("http://127.0.0.1:3128/openai" in p for p in enforced["pinned_settings"])
    assert REAL not in json.dumps(rec)


def test_the_loop_reaches_its_lane_only_through_the_door_with_a_placeholder(
        saphan_sqlite: Saphan, upstream_addr: str, ca: ScratchCA, tmp_path: Path) -> None:
    s = saphan_sqlite
    wd = tmp_path / "wd"
    wd.mkdir()
    key = tmp_path / "lane.key"
    key.write_text(LANE_REAL + "\n")
    os.chmod(key, 0o600)
    script: list[Any] = [
        ("calls", [("run_command", {"argv": ["sh", "-c", _probe(LANE_REAL)], "timeout": 60})]),
        ("text", "finished")]
    with ChatCompletionsServer(script, host=upstream_addr, tls=ca.server_context()) as srv:
        base = f"{srv.base_url}/v1"
        s.ok("lane", "add", "l1", "--base-url", base, "--model", "m1",
             "--credential-file", str(key))
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        pol = tmp_path / "egress.json"
        pol.write_text(json.dumps({"schema": 1, "routes": [
            {"name": "lane", "tool": "loop", "upstream": base, "header": "authorization",
             "prefix": "Bearer ", "secret_file": str(key)}]}))
        env = s.env(SSL_CERT_FILE=ca.ca_file)
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
              "--prompt", "probe", "--egress-policy", str(pol), "--json", env=env,
              timeout=240)
        results = "\n".join(srv.tool_results())
        headers = list(srv.headers)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert headers and all(h.get("Authorization") == f"Bearer {LANE_REAL}" for h in headers)
    assert "environ=0 cmdline=0" in results and "env=0" in results, results
    assert rec["lane"]["base_url"] == "http://127.0.0.1:3128/lane"
    assert rec["egress"]["agent_credential"].startswith("the agent was given no provider key")
    assert LANE_REAL not in json.dumps(rec)
