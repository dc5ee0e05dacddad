"""Agents on remote runners: the real pinned Claude Code and Codex CLI, run
over SSH on the netns test hosts (their own filesystem view) against
scripted model servers bound to the control plane's veth address, which
the far host reaches. Each run writes and commits in its far working
directory and is refused writing outside it; the key crosses the channel's
stdin, never a far command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from integration.sshd.conftest import Remote, linked_projects
from integration.sshd.sshhosts import FarHost
from saphan.tools.session_key import session_key
from tools.model_servers import MessagesServer, ResponsesServer, TokenServer

PINNED = "claude-opus-4-8"
KEY = "sk-ant-far-test-key-0123456789"
OPENAI_KEY = "sk-far-openai-test-key-9876543210"

#: every far process's command line, one a line (the model runs it)
CMDLINES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def argv_probe(secret: str, marker: str) -> str:
    """Shell that counts the far processes whose argv holds `marker` (the
    agent itself) and `secret`: the argvs are saved first, then counted, so
    only two short lines reach the agent (a whole dump was cut by the agent as
    too long) and the probe's own argv never holds the secret (the file stays:
    Codex refuses an `rm -f`)."""
    half = len(secret) // 2
    return (f"{CMDLINES} > .argvs; "
            f"echo marker=$(grep -c -- '{marker}' .argvs); "
            f"echo secret=$(grep -cF -- \"$(printf '%s%s' '{secret[:half]}' '{secret[half:]}')\" "
            f".argvs)")


#: a TCP forwarder for the far host's loopback (run in its network namespace):
#: the endpoint a far agent names is on its own machine's loopback (plain http
#: anywhere else is refused), and reaches the scripted server from there
FORWARD = r"""
import socket, sys, threading
lport, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", lport))
s.listen(64)
print("ready", flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    finally:
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
while True:
    c, _ = s.accept()
    u = socket.create_connection((host, port))
    for a, b in ((c, u), (u, c)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
"""


@contextmanager
def far_loopback(h: FarHost, port: int) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` on the far host, forwarded to the scripted
    server at the control plane's veth address (same port)."""
    p = subprocess.Popen(["ip", "netns", "exec", h.netns, sys.executable, "-c", FORWARD,
                          str(port), h.host_addr, str(port)], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        p.kill()
        p.wait()


def _far_agent(h: FarHost, local: str, name: str) -> Path:
    """The agent binary where the far user can run it: a copy in the far
    host's own view (the control plane's copy lives under /root)."""
    far = Path("/opt/saphan-test-agents") / name
    view = h.far_path(far)
    if not view.exists():
        view.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, view)
        view.chmod(0o755)
    return far


def _repo(h: FarHost, rel: str) -> Path:
    wd = h.mkdir(rel)
    h.as_user("git", "-C", str(wd), "init", "-q", "-b", "main")
    return wd


def _git_log(h: FarHost, wd: Path) -> str:
    return h.as_user("git", "-C", str(wd), "log", "--format=%s").stdout


def _claude_slot(far: Remote, name: str, claude_bin: str, endpoint: str,
                 slot: str = "cl") -> Path:
    far.ready(name, slot=slot, tool="claude")
    path = _far_agent(far.host(name), claude_bin, "claude")
    far.ok("slot", "set", name, slot, "--agent-path", str(path), "--endpoint", endpoint)
    return path


def _class(tmp_path: Path, *commands: str) -> Path:
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": list(commands),
                              "network": "open"}))
    return pc


def _run(far: Remote, name: str, slot: str, wd: Path, *extra: str, env: dict[str, str],
         ok: bool = True) -> Any:
    args = ("run", "--machine", name, "--slot", slot, "--workdir", str(wd), "--json", *extra)
    return far.ok(*args, env=env, timeout=300) if ok else far(*args, env=env, timeout=300)


