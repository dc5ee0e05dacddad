"""Codex CLI: the composed command line (whole vectors), Codex's OWN sandbox
run for real with exactly the composed settings, and a run end to end
through `saphan run` against a scripted Responses-API server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import Worktree, agents_env, git
from model_servers import ResponsesServer

from conftest import Saphan
from saphan import worktrees
from saphan.confine.grants import derive, make_run_dirs, verify_linked_worktree
from saphan.tools import codex

RUN = "01TESTRUN"


def test_composed_argv_whole_vector(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (tmp_path / "key").write_text("k")
    (tmp_path / "out").mkdir()
    policy = derive(str(wd), return_path=str(tmp_path / "out"),
                    read_denials=(str(tmp_path / "key"),))
    w, out, key = str(wd.resolve()), str((tmp_path / "out").resolve()), str(tmp_path / "key")
    argv = codex.compose_argv("/opt/codex", policy, run_id=RUN, model="gpt-x",
                              provider=codex.Provider("http://127.0.0.1:9/v1", "K"))
    assert argv == [
        "/opt/codex", "exec", "--strict-config", "--json", "--skip-git-repo-check", "-C", w,
        "-c", 'default_permissions="saphan-01testrun"',
        "-c", 'permissions.saphan-01testrun={ filesystem = { ":root" = "read", '
              f'":slash_tmp" = "read", "{out}" = "write", "{key}" = "none", '
              '":workspace_roots" = { "." = "write" } }, network = { enabled = false } }',
        "-c", 'approval_policy="never"',
        "-c", 'model="gpt-x"',
        "-c", 'model_provider="saphan"',
        "-c", 'model_providers.saphan={ name = "saphan", base_url = "http://127.0.0.1:9/v1", '
              'env_key = "K", wire_api = "responses" }',
        "-",
    ]
    resumed = codex.compose_argv("/opt/codex", policy, run_id=RUN, model=None,
                                 resume_session="th-1")
    assert resumed[-5:] == ["-c", 'model_provider="openai"', "resume", "th-1", "-"]
    assert 'model="' not in " ".join(resumed)


def _sandbox(codex_bin: str, home: str, wd: Path, settings: list[tuple[str, str]],
             script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    profile = json.loads(settings[0][1])
    argv = [codex_bin, "sandbox", "-P", profile, "-C", str(wd)]
    for key, value in settings:
        argv += ["-c", f"{key}={value}"]
    argv += ["--", "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env=agents_env(CODEX_HOME=home, **env), stdin=subprocess.DEVNULL)


def test_codex_own_sandbox_with_the_composed_settings(
    codex_bin: str, codex_home: str, linked_worktree: Worktree, tmp_path: Path
) -> None:
    """Each pinned setting measured against the real binary: the workdir and
    scratch are writable, /tmp, $HOME and the invoking TMPDIR are not (and
    stay byte-for-byte unchanged), the main repository's config, hooks and
    worktrees stay read-only, a commit on the namespaced branch works, the
    read denial hides the key, and sockets are refused."""
    wt = linked_worktree.path
    # A workspace as saphan lays it out: hidden whole, the run's return path
    # under it granted back.
    ws = tmp_path / "ws"
    out_dir = ws / "runs" / "R" / "out"
    out_dir.mkdir(parents=True)
    key = ws / "record.key"
    key.write_text("SECRET-KEY")
    lane_key = tmp_path / "lane.key"  # a read denial outside the workspace
    lane_key.write_text("LANE-KEY")
    linked = verify_linked_worktree(str(wt), str(linked_worktree.repo / ".git"))
    policy = derive(str(wt), return_path=str(out_dir), read_denials=(str(key), str(lane_key)),
                    hidden_dirs=(str(ws),), worktree=linked)
    make_run_dirs(policy, objects=True)
    home = tmp_path / "home"
    home.mkdir()
    invoking_tmp = Path(codex_home) / "invoking-tmpdir"  # outside the workdir, not /tmp
    invoking_tmp.mkdir(exist_ok=True)
    outside = tmp_path / "outside.txt"  # a sibling under /tmp
    outside.write_text("original\n")
    common = linked_worktree.repo / ".git"
    script = f"""
