"""Egress policies on real runs under bubblewrap (egress/cut.py, the door,
saphan-launcher's bridge): from inside a cut jail only the door leads out,
and only where the policy allows; a run without a policy is unchanged; the
paths that cannot carry a policy are refused by name, recorded, exit 3.

Upstreams listen on the host end of a veth pair (tests/egress/conftest.py):
loopback is always denied by the door, so an allowed upstream needs an
address of its own."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import Result, Saphan, saphan_exe

pytestmark = pytest.mark.usefixtures("bwrap_available")


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_a: object) -> None:
        return

    def do_GET(self) -> None:
        body = b"hello-through-the-door\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hello(upstream_addr: str) -> Iterator[int]:
    """A plain HTTP server on the veth address (reached through CONNECT)."""
    srv = ThreadingHTTPServer((upstream_addr, 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def host_loopback() -> Iterator[int]:
    """A server on the HOST's loopback: never reachable from a cut jail."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def _policy(tmp_path: Path, allow: list[dict[str, Any]], routes: list[Any] | None = None,
            name: str = "egress.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"schema": 1, "name": "t", "allow": allow,
                             "routes": routes or []}))
    return str(p)


def _local(s: Saphan, slot: str = "s1", tool: str = "command", *extra: str) -> None:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", slot, "--tool", tool, *extra)


#: run inside the jail: one line per attempt, "NAME: verdict"
PROBES = r"""
set +e
P="$HTTPS_PROXY"
try() { name=$1; shift; out=$("$@" 2>&1); echo "$name: rc=$? $(echo "$out" | tr '\n' ' ' | cut -c1-200)"; }
try allowed curl -sS --max-time 10 -p -x "$P" "http://$ADDR:$PORT/"
try notlisted curl -sS --max-time 10 -p -x "$P" "http://$ADDR:$OTHER/"
try metadata curl -sS --max-time 10 -p -x "$P" "http://169.254.169.254/latest/"
try localname curl -sS --max-time 10 -p -x "$P" "http://localhost:$LOOP/"
try notoken curl -sS --max-time 10 -p -x "http://127.0.0.1:3128" "http://$ADDR:$PORT/"
try badtoken curl -sS --max-time 10 -p -x "http://saphan:wrong@127.0.0.1:3128" "http://$ADDR:$PORT/"
try direct curl -sS --max-time 5 --noproxy '*' "http://$ADDR:$PORT/"
try hostloop curl -sS --max-time 5 --noproxy '*' "http://127.0.0.1:$LOOP/"
try tcp python3 raw.py tcp "$ADDR" "$PORT"
try udp python3 raw.py udp "$ADDR" 53
try dns python3 raw.py dns example.com 443
try dns8 python3 raw.py udp 8.8.8.8 53
"""


#: raw attempts, not through any proxy (python3 raw.py KIND HOST PORT)
RAW = """import socket, sys
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "tcp":
    socket.create_connection((host, port), timeout=5)
    print("TCP-CONNECTED")
elif kind == "udp":
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q", (host, port))
    print("UDP-SENT")
else:
    print(socket.getaddrinfo(host, port))
"""


def _lines(out: str) -> dict[str, str]:
    return {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in out.splitlines() if ":" in ln}


