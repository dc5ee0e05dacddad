"""Claude Code: the composed command line (whole vectors), the session key
checked against the pinned binary's own init event, and a run end to end
under bubblewrap through `saphan run` against a scripted Messages server, and a
`--repo` run whose Bash tool commits on `saphan/<run-id>`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents import Worktree, git
from model_servers import MessagesServer

from conftest import Saphan
from saphan.tools import claude
from saphan.tools.session_key import session_key


def test_composed_argv_whole_vectors() -> None:
    assert claude.compose_argv("/opt/claude", permission_mode="acceptEdits", model="m1") == [
        "/opt/claude", "-p", "--output-format", "stream-json", "--verbose",
        "--permission-mode", "acceptEdits", "--model", "m1"]
    assert claude.compose_argv("/opt/claude", permission_mode="plan", model=None,
                               allowed_commands=("git", "sh"), resume_session="s-1",
                               session_id="ignored-when-resuming") == [
        "/opt/claude", "-p", "--output-format", "stream-json", "--verbose",
        "--permission-mode", "plan", "--allowedTools", "Bash(git:*)", "Bash(sh:*)",
        "--resume", "s-1"]
    assert claude.compose_argv("/opt/claude", permission_mode="plan", model=None,
                               session_id="u-1")[-2:] == ["--session-id", "u-1"]


def _setup(s: Saphan, home: Path, claude_bin: str, srv: MessagesServer) -> dict[str, str]:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "cl", "--tool", "claude")
    return s.env(HOME=str(home), ANTHROPIC_BASE_URL=srv.base_url,
                 ANTHROPIC_API_KEY="sk-ant-test-not-a-key", SAPHAN_CLAUDE_BIN=claude_bin)


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_claude_end_to_end_under_bubblewrap(saphan_sqlite: Saphan, claude_bin: str,
                                            tmp_path: Path) -> None:
    """Write tool inside the workdir succeeds; a shell command the permission
    class ALLOWS (so policy does not stop it) writing /tmp and $HOME is
    refused by the kernel; the record names bubblewrap as what enforced and
    the permission mode as policy; the session landed in the granted leaf and
    its key matches the binary's init event."""
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["sh"], "network": "open",
                              "write_scope": [str(tmp_path)]}))
    script = [
        ("write", str(wd / "hello.txt"), "hi from claude\n"),
        ("shell", f"sh -c 'echo x > {outside}; echo x > {home}/x; echo ran'"),
        ("text", "finished"),
    ]
    s = saphan_sqlite
    with MessagesServer(script) as srv:
        env = _setup(s, home, claude_bin, srv)
        r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd),
              "--prompt", "write hello", "--model", "claude-scripted",
              "--permission-class", str(pc), "--json", env=env, timeout=180)
        assert r.code == 0, r.err
        results = srv.tool_results()
    rec = json.loads(r.out)
    assert (wd / "hello.txt").read_text() == "hi from claude\n"
    assert outside.read_text() == "original\n" and not (home / "x").exists()
    assert len(results) == 2 and "Read-only file system" in results[1], results
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert rec["tool_policy"]["permission_mode"] == "acceptEdits"
    assert rec["tool_policy"]["is_boundary"] is False
    real_wd = str(wd.resolve())
    leaf = str(home / ".claude" / "projects" / session_key(real_wd))
    assert rec["session_dir"] == leaf and leaf in rec["writable"]
    session = rec["agent_session"]
    assert session["cwd"] == real_wd and session["permission_mode"] == "acceptEdits"
    assert Path(leaf, f"{session['id']}.jsonl").exists()  # the transcript, in the leaf
    assert rec["argv"][-2:] == ["--session-id", session["id"]]
    assert rec["agent"]["version"].startswith("2.1.197")
    assert rec["permission_class"]["commands"] == ["sh"]
    assert "Bash(sh:*)" in rec["argv"] and "write hello" not in rec["argv"]
    human = s.ok("runs", "show", rec["id"], env=env).out
    assert "permission mode acceptEdits (the tool's own policy, not a boundary)" in human


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_claude_commits_in_a_repo_worktree(saphan_sqlite: Saphan, claude_bin: str,
                                           linked_worktree: Worktree, tmp_path: Path) -> None:
    """End to end with --repo: the scripted model makes Claude Code's Bash tool
    run `git add … && git commit …` in the run's worktree, inside bubblewrap;
    the commit lands on saphan/<run-id> and the base branch is untouched."""
    home = tmp_path / "home"
    home.mkdir()
    s = saphan_sqlite
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["git", "sh"],
                              "network": "open"}))
    script = [
        ("shell", "sh -c 'echo inside > inside.txt && echo WROTE'"),
        ("shell", "git add inside.txt && git -c user.email=t@e -c user.name=t commit -q "
                  "-m agent-commit && echo COMMITTED"),
        ("text", "committed"),
    ]
    repo = linked_worktree.repo
    base_head = git("rev-parse", "main", cwd=repo).strip()
    with MessagesServer(script) as srv:
        env = _setup(s, home, claude_bin, srv)
        r = s("run", "--machine", "here", "--slot", "cl", "--repo", str(repo),
              "--prompt", "commit a file", "--model", "claude-scripted",
              "--permission-class", str(pc), "--json", env=env, timeout=180)
        assert r.code == 0, r.err
        results = srv.tool_results()
    rec = json.loads(r.out)
    assert len(results) == 2 and "WROTE" in results[0] and "COMMITTED" in results[1], results
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    branch = rec["worktree"]["branch"]
    assert branch == f"saphan/{rec['id']}"
    wt = Path(rec["worktree"]["path"])
    assert (wt / "inside.txt").read_text() == "inside\n"
    assert git("log", "-1", "--format=%s", branch, cwd=repo).strip() == "agent-commit"
    assert git("show", f"{branch}:inside.txt", cwd=repo) == "inside\n"
    assert git("rev-parse", f"{branch}~1", cwd=repo).strip() == base_head
    assert rec["worktree"]["head_after"] == git("rev-parse", branch, cwd=repo).strip()
    assert git("rev-parse", "main", cwd=repo).strip() == base_head
    assert git("status", "--porcelain", cwd=wt).strip() == ""


