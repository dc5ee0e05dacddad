"""The argv guard (SPEC.md §6): every token in every form, every resumption
and substitution form, exact-token only, full-access grants inside config
overrides and JSON, each adapter's allow-list on the argv the real adapter
composes, the bypass check on a `command` slot's line, and
hypothesis-generated argv."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Saphan
from saphan.confine.grants import derive
from saphan.refusals import Refusal
from saphan.tools import claude, codex
from saphan.tools.adapter import Adapter, CommandAdapter
from saphan.tools.argv_guard import BYPASS_TOKENS, FULL_ACCESS_MARKERS, check, check_bypass
from saphan.tools.binaries import AgentBinary
from saphan.tools.instruction import Instruction, Resume
from saphan.tools.permission_class import parse

CLAUDE = ["/opt/claude", "-p", "--output-format", "stream-json", "--verbose",
          "--permission-mode", "acceptEdits", "--model", "m1"]
CODEX = ["/opt/codex", "exec", "--strict-config", "--json", "-C", "/w",
         "-c", 'approval_policy="never"', "-c", 'model="m1"', "-"]


def refused(argv: list[str], tool: str, *, model: str | None = "m1",
            resume: str | None = None) -> str:
    with pytest.raises(Refusal) as e:
        check(argv, tool=tool, model=model, resume_session=resume)
    return e.value.cls


def test_the_closed_list_is_the_spec_list() -> None:
    assert {
        "--dangerously-skip-permissions", "--allow-dangerously-skip-permissions",
        "bypassPermissions", "dangerouslyDisableSandbox", "--enable-auto-mode",
        "--dangerously-bypass-approvals-and-sandbox", "--yolo", "danger-full-access",
        "--dangerously-bypass-hook-trust", "--approve-for-me", "--not-so-yolo", "auto_review",
    } == BYPASS_TOKENS


def test_composed_command_lines_pass() -> None:
    check(CLAUDE, tool="claude", model="m1")
    check(CODEX, tool="codex", model="m1")


@pytest.mark.parametrize("token", sorted(BYPASS_TOKENS))
@pytest.mark.parametrize("tool", ["claude", "codex"])
def test_every_token_as_an_element(token: str, tool: str) -> None:
    base = CLAUDE if tool == "claude" else CODEX
    assert refused([*base[:2], token, *base[2:]], tool) == "bypass-token"
    assert refused([*base, token], tool) == "bypass-token"


@pytest.mark.parametrize("token", sorted(BYPASS_TOKENS))
@pytest.mark.parametrize("tool", ["claude", "codex"])
def test_every_token_in_flag_equals_value_form(token: str, tool: str) -> None:
    base = CLAUDE if tool == "claude" else CODEX
    if token.startswith("-"):
        assert refused([*base, f"{token}=true"], tool) == "bypass-token"
    assert refused([*base, f"--permission-mode={token}"], tool) == "bypass-token"
    assert refused([*base, f"-s={token}"], tool) == "bypass-token"


@pytest.mark.parametrize("token", sorted(BYPASS_TOKENS))
@pytest.mark.parametrize("quote", ["", '"', "'"])
def test_every_token_as_a_codex_config_value(token: str, quote: str) -> None:
    for key in ("sandbox_mode", "approvals_reviewer", "x.y"):
        assert refused([*CODEX[:-1], "-c", f"{key}={quote}{token}{quote}", "-"],
                       "codex") == "bypass-token"
        assert refused([*CODEX[:-1], f"--config={key}={quote}{token}{quote}", "-"],
                       "codex") == "bypass-token"


@pytest.mark.parametrize("word", ["--yolo-mode-docs", "yolo", "--yolo2", "x--yolo",
                                  "danger-full-access-docs", "auto_reviewer", "bypassPermissionsX",
                                  "/tmp/--yolo", "--add-dir=--yolo-x"])
def test_substrings_and_prefixes_never_match(word: str) -> None:
    check([*CLAUDE, "--add-dir", word], tool="claude", model="m1")
    check_bypass(["/usr/bin/tool", word, "--add-dir", word])
    line = [*CODEX[:-1], "-c", f"note={word}x", "-"]
    if any(m in word for m in FULL_ACCESS_MARKERS):
        # Inside a config override's value, a full-access marker is refused
        # wherever it stands (`:danger-full-access` is a profile's name).
        assert refused(line, "codex") == "bypass-token"
    else:
        check(line, tool="codex", model="m1")


@pytest.mark.parametrize("extra", [["--continue"], ["-c"], ["--resume", "abc"], ["-r", "abc"],
                                   ["--fork-session"], ["--resume=abc"], ["--continue=1"]])
def test_claude_resumption_forms(extra: list[str]) -> None:
    assert refused([*CLAUDE, *extra], "claude") == "session-resumption"


@pytest.mark.parametrize("extra", [["resume", "abc"], ["fork", "abc"], ["resume", "--last"],
                                   ["--last"]])
def test_codex_resumption_forms(extra: list[str]) -> None:
    assert refused([*CODEX[:-1], *extra, "-"], "codex") == "session-resumption"


def test_explicit_resume_of_exactly_the_recorded_session_passes() -> None:
    check([*CLAUDE, "--resume", "s-1"], tool="claude", model="m1", resume_session="s-1")
    check([*CODEX[:-1], "resume", "s-1", "-"], tool="codex", model="m1", resume_session="s-1")
    assert refused([*CLAUDE, "--resume", "s-2"], "claude", resume="s-1") == "session-resumption"
    assert refused([*CLAUDE, "--resume", "s-1", "--continue"], "claude",
                   resume="s-1") == "session-resumption"
    assert refused(CLAUDE, "claude", resume="s-1") == "session-resumption"
    assert refused([*CODEX[:-1], "resume", "s-1", "--last", "-"], "codex",
                   resume="s-1") == "session-resumption"


@pytest.mark.parametrize(("tool", "extra"), [
    ("claude", ["--fallback-model", "m2"]), ("claude", ["--fallback-model=m2"]),
    ("claude", ["--model", "m2"]), ("claude", ["--model=m1"]),
    ("codex", ["--oss"]), ("codex", ["--local-provider", "ollama"]),
    ("codex", ["--local-provider=lmstudio"]), ("codex", ["-m", "m2"]),
    ("codex", ["--model", "m1"]), ("codex", ["-c", "model=m2"]),
    ("codex", ["--config=model='m1'"]),
])
def test_substitution_forms(tool: str, extra: list[str]) -> None:
    base = CLAUDE if tool == "claude" else CODEX[:-1]
    assert refused([*base, *extra], tool) == "model-substitution"


def test_model_must_be_exactly_the_named_one() -> None:
    assert refused(CLAUDE, "claude", model="m2") == "model-substitution"
    assert refused(CLAUDE, "claude", model=None) == "model-substitution"
    assert refused(CLAUDE[:-2], "claude", model="m1") == "model-substitution"
    check(CLAUDE[:-2], tool="claude", model=None)
    assert refused([*CODEX[:-3], "-c", 'model="m2"', "-"], "codex") == "model-substitution"


# -- properties ----------------------------------------------------------------------

_safe_word = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                     min_size=0, max_size=24)


@settings(max_examples=300, deadline=None)
@given(token=st.sampled_from(sorted(BYPASS_TOKENS)), before=_safe_word, after=_safe_word)
def test_a_token_embedded_in_a_longer_word_never_matches(token: str, before: str,
                                                         after: str) -> None:
    word = before + token + after
    if word == token or "=" in word or word in BYPASS_TOKENS:
        return
    if word.lstrip().startswith("{") or re.fullmatch(r"-[A-Za-z]['\"]?" + re.escape(token)
                                                       + r"['\"]?", word):
        return  # a JSON object, or an attached short option: both read (tests below)
    check([*CLAUDE, "--add-dir", word], tool="claude", model="m1")


@settings(max_examples=300, deadline=None)
@given(token=st.sampled_from(sorted(BYPASS_TOKENS)), tool=st.sampled_from(["claude", "codex"]),
       form=st.sampled_from(["bare", "flag=", "=value", "config"]),
       position=st.integers(min_value=1, max_value=12))
def test_every_token_in_any_position_and_form_always_matches(
    token: str, tool: str, form: str, position: int
) -> None:
    base = list(CLAUDE if tool == "claude" else CODEX)
    if form == "bare":
        inserted = [token]
    elif form == "flag=":
        inserted = [f"{token}=1"] if token.startswith("-") else [f"--x={token}"]
    elif form == "=value":
        inserted = [f"--sandbox={token}"]
    else:
        inserted = (["-c", f'k="{token}"'] if tool == "codex" else [f"--settings={token}"])
    at = min(position, len(base))
    argv = [*base[:at], *inserted, *base[at:]]
    assert refused(argv, tool) == "bypass-token"


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_/.0123456789", max_size=16),
                      max_size=8))
def test_random_argv_verdicts_follow_the_exact_token_rule(words: list[str]) -> None:
    argv = [*CLAUDE, "--add-dir", *[f"/{w}" for w in words]]
    check(argv, tool="claude", model="m1")  # an absolute path is never a token


# -- the allow-lists, on what the real adapters compose -------------------------------

RUN = "01GUARDRUN"
PC = parse({"schema": 2, "name": "ci", "allowed_commands": ["git", "make"],
            "permission_mode": "plan"}, source="/classes/ci.json")


def _adapters(tmp_path: Path, *, resume: bool = False) -> list[tuple[Adapter, list[str]]]:
    """The real Claude and Codex adapters and the argv each composes (model
    named, a permission class, a pinned provider; resumed when asked)."""
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "key").write_text("k")
    policy = derive(str(wd), return_path=str(tmp_path / "out"),
                    read_denials=(str(tmp_path / "key"),))
    instruction = Instruction(prompt_path=str(tmp_path / "prompt"), workdir=str(wd),
                              model="m1", permission_class=PC,
                              resume=Resume("01PREV", "s-1") if resume else None)
    cl = claude.ClaudeAdapter(AgentBinary("claude", "/opt/claude", "a" * 64, "2.1.197"),
                              instruction, "engine", RUN)
    cx = codex.CodexAdapter(AgentBinary("codex", "/opt/codex", "b" * 64, "codex-cli 0.169.0"),
                            instruction, "engine", RUN,
                            provider=codex.Provider("http://127.0.0.1:9/v1", "K"))
    return [(cl, cl.argv(policy)), (cx, cx.argv(policy))]


def _inject(argv: list[str], extra: list[str]) -> list[str]:
    """``extra`` where an option would go: before Codex's trailing `-`, else last."""
    return [*argv[:-1], *extra, "-"] if argv[-1] == "-" else [*argv, *extra]


