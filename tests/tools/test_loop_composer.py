"""One composer, two callers: the loop's jail is the one every agent tool
gets in the same working directory, plus the blinding — nothing else.

A `command` run and a loop run in the same working directory are compared
through their records: the same mechanism and executable enforced, the same
writable set (the working directory and the run's own return path), and
read denials that differ exactly by the lanes file and every lane's
credential file. `run.confinement = vendor` does not unjail the loop.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from model_servers import ChatCompletionsServer

from conftest import Saphan


def _setup(s: Saphan, tmp_path: Path, base_url: str) -> tuple[Path, list[Path]]:
    keys = []
    for name in ("a", "b"):
        key = tmp_path / f"{name}.key"
        key.write_text("sk-" + secrets.token_hex(12))
        key.chmod(0o600)
        keys.append(key)
        s.ok("lane", "add", name, "--base-url", f"{base_url}/v1", "--model", f"m-{name}",
             "--credential-file", str(key), "--credential-env", f"KEY_{name.upper()}")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "lp", "--tool", "loop")
    s.ok("slot", "add", "here", "cmd", "--tool", "command")
    wd = tmp_path / "wd"
    wd.mkdir()
    return wd, keys


def _without_run(policy: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The policy with this run's own return path named generically."""
    text = json.dumps(policy).replace(run_id, "<run>")
    out: dict[str, Any] = json.loads(text)
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_loop_gets_the_tools_jail_plus_the_blinding(saphan_sqlite: Saphan,
                                                    tmp_path: Path) -> None:
    s = saphan_sqlite
    with ChatCompletionsServer([("text", "nothing to do")]) as srv:
        wd, keys = _setup(s, tmp_path, srv.base_url)
        loop = json.loads(s.ok("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
                               "--lane", "b", "--prompt", "t", "--json").out)
    cmd = json.loads(s.ok("run", "--machine", "here", "--slot", "cmd", "--workdir", str(wd),
                          "--json", "--", "/bin/true").out)
    assert loop["outcome"] == "exited" and loop["model"] == "m-b"
    for field in ("mechanism", "version", "executable", "executable_sha256"):
        assert loop["enforced_by"][field] == cmd["enforced_by"][field]
    lp, cp = _without_run(loop["policy"], loop["id"]), _without_run(cmd["policy"], cmd["id"])
    # lanes.toml is hidden with the whole workspace (on both); every lane's
    # key file is denied by name (all lanes, not just "b").
    assert lp["hidden"] == cp["hidden"] and str(s.home / "lanes.toml").startswith(lp["hidden"][0])
    blinding = [str(k) for k in keys]
    assert lp["read_denials"] == cp["read_denials"] + blinding
    # ...and the loop reads its spec file from under the hidden workspace.
    assert lp["readonly_within_writable"] == [
        *cp["readonly_within_writable"], str(s.home / "runs" / "<run>" / "loop-spec.json")]
    differ = ("read_denials", "readonly_within_writable")
    assert {k: v for k, v in lp.items() if k not in differ} == {
        k: v for k, v in cp.items() if k not in differ}
    assert lp["writable_dirs"] == [str(wd.resolve()), str(s.home / "runs" / "<run>" / "out")]
    # The denials are the last word in the rendered boundary (applied last).
    argv = loop["boundary_argv"]
    for path in blinding:
        assert ["--ro-bind", "/dev/null", path] == argv[argv.index(path) - 2: argv.index(path) + 1]
        assert argv.index(path) > max(i for i, a in enumerate(argv) if a in ("--bind", "--bind-fd"))
    assert sorted(loop["blinding"]["env_scrubbed"]) == ["KEY_A", "KEY_B"]
    shown = s.ok("runs", "show", loop["id"]).out
    assert f"lane:        b: m-b at {srv.base_url}/v1 (key on a pipe; $KEY_B scrubbed)" in shown
    assert ("loop:        finished after 1 turn(s), 0 tool call(s), 120 tokens, 0 redaction(s)"
            in shown), shown
    for path in blinding:
        assert f"unreadable:  {path}" in shown


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_vendor_confinement_does_not_unjail_the_loop(saphan_sqlite: Saphan,
                                                     tmp_path: Path) -> None:
    s = saphan_sqlite
    config = s.home / "config.toml"
    config.write_text(config.read_text().replace('confinement = "engine"',
                                                 'confinement = "vendor"'))
    with ChatCompletionsServer([("text", "ok")]) as srv:
        wd, _ = _setup(s, tmp_path, srv.base_url)
        rec = json.loads(s.ok("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
                              "--lane", "a", "--prompt", "t", "--json").out)
    assert rec["confinement_setting"] == "vendor"
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert "the engine confined it" in rec["confinement_note"]


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_loop_commits_in_its_own_worktree(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """`--repo`: the loop works in a linked worktree on saphan/<run-id>, made
    outside the boundary; its git commit lands there, the main branch and the
    main .git's config stay as they were."""
    import subprocess

    s = saphan_sqlite
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                    "commit", "-q", "--allow-empty", "-m", "base"], check=True)
    main_head = subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], check=True,
                               capture_output=True, text=True).stdout.strip()
    script: list[Any] = [
        ("calls", [("write_file", {"path": "feature.txt", "content": "from the loop\n"}),
                   ("run_command", {"argv": ["git", "add", "feature.txt"]}),
                   ("run_command", {"argv": ["git", "-c", "user.email=loop@saphan",
                                             "-c", "user.name=loop", "commit", "-q", "-m",
                                             "loop: add feature"]})]),
        ("calls", [("finish", {"summary": "committed"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        _setup(s, tmp_path, srv.base_url)
        r = s("run", "--machine", "here", "--slot", "lp", "--repo", str(repo), "--lane", "a",
              "--prompt", "add a feature and commit it", "--json", timeout=120)
        results = srv.tool_results()
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert results[1].startswith("exit 0") and results[2].startswith("exit 0"), results
    branch = rec["worktree"]["branch"]
    assert branch == f"saphan/{rec['id']}"
    log = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s", branch],
                         check=True, capture_output=True, text=True).stdout.strip()
    assert log == "loop: add feature"
    assert rec["worktree"]["head_after"] != main_head
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "main"], check=True,
                          capture_output=True, text=True).stdout.strip() == main_head