echo in > inside.txt && echo INSIDE-OK
echo x > $TMPDIR/s && echo SCRATCH-OK
echo x > {tmp_path}/new-in-tmp && echo TMP-WROTE
echo x > {outside} && echo OUTSIDE-WROTE
echo x > $HOME/x && echo HOME-WROTE
echo x > {invoking_tmp}/x && echo INVOKING-TMPDIR-WROTE
echo x > /tmp/saphan-codex-probe-{os.getpid()} && echo SLASH-TMP-WROTE
touch {common}/config && echo CONFIG-WROTE
touch {common}/hooks/pre-commit && echo HOOK-WROTE
mkdir {common}/worktrees/evil && echo WORKTREE-ADDED
cat {key} && echo KEY-READ
cat {lane_key} && echo LANE-KEY-READ
ls {ws} && echo WS-LISTED
echo r > {out_dir}/ret && echo RETURN-OK
printf 'gitdir: /tmp\n' > .git && echo DOTGIT-WROTE
git add inside.txt && git -c user.email=t@e -c user.name=t commit -q -m agent && echo COMMITTED
python3 -c 'import socket; socket.create_connection(("127.0.0.1", 9), 2)' 2>&1 | tail -1
echo WALK-FROM-$$-PARENT-$PPID; p=$PPID
while [ "$p" -gt 1 ]; do
  echo WALKED-$(cat /proc/$p/comm)
  echo x 2>/dev/null > /proc/$p/root{outside} && echo PROC-ROOT-WROTE-$p
  cat /proc/$p/root{key} 2>/dev/null && echo PROC-ROOT-KEY-$p
  p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
done
"""
    settings = codex.settings(policy, run_id=RUN, model=None)
    before_cfg = (common / "config").read_bytes()
    r = _sandbox(codex_bin, codex_home, wt, settings, script,
                 {"HOME": str(home), "TMPDIR": policy.scratch_dir, **dict(policy.setenv)})
    out = r.stdout
    assert "INSIDE-OK" in out and "SCRATCH-OK" in out and "COMMITTED" in out, r.stderr
    assert "RETURN-OK" in out, r.stderr
    for escaped in ("TMP-WROTE", "OUTSIDE-WROTE", "HOME-WROTE", "INVOKING-TMPDIR-WROTE",
                    "SLASH-TMP-WROTE", "CONFIG-WROTE", "HOOK-WROTE", "WORKTREE-ADDED",
                    "KEY-READ", "LANE-KEY-READ", "WS-LISTED", "DOTGIT-WROTE",
                    "PROC-ROOT-WROTE", "PROC-ROOT-KEY"):
        assert escaped not in out, (escaped, out, r.stderr)
    assert "SECRET-KEY" not in out
    # The ancestor walk ran: Codex's sandbox gives the command a PID namespace
    # (its parent is pid 1), so no process outside it is there to reach.
    assert "WALK-FROM-" in out and ("PARENT-1\n" in out or "WALKED-" in out), out
    assert "Operation not permitted" in out or "PermissionError" in out  # the socket
    assert outside.read_text() == "original\n"
    assert not (tmp_path / "new-in-tmp").exists() and not (home / "x").exists()
    assert not (invoking_tmp / "x").exists()
    assert not Path(f"/tmp/saphan-codex-probe-{os.getpid()}").exists()
    assert (common / "config").read_bytes() == before_cfg
    assert not (common / "worktrees" / "evil").exists()
    # The commit is the run's own (detached HEAD, its own object directory)
    # until saphan imports it onto the run's branch.
    spec = worktrees.RepoSpec(str(linked_worktree.repo), str(common),
                              git("rev-parse", "main", cwd=linked_worktree.repo).strip(), "main")
    imported = worktrees.import_run(spec, linked.git_dir, str(wt), str(tmp_path), "t1")
    assert imported["result"] == "imported", imported
    assert "agent" in git("log", "-1", "--format=%s", linked_worktree.branch,
                          cwd=linked_worktree.repo)


def test_codex_builtin_workspace_profile_leaves_tmp_writable(
    codex_bin: str, codex_home: str, tmp_path: Path
) -> None:
    """Why the engine defines its own profile: the legacy exclude keys do not
    shape `:workspace` in 0.169 — /tmp stays writable (SPEC.md §5). If this
    ever fails, the vendor fixed it; the engine's profile stays correct."""
    wd = tmp_path / "wd"
    wd.mkdir()
    probe = Path(f"/tmp/saphan-codex-legacy-{os.getpid()}")
    r = subprocess.run(
        [codex_bin, "sandbox", "-P", ":workspace", "-C", str(wd),
         "-c", "sandbox_workspace_write.exclude_slash_tmp=true",
         "-c", "sandbox_workspace_write.exclude_tmpdir_env_var=true",
         "--", "sh", "-c", f"echo x > {probe} && echo WROTE"],
        capture_output=True, text=True, timeout=120, env=agents_env(CODEX_HOME=codex_home),
        stdin=subprocess.DEVNULL)
    try:
        assert "WROTE" in r.stdout, r.stderr
    finally:
        probe.unlink(missing_ok=True)