def _guard_class(adapter: Adapter, argv: list[str], agent_at: int = 0) -> str:
    with pytest.raises(Refusal) as e:
        adapter.guard(argv, agent_at=agent_at)
    return e.value.cls


@pytest.mark.parametrize("resume", [False, True])
def test_what_the_real_adapters_compose_passes_their_allow_lists(tmp_path: Path,
                                                                 resume: bool) -> None:
    for adapter, argv in _adapters(tmp_path, resume=resume):
        adapter.guard(argv)
        # behind a boundary prefix (bubblewrap's, the reaper's): only the agent's part
        # is held to the allow-list
        prefix = ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--bind", "/w", "/w", "--"]
        adapter.guard([*prefix, *argv], agent_at=len(prefix))
        assert _guard_class(adapter, [*prefix, *argv]) == "bypass-token"


# The measured gaps (issue 16, item 1): each passed the block-list and widened
# the run. (tool, injected elements, class)
GAPS = [
    ("codex", ["-c", 'default_permissions=":danger-full-access"'], "bypass-token"),
    ("codex", ["-sdanger-full-access"], "bypass-token"),
    ("codex", ["--add-dir", "/"], "bypass-token"),
    ("claude", ["--settings", '{"permissions":{"defaultMode":"bypassPermissions"}}'],
     "bypass-token"),
    ("claude", ["--permission-mode", "auto"], "bypass-token"),
    ("claude", ["--agents", '{"r":{"description":"d","prompt":"p","model":"opus"}}'],
     "model-substitution"),
]