@pytest.mark.slow
def test_a_cut_command_reaches_only_what_its_policy_allows(
        saphan_sqlite: Saphan, upstream_addr: str, hello: int, host_loopback: int,
        tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    wd = tmp_path / "wd"
    wd.mkdir()
    # (the jail's environment is allow-listed: the values go in the script)
    (wd / "probe.sh").write_text(f"ADDR={upstream_addr} PORT={hello} OTHER={hello + 1} "
                                 f"LOOP={host_loopback}\n" + PROBES)
    (wd / "raw.py").write_text(RAW)
    pol = _policy(tmp_path, [{"host": upstream_addr, "ports": [hello]},
                             {"host": "169.254.169.254", "ports": [80]},
                             {"host": "localhost", "ports": [host_loopback]}])
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--egress-policy", pol, "--json", "--", "sh", "probe.sh", timeout=120)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    seen = _lines(r.err)
    assert "hello-through-the-door" in seen["allowed"], seen
    for denied in ("notlisted", "metadata", "localname"):
        assert "403" in seen[denied], (denied, seen[denied])
    for unauth in ("notoken", "badtoken"):
        assert "407" in seen[unauth], (unauth, seen[unauth])
    for cut_off in ("direct", "hostloop", "tcp", "udp", "dns", "dns8"):
        assert "rc=0" not in seen[cut_off], (cut_off, seen[cut_off])
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert "--unshare-net" in rec["boundary_argv"]
    assert rec["network"].startswith("egress policy t: cut")
    egress = rec["egress"]
    assert egress["policy"]["source"] == pol and egress["policy"]["sha256"]
    summary = egress["door"]["summary"]
    assert summary["allowed"] >= 1 and summary["denied"] >= 5
    assert f"{upstream_addr}:{hello}" in summary["hosts"]
    log = [json.loads(ln) for ln in Path(summary["audit_log"]).read_text().splitlines()]
    verdicts = {(e["host"], e["port"], e["verdict"]) for e in log}
    assert (upstream_addr, hello, "allowed") in verdicts
    assert ("169.254.169.254", 80, "denied") in verdicts
    assert ("localhost", host_loopback, "denied") in verdicts
    assert (upstream_addr, hello + 1, "denied") in verdicts
    assert any(e["status"] == 407 for e in log)
    allowed = next(e for e in log if e["verdict"] == "allowed")
    assert allowed["down"] > 0 and allowed["up"] > 0
    # the token is in the jail's environment only, never on the record or the log
    token_free = json.dumps(rec) + Path(summary["audit_log"]).read_text()
    assert "saphan:" not in json.dumps(rec["environment"])
    assert "HTTPS_PROXY" in rec["environment"]["set"]
    assert "@127.0.0.1" not in token_free
    human = s.ok("runs", "show", rec["id"]).out
    assert f"door:        {summary['requests']} request(s)" in human
    assert "denied:      169.254.169.254:80" in human


@pytest.mark.slow
def test_without_a_policy_nothing_changes(saphan_sqlite: Saphan, upstream_addr: str,
                                          hello: int, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    rec = s.ok("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
               "--json", "--", "curl", "-sS", "--max-time", "10", "--noproxy", "*",
               f"http://{upstream_addr}:{hello}/").json()
    assert rec["outcome"] == "exited" and rec["exit_code"] == 0
    assert "egress" not in rec and rec["network"] == "not restricted"
    assert "--unshare-net" not in rec["boundary_argv"]
    assert any("network egress (no egress policy declared)" in n for n in rec["notes"])


def _refused(r: Any, cls: str) -> dict[str, Any]:
    assert r.code == 3, (r.out, r.err)
    rec: dict[str, Any] = json.loads(r.out)
    assert rec["refusal"]["class"] == cls, rec
    return rec


def test_a_landlock_run_with_a_policy_is_refused_before_its_seat(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    pol = _policy(tmp_path, [])
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
          "--boundary", "landlock", "--egress-policy", pol, "--json", "--", "true")
    rec = _refused(r, "egress-unsupported-lane")
    assert "Landlock" in rec["refusal"]["message"]
    shown = s.ok("runs", "list", "--json").json()
    assert shown[0]["outcome"] == "refused"


def test_a_class_saying_network_off_leaves_the_door_only_its_routes(
        saphan_sqlite: Saphan, upstream_addr: str, hello: int, tmp_path: Path) -> None:
    """`network: off` with a policy: the cut stands, and the door answers no
    CONNECT, not even to what the policy's allow-list names."""
    s = saphan_sqlite
    _local(s)
    wd = tmp_path / "wd"
    wd.mkdir()
    pol = _policy(tmp_path, [{"host": upstream_addr, "ports": [hello]}])
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 4, "allowed_commands": ["sh"], "network": "off",
                              "egress_policy": pol}))
    (wd / "try.sh").write_text(
        f'curl -sS --max-time 10 -p -x "$HTTPS_PROXY" http://{upstream_addr}:{hello}/\n')
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--permission-class", str(pc), "--json", "--", "sh", "try.sh")
    rec = json.loads(r.out)
    assert r.code == 1 and "403" in r.err, r.err
    assert rec["egress"]["connect"].startswith("none")
    assert "only the credential routes" in rec["network"]
    assert rec["egress"]["door"]["summary"]["allowed"] == 0


@pytest.mark.usefixtures("bwrap_available")
def test_a_host_without_network_namespaces_refuses_the_run_uncuttable(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """user.max_net_namespaces=0 (in a user namespace of the test's own):
    bubblewrap still makes a sandbox but not one with a network of its own,
    so the run is refused egress-uncuttable — never started open."""
    s = saphan_sqlite
    _local(s)
    wd = tmp_path / "wd"
    wd.mkdir()
    pol = _policy(tmp_path, [])
    marker = tmp_path / "ran"
    script = "echo 0 > /proc/sys/user/max_net_namespaces && exec \"$0\" \"$@\""
    p = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script,
                        saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                        "--workdir", str(wd), "--egress-policy", pol, "--json", "--",
                        "touch", str(marker)],
                       capture_output=True, text=True, env=s.env(), timeout=120,
                       stdin=subprocess.DEVNULL)
    rec = _refused(Result(p.returncode, p.stdout, p.stderr), "egress-uncuttable")
    assert "--unshare-net" in rec["refusal"]["message"]
    assert "max_net_namespaces" in rec["refusal"]["remediation"]
    assert not marker.exists()


