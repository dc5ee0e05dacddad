"""The argv guard (SPEC.md §6): defence in depth, on the FINAL command line.

The instruction format (instruction.py) cannot express a bypass, a second
model or a silent resumption; this check inspects the argv an adapter
actually composed — boundary prefix included — immediately before launch,
and refuses:

- ``bypass-token``: any element of :data:`BYPASS_TOKENS`;
- ``model-substitution``: a fallback model, a local/OSS provider switch, a
  model selector naming another model than the operator named, or two
  selectors (or one when none was named);
- ``session-resumption``: a continue/resume/fork of another session, unless
  it is exactly the explicit, recorded ``saphan run --resume RUN``.

Matching is exact-token, never prefix or substring. An element matches a
token when it IS the token, or has the form ``-flag=value`` where the flag or
the value is the token, or is a Codex ``key=value`` override (the operand of
``-c``/``--config``) whose value, unquoted, is the token. So ``--yolo`` is
refused and ``--yolo-mode-docs`` is not. The prompt is never on the command
line (adapters pass it on stdin), so no word of a task can trip — or slip
past — this check.

Which tools: Claude Code and Codex CLI, whose argv the engine composes, and
the built-in loop (``python -I -m saphan.loop.agent SPEC``: its model rides
the spec file, named by the lane, and it has no sessions, so only the bypass
tokens apply to its argv). The
generic ``command`` tool runs the operator's own command line verbatim; the
guard does not second-guess it (an operator who types a bypass flag into
their own command is not an agent asking for one), and the boundary around
it is the engine's either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from saphan import refusals

#: The closed list (SPEC.md §6; the design document counted nine, the list
#: follows the pinned tool versions). Each entry has a test.
BYPASS_TOKENS: frozenset[str] = frozenset({
    "--dangerously-skip-permissions",
    "--allow-dangerously-skip-permissions",
    "bypassPermissions",
    "dangerouslyDisableSandbox",
    "--dangerously-bypass-approvals-and-sandbox",
    "--yolo",
    "danger-full-access",
    "--dangerously-bypass-hook-trust",
    "--approve-for-me",
    "--not-so-yolo",
    "auto_review",
})

#: Flags that select a model other than the named one, whatever their value.
SUBSTITUTION_FLAGS: dict[str, frozenset[str]] = {
    "claude": frozenset({"--fallback-model"}),
    "codex": frozenset({"--oss", "--local-provider"}),
    "loop": frozenset(),
}
#: Flags whose value is the model.
MODEL_FLAGS: dict[str, frozenset[str]] = {
    "claude": frozenset({"--model"}),
    "codex": frozenset({"--model", "-m"}),
    "loop": frozenset(),
}
#: Elements that continue or fork another session.
RESUME_TOKENS: dict[str, frozenset[str]] = {
    "claude": frozenset({"--continue", "-c", "--resume", "-r", "--fork-session"}),
    "codex": frozenset({"resume", "fork", "--last"}),
    "loop": frozenset(),
}
#: Codex's config-override flags: their operand is ``key=value``.
_CONFIG_FLAGS = frozenset({"-c", "--config"})

TOOLS = ("claude", "codex", "loop")


@dataclass(frozen=True)
class Element:
    """One argv element, split into the forms the guard matches."""

    index: int
    text: str
    flag: str | None = None  # "-x"/"--xx" of a "-flag=value" element
    value: str | None = None  # its value, or a config override's unquoted value
    key: str | None = None  # a config override's key


def _unquote(value: str) -> str:
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    return v


def split(argv: Sequence[str], tool: str) -> list[Element]:
    """Every element with its ``-flag=value`` / ``key=value`` reading."""
    out: list[Element] = []
    operand_of_config = False
    for i, text in enumerate(argv):
        if operand_of_config:
            key, sep, value = text.partition("=")
            out.append(Element(i, text, key=key.strip() if sep else None,
                               value=_unquote(value) if sep else None))
            operand_of_config = False
            continue
        if tool == "codex" and text in _CONFIG_FLAGS:
            operand_of_config = True
            out.append(Element(i, text))
            continue
        if text.startswith("-") and "=" in text:
            flag, _, value = text.partition("=")
            if tool == "codex" and flag in _CONFIG_FLAGS:
                key, sep, inner = value.partition("=")
                out.append(Element(i, text, flag=flag, key=key.strip() if sep else None,
                                   value=_unquote(inner) if sep else value))
            else:
                out.append(Element(i, text, flag=flag, value=value))
            continue
        out.append(Element(i, text))
    return out


def check(
    argv: Sequence[str],
    *,
    tool: str,
    model: str | None,
    resume_session: str | None = None,
) -> None:
    """Raise the matching :class:`Refusal` if ``argv`` carries a bypass token,
    could yield a model other than ``model``, or continues a session other
    than the explicitly requested ``resume_session``."""
    if tool not in TOOLS:
        raise ValueError(f"the argv guard is for {', '.join(TOOLS)}, not {tool!r}")
    elements = split(argv, tool)
    shown = " ".join(argv)
    for e in elements:
        # The element itself, and — wherever it stands, even where a shifted
        # argv makes it the operand of another flag — the halves of any
        # `a=b` form (flag or config key, value unquoted). Each compared
        # whole: never a prefix or substring.
        flag, _, value = e.text.partition("=")
        halves = (flag, value, _unquote(value)) if value else ()
        forms = (e.text, e.flag, e.value, e.key, *halves)
        hit = next((t for t in forms if t in BYPASS_TOKENS), None)
        if hit is not None:
            raise refusals.bypass_token(
                f"argv element {e.index} ({e.text!r}) is the bypass token {hit!r}; the "
                f"composed command line was refused before launch: {shown}",
                "nothing to change in your request: saphan never launches an agent with an "
                "option that disables its safety mechanisms; report this as an adapter bug",
            )
    _check_models(elements, tool=tool, model=model, shown=shown)
    _check_resumption(elements, argv, tool=tool, resume_session=resume_session, shown=shown)


def _check_models(elements: list[Element], *, tool: str, model: str | None, shown: str) -> None:
    selectors: list[tuple[int, str]] = []
    pending: int | None = None
    for e in elements:
        if pending is not None:
            selectors.append((pending, e.text))
            pending = None
            continue
        name = e.flag or e.text
        if name in SUBSTITUTION_FLAGS[tool]:
            raise refusals.model_substitution(
                f"argv element {e.index} ({e.text!r}) could run a model other than the one "
                f"named ({model or 'the tool default'}): {shown}",
                "name exactly one model with --model; saphan composes no fallback or "
                "provider switch",
            )
        if name in MODEL_FLAGS[tool]:
            if e.flag is not None:
                selectors.append((e.index, e.value or ""))
            else:
                pending = e.index
        elif e.key == "model":
            selectors.append((e.index, e.value or ""))
    if pending is not None:
        selectors.append((pending, ""))
    named = "no model (the tool default)" if model is None else f"model {model!r}"
    if len(selectors) > 1 or (model is None and selectors) or (
        selectors and selectors[0][1] != model
    ):
        got = ", ".join(f"element {i}: {v!r}" for i, v in selectors)
        raise refusals.model_substitution(
            f"the operator named {named} but the command line selects {got}: {shown}",
            "name exactly one model with --model (or none for the tool's default); "
            "report a mismatch as an adapter bug",
        )
    if model is not None and not selectors:
        raise refusals.model_substitution(
            f"the operator named model {model!r} but the command line selects none, so the "
            f"tool would pick its own: {shown}",
            "report this as an adapter bug: a named model is always pinned on the command line",
        )


def _check_resumption(
    elements: list[Element], argv: Sequence[str], *, tool: str,
    resume_session: str | None, shown: str,
) -> None:
    hits = [e for e in elements if (e.flag or e.text) in RESUME_TOKENS[tool]]
    allowed = _explicit_resume(argv, tool, resume_session)
    for e in hits:
        if allowed is not None and e.index == allowed:
            continue
        why = ("the run asked to resume nothing" if resume_session is None else
               f"only session {resume_session!r} may be resumed, explicitly")
        raise refusals.session_resumption(
            f"argv element {e.index} ({e.text!r}) would continue another session; {why}: "
            f"{shown}",
            "continue a session only with `saphan run --resume RUN` (recorded on the new run)",
        )
    if resume_session is not None and allowed is None:
        raise refusals.session_resumption(
            f"an explicit resume of session {resume_session!r} was asked for, but the command "
            f"line does not resume exactly that session: {shown}",
            "report this as an adapter bug",
        )


def _explicit_resume(argv: Sequence[str], tool: str, session: str | None) -> int | None:
    """Index of the one resume element that continues exactly ``session``."""
    if session is None:
        return None
    word = "--resume" if tool == "claude" else "resume"
    found = [i for i, a in enumerate(argv) if a == word]
    if len(found) != 1 or found[0] + 1 >= len(argv) or argv[found[0] + 1] != session:
        return None
    return found[0]