@pytest.mark.parametrize(("tool", "extra", "cls"), GAPS)
def test_each_measured_gap_is_refused_on_the_composed_line(tmp_path: Path, tool: str,
                                                           extra: list[str], cls: str) -> None:
    adapter, argv = next((a, v) for a, v in _adapters(tmp_path) if a.tool == tool)
    adapter.guard(argv)
    assert _guard_class(adapter, _inject(argv, extra)) == cls
    assert _guard_class(adapter, [*argv[:1], *extra, *argv[1:]]) == cls


@pytest.mark.parametrize(("tool", "extra"), [
    # not bypass tokens, and still not what the adapter composes
    ("codex", ["--add-dir", "/tmp"]), ("codex", ["-p", "evil"]), ("codex", ["--profile", "x"]),
    ("codex", ["--enable", "x"]), ("codex", ["-s", "workspace-write"]), ("codex", ["-C", "/"]),
    ("codex", ["-C", "/elsewhere"]), ("codex", ["-c", 'approval_policy="on-request"']),
    ("codex", ["-c", "sandbox_workspace_write.network_access=true"]),
    ("codex", ["-c", 'default_permissions="other"']),
    ("codex", ["-c", 'permissions.saphan-x={ filesystem = { ":root" = "read", '
                     '":slash_tmp" = "read", "/home" = "write", '
                     '":workspace_roots" = { "." = "write" } }, network = { enabled = false } }',
               "-c", 'default_permissions="saphan-x"']),
    ("codex", ["--config=model_provider=x"]), ("codex", ["--json"]), ("codex", ["prompt"]),
    ("claude", ["--add-dir", "/"]), ("claude", ["--settings", "/tmp/s.json"]),
    ("claude", ["--mcp-config", "x.json"]), ("claude", ["--permission-mode", "default"]),
    ("claude", ["--tools", "default"]), ("claude", ["--allowedTools", "Edit"]),
    ("claude", ["--session-id", "not-a-uuid"]), ("claude", ["a", "prompt"]),
    ("claude", ["--verbose"]), ("claude", ["--dangerously-load-development-channels"]),
    ("claude", ["--output-format=json"]),
])
def test_anything_off_the_allow_list_is_refused(tmp_path: Path, tool: str,
                                                extra: list[str]) -> None:
    adapter, argv = next((a, v) for a, v in _adapters(tmp_path) if a.tool == tool)
    with pytest.raises(Refusal) as e:
        adapter.guard(_inject(argv, extra))
    assert e.value.cls == "bypass-token" and "allow-list" in e.value.message, e.value.message