@pytest.mark.slow
def test_far_claude_writes_commits_is_refused_outside_and_the_key_stays_off_argv(
        far: Remote, claude_bin: str, tmp_path: Path) -> None:
    h = far.host("far1")
    wd = _repo(h, "agents/claude-wd")
    outside = h.home / "outside-claude.txt"
    above = h.home / ".claude" / "settings-escape.json"  # above this run's leaf
    commit = ("git add hello.txt && git -c user.email=a@b -c user.name=a commit -qm far-claude "
              "&& echo committed")
    script = [("write", str(wd / "hello.txt"), "from far claude\n"),
              ("write", str(wd / "i.sh"), f"{commit}\necho x > {outside} || echo refused\n"
                                          f"echo x > {above} || echo above-refused\n"
                                          'echo "tmpdir=$TMPDIR"\n'
                                          f"{argv_probe(KEY, '--output-format')}\n"),
              ("shell", "sh i.sh"), ("text", "finished")]
    with MessagesServer(script, host=h.host_addr) as srv, \
            far_loopback(h, srv.port) as url:
        path = _claude_slot(far, "far1", claude_bin, url)
        env = far.s.env(ANTHROPIC_API_KEY=KEY)
        rec = _run(far, "far1", "cl", wd, "--prompt", "go", "--permission-class",
                   str(_class(tmp_path, "sh")), env=env).json()
        results = "\n".join(srv.tool_results())
        assert set(srv.models()) == {PINNED}
        assert all(hd.get("x-api-key") == KEY for hd in srv.headers)
    assert rec["outcome"] == "exited" and rec["exit_code"] == 0, rec
    assert h.far_path(wd / "hello.txt").read_text() == "from far claude\n"
    assert "far-claude" in _git_log(h, wd)
    assert "committed" in results and "refused" in results
    assert not h.far_path(outside).exists()
    assert "above-refused" in results and not h.far_path(above).exists()
    # the key crossed the channel's stdin: no far process's argv held it
    assert "secret=0" in results and "marker=0" not in results and "marker=" in results
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "landlock" and enforced["machine"] == "far1"
    assert rec["agent"]["path"] == str(path) and rec["agent"]["resolved_on"] == "far1"
    assert rec["agent"]["version"].startswith("2.1.197")
    leaf = h.home / ".claude" / "projects" / session_key(str(wd))
    assert rec["writable"][:2] == [str(wd), str(leaf)]
    assert rec["claude_transcript"]["sha256"] and rec["session_dir"] == str(leaf)
    assert "ANTHROPIC_API_KEY" in rec["environment"]["set"]
    assert KEY not in json.dumps(rec)
    # TMPDIR is inside the far workdir
    tmpdir = next(x.split("=", 1)[1] for x in results.split() if x.startswith("tmpdir="))
    assert tmpdir.startswith(str(wd) + "/"), tmpdir
    # nothing was written to the runner's disk holding the key: not its home, not /tmp
    found = h.in_view("grep", "-rlsF", "--", KEY, str(h.home), "/tmp", "/var/tmp",
                      check=False)
    assert found.returncode == 1 and found.stdout == "", found.stdout
    # `machine show` lists the binary with what the runner measured at this run
    shown = far.ok("machine", "show", "far1", "--json").json()
    mine = [a for a in shown["agents"] if a["path"] == str(path)]
    assert mine and mine[0]["sha256"] == rec["agent"]["sha256"]
    assert mine[0]["version"] == rec["agent"]["version"] and rec["id"] in mine[0]["source"]


@pytest.mark.slow
def test_far_claude_resume_continues_the_same_session_in_the_same_leaf(
        far: Remote, claude_bin: str, tmp_path: Path) -> None:
    h = far.host("far2")
    wd = _repo(h, "agents/claude-resume")
    with MessagesServer([("text", "first answer: the word is PELICAN")],
                        host=h.host_addr) as srv, far_loopback(h, srv.port) as url:
        _claude_slot(far, "far2", claude_bin, url)
        env = far.s.env(ANTHROPIC_API_KEY=KEY)
        first = _run(far, "far2", "cl", wd, "--prompt", "remember a word", env=env).json()
    session = first["agent_session"]["id"]
    leaf = h.home / ".claude" / "projects" / session_key(str(wd))
    transcript = h.far_path(leaf / f"{session}.jsonl")
    before = transcript.stat().st_size
    with MessagesServer([("text", "second answer")], host=h.host_addr) as srv2, \
            far_loopback(h, srv2.port) as url2:
        far.ok("slot", "set", "far2", "cl", "--endpoint", url2)
        second = _run(far, "far2", "cl", wd, "--prompt", "what was the word?", "--resume",
                      first["id"], env=env).json()
        sent = json.dumps(srv2.requests)
    assert second["agent_session"]["id"] == session
    assert second["resumes"] == {"run": first["id"], "session": session}
    assert "PELICAN" in sent and "remember a word" in sent
    assert transcript.stat().st_size > before
    assert second["claude_transcript"]["sha256"] != first["claude_transcript"]["sha256"]


