"""The argv guard (SPEC.md §6): every token in every form, every resumption
and substitution form, exact-token only, and hypothesis-generated argv."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saphan.refusals import Refusal
from saphan.tools.argv_guard import BYPASS_TOKENS, check

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
        "bypassPermissions", "dangerouslyDisableSandbox",
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
    check([*CODEX[:-1], "-c", f"note={word}x", "-"], tool="codex", model="m1")


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