@pytest.mark.slow
def test_claude_vendor_confinement_says_no_claim(saphan_sqlite: Saphan, claude_bin: str,
                                                  tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    s = saphan_sqlite
    cfg = s.home / "config.toml"
    cfg.write_text(cfg.read_text().replace('confinement = "engine"', 'confinement = "vendor"'))
    with MessagesServer([("text", "nothing to do")]) as srv:
        env = _setup(s, home, claude_bin, srv)
        r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd),
              "--prompt", "hi", "--json", env=env, timeout=180)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert rec["enforced_by"]["mechanism"] == "vendor:claude"
    assert rec["boundary_argv"] == [] and rec["writable"] == []
    assert "the engine makes no claim that this agent is confined" in rec["engine_claim"]
    assert any("makes no claim that this agent is confined" in n for n in rec["notes"])


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_explicit_resume_is_the_only_continuation(saphan_sqlite: Saphan, claude_bin: str,
                                                  tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    s = saphan_sqlite
    with MessagesServer([("text", "first")]) as srv:
        env = _setup(s, home, claude_bin, srv)
        first = json.loads(s.ok("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd),
                                "--prompt", "one", "--json", env=env, timeout=180).out)
        second = json.loads(s.ok("run", "--machine", "here", "--slot", "cl", "--workdir",
                                 str(wd), "--prompt", "two", "--resume", first["id"], "--json",
                                 env=env, timeout=180).out)
    sid = first["agent_session"]["id"]
    assert second["resumes"] == {"run": first["id"], "session": sid}
    assert second["argv"][-2:] == ["--resume", sid]
    assert second["agent_session"]["id"] == sid  # Claude Code continued that session
    r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(tmp_path),
          "--prompt", "x", "--resume", first["id"], env=env)
    assert r.code == 2 and "same working directory" in r.err