@pytest.mark.slow
def test_far_codex_delivered_pinned_and_self_confined(far: Remote, codex_bin: str,
                                                      tmp_path: Path) -> None:
    h = far.host("far3")
    wd = _repo(h, "agents/codex-wd")
    outside = h.home / "outside-codex.txt"
    commit = ("git add hello.txt && git -c user.email=a@b -c user.name=a commit -qm far-codex "
              "&& echo committed")
    script = [("shell", f"echo from-codex > hello.txt && {commit}"),
              ("shell", f"echo x > {outside} || echo refused"),
              ("shell", argv_probe(OPENAI_KEY, "codex")), ("text", "finished")]
    far.ready("far3", slot="cx", tool="codex")
    delivered = far.ok("machine", "deliver", "far3", "--agent", "codex", "--json").json()[0]
    assert delivered["result"] == "installed"
    sha = subprocess.run(["sha256sum", codex_bin], capture_output=True, text=True,
                         check=True).stdout.split()[0]
    assert delivered["sha256"] == sha
    shown = far.ok("machine", "show", "far3", "--json").json()
    assert [a["path"] for a in shown["agents"]] == [delivered["path"]]
    with ResponsesServer(script, host=h.host_addr) as srv, far_loopback(h, srv.port) as url:
        far.ok("slot", "set", "far3", "cx", "--endpoint", url + "/v1",
               "--pin-sha256", sha)
        env = far.s.env(OPENAI_API_KEY=OPENAI_KEY)
        # (a model outside Codex's own families gets its plain shell tool)
        rec = _run(far, "far3", "cx", wd, "--prompt", "go", "--model", "scripted-model",
                   env=env).json()
        outputs = "\n".join(srv.outputs())
        assert all({k.lower(): v for k, v in hd.items()}.get("authorization")
                   == f"Bearer {OPENAI_KEY}" for hd in srv.headers)
    assert rec["outcome"] == "exited" and rec["exit_code"] == 0, rec
    assert "far-codex" in _git_log(h, wd)
    assert "refused" in outputs and not h.far_path(outside).exists()
    assert "secret=0" in outputs and "marker=0" not in outputs and "marker=" in outputs
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "vendor:codex"
    assert enforced["engine_claim"].startswith("none")
    assert enforced["validated_by"] == "--strict-config"
    assert any(p.startswith("features.plugins=") for p in enforced["pinned_settings"])
    assert rec["agent"]["sha256"] == sha and rec["agent"]["pinned_sha256"] == sha
    assert OPENAI_KEY not in json.dumps(rec)


def _refused(far: Remote, name: str, slot: str, wd: Path, env: dict[str, str]) -> Any:
    r = _run(far, name, slot, wd, "--prompt", "go", env=env, ok=False)
    assert r.code == 3, (r.out, r.err)
    return r


def test_far_refusals_missing_binary_and_pin(far: Remote, claude_bin: str) -> None:
    h = far.host("far1")
    wd = h.mkdir("agents/refusals")
    far.ready("far1", slot="cl2", tool="claude")
    env = far.s.env(ANTHROPIC_API_KEY=KEY)
    # no --agent-path: Claude Code is never looked up on the far PATH
    r = _refused(far, "far1", "cl2", wd, env)
    assert "agent-binary-missing" in r.err and "--agent-path" in r.err
    far.ok("slot", "set", "far1", "cl2", "--agent-path", "/opt/nothing/claude")
    r = _refused(far, "far1", "cl2", wd, env)
    assert "agent-binary-missing" in r.err and "/opt/nothing/claude" in r.err
    path = _far_agent(h, claude_bin, "claude")
    far.ok("slot", "set", "far1", "cl2", "--agent-path", str(path), "--pin-sha256", "0" * 64)
    r = _refused(far, "far1", "cl2", wd, env)
    assert "digest-mismatch" in r.err and "0" * 64 in r.err
    # refused before any seat: nothing holds the slot
    assert far.ok("slot", "show", "far1", "cl2", "--json").json()["holders"] == []


