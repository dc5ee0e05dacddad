"""loop/adapter.py: the loop's outer half. One composer, two callers: the
loop's jail is the one every agent tool gets in the same working directory,
plus the blinding — nothing else.

The unit tests below hold the adapter's own answers (what it hides, what it
scrubs, the spec it writes, its record, how it reads the loop's result); the
end-to-end tests drive the real CLI. A `command` run and a loop run in the same working directory are compared
through their records: the same mechanism and executable enforced, the same
writable set (the working directory and the run's own return path), and
read denials that differ exactly by the lanes file and every lane's
credential file. `run.confinement = vendor` does not unjail the loop.
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
from saphan.confine.policy import Policy
from saphan.lanes import Lane
from saphan.loop.adapter import (
    CHANNEL_NOTE,
    COMMAND_TIMEOUT,
    DEFAULT_MAX_SECONDS,
    DEFAULT_MAX_TURNS,
    RETRIES,
    VENDOR_NOTE,
    WATCHDOG_GRACE,
    LoopAdapter,
    interpreter,
)
from saphan.refusals import Refusal
from saphan.tools.instruction import Instruction
from saphan.tools.permission_class import parse
from tools.model_servers import ChatCompletionsServer

# -- the adapter's own answers (unit) --------------------------------------------------------

SECRET_A = b"sk-lane-a-" + b"1" * 24
SECRET_B = b"sk-lane-b-" + b"2" * 24


def _adapter(tmp_path: Path, *, confinement: str = "engine", pc: Any = None,
             **kw: Any) -> LoopAdapter:
    run_dir = tmp_path / "runs" / "01RUN"
    (run_dir / "out").mkdir(parents=True, exist_ok=True)
    prompt = run_dir / "prompt.txt"
    prompt.write_text("write hello.txt\n")
    lane = Lane("b", "http://127.0.0.1:8080/v1", "m-b", "/keys/b.key", "KEY_B", timeout=7)
    return LoopAdapter(
        interpreter(), Instruction(str(prompt), "/wd", permission_class=pc), confinement,
        "01RUN", lane=lane, secret=SECRET_B, hidden=("/ws/lanes.toml", "/keys/a.key",
                                                     "/keys/b.key"),
        scrub_env=("KEY_A", "KEY_B"), scrub_values=(SECRET_A, SECRET_B),
        spec_path=str(run_dir / "loop-spec.json"), out_dir=str(run_dir / "out"), **kw)


POLICY = Policy(workdir="/wd", writable_dirs=("/wd",), hidden_dirs=("/ws",),
                read_denials=("/keys/a.key", "/keys/b.key"))


def test_the_interpreter_is_this_python_digested() -> None:
    import hashlib

    binary = interpreter()
    assert binary.tool == "loop" and binary.path == os.path.abspath(sys.executable)
    with open(os.path.realpath(sys.executable), "rb") as f:
        assert binary.sha256 == hashlib.sha256(f.read()).hexdigest()
    assert "loop on Python" in binary.version


def test_the_key_goes_on_the_pipe_and_nowhere_else(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    assert a.stdin_path is None and a.stdin_bytes() == SECRET_B
    assert SECRET_A.decode() not in repr(a) and SECRET_B.decode() not in repr(a)
    argv = a.argv(POLICY)
    assert not any(SECRET_B.decode() in x for x in argv)
    assert SECRET_B.decode() not in Path(a.spec_path).read_text()
    assert SECRET_B.decode() not in json.dumps(a.record(POLICY))


def test_every_lane_file_is_hidden_and_only_the_spec_exposed(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    assert a.read_denials() == ("/ws/lanes.toml", "/keys/a.key", "/keys/b.key")
    assert a.exposed_paths() == (a.spec_path,)
    assert a.session_dirs() == ()


def test_the_environment_takes_nothing_extra_and_loses_every_key(tmp_path: Path) -> None:
    pc = parse({"schema": 2, "allowed_commands": ["git"], "credentials": ["GH_TOKEN"]})
    a = _adapter(tmp_path, pc=pc)
    assert a.env_allowed() == ()  # not even the class's credentials
    env = {"PATH": "/usr/bin", "KEY_A": "x", "KEY_B": "y", "OTHER": "fine",
           "ALIAS": f"Bearer {SECRET_A.decode()}", "COPY": SECRET_B.decode()}
    assert a.environment(env) == {"PATH": "/usr/bin", "OTHER": "fine"}


def test_the_spec_it_writes(tmp_path: Path) -> None:
    pc = parse({"schema": 2, "allowed_commands": ["git", "make"]})
    a = _adapter(tmp_path, pc=pc, max_turns=3)
    argv = a.argv(POLICY)
    assert argv == [a.binary.path, "-I", "-m", "saphan.loop.agent", a.spec_path]
    out = Path(a.out_dir)
    assert json.loads(Path(a.spec_path).read_text()) == {
        "lane": "b", "base_url": "http://127.0.0.1:8080/v1", "model": "m-b", "timeout": 7,
        "retries": RETRIES, "prompt": "write hello.txt\n", "workdir": "/wd",
        "allowed_commands": ["git", "make"], "writable": ["/wd"], "max_turns": 3,
        "max_seconds": DEFAULT_MAX_SECONDS, "command_timeout": COMMAND_TIMEOUT,
        "scrub_env": ["KEY_A", "KEY_B"], "transcript": str(out / "transcript.jsonl"),
        "result": str(out / "loop-result.json")}
    _adapter(tmp_path).argv(POLICY)  # no class: any command
    assert json.loads(Path(a.spec_path).read_text())["allowed_commands"] is None


def test_the_composed_line_passes_the_guard_and_a_token_does_not(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    argv = a.argv(POLICY)
    a.guard(argv)
    with pytest.raises(Refusal) as info:
        a.guard([*argv, "--dangerously-skip-permissions"])
    assert info.value.cls == "bypass-token"
    # The allow-list: `-I -m saphan.loop.agent SPEC` and nothing else.
    for bad in ([*argv, "/other/spec.json"], [argv[0], "-c", "print(1)", *argv[1:]],
                [*argv[:3], "saphan.other", argv[4]], [argv[0], *argv[2:]],
                [argv[0], "-I", "-I", *argv[2:]], ["/usr/bin/python3", *argv[1:]],
                [*argv[:4], "spec.json"]):
        with pytest.raises(Refusal) as info:
            a.guard(bad)
        assert info.value.cls == "bypass-token" and "allow-list" in info.value.message, bad


@pytest.mark.parametrize("confinement", ["engine", "vendor"])
def test_the_record(tmp_path: Path, confinement: str) -> None:
    a = _adapter(tmp_path, confinement=confinement, max_seconds=60)
    rec = a.record(POLICY)
    assert rec["model"] == "m-b"
    assert rec["lane"] == {"name": "b", "base_url": "http://127.0.0.1:8080/v1", "model": "m-b",
                           "credential_env": "KEY_B"}
    # lanes.toml is denied with its workspace, the keys by name: all three are named.
    assert rec["blinding"] == {"read_denied": ["/ws/lanes.toml", "/keys/a.key", "/keys/b.key"],
                               "env_scrubbed": ["KEY_A", "KEY_B"],
                               "credential_channel": CHANNEL_NOTE}
    assert rec["budgets"] == {"max_turns": DEFAULT_MAX_TURNS, "max_seconds": 60,
                              "command_timeout": COMMAND_TIMEOUT, "model_retries": RETRIES,
                              "engine_kills_at_seconds": 60 + WATCHDOG_GRACE}
    assert rec.get("confinement_note") == (VENDOR_NOTE if confinement == "vendor" else None)


def test_the_record_names_only_what_the_policy_denies(tmp_path: Path) -> None:
    """A path the policy did not deny is not claimed as denied."""
    policy = Policy(workdir="/wd", writable_dirs=("/wd",), hidden_dirs=("/wsx",),
                    read_denials=("/keys/b.key",))
    assert _adapter(tmp_path).record(policy)["blinding"]["read_denied"] == ["/keys/b.key"]


def test_the_engines_watchdog_is_past_the_loops_own_budget(tmp_path: Path) -> None:
    assert _adapter(tmp_path, max_seconds=90).time_limit() == 90.0 + WATCHDOG_GRACE


def test_reading_the_loops_result(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    out = Path(a.out_dir)
    transcript = str(out / "transcript.jsonl")
    missing = a.after_run("/dev/null")
    assert missing == {"loop": {"end": None, "transcript": transcript, "detail": (
        "the loop wrote no result (it did not finish its bookkeeping; see stderr.log)")}}
    assert a.outcome(missing) is None
    result = out / "loop-result.json"
    for bad in ("[1, 2]", "not json", '"text"'):
        result.write_text(bad)
        assert a.after_run("/dev/null") == missing, bad
    result.write_text(json.dumps({"end": "turn-budget-exhausted", "turns": 3}))
    facts = a.after_run("/dev/null")
    assert facts["loop"] == {"end": "turn-budget-exhausted", "turns": 3,
                             "transcript": transcript}
    assert facts["usage"]["models"] == [] and facts["usage"]["tokens"]["input"] is None
    assert a.outcome(facts) == "turn-budget-exhausted"
    # usage, as the endpoint reported it; what is not a count or a name is dropped
    result.write_text(json.dumps({"end": "finished", "models": ["m-1", "bad name", 7],
                                  "tokens": {"prompt": 120, "completion": -5, "total": 115}}))
    got = a.after_run("/dev/null")["usage"]
    assert got == {"models": ["m-1"], "tokens": {"input": 120, "output": None, "cache_read": None,
                                                 "cache_creation": None},
                   "cost_usd": None, "reported_by": got["reported_by"]}
    assert "loop's result file" in got["reported_by"]
    result.write_text(json.dumps({"end": "finished"}))
    assert a.outcome(a.after_run("/dev/null")) is None  # the run's own exit says it
    # a forged end (review: OSC 52 in the outcome column) is none of the names
    result.write_text(json.dumps({"end": "exited\x1b]52;c;cHduZWQ=\x07\rOK"}))
    assert a.outcome(a.after_run("/dev/null")) == "loop-result-unreadable"


def test_a_result_planted_as_a_link_or_fifo_is_not_read(tmp_path: Path) -> None:
    a = _adapter(tmp_path)
    result = Path(a.out_dir) / "loop-result.json"
    elsewhere = tmp_path / "forged.json"
    elsewhere.write_text(json.dumps({"end": "finished", "summary": "forged"}))
    result.symlink_to(elsewhere)
    assert a.after_run("/dev/null")["loop"]["end"] is None
    result.unlink()
    os.mkfifo(result)  # reading must not block
    assert a.after_run("/dev/null")["loop"]["end"] is None


# -- end to end, through the CLI ---------------------------------------------------------------


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
    # the scripted endpoint answered as m-b with 100 prompt / 20 completion tokens
    assert loop["usage"]["models"] == ["m-b"]
    assert (loop["usage"]["tokens"]["input"], loop["usage"]["tokens"]["output"]) == (100, 20)
    shown = s.ok("runs", "show", loop["id"]).out
    assert ("usage:       models m-b; tokens in 100 (cache read -, cache write -) out 20; "
            "cost not reported (as reported by the loop's result file") in shown
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