def test_codex_positionals_are_exec_resume_and_stdin(tmp_path: Path) -> None:
    adapter, argv = next((a, v) for a, v in _adapters(tmp_path) if a.tool == "codex")
    assert _guard_class(adapter, [argv[0], *argv[2:]]) == "bypass-token"  # no `exec`
    assert _guard_class(adapter, argv[:-1]) == "bypass-token"  # no `-`
    assert _guard_class(adapter, ["/other/codex", *argv[1:]]) == "bypass-token"


# -- the attached short form and config grants, for every tool -------------------------

@pytest.mark.parametrize("element", [
    "-sdanger-full-access", "-s=danger-full-access", "-s'danger-full-access'", "-x--yolo",
])
def test_the_attached_short_form_is_read(element: str) -> None:
    assert refused([*CODEX[:-1], element, "-"], "codex") == "bypass-token"
    with pytest.raises(Refusal):
        check_bypass(["/usr/bin/codex", "exec", element])


@pytest.mark.parametrize("operand", [
    'default_permissions=":danger-full-access"', "default_permissions=:danger-full-access",
    'sandbox_mode="danger-full-access"', 'sandbox_mode="anything-else"',
    'sandbox_permissions=["disk-full-write-access"]', 'approvals_reviewer="guardian_subagent"',
    'permissions.p.filesystem.":root"="write"', 'permissions.p={ filesystem = { "/" = "write" } }',
    'profiles.x.sandbox_mode="danger-full-access"', 'x.defaultMode="bypassPermissions"',
    'x={ dangerouslyDisableSandbox = true }',
])
def test_a_config_override_that_grants_full_access_is_a_bypass(operand: str) -> None:
    for form in (["-c", operand], ["--config", operand], [f"--config={operand}"],
                 [f"-c{operand}"]):
        assert refused([*CODEX[:-1], *form, "-"], "codex") == "bypass-token", form
        with pytest.raises(Refusal):
            check_bypass(["/usr/bin/codex", "exec", *form])


@pytest.mark.parametrize("operand", [
    'sandbox_mode="workspace-write"', 'approvals_reviewer="user"', 'note="full access"',
    'permissions.p.filesystem.":root"="read"', "shell_environment_policy.inherit=all",
])
def test_a_config_override_that_grants_nothing_is_not_a_bypass(operand: str) -> None:
    check_bypass(["/usr/bin/codex", "exec", "-c", operand, "-"])


# -- a `command` slot: the bypass check applies, whichever tool it runs ------------------