def test_an_egress_policy_on_a_runner_is_refused_by_name_before_any_seat(
        far: Remote, tmp_path: Path) -> None:
    """saphan-launcher has no network lever: a far run carrying an egress
    policy (by option, or by its permission class) never runs open."""
    h = far.host("far1")
    wd = h.mkdir("agents/egress")
    far.ready("far1", slot="eg", tool="command")
    pol = tmp_path / "egress.json"
    pol.write_text(json.dumps({"schema": 1, "allow": [{"host": "example.com",
                                                       "ports": [443]}]}))
    r = far("run", "--machine", "far1", "--slot", "eg", "--workdir", str(wd),
            "--egress-policy", str(pol), "--json", "--", "true")
    assert r.code == 3, (r.out, r.err)
    rec = json.loads(r.out)
    assert rec["refusal"]["class"] == "egress-unsupported-lane"
    assert "SSH machine far1" in rec["refusal"]["message"]
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 4, "allowed_commands": ["true"], "network": "open",
                              "egress_policy": str(pol)}))
    r = far("run", "--machine", "far1", "--slot", "eg", "--workdir", str(wd),
            "--permission-class", str(pc), "--json", "--", "true")
    assert r.code == 3 and json.loads(r.out)["refusal"]["class"] == "egress-unsupported-lane"
    assert far.ok("slot", "show", "far1", "eg", "--json").json()["holders"] == []


def test_far_codex_needs_the_runners_measured_landlock(far: Remote) -> None:
    far.add("far2")
    far.ok("machine", "deliver", "far2")  # no --probe: no Landlock row
    far.ok("slot", "add", "far2", "cx2", "--tool", "codex", "--agent-path", "/bin/true")
    r = _refused(far, "far2", "cx2", far.host("far2").mkdir("agents/unprobed"),
                 far.s.env(OPENAI_API_KEY=OPENAI_KEY))
    assert "landlock-unprobed" in r.err


def test_a_tampered_dial_reporting_a_foreign_leaf_is_refused(far: Remote, claude_bin: str
                                                             ) -> None:
    h = far.host("far2")
    wd = h.mkdir("agents/foreign")
    elsewhere = h.mkdir("agents/elsewhere")
    with linked_projects(h, elsewhere):
        with MessagesServer([("text", "never")], host=h.host_addr) as srv, \
                far_loopback(h, srv.port) as url:
            _claude_slot(far, "far2", claude_bin, url, slot="cl3")
            r = _refused(far, "far2", "cl3", wd, far.s.env(ANTHROPIC_API_KEY=KEY))
            assert srv.requests == []
        assert "session-dir-foreign" in r.err
        assert "is a link there (the preflight made nothing through it)" in r.err
        # nothing was made through the link: the directory it points at stays empty
        assert list(h.far_path(elsewhere).iterdir()) == []


def test_a_rejected_key_is_refused_from_the_runner_before_any_seat(far: Remote, claude_bin: str
                                                                   ) -> None:
    h = far.host("far1")
    wd = h.mkdir("agents/auth")
    with MessagesServer([("text", "never")], host=h.host_addr, reject_auth=True) as srv, \
            far_loopback(h, srv.port) as url:
        _claude_slot(far, "far1", claude_bin, url, slot="cl4")
        r = _refused(far, "far1", "cl4", wd, far.s.env(ANTHROPIC_API_KEY=KEY))
        assert srv.requests == [] and srv.paths == ["GET /v1/models"]
        # the far curl read the key from its stdin: the server got it, no argv held it
        assert srv.get_headers[0].get("x-api-key") == KEY
    assert "agent-auth-rejected" in r.err and KEY not in r.err
    assert far.ok("slot", "show", "far1", "cl4", "--json").json()["holders"] == []
    rec = far.record()
    assert rec["refusal"]["class"] == "agent-auth-rejected" and rec.get("session_ordinal") is None
    # without any key here and no login file there: missing, named
    r = _refused(far, "far1", "cl4", wd, far.s.env())
    assert "agent-auth-missing" in r.err and "ANTHROPIC_API_KEY" in r.err


@contextmanager
def far_claude_login(h: FarHost, oauth: dict[str, Any]) -> Iterator[Path]:
    """The far user's ``~/.claude/.credentials.json`` holding ``oauth`` (an
    earlier one kept aside and put back); yields its far path."""
    creds = h.home / ".claude" / ".credentials.json"
    kept = creds.with_name(".credentials.json.kept")
    h.as_user("mkdir", "-p", str(creds.parent))
    h.as_user("sh", "-c", f'[ -e "{creds}" ] && mv "{creds}" "{kept}" || true')
    _plant_login(h, creds, oauth)
    try:
        yield creds
    finally:
        h.as_user("rm", "-f", str(creds))
        h.as_user("sh", "-c", f'[ -e "{kept}" ] && mv "{kept}" "{creds}" || true')


def _plant_login(h: FarHost, creds: Path, oauth: dict[str, Any]) -> None:
    import os

    p = h.far_path(creds)
    p.unlink(missing_ok=True)
    p.write_text(json.dumps({"claudeAiOauth": oauth}))
    os.chown(p, h.uid, h.uid)
    p.chmod(0o600)