def test_a_config_file_cannot_widen_a_per_run_profile(
    codex_bin: str, codex_home: str, tmp_path: Path
) -> None:
    """A config file naming a fixed profile name merges into it; the per-run
    name cannot be predicted, so a file's "/" = "write" never reaches it."""
    wd = tmp_path / "wd"
    wd.mkdir()
    Path(codex_home, "config.toml").write_text(
        'sandbox_mode = "danger-full-access"\n'
        '[permissions.saphan-fixed.filesystem]\n"/" = "write"\n')
    policy = derive(str(wd))
    settings = codex.settings(policy, run_id=RUN, model=None)
    probe = tmp_path / "sibling"
    r = _sandbox(codex_bin, codex_home, wd, settings,
                 f"echo x > {probe} && echo WROTE; echo ok > in && echo IN", {})
    assert "IN" in r.stdout and "WROTE" not in r.stdout, (r.stdout, r.stderr)
    assert not probe.exists()


def test_strict_config_rejects_a_mistyped_setting(codex_bin: str, codex_home: str,
                                                  tmp_path: Path) -> None:
    Path(codex_home, "config.toml").write_text("aproval_policy = \"never\"\n")
    r = subprocess.run([codex_bin, "exec", "--strict-config", "--skip-git-repo-check",
                        "-C", str(tmp_path), "-"], input="hi", capture_output=True, text=True,
                       timeout=60, env=agents_env(CODEX_HOME=codex_home))
    assert r.returncode != 0 and "aproval_policy" in (r.stderr + r.stdout)