@pytest.mark.parametrize("line", [
    ["claude", "--dangerously-skip-permissions"], ["claude", "-p", "--yolo"],
    ["codex", "--yolo", "exec"], ["codex", "exec", "--not-so-yolo"],
    ["codex", "exec", "--dangerously-bypass-approvals-and-sandbox"],
    ["codex", "exec", "-c", 'default_permissions=":danger-full-access"'],
    ["codex", "exec", "-sdanger-full-access"], ["codex", "exec", "--sandbox=danger-full-access"],
    ["claude", "--settings", '{"permissions":{"defaultMode":"bypassPermissions"}}'],
    ["claude", "--permission-mode", "auto"], ["claude", "--permission-mode=auto"],
    ["claude", "--enable-auto-mode"], ["claude", "--allow-dangerously-skip-permissions"],
])
def test_a_command_slot_line_with_a_bypass_is_refused(line: list[str]) -> None:
    binary = AgentBinary("command", "/usr/bin/" + line[0], "c" * 64, "")
    a = CommandAdapter(binary, Instruction(prompt_path="", workdir="/wd"), "engine", "R",
                       command=(binary.path, *line[1:]))
    with pytest.raises(Refusal) as e:
        a.guard(["/usr/bin/bwrap", "--", binary.path, *line[1:]], agent_at=2)
    assert e.value.cls == "bypass-token"


def test_a_command_slot_line_without_one_runs_as_given() -> None:
    for line in (["/usr/bin/make", "test"], ["/usr/bin/sh", "-c", "echo auto"],
                 ["/usr/bin/git", "-c", "user.name=x", "commit"],
                 ["/usr/bin/claude", "-p", "--permission-mode", "plan", "--add-dir", "/x"]):
        CommandAdapter(AgentBinary("command", line[0], "c" * 64, ""),
                       Instruction(prompt_path="", workdir="/wd"), "engine", "R",
                       command=tuple(line)).guard(line)


@pytest.mark.parametrize(("tool", "drop"), [
    ("codex", ["--strict-config"]), ("codex", ["-C"]), ("claude", ["-p"]),
    ("claude", ["--permission-mode"]),
])
def test_the_options_that_keep_a_tool_in_its_composed_mode_are_required(
    tmp_path: Path, tool: str, drop: list[str]
) -> None:
    adapter, argv = next((a, v) for a, v in _adapters(tmp_path) if a.tool == tool)
    i = argv.index(drop[0])
    arity = adapter.allowed_argv.options[drop[0]].arity if adapter.allowed_argv else 0
    with pytest.raises(Refusal) as e:
        adapter.guard([*argv[:i], *argv[i + 1 + arity:]])
    assert e.value.cls == "bypass-token" and "must carry" in e.value.message


@pytest.mark.parametrize("bypass", [
    ["--dangerously-skip-permissions"], ["--permission-mode", "auto"],
    ["-c", 'default_permissions=":danger-full-access"'], ["-sdanger-full-access"],
])
def test_saphan_run_refuses_a_command_slot_line_with_a_bypass_and_runs_nothing(
    saphan_sqlite: Saphan, tmp_path: Path, bypass: list[str]
) -> None:
    """`saphan run --slot <command slot> -- claude --dangerously-skip-permissions`:
    refused bypass-token before anything runs, recorded on the run's row."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wd = tmp_path / "wd"
    wd.mkdir()
    ran = wd / "ran"  # inside the run's writable set: a run that starts writes it
    fake = bin_dir / "claude"
    fake.write_text(f"#!/bin/sh\necho ran > {ran}\n")
    fake.chmod(0o755)
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "c", "--tool", "command")
    env = s.env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    r = s("run", "--machine", "here", "--slot", "c", "--workdir", str(wd), "--",
          "claude", *bypass, env=env)
    assert r.code == 3, r.err
    lines = r.err.splitlines()
    assert lines[0].startswith(f"refused [bypass-token]: argv element {len(bypass)} "), r.err
    run_id = lines[2].removeprefix("run: ")
    shown = json.loads(s.ok("runs", "show", run_id, "--json").out)
    assert shown["outcome"] == "refused" and shown["refusal"]["class"] == "bypass-token"
    assert shown["argv"] == ["claude", *bypass]
    assert not ran.exists()  # nothing ran
    # the same slot runs the same program without the bypass
    s.ok("run", "--machine", "here", "--slot", "c", "--workdir", str(wd), "--", "claude",
         env=env)
    assert ran.read_text() == "ran\n"