def test_a_far_login_seat_is_refreshed_from_here_and_checked_from_the_runner(
        far: Remote, claude_bin: str) -> None:
    """Item 6 on a runner: the far seat's login file is read over the SSH
    connection, its expired token refreshed by the unconfined side here (a
    scripted token endpoint on this host's loopback), written back there
    owner-only, and the new token presented from the runner to the slot's
    endpoint; a refused grant is agent-auth-rejected before any seat."""
    import time

    h = far.host("far1")
    wd = h.mkdir("agents/login")
    oauth = {"accessToken": "far-acc-1", "refreshToken": "far-ref-1",
             "expiresAt": int((time.time() - 60) * 1000), "scopes": ["user:inference"]}
    config = far.s.home / "config.toml"
    before = config.read_text()
    with TokenServer([(200, {"access_token": "far-acc-2", "refresh_token": "far-ref-2",
                             "expires_in": 3600}), (400, {"error": "invalid_grant"})]) as tok, \
            MessagesServer([("text", "never")], host=h.host_addr, reject_auth=True) as srv, \
            far_loopback(h, srv.port) as url, far_claude_login(h, oauth) as creds:
        config.write_text(before + f'\n[auth]\nclaude_token_url = "{tok.url}"\n')
        try:
            _claude_slot(far, "far1", claude_bin, url, slot="cl6")
            r = _refused(far, "far1", "cl6", wd, far.s.env())
            # refreshed here with the far file's refresh token, written back there
            assert tok.bodies[0]["refresh_token"] == "far-ref-1"
            stored = json.loads(h.far_path(creds).read_text())["claudeAiOauth"]
            assert (stored["accessToken"], stored["refreshToken"]) == ("far-acc-2", "far-ref-2")
            assert stored["scopes"] == ["user:inference"]
            st = h.far_path(creds).stat()
            assert st.st_mode & 0o777 == 0o600 and st.st_uid == h.uid
            # the new token went to the endpoint from the runner (its curl), as Claude sends it
            sent = {k.lower(): v for k, v in srv.get_headers[-1].items()}
            assert sent["authorization"] == "Bearer far-acc-2"
            assert "agent-auth-rejected" in r.err and srv.requests == []
            rec = far.record()  # the refusal's, recorded before any seat
            assert rec["refusal"]["class"] == "agent-auth-rejected"
            assert "far-acc" not in json.dumps(rec) and "far-ref" not in json.dumps(rec)
            assert "far-acc" not in r.err and "far-ref" not in r.err
            # expired again, and the token endpoint refuses the grant: dead session
            _plant_login(h, creds, {**oauth, "refreshToken": "far-ref-2"})
            n = len(srv.get_headers)
            r = _refused(far, "far1", "cl6", wd, far.s.env())
            assert "agent-auth-rejected" in r.err and "login session is dead" in r.err
            assert len(srv.get_headers) == n  # nothing presented to the endpoint
            assert json.loads(h.far_path(creds).read_text())["claudeAiOauth"][
                "refreshToken"] == "far-ref-2"
        finally:
            config.write_text(before)
    assert far.ok("slot", "show", "far1", "cl6", "--json").json()["holders"] == []


