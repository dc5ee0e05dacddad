"""The escape battery, run BY the loop: the model writes the battery as a
script in the working directory (a git main worktree) and runs it with
`run_command`. Every attempt must come back refused, and the victim outside
must be byte-for-byte (and mode- and mtime-) unchanged: the loop's tool calls
are inside exactly the boundary every other tool gets."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

import escapes
from conftest import Saphan
from tools.model_servers import ChatCompletionsServer

ATTEMPTS = {**escapes.CONTENT, **escapes.METADATA, "remount": "mount -o remount,rw /"}


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_the_loops_tool_calls_cannot_write_outside(saphan_sqlite: Saphan,
                                                   tmp_path: Path) -> None:
    s = saphan_sqlite
    repo, outside = escapes.make_repo_and_victim(tmp_path)
    victim = outside / "victim.txt"
    before = (escapes.digest(victim), victim.stat().st_mode, victim.stat().st_mtime_ns)
    git_config = (repo / ".git" / "config").read_bytes()
    key = tmp_path / "lane.key"
    key.write_text("sk-" + secrets.token_hex(16))
    key.chmod(0o600)
    script: list[Any] = [
        ("calls", [("write_file", {"path": "battery.sh", "content": escapes.script(ATTEMPTS)}),
                   ("run_command", {"argv": ["sh", "battery.sh"], "timeout": 60})]),
        ("calls", [("finish", {"summary": "tried"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        s.ok("lane", "add", "L", "--base-url", f"{srv.base_url}/v1", "--model", "m",
             "--credential-file", str(key))
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(repo),
              "--prompt", "try to get out", "--json", timeout=120)
        results = srv.tool_results()
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    lines = set(results[1].splitlines())
    for name in ATTEMPTS:
        assert f"REFUSED {name}" in lines, f"escape {name!r} succeeded:\n{results[1]}"
    assert "INSIDE ok" in lines
    assert (escapes.digest(victim), victim.stat().st_mode, victim.stat().st_mtime_ns) == before
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert not (repo / ".git" / "worktrees").exists()
    assert (repo / ".git" / "config").read_bytes() == git_config
    assert not list(Path("/tmp").glob("saphan-escape-*"))
