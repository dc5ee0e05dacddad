"""tools/launch.py: from what the operator asked (`saphan run --prompt …`) to an
adapter holding an Instruction. Every check happens before the seat is taken,
so a bad request writes nothing; a good one writes only the prompt file (and,
for the loop, names what its jail must hide)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.ids import new_run_id
from saphan.lanes import Lane
from saphan.lanes import add as add_lane
from saphan.lanes import path as lanes_path
from saphan.liveness import current_holder
from saphan.records import signed_record_json
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso
from saphan.tools.adapter import Adapter
from saphan.tools.instruction import Request, Resume
from saphan.tools.launch import prepare
from saphan.workspace import Workspace


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = Workspace(tmp_path / "home")
    ws.init()
    c = Context(ws)
    yield c
    c.close()


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    d = tmp_path / "wd"
    d.mkdir()
    return d


@pytest.fixture
def agent_bins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Stand-in binaries that only say their version: resolution and digest
    are what is tested here; the real CLIs run in test_claude/test_codex."""
    out = {}
    for tool, version in (("claude", "2.1.197 (Claude Code)"), ("codex", "codex-cli 0.169.0")):
        exe = tmp_path / "bin" / tool
        exe.parent.mkdir(exist_ok=True)
        exe.write_text(f"#!/bin/sh\necho '{version}'\n")
        exe.chmod(0o755)
        monkeypatch.setenv(f"SAPHAN_{tool.upper()}_BIN", str(exe))
        out[tool] = exe
    return out


def _prepare(ctx: Context, tool: str, request: Request, wd: Path,
             run_id: str = "01RUN", slot: Slot | None = None) -> Adapter:
    return prepare(ctx, tool, request, workdir=str(wd), run_id=run_id, confinement="engine",
                   run_dir=ctx.workspace.run_dir(run_id), slot=slot)


def _pc(tmp_path: Path, **data: Any) -> str:
    path = tmp_path / "class.json"
    path.write_text(json.dumps({"schema": 2, "allowed_commands": ["git"], **data}))
    return str(path)


# -- bad requests: refused before anything is written -----------------------------------

@pytest.mark.parametrize(("request_", "needle"), [
    (Request(), "give exactly one of --prompt TEXT or --prompt-file FILE"),
    (Request(prompt="a", prompt_file="/etc/hostname"), "give exactly one of --prompt"),
    (Request(prompt="   \n"), "the prompt is empty"),
    (Request(prompt="task", model=""), "--model '' is not a model name"),
    (Request(prompt="task", model="--yolo"), "--model '--yolo' is not a model name"),
    (Request(prompt_file="/nonexistent/task.txt"), "--prompt-file /nonexistent/task.txt: "
                                                   "cannot read it"),
])
def test_bad_requests_write_nothing(ctx: Context, wd: Path, agent_bins: dict[str, Path],
                                    request_: Request, needle: str) -> None:
    with pytest.raises(UserError) as info:
        _prepare(ctx, "claude", request_, wd)
    assert needle in str(info.value)
    assert not ctx.workspace.run_dir("01RUN").exists()


def test_a_prompt_file_that_is_not_text_is_refused(ctx: Context, wd: Path, tmp_path: Path,
                                                   agent_bins: dict[str, Path]) -> None:
    task = tmp_path / "task.bin"
    task.write_bytes(b"\xff\xfe\x00task")
    with pytest.raises(UserError, match="cannot read it"):
        _prepare(ctx, "claude", Request(prompt_file=str(task)), wd)


def test_a_class_whose_write_scope_excludes_the_workdir(ctx: Context, wd: Path, tmp_path: Path,
                                                        agent_bins: dict[str, Path]) -> None:
    elsewhere = tmp_path / "elsewhere"
    pc = _pc(tmp_path, write_scope=[str(elsewhere)])
    with pytest.raises(UserError) as info:
        _prepare(ctx, "claude", Request(prompt="t", permission_class=pc), wd)
    assert f"allows work only inside {elsewhere}, and the working directory is {wd}" in str(
        info.value)
    inside = _pc(tmp_path, write_scope=[str(tmp_path)])
    a = _prepare(ctx, "claude", Request(prompt="t", permission_class=inside), wd)
    assert a.instruction.permission_class is not None
    assert a.instruction.permission_class.write_scope == (str(tmp_path),)