@pytest.mark.slow
def test_far_loop_is_jailed_and_its_key_never_reaches_argv_env_or_a_far_file(
        far: Remote, tmp_path: Path) -> None:
    import secrets

    from tools.model_servers import ChatCompletionsServer

    h = far.host("far3")
    wd = _repo(h, "agents/loop-wd")
    outside = h.home / "outside-loop.txt"
    lane_key = "sk-lane-" + secrets.token_hex(16)
    keyfile = tmp_path / "lane.key"
    keyfile.write_text(lane_key)
    keyfile.chmod(0o600)
    commit = ("git add hello.txt && git -c user.email=a@b -c user.name=a commit -qm far-loop "
              "&& echo committed")
    # (the key's start is put together at run time, so this line never holds it)
    probe = (f"{CMDLINES}; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
             f"grep -rl -- \"$(printf '%s%s' sk-lane- {lane_key[8:16]})\" {h.home} /tmp "
             "2>/dev/null | sed 's/^/F''OUND /'; echo probed")
    script: list[Any] = [
        ("calls", [("write_file", {"path": "hello.txt", "content": "from the far loop\n"}),
                   ("run_command", {"argv": ["sh", "-c", commit], "timeout": 60}),
                   ("run_command", {"argv": ["sh", "-c", f"echo x > {outside} || echo refused"],
                                    "timeout": 60}),
                   ("run_command", {"argv": ["sh", "-c", probe], "timeout": 60})]),
        ("calls", [("finish", {"summary": "done"})]),
    ]
    far.ready("far3", slot="lp", tool="loop")
    assert far.ok("machine", "deliver", "far3", "--agent", "loop", "--json"
                  ).json()[0]["result"] == "installed"
    far.ok("slot", "set", "far3", "lp", "--agent-path", "/usr/bin/python3")
    # an earlier run's leftovers decide nothing: a forged result where the
    # scratch is, and a task larger than a far command line may hold (the
    # spec crosses on a channel's stdin)
    forged = h.far_path(wd / ".saphan-run" / "tmp")
    forged.mkdir(parents=True)
    (forged / "loop-result.json").write_text('{"end": "finished", "summary": "FORGED"}')
    h.in_view("chown", "-R", h.user, str(wd / ".saphan-run"))
    task = tmp_path / "task.txt"
    task.write_text("go\n" + "x" * 200_000)
    with ChatCompletionsServer(script, host=h.host_addr) as srv, \
            far_loopback(h, srv.port) as url:
        far.ok("lane", "add", "L", "--base-url", f"{url}/v1", "--model", "m",
               "--credential-file", str(keyfile))
        rec = _run(far, "far3", "lp", wd, "--prompt-file", str(task), env=far.s.env()).json()
        results = "\n".join(srv.tool_results())
        assert all(hd.get("Authorization") == f"Bearer {lane_key}" for hd in srv.headers)
    assert rec["loop"]["end"] == "finished" and "FORGED" not in json.dumps(rec), rec
    assert not h.far_path(wd / ".saphan-run" / rec["id"]).exists()  # read, then removed
    assert h.far_path(wd / "hello.txt").read_text() == "from the far loop\n"
    assert "far-loop" in _git_log(h, wd)
    assert "refused" in results and not h.far_path(outside).exists()
    assert "probed" in results and "saphan-launcher" in results
    assert lane_key not in results and "FOUND" not in results
    assert rec["enforced_by"]["mechanism"] == "landlock"
    assert rec["agent"]["zipapp"]["sha256"] and rec["agent"]["path"] == "/usr/bin/python3"
    assert rec["blinding"]["credential_channel"].startswith("the lane's key was read")
    assert lane_key not in json.dumps(rec)


