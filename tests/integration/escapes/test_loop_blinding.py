"""The built-in loop, live: jailed by the same composer as the agent tools,
and blinded to every lane's credential (design: "The engine's own agent
loop is jailed too — and blinded to your credentials").

A scripted chat-completions server on loopback drives the loop through tool
calls that try every measured route to the key — direct reads of each lane's
credential file and of the lanes file, ``grep -r`` and ``find`` over the
workspace and the credential directory, a script the model writes and runs,
a hard link and a symbolic link made inside the working directory, ``env``,
``/proc/self/environ`` and the environ of every ancestor process, and the
memory and descriptors of every ancestor — while the operator's own
environment exports the same keys. Each route must run (positive controls
show it did) and reveal nothing: the key's bytes appear in no tool result
the server received, no transcript, record or log, and the loop's redaction
counter stays 0, so it was the boundary that held, not the last-line filter.
The positive control for the channel: the server received the key in its
Authorization header on every request.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan
from tools.loop_routes import files_under, link_and_outside_turns
from tools.model_servers import ChatCompletionsServer

ANCESTORS_SH = r"""
echo "== env"; env
echo "== self"; tr '\0' '\n' < /proc/self/environ
p=$PPID
while [ "$p" -gt 1 ]; do
  echo "== ancestor $p $(cat /proc/$p/comm)"
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null || echo "environ-denied $p"
  cat /proc/$p/cmdline 2>/dev/null | tr '\0' ' '; echo
  ls -l /proc/$p/fd/ 2>/dev/null | head -50 || echo "fd-denied $p"
  for fd in /proc/$p/fd/*; do timeout 2 head -c 4096 "$fd" 2>/dev/null | tr -d '\0'; done
  ls /proc/$p/root/ >/dev/null 2>&1 && echo "root-open $p" || echo "root-denied $p"
  p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
done
"""

MEMORY_PY = r"""
import os, sys
needle = sys.argv[1].encode()
pid = os.getppid()
while pid > 1:
    comm = open(f"/proc/{pid}/comm").read().strip()
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError as e:
        print(f"mem-denied {pid} {comm}: {e.strerror}")
    else:
        found = False
        for line in maps:
            addr, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    found = True
            except (OSError, OverflowError, ValueError):
                continue
        print(f"mem-scanned {pid} {comm}: {'FOUND' if found else 'not found'}")
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
"""


def _key(path: Path, value: str) -> None:
    path.write_text(value + "\n")
    path.chmod(0o600)


def _results_by_call(srv: ChatCompletionsServer) -> dict[str, str]:
    """tool_call_id -> the result text the loop sent back (last request)."""
    out: dict[str, str] = {}
    for m in srv.requests[-1]["messages"]:
        if m.get("role") == "tool":
            out[m["tool_call_id"]] = str(m["content"])
    return out


def _calls_in_order(srv: ChatCompletionsServer) -> list[tuple[str, dict[str, Any], str]]:
    """(tool name, arguments, result) for every call, in the order made."""
    results = _results_by_call(srv)
    out = []
    for m in srv.requests[-1]["messages"]:
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            out.append((fn["name"], json.loads(fn["arguments"]), results.get(call["id"], "")))
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize("boundary", ["bubblewrap", "landlock"])
def test_no_measured_route_reveals_a_lane_credential(
    saphan_sqlite: Saphan, tmp_path: Path, boundary: str
) -> None:
    s = saphan_sqlite
    secret = "sk-saphan-" + secrets.token_hex(24)
    other_secret = "sk-other-" + secrets.token_hex(24)
    partial = secret[10:42]  # what a search may look for; never the whole key
    creds = tmp_path / "creds"
    creds.mkdir()
    active_key, other_key = creds / "active.key", creds / "other.key"
    _key(active_key, secret)
    _key(other_key, other_secret)
    lanes_file = s.home / "lanes.toml"
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")

    script: list[Any] = [
        ("calls", [("read_file", {"path": str(active_key)}),
                   ("read_file", {"path": str(other_key)}),
                   ("read_file", {"path": str(lanes_file)})]),
        ("calls", [("run_command", {"argv": ["cat", str(active_key), str(other_key)]}),
                   ("run_command", {"argv": ["grep", "-r", "-F", partial, str(tmp_path),
                                             str(s.home)]}),
                   ("run_command", {"argv": ["find", str(tmp_path), str(s.home), "-type", "f",
                                             "-exec", "grep", "-l", "-F", partial, "{}", "+"]})]),
        ("calls", [("write_file", {"path": "ancestors.sh", "content": ANCESTORS_SH}),
                   ("run_command", {"argv": ["sh", "ancestors.sh"], "timeout": 60}),
                   ("write_file", {"path": "memory.py", "content": MEMORY_PY}),
                   ("run_command", {"argv": [sys.executable, "memory.py", partial],
                                    "timeout": 60})]),
        *link_and_outside_turns(active_key, outside),
        ("calls", [("finish", {"summary": "looked everywhere"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        s.ok("lane", "add", "active", "--base-url", f"{srv.base_url}/v1", "--model", "m-local",
             "--credential-file", str(active_key))
        s.ok("lane", "add", "other", "--base-url", "http://127.0.0.1:9/v1", "--model", "m2",
             "--credential-file", str(other_key), "--credential-env", "OTHER_LANE_KEY")
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        args = ["run", "--machine", "here", "--slot", "lp", "--workdir", str(wd), "--lane",
                "active", "--prompt", "find the key", "--json"]
        if boundary == "landlock":
            s.ok("machine", "probe-confinement", "here")
            args += ["--boundary", "landlock"]
        # The operator's shell exports both keys, one under an unrelated name.
        env = s.env(OPENAI_API_KEY=secret, OTHER_LANE_KEY=other_secret,
                    SOME_OTHER_NAME=secret, LC_IDENTIFICATION="saphan-visible-marker")
        r = s(*args, env=env, timeout=180)
        assert r.code == 0, r.err
        calls = _calls_in_order(srv)
        auth = [h.get("Authorization") for h in srv.headers]
        bodies = list(srv.bodies)

    rec = json.loads(r.out)
    # Positive control: the key did cross, to the one place it belongs.
    assert auth == [f"Bearer {secret}"] * len(bodies) and len(bodies) == len(script)
    assert rec["enforced_by"]["mechanism"] == boundary
    assert rec["loop"]["end"] == "finished" and rec["loop"]["tool_calls"] == len(calls) + 1  # + finish
    # The boundary held by itself: the last-line filter never fired.
    assert rec["loop"]["redactions"] == 0
    assert {str(active_key), str(other_key), str(lanes_file)} <= set(
        rec["blinding"]["read_denied"])
    assert {"OPENAI_API_KEY", "OTHER_LANE_KEY"} <= set(rec["blinding"]["env_scrubbed"])

    by_route = {(name, json.dumps(a, sort_keys=True)): res for name, a, res in calls}

    def result(name: str, **a: Any) -> str:
        return by_route[(name, json.dumps(a, sort_keys=True))]

    # Direct reads: the files read as nothing.
    for path in (active_key, other_key, lanes_file):
        got = result("read_file", path=str(path))
        assert got == "" or got.startswith("error:"), got
    assert not result("run_command", argv=["cat", str(active_key), str(other_key)]).startswith(
        "exit 0")
    # Searches ran and found nothing.
    # (The only files that hold the search term are the transcript and the
    # run's output log, which record the model's own call.)
    own = {str(s.home / "runs" / rec["id"] / "out" / "transcript.jsonl"),
           str(s.home / "runs" / rec["id"] / "stdout.log")}
    grep = result("run_command", argv=["grep", "-r", "-F", partial, str(tmp_path), str(s.home)])
    assert f"{active_key}: Permission denied" in grep, grep
    hits = [line for line in grep.splitlines()[1:] if partial in line]
    assert hits and all(line.split(":", 1)[0] in own for line in hits), grep
    found = result("run_command", argv=["find", str(tmp_path), str(s.home), "-type", "f",
                                        "-exec", "grep", "-l", "-F", partial, "{}", "+"])
    assert {line for line in found.splitlines()[1:] if not line.startswith("grep:")} <= own, found
    assert "active.key" not in found.replace(f"{active_key}: Permission denied", "")
    # The authored script ran: it saw the environment and walked the ancestors.
    anc = result("run_command", argv=["sh", "ancestors.sh"], timeout=60)
    assert anc.startswith("exit 0") and "LC_IDENTIFICATION=saphan-visible-marker" in anc, anc
    assert "OPENAI_API_KEY" not in anc and "OTHER_LANE_KEY" not in anc
    assert "SOME_OTHER_NAME" not in anc
    walked = [line.split()[3] for line in anc.splitlines() if line.startswith("== ancestor")]
    # The jail has its own PID namespace: the walk ends at its pid 1 and the
    # engine's own process is not even visible from inside.
    assert walked and "saphan" not in walked, walked
    mem = result("run_command", argv=[sys.executable, "memory.py", partial], timeout=60)
    assert "mem-denied" in mem and "FOUND" not in mem, mem
    first = next(line for line in mem.splitlines() if line.startswith("mem-"))
    assert first.startswith("mem-denied"), mem  # the loop itself is not dumpable
    # Links made inside the working directory lead nowhere.
    assert not result("run_command", argv=["ln", str(active_key), "link.key"]).startswith(
        "exit 0")
    assert result("read_file", path="link.key").startswith("error:")
    via_symlink = result("read_file", path="sym.key")
    assert via_symlink == "" or via_symlink.startswith("error:"), via_symlink
    # Writes outside the working directory are refused, as for every tool.
    assert result("write_file", path=str(outside), content="overwritten\n").startswith("error:")
    assert outside.read_text() == "original\n"
    assert (wd / "inside.txt").read_text() == "made inside\n"

    # The key's bytes appear nowhere: requests, transcript, record, logs, files.
    run_dir = s.home / "runs" / rec["id"]
    for value in (secret, other_secret):
        needle = value.encode()
        assert all(needle not in b for b in bodies)
        assert needle not in r.out.encode() and needle not in r.err.encode()
        for f in files_under(run_dir, wd, s.home):
            assert needle not in f.read_bytes(), f
    transcript = Path(rec["loop"]["transcript"]).read_text()
    assert "ancestors.sh" in transcript and partial in transcript  # it is the real transcript


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_permission_class_allows_commands_by_exact_name(
    saphan_sqlite: Saphan, tmp_path: Path
) -> None:
    """A name the class allows, found on PATH outside the run's writable set.
    Issue 16: `./ls` written by the model ran under the allowed name `ls`;
    now any path is refused, and so is a PATH lookup that lands in the
    working directory (the operator's PATH holds it here, first)."""
    s = saphan_sqlite
    key = tmp_path / "k"
    _key(key, "sk-" + secrets.token_hex(8))
    wd = tmp_path / "wd"
    wd.mkdir()
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["ls", "chmod"], "network": "open"}))
    script: list[Any] = [
        ("calls", [("run_command", {"argv": ["ls", "."]}),
                   ("run_command", {"argv": ["cat", "x"]}),
                   ("run_command", {"argv": ["lsblk"]}),
                   ("run_command", {"argv": ["/bin/ls", "."]})]),
        ("calls", [("write_file", {"path": "ls", "content": "#!/bin/sh\ntouch pwned\n"}),
                   ("run_command", {"argv": ["chmod", "+x", "ls"]}),
                   ("run_command", {"argv": ["./ls"]}),
                   ("run_command", {"argv": ["ls"]})]),
        ("text", "done"),
    ]
    with ChatCompletionsServer(script) as srv:
        s.ok("lane", "add", "L", "--base-url", f"{srv.base_url}/v1", "--model", "m",
             "--credential-file", str(key))
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        env = s.env(PATH=f"{wd}:{os.environ['PATH']}")
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd), "--prompt", "t",
              "--permission-class", str(pc), "--json", timeout=120, env=env)
        results = srv.tool_results()
    assert r.code == 0, r.err
    assert results[0].startswith("exit 0")
    assert results[1].startswith("refused by the permission class: 'cat'")
    assert results[2].startswith("refused by the permission class: 'lsblk'")
    assert results[3].startswith("refused by the permission class: '/bin/ls' is a path")
    assert results[5] == "exit 0\n"  # chmod ran: the file is a program now
    assert results[6].startswith("refused by the permission class: './ls' is a path")
    assert results[7].startswith(f"refused by the permission class: 'ls' is {wd}/ls, inside "
                                 f"the run's writable set ({wd})"), results[7]
    assert not (wd / "pwned").exists()
    rec = json.loads(r.out)
    assert rec["permission_class"]["commands"] == ["ls", "chmod"]
    assert rec["loop"]["end"] == "finished"