def test_a_class_credential_must_be_set(ctx: Context, wd: Path, tmp_path: Path,
                                        agent_bins: dict[str, Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pc = _pc(tmp_path, credentials=["GH_TOKEN"])
    monkeypatch.delenv("GH_TOKEN", raising=False)
    with pytest.raises(UserError, match=r"needs credential\(s\) GH_TOKEN, which are not set"):
        _prepare(ctx, "claude", Request(prompt="t", permission_class=pc), wd)
    monkeypatch.setenv("GH_TOKEN", "ghp_x")
    a = _prepare(ctx, "claude", Request(prompt="t", permission_class=pc), wd)
    assert "GH_TOKEN" in a.env_allowed()


@pytest.mark.parametrize("name", [
    "CLAUDE_CODE_USE_BEDROCK", "ANTHROPIC_BEDROCK_BASE_URL", "CLAUDE_CODE_SKIP_BEDROCK_AUTH",
    "AWS_REGION", "ANTHROPIC_MODEL", "CLAUDE_CODE_USE_VERTEX", "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUD_ML_REGION", "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "NODE_OPTIONS", "LD_PRELOAD",
    "DISABLE_PROMPT_CACHING", "MAX_THINKING_TOKENS", "MCP_TOOL_TIMEOUT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
])
def test_a_class_credential_that_steers_claude_is_refused(
        ctx: Context, wd: Path, tmp_path: Path, agent_bins: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A class (which a repository can supply) may not name a variable Claude
    Code reads itself: refused (exit 2) naming the class, the variable and why."""
    pc = _pc(tmp_path, credentials=["GH_TOKEN", name])
    monkeypatch.setenv("GH_TOKEN", "ghp_x")
    monkeypatch.setenv(name, "1")
    with pytest.raises(UserError) as info:
        _prepare(ctx, "claude", Request(prompt="t", permission_class=pc), wd)
    msg = str(info.value)
    assert f"permission class {pc} names credential {name}, which claude reads itself" in msg
    assert f"remove {name} from the class's credentials" in msg


def test_claude_class_credentials_that_only_authenticate_pass(
        ctx: Context, wd: Path, tmp_path: Path, agent_bins: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["GH_TOKEN", "NPM_TOKEN", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"]
    for n in names:
        monkeypatch.setenv(n, "x")
    a = _prepare(ctx, "claude", Request(prompt="t", permission_class=_pc(
        tmp_path, credentials=names)), wd)
    assert set(names) <= set(a.env_allowed())


@pytest.mark.parametrize("where", ["config-dir", "home"])
def test_claude_refuses_a_config_home_inside_the_workdir(
        ctx: Context, wd: Path, agent_bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    """CLAUDE_CONFIG_DIR (else ~/.claude) inside the working directory: the
    run could leave settings or hooks for the next; refused before anything."""
    if where == "config-dir":
        monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(wd / "sub" / ".cfg"))
    else:
        monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
        monkeypatch.setenv("HOME", str(wd))
    with pytest.raises(UserError, match=r"configuration directory .* is inside the working "
                                        r"directory"):
        _prepare(ctx, "claude", Request(prompt="t"), wd)
    assert not ctx.workspace.run_dir("01RUN").exists()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(wd.parent / "cfg"))
    _prepare(ctx, "claude", Request(prompt="t"), wd)  # beside it: fine


# -- good requests -------------------------------------------------------------------------

def test_claude_gets_the_prompt_on_a_file_and_the_digested_binary(
        ctx: Context, wd: Path, tmp_path: Path, agent_bins: dict[str, Path]) -> None:
    link = tmp_path / "wd-link"
    link.symlink_to(wd)
    a = _prepare(ctx, "claude", Request(prompt="fix the bug\n", model="m1"), link)
    assert a.tool == "claude" and a.run_id == "01RUN" and a.confinement == "engine"
    prompt = ctx.workspace.run_dir("01RUN") / "prompt.txt"
    assert a.instruction.prompt_path == str(prompt) == a.stdin_path
    assert prompt.read_text() == "fix the bug\n"
    assert a.instruction.workdir == str(wd)  # the canonical path, not the link
    assert a.instruction.model == "m1" and a.instruction.resume is None
    exe = agent_bins["claude"]
    assert (a.binary.path, a.binary.version) == (str(exe), "2.1.197 (Claude Code)")
    assert a.binary.sha256 == hashlib.sha256(exe.read_bytes()).hexdigest()


def test_a_prompt_file_is_copied_into_the_run(ctx: Context, wd: Path, tmp_path: Path,
                                              agent_bins: dict[str, Path]) -> None:
    task = tmp_path / "task.md"
    task.write_text("# the task\nsteps\n")
    a = _prepare(ctx, "codex", Request(prompt_file=str(task)), wd)
    assert a.instruction.prompt_path != str(task)
    assert Path(a.instruction.prompt_path).read_text() == "# the task\nsteps\n"


def test_codex_gets_the_provider_from_the_config(ctx: Context, wd: Path,
                                                 agent_bins: dict[str, Path]) -> None:
    a = _prepare(ctx, "codex", Request(prompt="t"), wd)
    assert a.tool == "codex" and a.provider is None  # type: ignore[attr-defined]
    ctx.workspace.config_path.write_text('[codex]\nbase_url = "http://127.0.0.1:9/v1"\n')
    ctx._config = None  # the file changed under this context: read it again
    a = _prepare(ctx, "codex", Request(prompt="t"), wd)
    provider = a.provider  # type: ignore[attr-defined]
    assert (provider.base_url, provider.env_key) == ("http://127.0.0.1:9/v1", "OPENAI_API_KEY")
    # the slot's endpoint comes before the workspace's table
    slot = Slot("m", "cx", "codex", None, endpoint="http://127.0.0.1:7/v1", model="slot-model",
                max_seconds=120)
    a = _prepare(ctx, "codex", Request(prompt="t"), wd, slot=slot)
    assert a.provider.base_url == "http://127.0.0.1:7/v1"  # type: ignore[attr-defined]
    assert a.instruction.model == "slot-model" and a.time_limit() == 120.0
    # what the run names comes before the slot's defaults
    a = _prepare(ctx, "codex", Request(prompt="t", model="mine", max_seconds=30), wd, slot=slot)
    assert a.instruction.model == "mine" and a.time_limit() == 30.0
    with pytest.raises(UserError, match="Codex CLI has no turn budget"):
        _prepare(ctx, "codex", Request(prompt="t", max_turns=3), wd, slot=slot)


# -- the loop: every lane's key read here, outside any jail -----------------------------------

def _lanes(ctx: Context, tmp_path: Path) -> dict[str, bytes]:
    keys = {}
    for name, env in (("a", "KEY_A"), ("b", "KEY_B"), ("c", "KEY_A")):
        key = tmp_path / "keys" / f"{name}.key"
        key.parent.mkdir(exist_ok=True)
        keys[name] = f"sk-{name}-{os.urandom(12).hex()}".encode()
        key.write_bytes(keys[name] + b"\n")
        key.chmod(0o600)
        add_lane(lanes_path(ctx.workspace.home),
                 Lane(name, "http://127.0.0.1:9/v1", f"model-{name}", str(key),
                      credential_env=env))
    return keys


def test_the_loop_names_its_lane_and_every_secret_to_hide(ctx: Context, wd: Path,
                                                          tmp_path: Path) -> None:
    keys = _lanes(ctx, tmp_path)
    with pytest.raises(UserError, match=r"3 lanes are declared \(a, b, c\); name one"):
        _prepare(ctx, "loop", Request(prompt="t"), wd)
    a = _prepare(ctx, "loop", Request(prompt="t", lane="b", max_turns=7), wd)
    run_dir = ctx.workspace.run_dir("01RUN")
    assert a.tool == "loop"
    assert a.lane.name == "b" and a.lane.model == "model-b"  # type: ignore[attr-defined]
    assert a.stdin_bytes() == keys["b"]  # the key goes on the pipe, stripped
    assert sorted(a.scrub_values) == sorted(keys.values())  # type: ignore[attr-defined]
    assert a.scrub_env == ("KEY_A", "KEY_B")  # type: ignore[attr-defined]
    key_dir = os.path.realpath(tmp_path / "keys")
    assert a.read_denials() == (str(lanes_path(ctx.workspace.home)),
                                *(f"{key_dir}/{n}.key" for n in ("a", "b", "c")))
    assert a.spec_path == str(run_dir / "loop-spec.json")  # type: ignore[attr-defined]
    assert a.out_dir == str(run_dir / "out")  # type: ignore[attr-defined]
    assert (a.max_turns, a.max_seconds) == (7, 1800)  # type: ignore[attr-defined]
    slot = Slot("m", "lp", "loop", None, max_seconds=90, max_turns=4)
    a = _prepare(ctx, "loop", Request(prompt="t", lane="b"), wd, slot=slot)
    assert (a.max_turns, a.max_seconds) == (4, 90)  # type: ignore[attr-defined]
    a = _prepare(ctx, "loop", Request(prompt="t", lane="b", max_turns=9), wd, slot=slot)
    assert (a.max_turns, a.max_seconds) == (9, 90)  # type: ignore[attr-defined]
    assert a.binary.path == os.path.abspath(sys.executable)
    assert "loop on Python" in a.binary.version
    assert "sk-" not in repr(a)


def test_the_loop_ignores_class_credentials(ctx: Context, wd: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _lanes(ctx, tmp_path)
    monkeypatch.delenv("GH_TOKEN", raising=False)
    pc = _pc(tmp_path, credentials=["GH_TOKEN"])
    a = _prepare(ctx, "loop", Request(prompt="t", lane="a", permission_class=pc), wd)
    assert a.env_allowed() == ()


def test_the_loop_without_lanes(ctx: Context, wd: Path) -> None:
    with pytest.raises(UserError, match="a loop slot needs a lane and none is declared"):
        _prepare(ctx, "loop", Request(prompt="t"), wd)


# -- --resume RUN: the only way a session continues ---------------------------------------------

SESSION = "3f1d6c2e-8a4b-5c6d-9e0f-112233445566"


@pytest.fixture(autouse=True)
def claude_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Claude Code's configuration home for these tests (never the machine's)."""
    cfg = tmp_path / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(cfg))
    return cfg


def _transcript(wd: Path, session: str, text: str = '{"type":"user"}\n') -> str:
    """Write the session's transcript where Claude Code keeps it; its SHA-256."""
    from saphan.tools import claude

    path = Path(claude.transcript_path(os.path.realpath(wd), session))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def _recorded_run(ctx: Context, wd: Path, *, tool: str = "claude",
                  session: str | None = SESSION, key: bytes | None = None,
                  transcript: str | None = None) -> str:
    store = ctx.store
    if store.get_machine("m") is None:
        store.add_machine(Machine("m", "local"))
    if store.get_slot("m", tool) is None:
        store.add_slot(Slot("m", tool, tool, None))
    run_id = new_run_id()
    ordinal = store.reserve(run_id=run_id, machine="m", slot=tool, capacity=1, tool=tool,
                            workdir=str(wd), holder=current_holder().as_tuple())
    assert ordinal == 0
    finished = now_iso()
    record: dict[str, Any] = {
        "id": run_id, "machine": "m", "slot": tool, "tool": tool, "state": "ended",
        "outcome": "exited", "exit_code": 0, "finished_at": finished, "session_ordinal": 0,
        "workdir": str(wd)}
    if session is not None:
        record["agent_session"] = {"id": session}
    if transcript is not None:
        record["claude_transcript"] = {"path": "(the leaf)", "sha256": transcript}
    store.finalize(run_id, state="ended", outcome="exited", exit_code=0, finished_at=finished,
                   record_json=signed_record_json(key or ctx.record_key(), record))
    return run_id


def test_resume_names_the_recorded_session(ctx: Context, wd: Path,
                                           agent_bins: dict[str, Path]) -> None:
    previous = _recorded_run(ctx, wd, transcript=_transcript(wd, SESSION))
    a = _prepare(ctx, "claude", Request(prompt="go on", resume=previous[:12]), wd)
    assert a.instruction.resume == Resume(run_id=previous, session_id=SESSION)
    assert a.record(None)["resumes"] == {"run": previous, "session": SESSION}  # type: ignore[arg-type]


def test_resume_refuses_a_claude_session_that_is_not_a_uuid(
        ctx: Context, wd: Path, agent_bins: dict[str, Path]) -> None:
    """The session id names session-env/<id>, which saphan creates and grants."""
    for bad in ("sess-1", "../../x", SESSION.upper(), f"{SESSION}/x"):
        previous = _recorded_run(ctx, wd, session=bad, transcript="0" * 64)
        with pytest.raises(UserError, match="which is not a UUID"):
            _prepare(ctx, "claude", Request(prompt="t", resume=previous), wd)
    assert not ctx.workspace.run_dir("01RUN").exists()


def test_resume_refuses_a_claude_transcript_changed_since_its_run(
        ctx: Context, wd: Path, agent_bins: dict[str, Path]) -> None:
    """The transcript's digest at the run's end is compared with the file
    now: another run in the same workdir shares its directory."""
    digest = _transcript(wd, SESSION)
    previous = _recorded_run(ctx, wd, transcript=digest)
    forged = _transcript(wd, SESSION, '{"type":"user","text":"INJECTED"}\n')
    with pytest.raises(UserError) as info:
        _prepare(ctx, "claude", Request(prompt="t", resume=previous), wd)
    msg = str(info.value)
    assert digest in msg and forged in msg
    assert "Another run in the same working directory could have written it" in msg
    # no digest recorded (a run from before): start a new run
    bare = _recorded_run(ctx, wd)
    with pytest.raises(UserError, match=r"recorded no digest of its Claude Code transcript.*"
                                        r"start a new run"):
        _prepare(ctx, "claude", Request(prompt="t", resume=bare), wd)
    # a link in its place, to a file with the recorded content, is not followed
    from saphan.tools import claude

    elsewhere = wd.parent / "elsewhere.jsonl"
    elsewhere.write_text('{"type":"user"}\n')
    transcript = Path(claude.transcript_path(os.path.realpath(wd), SESSION))
    transcript.unlink()
    transcript.symlink_to(elsewhere)
    with pytest.raises(UserError, match="cannot be read"):
        _prepare(ctx, "claude", Request(prompt="t", resume=previous), wd)
    assert not ctx.workspace.run_dir("01RUN").exists()


def test_resume_refuses_another_tool_no_session_or_another_workdir(
        ctx: Context, wd: Path, tmp_path: Path, agent_bins: dict[str, Path]) -> None:
    claude_run = _recorded_run(ctx, wd)
    with pytest.raises(UserError, match=f"run {claude_run} ran tool 'claude', this slot runs "
                                        "'codex'"):
        _prepare(ctx, "codex", Request(prompt="t", resume=claude_run), wd)
    sessionless = _recorded_run(ctx, wd, session=None)
    with pytest.raises(UserError, match="recorded no claude session"):
        _prepare(ctx, "claude", Request(prompt="t", resume=sessionless), wd)
    other = tmp_path / "other-wd"
    other.mkdir()
    with pytest.raises(UserError, match=f"worked in {wd}; resume it in the same working "
                                        f"directory \\(--workdir {wd}\\)"):
        _prepare(ctx, "claude", Request(prompt="t", resume=claude_run), other)
    with pytest.raises(UserError, match="no run '01NOSUCH'"):
        _prepare(ctx, "claude", Request(prompt="t", resume="01NOSUCH"), wd)
    assert not ctx.workspace.run_dir("01RUN").exists()


def test_resume_does_not_trust_a_record_that_does_not_verify(
        ctx: Context, wd: Path, agent_bins: dict[str, Path]) -> None:
    forged = _recorded_run(ctx, wd, session="someone-elses-session", key=os.urandom(32))
    # signed under a key this workspace does not hold: foreign, never valid
    assert ctx.run_record(forged).signature == "foreign"
    with pytest.raises(Exception):  # noqa: B017 - any refusal is right, a resume is not
        _prepare(ctx, "claude", Request(prompt="t", resume=forged), wd)