@pytest.mark.slow
def test_a_far_agent_run_holds_its_seat_far_and_runs_cancel_ends_it(
        far: Remote, claude_bin: str, tmp_path: Path) -> None:
    """Capacity and liveness as for a far command: the far launcher holds
    the seat (read there by pid, start time and boot id), a second run on
    the one-seat slot is refused seat-full, and `runs cancel` ends the
    agent's whole far tree and records it."""
    import os
    import time

    from conftest import saphan_exe
    from integration.sshd.conftest import pid_alive, stop
    from run.test_cancel import processes_with

    h = far.host("far1")
    wd = h.mkdir("agents/cancel")
    token = f"900.{os.getpid()}{time.monotonic_ns() % 10**6}"
    script = [("shell", f"sleep {token}"), ("text", "never reached")]
    with MessagesServer(script, host=h.host_addr) as srv, far_loopback(h, srv.port) as url:
        _claude_slot(far, "far1", claude_bin, url, slot="cl5")
        env = far.s.env(ANTHROPIC_API_KEY=KEY)
        pc = _class(tmp_path, "sleep")
        proc = subprocess.Popen(
            [saphan_exe(), "run", "--machine", "far1", "--slot", "cl5", "--workdir", str(wd),
             "--prompt", "go", "--permission-class", str(pc)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            holder = far.wait_far_holder("far1", "cl5", timeout=60)
            deadline = time.monotonic() + 60
            while not processes_with(token) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_with(token), "the agent's command never started"
            second = _run(far, "far1", "cl5", wd, "--prompt", "again", env=env, ok=False)
            assert second.code == 3 and "seat-full" in second.err
            r = far("runs", "cancel", holder["run"], "--grace", "5")
            assert r.code == 0, r.err
        finally:
            code, _out, err = stop(proc)
    rec = far.record(holder["run"])
    assert rec["outcome"] == "cancelled" and rec["state"] == "ended", (code, err)
    assert not pid_alive(holder["pid"]) and not processes_with(token)
    assert far.ok("slot", "show", "far1", "cl5", "--json").json()["holders"] == []


def test_what_a_far_run_writes_reaches_a_terminal_escaped(far: Remote) -> None:
    """A far run's stdout and stderr are the run's bytes: on the operator's
    terminal an OSC 52 (clipboard write) and a screen erase arrive escaped;
    the logs keep every byte."""
    from run.test_view import _in_a_terminal

    far.ready("far2", slot="t1")
    wd = far.host("far2").mkdir("agents/tty")
    osc = "printf '\\033]52;c;cHduZWQ=\\007out\\n'; printf '\\033[2Jerr\\n' >&2"
    code, shown = _in_a_terminal(["run", "--machine", "far2", "--slot", "t1", "--workdir",
                                  str(wd), "--", "sh", "-c", osc], far.s.env())
    assert code == 0, shown
    assert "\x1b]52" not in shown and "\x1b[2J" not in shown
    assert "\\x1b]52;c;cHduZWQ=\\x07out" in shown and "\\x1b[2Jerr" in shown
    rec = far.record()
    with open(rec["output"]["stdout"], "rb") as f:
        assert f.read() == b"\x1b]52;c;cHduZWQ=\x07out\n"


def test_the_dial_runs_nothing_of_a_workdir_unconfined(far: Remote) -> None:
    """Review (far path): the dial ran the agent's --version unconfined, before
    the workdir and pin checks, and ran the far user's PATH from inside the
    workdir. Now: an agent path that resolves (through a link) into the
    working directory is refused and never run; an agent's --version runs
    inside a Landlock domain; a relative PATH entry of the far user's shell
    start-up runs nothing the workdir holds."""
    import secrets

    h = far.host("far1")
    wd = h.mkdir("agents/dial")
    tag = secrets.token_hex(4)
    # a far account whose ~/.bashrc puts the `./node_modules/.bin` idiom on PATH
    rc, pw = h.far_path(h.home / ".bashrc"), h.far_path("/etc/passwd")
    old_rc = rc.read_bytes() if rc.exists() else None
    old_pw = pw.read_text()
    rc.write_text('export PATH="./node_modules/.bin:$PATH"\n')
    pw.write_text(old_pw.replace(f"{h.home}:/bin/sh", f"{h.home}:/bin/bash"))
    try:
        planted = h.far_path(wd / "node_modules" / ".bin")
        planted.mkdir(parents=True)
        for tool in ("basename", "dirname", "head", "tr", "mkdir", "readlink", "sha256sum",
                     "sed", "cut", "cat", "mv", "curl", "rm", "mktemp"):
            (planted / tool).write_text(f"#!/bin/sh\necho x > {h.home}/ESCAPED-{tag}-{tool}\n")
            (planted / tool).chmod(0o755)
        agent = h.far_path(wd / "bin" / "claude")
        agent.parent.mkdir()
        agent.write_text(f"#!/bin/sh\necho x > {h.home}/ESCAPED-{tag}-agent\necho 9.9.9\n")
        agent.chmod(0o755)
        h.in_view("chown", "-R", h.user, str(wd))
        link = h.far_path("/opt/saphan-test-agents/linked-claude")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(wd / "bin" / "claude")
        far.ready("far1", slot="cl6", tool="claude")
        far.ok("slot", "set", "far1", "cl6", "--agent-path",
               "/opt/saphan-test-agents/linked-claude")
        env = far.s.env(ANTHROPIC_API_KEY=KEY)
        r = _refused(far, "far1", "cl6", wd, env)
        assert "workdir-unsafe" in r.err and "inside the run's working directory" in r.err
        # outside the workdir, its --version runs confined: its write is refused
        outside = h.far_path("/opt/saphan-test-agents/version-writer")
        outside.write_text(f"#!/bin/sh\necho x > {h.home}/ESCAPED-{tag}-version\n"
                           "echo 9.9.9\nexit 0\n")
        outside.chmod(0o755)
        far.ok("slot", "set", "far1", "cl6", "--agent-path",
               "/opt/saphan-test-agents/version-writer")
        rec = _run(far, "far1", "cl6", wd, "--prompt", "go", env=env).json()
        assert rec["agent"]["version"] == "9.9.9"
        escaped = sorted(p.name for p in h.far_path(h.home).glob(f"ESCAPED-{tag}-*"))
        # the agent itself ran as the run (inside its boundary); nothing else did
        assert escaped == [], escaped
    finally:
        pw.write_text(old_pw)
        if old_rc is None:
            rc.unlink()
        else:
            rc.write_bytes(old_rc)


@pytest.mark.slow
def test_a_run_whose_leaf_the_dial_cannot_resolve_runs_and_says_it_cannot_be_resumed(
        far: Remote, claude_bin: str) -> None:
    """Reached through a link, a long working directory's project key cannot
    be derived by the far shell: no session directory is granted, the run
    still does its work, and its record says so in those words; a resume of
    it is refused (nothing recorded to check a history against)."""
    h = far.host("far3")
    wd = h.mkdir("agents/" + "/".join(["d" * 60] * 4))
    link = h.data / "agents-link"
    h.as_user("ln", "-sfn", str(wd), str(link))
    with MessagesServer([("write", str(wd / "made.txt"), "made\n"), ("text", "done")],
                        host=h.host_addr) as srv, far_loopback(h, srv.port) as url:
        _claude_slot(far, "far3", claude_bin, url, slot="cl7")
        env = far.s.env(ANTHROPIC_API_KEY=KEY)
        rec = _run(far, "far3", "cl7", link, "--prompt", "go", env=env).json()
    assert rec["exit_code"] == 0 and h.far_path(wd / "made.txt").read_text() == "made\n"
    assert any(n.startswith("this run cannot be resumed") for n in rec["notes"])
    assert rec["writable"][0] == str(wd) and not any("/projects/" in w for w in rec["writable"])
    assert rec.get("claude_transcript") is None and rec["session_dir"] is None
    r = _run(far, "far3", "cl7", link, "--prompt", "again", "--resume", rec["id"], env=env,
             ok=False)
    assert r.code == 2 and "recorded no digest" in r.err


def test_a_planted_link_where_the_far_script_makes_dirs_stops_the_run_by_name(
        far: Remote, tmp_path: Path) -> None:
    """`.saphan-run` planted as a link (an earlier run may have): the far
    script makes no directory through it; the run ends before it starts,
    and the operator reads why."""
    h = far.host("far2")
    wd = h.mkdir("agents/planted")
    elsewhere = h.mkdir("agents/planted-elsewhere")
    h.as_user("ln", "-s", str(elsewhere), str(wd / ".saphan-run"))
    keyfile = tmp_path / "lane.key"
    keyfile.write_text("sk-lane-0123456789abcdef0123")
    keyfile.chmod(0o600)
    far.ready("far2", slot="lp2", tool="loop")
    far.ok("machine", "deliver", "far2", "--agent", "loop")
    far.ok("slot", "set", "far2", "lp2", "--agent-path", "/usr/bin/python3")
    far.ok("lane", "add", "L", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
           "--credential-file", str(keyfile))
    r = _run(far, "far2", "lp2", wd, "--prompt", "go", env=far.s.env(), ok=False)
    assert r.code != 0
    assert "the far side said: saphan-far: cannot make the return directory" in r.err, r.err
    assert list(h.far_path(elsewhere).iterdir()) == []
    assert far.ok("slot", "show", "far2", "lp2", "--json").json()["holders"] == []


def test_a_far_workdir_another_live_run_can_write_is_busy(far: Remote) -> None:
    """Review (far path): a concurrent run in the same far working directory
    rewrote a resumed run's transcript after the check, and swapped the .git
    Codex's profile named writable for a link to $HOME. Now a far run whose
    directory overlaps a live run's on the same machine is refused after its
    seat, naming that run, and its seat is given back."""
    from integration.sshd.conftest import stop

    far.ready("far1", slot="b1", max_sessions=4)
    h = far.host("far1")
    wd = h.mkdir("agents/busy")
    inner = h.mkdir("agents/busy/inner")
    link = h.data / "busy-link"
    h.as_user("ln", "-sfn", str(wd), str(link))
    proc = far.start_run("far1", wd, "sleep", "60", slot="b1")
    try:
        holder = far.wait_far_holder("far1", "b1")
        for where in (wd, inner, h.data / "agents", link):
            r = far("run", "--machine", "far1", "--slot", "b1", "--workdir", str(where),
                    "--", "true")
            assert r.code == 3 and "workdir-busy" in r.err, (where, r.err)
            assert holder["run"] in r.err
        rec = far.record()
        assert rec["refusal"]["class"] == "workdir-busy" and rec["finished_at"]
        # a directory of its own runs alongside
        r = far("run", "--machine", "far1", "--slot", "b1", "--workdir",
                str(h.mkdir("agents/busy-sibling")), "--", "true")
        assert r.code == 0, r.err
        assert [x["run"] for x in far.ok("slot", "show", "far1", "b1", "--json").json()[
            "holders"]] == [holder["run"]]
    finally:
        stop(proc)
