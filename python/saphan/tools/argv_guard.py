"""The argv guard (SPEC.md §6): defence in depth, on the FINAL command line.

The instruction format (instruction.py) cannot express a bypass, a second
model or a silent resumption; this check inspects the argv an adapter
actually composed — boundary prefix included — immediately before launch,
and refuses:

- ``bypass-token``: any element of :data:`BYPASS_TOKENS`, in any of the
  forms below; an option of :data:`BYPASS_OPTION_VALUES` given one of its
  bypass values (``--permission-mode auto``); a config override
  (``-c``/``--config key=value``) or a JSON object on the line whose value
  grants full access (:func:`config_grant`, :func:`json_grant`); and — for an
  agent adapter — any element of the agent's argv that is not on the
  adapter's declared allow-list (:class:`AllowList`: the exact flags it may
  emit, their values or a validator, and its positional words);
- ``model-substitution``: a fallback model, a local/OSS provider switch, a
  subagent definition (Claude's ``--agents``/``--agent``), a model selector
  naming another model than the operator named, or two selectors (or one
  when none was named);
- ``session-resumption``: a continue/resume/fork of another session, unless
  it is exactly the explicit, recorded ``saphan run --resume RUN``.

Token matching is exact-token, never prefix or substring. An element matches
a token when it IS the token, or has the form ``-flag=value`` where the flag
or the value is the token, or is an attached short option ``-Xvalue`` whose
value is the token (``-sdanger-full-access``), or is a config override whose
value, unquoted, is the token. So ``--yolo`` is refused and
``--yolo-mode-docs`` is not. Inside a config override's value (TOML, as
Codex parses it) or a JSON object, the full-access markers of
:data:`FULL_ACCESS_MARKERS` are refused wherever they stand in a string
(``":danger-full-access"`` is Codex's built-in profile of that name). The
prompt is never on the command line (adapters pass it on stdin), so no word
of a task can trip — or slip past — this check.

Which tools: the bypass check (:func:`check_bypass`) applies to every
tool's final command line, the generic ``command`` slot's included — the
design refuses the bypass tokens "whichever tool they belong to". The
model, resumption and allow-list checks apply to what saphan composes:
Claude Code, Codex CLI and the built-in loop (``python -I -m
saphan.loop.agent SPEC``: its model rides the spec file, named by the lane,
and it has no sessions).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from saphan import refusals

#: The closed list (SPEC.md §6; the design document counted nine, the list
#: follows the pinned tool versions: Claude Code 2.1.197, codex-cli 0.169.0,
#: whose ``--help`` and parsers were read — Codex also accepts the hidden
#: aliases ``--yolo`` and ``--not-so-yolo``, Claude Code the hidden
#: ``--enable-auto-mode``). Each entry has a test.
BYPASS_TOKENS: frozenset[str] = frozenset({
    "--dangerously-skip-permissions",
    "--allow-dangerously-skip-permissions",
    "bypassPermissions",
    "dangerouslyDisableSandbox",
    "--enable-auto-mode",
    "--dangerously-bypass-approvals-and-sandbox",
    "--yolo",
    "danger-full-access",
    "--dangerously-bypass-hook-trust",
    "--approve-for-me",
    "--not-so-yolo",
    "auto_review",
})

#: Options whose value, when it is one of these, bypasses the tool's own
#: checks (as ``--opt VALUE`` or ``--opt=VALUE``): Claude Code's auto mode
#: approves its own actions.
BYPASS_OPTION_VALUES: dict[str, frozenset[str]] = {
    "--permission-mode": frozenset({"auto", "bypassPermissions"}),
}

#: Inside a config override's value or a JSON object, a string holding one of
#: these grants full access (Codex's ``danger-full-access`` sandbox and
#: ``:danger-full-access`` profile, its legacy ``disk-full-write-access``,
#: Claude Code's ``bypassPermissions`` mode).
FULL_ACCESS_MARKERS: tuple[str, ...] = (
    "danger-full-access", "disk-full-write-access", "bypassPermissions",
)
#: Codex's sandbox modes that stay inside a sandbox; any other grants all.
_SANDBOX_MODES = frozenset({"read-only", "workspace-write"})
#: A permission-mode key of Claude Code's settings, and its modes that
#: approve the agent's own actions.
_MODE_KEYS = frozenset({"defaultMode", "permission_mode", "permissionMode"})
_PERMISSIVE_MODES = frozenset({"auto", "bypassPermissions"})

#: Flags that select a model other than the named one, whatever their value.
SUBSTITUTION_FLAGS: dict[str, frozenset[str]] = {
    # --agents defines subagents, each of which may name its own model
    "claude": frozenset({"--fallback-model", "--agents", "--agent"}),
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


# -- the allow-list ------------------------------------------------------------------

class Option(NamedTuple):
    """One flag an adapter may emit, always as its own element (never
    ``--flag=value``, never an attached short form)."""

    #: 0: a switch; 1: one value (the next element); -1: one or more values
    #: (every following element up to the next that starts with ``-``)
    arity: int = 0
    #: the values it may take (None: any that ``check`` accepts)
    values: frozenset[str] | None = None
    #: a validator for each value (None: any that ``values`` holds)
    check: Callable[[str], bool] | None = None
    #: may appear at most once
    once: bool = True
    #: for a repeatable option: each value's identity, which may not repeat
    #: (Codex's ``-c``: one override per key)
    unique: Callable[[str], str] | None = None
    #: what the docs and a refusal say it may take
    says: str = ""

    def accepts(self, value: str) -> bool:
        if value.startswith("-") and value != "-":
            return False
        if self.values is not None and value not in self.values:
            return False
        return self.check is None or self.check(value)


class AllowList(NamedTuple):
    """Everything an adapter may put on its tool's command line: argv[0] is
    its binary; every other element is one of ``options`` (with its values)
    or a positional word, and the positional words in order must satisfy
    ``positionals``."""

    options: Mapping[str, Option]
    positionals: Callable[[tuple[str, ...]], bool] = lambda words: not words
    #: the positional words it may use, for the docs and refusals
    says: str = "no positional words"
    #: options that must be present (what keeps the tool in its composed mode:
    #: Codex's ``--strict-config``, Python's ``-I``)
    required: frozenset[str] = frozenset()


def check_allowed(final_argv: Sequence[str], allowed: AllowList, *, tool: str, binary: str,
                  agent_at: int = 0) -> None:
    """Refuse (``bypass-token``) any element of the agent's argv — the final
    argv from ``agent_at`` on — that is not on ``allowed``."""
    shown = " ".join(final_argv)
    argv = list(final_argv[agent_at:])

    def refuse(i: int, why: str) -> refusals.Refusal:
        where = (f"argv element {agent_at + i} ({final_argv[agent_at + i]!r}) is"
                 if i < len(argv) else "the command line as a whole is")
        return refusals.bypass_token(
            f"{where} not on the {tool} adapter's allow-list: "
            f"{why}; the composed command line was refused before launch: {shown}",
            "nothing to change in your request: saphan launches an agent only with the "
            "options its adapter declares (docs/tools.md); report this as an adapter bug",
        )

    if not argv or argv[0] != binary:
        raise refuse(0, f"the agent's command line must start with its binary {binary}")
    seen: set[str] = set()
    identities: set[tuple[str, str]] = set()
    words: list[str] = []
    i = 1
    while i < len(argv):
        text = argv[i]
        if text == "-" or not text.startswith("-"):
            words.append(text)
            i += 1
            continue
        opt = allowed.options.get(text)
        if opt is None:
            raise refuse(i, f"{tool} may emit only {', '.join(sorted(allowed.options))}")
        if opt.once and text in seen:
            raise refuse(i, f"{text} may appear once")
        seen.add(text)
        if opt.arity == 0:
            i += 1
            continue
        values: list[int] = []
        j = i + 1
        while j < len(argv) and (opt.arity == -1 or len(values) < opt.arity):
            if argv[j].startswith("-") and argv[j] != "-":
                break
            values.append(j)
            j += 1
        if not values or (opt.arity > 0 and len(values) < opt.arity):
            raise refuse(i, f"{text} takes {opt.says or 'a value'}, and none follows")
        for k in values:
            if not opt.accepts(argv[k]):
                raise refuse(k, f"{text} takes {opt.says or 'a declared value'}")
            if opt.unique is not None:
                ident = (text, opt.unique(argv[k]))
                if ident in identities:
                    raise refuse(k, f"{text} {ident[1]} may be given once")
                identities.add(ident)
        i = j
    missing = sorted(allowed.required - seen)
    if missing:
        raise refuse(len(argv), f"{tool}'s command line must carry {', '.join(missing)}")
    if not allowed.positionals(tuple(words)):
        raise refuse(len(argv), f"its positional words {words!r} are not {allowed.says}")


# -- the bypass check ------------------------------------------------------------------

class Element:
    """One argv element, split into the forms the guard matches (a plain
    class: it is made for every element of every run's command line)."""

    __slots__ = ("flag", "index", "key", "text", "value")

    def __init__(self, index: int, text: str, flag: str | None = None,
                 value: str | None = None, key: str | None = None) -> None:
        self.index = index
        self.text = text
        self.flag = flag  # "-x"/"--xx" of a "-flag=value" element
        self.value = value  # its value, or a config override's unquoted value
        self.key = key  # a config override's key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Element) and all(
            getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __hash__(self) -> int:
        return hash((self.index, self.text, self.flag, self.value, self.key))

    def __repr__(self) -> str:
        return (f"Element(index={self.index!r}, text={self.text!r}, flag={self.flag!r}, "
                f"value={self.value!r}, key={self.key!r})")


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


def toml_value(value: str) -> Any:
    """A config override's value as Codex reads it: TOML, else the raw string."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return value.strip()


def _leaves(path: tuple[str, ...], obj: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*path, str(k)), None  # the key itself is a leaf too
            yield from _leaves((*path, str(k)), v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(path, v)
    else:
        yield path, obj


def _key_path(key: str) -> tuple[str, ...]:
    try:
        doc = tomllib.loads(f"{key} = 0")
    except (tomllib.TOMLDecodeError, RecursionError):
        return tuple(_unquote(k) for k in key.split("."))
    path: list[str] = []
    node: Any = doc
    while isinstance(node, dict) and len(node) == 1:
        (k, node), = node.items()
        path.append(k)
    return tuple(path)


def _grant(path: tuple[str, ...], value: Any) -> str | None:
    """Why the leaf ``value`` at ``path`` grants full access, else None."""
    last = path[-1] if path else ""
    if value is None:  # a key: {"dangerouslyDisableSandbox": ...}
        return f"the key {last!r} is a bypass token" if last in BYPASS_TOKENS else None
    if not isinstance(value, str):
        return None
    if value in BYPASS_TOKENS:
        return f"{value!r} is a bypass token"
    marker = next((m for m in FULL_ACCESS_MARKERS if m in value), None)
    if marker is not None:
        return f"the value {value!r} holds {marker!r}, which grants full access"
    if last == "sandbox_mode" and value not in _SANDBOX_MODES:
        return f"sandbox_mode {value!r} is not one of {', '.join(sorted(_SANDBOX_MODES))}"
    if last == "approvals_reviewer" and value != "user":
        return f"approvals_reviewer {value!r} approves the agent's own requests"
    if last in _MODE_KEYS and value in _PERMISSIVE_MODES:
        return f"{last} {value!r} approves the agent's own actions"
    if last in (":root", "/") and value == "write":
        return f"{last!r} = \"write\" makes the whole file system writable"
    return None


def config_grant(operand: str) -> str | None:
    """Why a config override ``key=value`` grants full access, else None."""
    key, sep, value = operand.partition("=")
    if not sep:
        return None
    base = _key_path(key.strip())
    for path, leaf in _leaves(base, toml_value(value)):
        why = _grant(path, leaf)
        if why is not None:
            return why
    return None


def json_grant(text: str) -> str | None:
    """Why a JSON object given on the line (Claude Code's ``--settings``,
    ``--agents``) grants full access, else None."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    for path, leaf in _leaves((), obj):
        why = _grant(path, leaf)
        if why is not None:
            return why
    return None


_ATTACHED_SHORT = re.compile(r"-([A-Za-z])(.+)", re.DOTALL)


def _bypass_in(argv: Sequence[str], i: int) -> str | None:
    """Why element ``i`` is (or carries) a bypass, else None."""
    text = argv[i]
    # The element itself, and — wherever it stands, even where a shifted
    # argv makes it the operand of another flag — the halves of any `a=b`
    # form (flag or config key, value unquoted), and an attached short
    # option's value. Each compared whole: never a prefix or substring.
    flag, _, value = text.partition("=")
    forms = [text, *((flag, value, _unquote(value)) if value else ())]
    short = None if text.startswith("--") else _ATTACHED_SHORT.fullmatch(text)
    if short is not None:
        rest = short.group(2).removeprefix("=")
        forms += [rest, _unquote(rest)]
    hit = next((t for t in forms if t in BYPASS_TOKENS), None)
    if hit is not None:
        return f"is the bypass token {hit!r}"
    # An option given a bypass value: `--permission-mode auto` / `=auto`.
    if value and flag in BYPASS_OPTION_VALUES and _unquote(value) in BYPASS_OPTION_VALUES[flag]:
        return f"gives {flag} the bypass value {_unquote(value)!r}"
    prev = argv[i - 1] if i > 0 else ""
    if prev in BYPASS_OPTION_VALUES and _unquote(text) in BYPASS_OPTION_VALUES[prev]:
        return f"gives {prev} the bypass value {_unquote(text)!r}"
    # A config override: `-c k=v`, `--config k=v`, `--config=k=v`, `-ck=v`.
    operands = []
    if prev in _CONFIG_FLAGS:
        operands.append(text)
    if flag in _CONFIG_FLAGS and value:
        operands.append(value)
    if short is not None and short.group(1) == "c":
        operands.append(short.group(2))
    for operand in operands:
        why = config_grant(operand)
        if why is not None:
            return f"is a config override that grants full access ({why})"
    why = json_grant(text)
    if why is not None:
        return f"is a JSON object that grants full access ({why})"
    return None


def check_bypass(argv: Sequence[str]) -> None:
    """Refuse (``bypass-token``) a final command line, of any tool, that
    carries a bypass token or a full-access grant in any form above."""
    for i, text in enumerate(argv):
        why = _bypass_in(argv, i)
        if why is not None:
            raise refusals.bypass_token(
                f"argv element {i} ({text!r}) {why}; the final command line was refused "
                f"before launch: {' '.join(argv)}",
                "saphan never launches a command with an option that disables the agent's "
                "safety mechanisms: remove it (for an agent slot this is an adapter bug; "
                "report it)",
            )


def check(
    argv: Sequence[str],
    *,
    tool: str,
    model: str | None,
    resume_session: str | None = None,
    allowed: AllowList | None = None,
    binary: str | None = None,
    agent_at: int = 0,
) -> None:
    """Raise the matching :class:`Refusal` if ``argv`` carries a bypass token,
    could yield a model other than ``model``, continues a session other
    than the explicitly requested ``resume_session``, or — when ``allowed``
    is given — holds, from ``agent_at`` on (after the boundary prefix),
    anything but ``binary`` and what the allow-list declares."""
    if tool not in TOOLS:
        raise ValueError(f"the argv guard is for {', '.join(TOOLS)}, not {tool!r}")
    check_bypass(argv)
    elements = split(argv, tool)
    shown = " ".join(argv)
    _check_models(elements, tool=tool, model=model, shown=shown)
    _check_resumption(elements, argv, tool=tool, resume_session=resume_session, shown=shown)
    if allowed is not None:
        check_allowed(argv, allowed, tool=tool, binary=binary if binary is not None else
                      argv[agent_at] if agent_at < len(argv) else "", agent_at=agent_at)


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