def test_a_class_naming_a_policy_cuts_the_run(saphan_sqlite: Saphan, upstream_addr: str,
                                              hello: int, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    wd = tmp_path / "wd"
    wd.mkdir()
    pol = _policy(tmp_path, [{"host": upstream_addr, "ports": [hello]}])
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 4, "allowed_commands": ["curl"], "network": "open",
                              "egress_policy": pol}))
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--permission-class", str(pc), "--json", "--", "curl", "-sS", "--max-time",
          "10", "--noproxy", "*", f"http://{upstream_addr}:{hello}/")
    rec = json.loads(r.out)
    # cut: the direct request cannot leave the jail (curl: couldn't connect)
    assert r.code == 1 and rec["exit_code"] == 7, r.err
    assert rec["egress"]["policy"]["source"] == pol
    other = _policy(tmp_path, [], name="other.json")
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--permission-class", str(pc), "--egress-policy", other, "--", "curl", "-V")
    assert r.code != 0 and "differ" in r.err, r.err


def test_claude_confined_by_itself_alone_with_a_policy_is_refused_by_name(
        saphan_sqlite: Saphan, claude_bin: str, tmp_path: Path) -> None:
    s = saphan_sqlite
    cfg = s.home / "config.toml"
    cfg.write_text(cfg.read_text().replace('confinement = "engine"', 'confinement = "vendor"'))
    _local(s, "cl", "claude")
    pol = _policy(tmp_path, [])
    r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(tmp_path), "--prompt",
          "p", "--egress-policy", pol, "--json",
          env=s.env(ANTHROPIC_API_KEY="sk-ant-unused-0123456789", SAPHAN_CLAUDE_BIN=claude_bin))
    rec = _refused(r, "egress-unsupported-tool")
    assert "vendor:claude" in rec["refusal"]["message"]
    assert s.ok("runs", "list", "--json").json()[0]["outcome"] == "refused"


def test_a_route_secret_file_is_unreadable_in_the_jail(saphan_sqlite: Saphan,
                                                      tmp_path: Path) -> None:
    """The door reads the secret; the jail cannot (the policy names where
    the file is)."""
    s = saphan_sqlite
    _local(s)
    key = tmp_path / "keys" / "route.key"
    key.parent.mkdir()
    key.write_text("sk-route-secret-file-0123456789abcdef\n")
    key.chmod(0o600)
    pol = _policy(tmp_path, [], [{"name": "gh", "upstream": "https://api.github.com",
                                  "header": "authorization", "prefix": "Bearer ",
                                  "secret_file": str(key)}])
    wd = tmp_path / "wd"
    wd.mkdir()
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--egress-policy", pol, "--json", "--", "cat", str(key))
    rec = json.loads(r.out)
    assert "sk-route-secret" not in r.out + r.err
    assert str(key) in rec["policy"]["read_denials"]


def test_a_policy_the_run_could_rewrite_is_refused(saphan_sqlite: Saphan,
                                                   tmp_path: Path) -> None:
    """A policy (or its secret file, or a class naming it) inside what the
    run may write would let one run open the next run's door."""
    s = saphan_sqlite
    _local(s)
    pol = _policy(tmp_path, [])  # tmp_path is the workdir below
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
          "--egress-policy", pol, "--json", "--", "true")
    rec = _refused(r, "policy-invalid")
    assert "which this run may write" in rec["refusal"]["message"]
    # a class in the workdir, the policy outside: the class's network posture
    # decides whether the door answers CONNECT at all (review: run 1 opened it)
    outside = tmp_path.parent / f"{tmp_path.name}-policy.json"
    outside.write_text(json.dumps({"schema": 1, "allow": []}))
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["true"], "network": "off"}))
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
          "--permission-class", str(pc), "--egress-policy", str(outside), "--json", "--", "true")
    rec = _refused(r, "policy-invalid")
    assert "the run's permission class" in rec["refusal"]["message"]


def test_a_cut_codex_run_without_a_codex_route_is_refused(
        saphan_sqlite: Saphan, codex_bin: str, codex_home: str, tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s, "cx", "codex")
    wd = tmp_path / "wd"
    wd.mkdir()
    r = s("run", "--machine", "here", "--slot", "cx", "--workdir", str(wd), "--prompt", "p",
          "--egress-policy", _policy(tmp_path, []), "--json",
          env=s.env(CODEX_HOME=codex_home, OPENAI_API_KEY="sk-unused-0123456789abcdef",
                    SAPHAN_CODEX_BIN=codex_bin))
    rec = _refused(r, "policy-invalid")
    assert '"tool": "codex"' in rec["refusal"]["message"]


def test_a_route_secret_missing_is_refused_before_the_seat(saphan_sqlite: Saphan,
                                                           tmp_path: Path) -> None:
    s = saphan_sqlite
    _local(s)
    pol = _policy(tmp_path, [], [{"name": "gh", "upstream": "https://api.github.com",
                                  "header": "authorization", "prefix": "Bearer ",
                                  "secret_env": "SAPHAN_TEST_UNSET_SECRET"}])
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
          "--egress-policy", pol, "--json", "--", "true")
    rec = _refused(r, "agent-auth-missing")
    assert "SAPHAN_TEST_UNSET_SECRET" in rec["refusal"]["message"]