@pytest.mark.slow
def test_codex_end_to_end_through_saphan_run(
    saphan_sqlite: Saphan, codex_bin: str, codex_home: str, linked_worktree: Worktree,
    tmp_path: Path,
) -> None:
    """`saphan run` on a codex slot: the scripted model issues one shell call
    that writes inside, writes /tmp and $HOME, and commits. Codex's sandbox
    refuses the outside writes; the commit lands; the record says the vendor
    enforced, lists the pinned settings and what lies outside."""
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    cmd = (f"echo inside > inside.txt; echo x > {outside}; echo x > $HOME/x; "
           "git add inside.txt && git -c user.email=t@e -c user.name=t commit -q -m agent "
           "&& echo COMMITTED")
    s = saphan_sqlite
    with ResponsesServer([("shell", cmd), ("text", "done")]) as srv:
        with open(s.home / "config.toml", "a") as f:
            f.write(f'\n[codex]\nbase_url = "{srv.base_url}/v1"\nenv_key = "SAPHAN_TEST_KEY"\n')
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cx", "--tool", "codex")
        env = s.env(CODEX_HOME=codex_home, HOME=str(home), SAPHAN_TEST_KEY="sk-test",
                    SAPHAN_CODEX_BIN=codex_bin)
        r = s("run", "--machine", "here", "--slot", "cx", "--repo", str(linked_worktree.repo),
              "--prompt", "commit a file", "--model", "scripted-model", "--json", env=env,
              timeout=180)
        assert r.code == 0, r.err
        outputs = list(srv.outputs())
    rec = json.loads(r.out)
    assert len(outputs) == 1 and "COMMITTED" in outputs[0], outputs
    assert "Read-only file system" in outputs[0]
    assert outside.read_text() == "original\n" and not (home / "x").exists()
    wt = Path(rec["worktree"]["path"])
    assert (wt / "inside.txt").read_text() == "inside\n"
    assert "agent" in git("log", "-1", "--format=%s", rec["worktree"]["branch"],
                          cwd=linked_worktree.repo)
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "vendor:codex" and enforced["version"] == "codex-cli 0.169.0"
    # No engine boundary nested around Codex: only saphan-launcher's reaper,
    # which confines nothing and kills what the run leaves behind — Codex's
    # fs-helper daemon outlived its run by an hour before (measured).
    assert rec["boundary_argv"][1:] == ["reap", "--expect-sha256", enforced["reaper"]["sha256"],
                                        "--status-fd", "3", "--"]
    assert rec["processes_killed_at_end"] is not None
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in left.splitlines() if rec["id"] in line], left
    assert any(p.startswith('permissions.saphan-') for p in enforced["pinned_settings"])
    assert 'approval_policy="never"' in enforced["pinned_settings"]
    assert 'model="scripted-model"' in enforced["pinned_settings"]
    assert "its hooks" in enforced["not_restricted"] and "all reads" in enforced["not_restricted"]
    assert rec["agent"]["version"] == "codex-cli 0.169.0" and len(rec["agent"]["sha256"]) == 64
    assert rec["agent_session"]["id"]
    assert srv.requests[0]["model"] == "scripted-model"
    assert "commit a file" in json.dumps(srv.requests[0]["input"])
    assert "commit a file" not in rec["argv"]  # the prompt went on stdin


@pytest.mark.slow
def test_a_codex_run_against_a_dead_endpoint_ends_at_its_limit(
    saphan_sqlite: Saphan, codex_bin: str, codex_home: str, tmp_path: Path,
) -> None:
    """Codex retried an endpoint that never answers for minutes (measured):
    the run ends at --max-seconds, recorded time-limit-killed, and nothing
    of it is left running."""
    import socket
    import time

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(0)  # accepts connections into its backlog, never answers
    port = held.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir()
    wd = tmp_path / "wd"
    wd.mkdir()
    s = saphan_sqlite
    try:
        with open(s.home / "config.toml", "a") as f:
            f.write(f'\n[codex]\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                    'env_key = "SAPHAN_TEST_KEY"\n')
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cx", "--tool", "codex")
        env = s.env(CODEX_HOME=codex_home, HOME=str(home), SAPHAN_TEST_KEY="sk-test",
                    SAPHAN_CODEX_BIN=codex_bin)
        start = time.monotonic()
        r = s("run", "--machine", "here", "--slot", "cx", "--workdir", str(wd), "--prompt",
              "say hi", "--model", "scripted-model", "--max-seconds", "4", "--json", env=env,
              timeout=120)
        took = time.monotonic() - start
    finally:
        held.close()
    assert r.code != 0
    rec = json.loads(r.out)
    assert rec["outcome"] == "time-limit-killed", rec
    assert any("time limit (4 s)" in n for n in rec["notes"])
    assert took < 4 + 12 + 15, took
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in left.splitlines() if rec["id"] in line], left
