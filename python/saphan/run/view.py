"""The readable view of a claude or codex run: one line per step, not JSONL.

Both CLIs print an event per line on stdout (Claude Code's ``stream-json``,
``codex exec --json``). On a terminal, ``saphan run`` shows instead (the
capture tests/run/data/claude_tools.jsonl, 100 columns wide)::

    claude 2.1.197, model claude-scripted, permission mode acceptEdits
    [1] write hello.txt  (10 in / 1 out tokens)
    [2] run echo ran; printf 'out \\033]52;c;aGk=\\007 end\\n'  (20 in / 2 out tokens)
    [3] run echo ran \\x1b]52;c;aGVsbG8=\\x07 done  (30 in / 3 out tokens)
        error: <tool_use_error>InputValidationError: [ { "code": "custom", "path": [ ...
    [4] read a.txt  (40 in / 4 out tokens)
    [5] edit a.txt  (50 in / 5 out tokens)
        model: finished \\x1b]52;c;aGk=\\x07 \\x1b[31mred\\x1b[0m
    saphan: 5 steps, 6 turns, 60 in / 30 out tokens, cost $0.00105 (claude's own figure)

A step is a tool call (Claude's ``tool_use`` blocks; Codex's
``command_execution``, ``file_change``, ``mcp_tool_call`` and ``web_search``
items), numbered, with the tokens reported so far; the model's text and
errors get their own lines; one summary line ends the run. Every piece of
text comes from the model or a tool, so every line is escaped
(:func:`saphan.terminal.terminal_safe`: ESC, OSC 52, CSI, C1 controls, bidi
overrides), made one line, and cut to the terminal's width (else
:data:`DEFAULT_WIDTH`). A line that is not an event passes through escaped.

The raw stream is untouched: transport/local.py writes every byte to the
run's ``stdout.log`` before a :class:`LineView` sees it. Which fields mean
what was measured on the pinned CLIs (tests/run/data/ holds the captures).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import IO, Any

from saphan.terminal import terminal_safe

#: the tools whose output the view reads
TOOLS = ("claude", "codex")
#: columns when the terminal's width cannot be read
DEFAULT_WIDTH = 200
#: the longest line kept in memory; a longer one is not shown (stdout.log keeps it)
MAX_LINE = 16 * 1024 * 1024
#: what a cut line ends with
ELLIPSIS = "..."
#: the largest token count (or cost) believed; the run could have printed anything
MAX_COUNT = 10**15


# -- text for one terminal line ---------------------------------------------------------

def _columns(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal columns (wide characters count
    two), ending with :data:`ELLIPSIS` when it was cut."""
    if sum(_columns(c) for c in text) <= width:
        return text
    room, used, out = max(0, width - len(ELLIPSIS)), 0, []
    for c in text:
        used += _columns(c)
        if used > room:
            break
        out.append(c)
    return "".join(out) + ELLIPSIS


def one_line(text: str) -> str:
    """Model or tool text as one safe line: control characters escaped
    first, then every run of whitespace (newlines included) one space."""
    return " ".join(terminal_safe(text).split())


# -- the sinks transport/local.py writes to ------------------------------------------------

class _Lines(ABC):
    """A sink of bytes that acts on whole lines (a partial one waits for the
    rest); ``finish`` takes what is left when the run has ended."""

    #: the run's file that keeps every byte of what this sink is shown
    log = "stdout.log"

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self._buf = bytearray()
        self._skipping = False  # inside a line longer than MAX_LINE

    def write(self, chunk: bytes, /) -> None:
        buf = self._buf
        start = len(buf)
        buf += chunk
        while True:
            i = buf.find(b"\n", start)
            if i < 0:
                break
            whole = i <= MAX_LINE
            line = bytes(buf[:i]) if whole else b""
            del buf[:i + 1]
            start = 0
            if self._skipping:
                self._skipping = False
                continue
            if not whole:
                # a line over the limit that arrived whole in one write
                # (review: 25 MB of escapes held the pump for seconds)
                self._overlong()
                continue
            self._line(line)
        if len(buf) > MAX_LINE:
            buf.clear()
            if not self._skipping:
                self._skipping = True
                self._overlong()

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        if self._buf and not self._skipping:
            self._line(bytes(self._buf))
        self._buf.clear()
        self.out.flush()

    def _emit(self, text: str) -> None:
        self.out.write(text.encode("utf-8", "backslashreplace") + b"\n")

    @abstractmethod
    def _line(self, line: bytes) -> None:
        """Each kind of stream or tool says its own."""

    def _overlong(self) -> None:
        self._emit(f"(a line of more than {MAX_LINE:,} bytes, not shown: the run's {self.log} "
                   "keeps it)")


class EscapedLines(_Lines):
    """The child's stderr while the view is on: each line as it was, with
    control characters escaped (never cut: it is the tool's own diagnostics)."""

    log = "stderr.log"

    def _line(self, line: bytes) -> None:
        self._emit(terminal_safe(line.decode("utf-8", "backslashreplace").rstrip("\r")))


@dataclass
class Shown:
    """One line of the view: a step (numbered) or a note under the steps."""

    label: str
    detail: str = ""
    step: int | None = None
    #: a line about the whole run (the tool, its model), not indented under the steps
    header: bool = False


class LineView(_Lines):
    """The child's stdout as one line per event (:class:`Claude`, :class:`Codex`
    read them) and, at :meth:`finish`, the summary line."""

    def __init__(self, tool: str, out: IO[bytes], *, workdir: str | None = None,
                 width: int | None = None) -> None:
        super().__init__(out)
        self.tool = tool
        self.events: Claude | Codex = Claude(workdir) if tool == "claude" else Codex(workdir)
        self.width = width

    def _columns(self) -> int:
        if self.width is not None:
            return self.width
        try:
            cols = os.get_terminal_size(self.out.fileno()).columns
        except (AttributeError, OSError, ValueError):
            cols = 0
        return cols if cols > 0 else DEFAULT_WIDTH

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            event = None
        lines: list[str] | None = None
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            try:
                lines = [self._show(s) for s in self.events.read(event)]
            except Exception:  # an event of a shape never measured: shown as it came
                lines = None
        if lines is None:
            text = line.decode("utf-8", "backslashreplace").rstrip("\r")
            lines = [cut(one_line(text), self._columns())]
        for text in lines:
            self._emit(text)

    def _show(self, s: Shown) -> str:
        width = self._columns()
        label, detail = one_line(s.label), one_line(s.detail)
        if s.step is None:
            indent = "" if s.header else "    "
            return cut(f"{indent}{label} {detail}".rstrip(), width)
        head = f"[{s.step}] {label} "
        tally = self.events.tally()
        tail = f"  ({tally})" if tally else ""
        room = width - len(head) - len(tail)
        if room < 12:  # a narrow terminal: the step before the tally
            return cut(head + detail + tail, width)
        return head + cut(detail, room) + tail

    def finish(self) -> None:
        super().finish()
        self._emit(cut("saphan: " + self.events.summary(), self._columns()))
        self.out.flush()


# -- the events of each tool -----------------------------------------------------------------

def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    """A count as reported, or 0 when it is not a plausible one."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else 0


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _money(usd: float) -> str:
    return f"${usd:.2f}" if usd >= 1 else f"${usd:.4g}"


class _Events(ABC):
    tool = ""

    def __init__(self, workdir: str | None) -> None:
        self.workdir = workdir
        self.steps = 0
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.cost_usd: float | None = None

    @abstractmethod
    def read(self, event: dict[str, Any]) -> list[Shown]:
        """Each kind of stream or tool says its own."""

    def step(self, label: str, detail: str) -> Shown:
        self.steps += 1
        return Shown(label, detail, self.steps)

    def path(self, value: Any) -> str:
        """A path as the run sees it, relative to its working directory when inside it."""
        p = _str(value)
        wd = (self.workdir or "").rstrip("/")
        if wd and p.startswith(wd + "/"):
            return p[len(wd) + 1:]
        return p

    def tally(self) -> str:
        """Tokens (and cost) reported so far; empty when none are."""
        parts = []
        if self.tokens_in is not None or self.tokens_out is not None:
            parts.append(f"{self.tokens_in or 0:,} in / {self.tokens_out or 0:,} out tokens")
        if self.cost_usd is not None:
            parts.append(_money(self.cost_usd))
        return ", ".join(parts)

    def summary(self) -> str:
        tokens = (f"{self.tokens_in or 0:,} in / {self.tokens_out or 0:,} out tokens"
                  if self.tokens_in is not None or self.tokens_out is not None
                  else "no tokens reported")
        return ", ".join([*self.counts(), tokens, self.cost()])

    def counts(self) -> list[str]:
        return [_plural(self.steps, "step")]

    @abstractmethod
    def cost(self) -> str:
        """Each kind of stream or tool says its own."""


class Claude(_Events):
    """Claude Code 2.1's ``--output-format stream-json --verbose`` events:
    ``system`` (``init``), ``assistant`` (a message's content blocks and its
    ``usage``; one event per block, the message's id repeated), ``user``
    (``tool_result`` blocks, ``is_error``), ``result`` (``total_cost_usd``,
    ``usage``, ``num_turns``)."""

    tool = "claude"

    def __init__(self, workdir: str | None) -> None:
        super().__init__(workdir)
        #: each message's usage as last reported (a message spans several events)
        self.usage: dict[str, tuple[int, int]] = {}
        self.turns: int | None = None
        self.ended = False  # a result event was read

    def read(self, event: dict[str, Any]) -> list[Shown]:
        kind = event["type"]
        if kind == "system":
            return self._system(event)
        if kind == "assistant":
            return self._assistant(event)
        if kind == "user":
            return self._user(event)
        if kind == "result":
            return self._result(event)
        return [Shown(f"({kind})")]

    def _system(self, event: dict[str, Any]) -> list[Shown]:
        subtype = _str(event.get("subtype"))
        if subtype == "task_started":  # a sub-agent (the Agent tool's step is above)
            return [Shown("sub-agent started:", _str(event.get("description")))]
        if subtype == "task_notification":
            return [Shown(f"sub-agent {_str(event.get('status')) or 'ended'}:",
                          _str(event.get("summary")))]
        if subtype == "task_updated":
            return []
        if subtype != "init":
            return [Shown(f"(system {subtype})")]
        if not self.workdir:
            self.workdir = _str(event.get("cwd")) or None
        parts = [f"claude {_str(event.get('claude_code_version'))}".rstrip(),
                 f"model {_str(event.get('model'))}"]
        if event.get("permissionMode"):
            parts.append(f"permission mode {_str(event.get('permissionMode'))}")
        return [Shown(", ".join(parts), header=True)]

    def _assistant(self, event: dict[str, Any]) -> list[Shown]:
        message = event.get("message")
        if not isinstance(message, dict):
            return []
        usage = message.get("usage")
        if isinstance(usage, dict):
            key = _str(message.get("id")) or str(len(self.usage))
            self.usage[key] = (
                _int(usage.get("input_tokens")) + _int(usage.get("cache_creation_input_tokens"))
                + _int(usage.get("cache_read_input_tokens")), _int(usage.get("output_tokens")))
            self.tokens_in = sum(i for i, _ in self.usage.values())
            self.tokens_out = sum(o for _, o in self.usage.values())
        sub = "sub-agent " if event.get("parent_tool_use_id") else ""
        shown = []
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and _str(block.get("text")).strip():
                shown.append(Shown(f"{sub}model:", _str(block.get("text"))))
            elif kind == "thinking" and _str(block.get("thinking")).strip():
                shown.append(Shown(f"{sub}thinking:", _str(block.get("thinking"))))
            elif kind == "tool_use":
                label, detail = self._tool(_str(block.get("name")), block.get("input"))
                shown.append(self.step(sub + label, detail))
        return shown

    def _tool(self, name: str, given: Any) -> tuple[str, str]:
        args = given if isinstance(given, dict) else {}
        if name == "Bash":
            return "run", _str(args.get("command"))
        if name == "Write":
            return "write", self.path(args.get("file_path"))
        if name in ("Edit", "MultiEdit"):
            return "edit", self.path(args.get("file_path"))
        if name == "NotebookEdit":
            return "edit", self.path(args.get("notebook_path"))
        if name == "Read":
            return "read", self.path(args.get("file_path"))
        if name in ("Agent", "Task"):
            return "agent", f"{_str(args.get('subagent_type'))}: {_str(args.get('description'))}"
        return name or "(tool)", _compact(given)

    def _user(self, event: dict[str, Any]) -> list[Shown]:
        message = event.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        shown = []
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result" \
                    and block.get("is_error") is True:
                result = block.get("content")
                shown.append(Shown("error:", result if isinstance(result, str)
                                   else _compact(result)))
        return shown

    def _result(self, event: dict[str, Any]) -> list[Shown]:
        self.ended = True
        cost = event.get("total_cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool) \
                and 0 <= cost <= MAX_COUNT:
            self.cost_usd = float(cost)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.tokens_in = (_int(usage.get("input_tokens"))
                              + _int(usage.get("cache_creation_input_tokens"))
                              + _int(usage.get("cache_read_input_tokens")))
            self.tokens_out = _int(usage.get("output_tokens"))
        if event.get("num_turns") is not None:
            self.turns = _int(event.get("num_turns"))
        subtype = _str(event.get("subtype"))
        if event.get("is_error") is True:
            return [Shown("ended with an error:", _str(event.get("result")))]
        if subtype != "success":
            return [Shown(f"ended ({subtype}):", _str(event.get("result")))]
        return []

    def counts(self) -> list[str]:
        return [*super().counts(), *([_plural(self.turns, "turn")] if self.turns is not None
                                     else [])]

    def cost(self) -> str:
        if self.cost_usd is None:
            return "cost not reported" + ("" if self.ended else " (no result event)")
        return f"cost {_money(self.cost_usd)} (claude's own figure)"


def _unwrap(command: str) -> str:
    """Codex runs a command as ``/bin/bash -lc '<line>'``: the line."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if len(argv) == 3 and os.path.basename(argv[0]) in ("bash", "sh", "zsh") \
            and argv[1] in ("-c", "-lc"):
        return argv[2]
    return command


class Codex(_Events):
    """Codex 0.169's ``exec --json`` events: ``thread.started``,
    ``turn.started``, ``item.started``/``item.completed`` (items
    ``command_execution``, ``file_change``, ``agent_message``, ``reasoning``,
    ``error``, …), ``turn.completed`` (``usage``), ``turn.failed``, ``error``.
    Codex reports tokens per turn and no cost."""

    tool = "codex"

    def __init__(self, workdir: str | None) -> None:
        super().__init__(workdir)
        #: a command's step number, by item id (from its item.started)
        self.commands: dict[str, int] = {}

    def read(self, event: dict[str, Any]) -> list[Shown]:
        kind = event["type"]
        if kind == "thread.started":
            return [Shown("codex", f"thread {_str(event.get('thread_id'))}", header=True)]
        if kind in ("turn.started", "item.updated"):
            return []
        if kind == "turn.completed":
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.tokens_in = (self.tokens_in or 0) + _int(usage.get("input_tokens"))
                self.tokens_out = (self.tokens_out or 0) + _int(usage.get("output_tokens"))
            return []
        if kind == "turn.failed":
            error = event.get("error")
            return [Shown("turn failed:", _str(error.get("message")) if isinstance(error, dict)
                          else _compact(error))]
        if kind == "error":
            return [Shown("error:", _str(event.get("message")))]
        item = event.get("item")
        if kind in ("item.started", "item.completed") and isinstance(item, dict):
            return self._item(item, started=kind == "item.started")
        return [Shown(f"({kind})")]

    def _item(self, item: dict[str, Any], *, started: bool) -> list[Shown]:
        kind, ident = _str(item.get("type")), _str(item.get("id"))
        if kind == "command_execution":
            shown = []
            if ident not in self.commands:
                shown.append(self.step("run", _unwrap(_str(item.get("command")))))
                self.commands[ident] = self.steps
            code, status = item.get("exit_code"), _str(item.get("status"))
            if not started and (status not in ("completed", "in_progress")
                                or (isinstance(code, int) and code != 0)):
                shown.append(Shown(f"[{self.commands[ident]}] {status or 'ended'}:",
                                   f"exit {code}" if code is not None else ""))
            return shown
        if started:
            return []  # shown when completed, with how it ended
        if kind == "file_change":
            changes = item.get("changes")
            files = ", ".join(
                f"{self.path(c.get('path'))} ({_str(c.get('kind'))})"
                for c in (changes if isinstance(changes, list) else []) if isinstance(c, dict))
            status = _str(item.get("status"))
            return [self.step("edit", files + (f" [{status}]" if status != "completed" else ""))]
        if kind == "agent_message":
            return [Shown("model:", _str(item.get("text")))]
        if kind == "reasoning":
            return [Shown("thinking:", _str(item.get("text")))]
        if kind == "error":
            return [Shown("error:", _str(item.get("message")))]
        if kind == "mcp_tool_call":
            return [self.step("mcp", f"{_str(item.get('server'))} {_str(item.get('tool'))}")]
        if kind == "web_search":
            return [self.step("search", _str(item.get("query")))]
        return [Shown(f"({kind or 'item'})", _compact(item))]

    def cost(self) -> str:
        return "cost not reported (codex reports none)"


@dataclass
class View:
    """What replaces the terminal's streams for one run: ``out`` for the
    child's stdout, ``err`` for its stderr; :meth:`finish` when it has ended."""

    out: LineView
    err: EscapedLines

    def finish(self) -> None:
        self.err.finish()
        self.out.finish()


class EscapedStdout(EscapedLines):
    """The child's stdout shown as it comes (``--raw``), each line with
    control characters escaped: JSON escapes C0 controls itself, but not C1
    controls or bidi overrides, and a line that is not JSON holds anything."""

    log = "stdout.log"


@dataclass
class Escaped:
    """The raw streams of a tool run, each one that is a terminal escaped."""

    out: EscapedLines | None
    err: EscapedLines | None

    def finish(self) -> None:
        for sink in (self.err, self.out):
            if sink is not None:
                sink.finish()


def escaped_for_tool(tool: str, *, out: IO[bytes] | None = None,
                     err: IO[bytes] | None = None) -> Escaped | None:
    """Without the view (``--raw``, stdout not a terminal, or a tool that has
    no view: command and loop runs): the streams as they come, but what
    reaches a terminal is escaped line by line — the run writes these
    streams (review: an OSC 52 clipboard write and a line erase reached the
    operator's terminal through a tool's stderr, and a command run's output
    did the same). A stream that is not a terminal (a pipe, a file) gets the
    bytes as they are, as the run's logs keep them. None when neither is a
    terminal. ``tool`` names the run's tool (every tool is escaped alike)."""
    del tool
    o = out if out is not None else sys.stdout.buffer
    e = err if err is not None else sys.stderr.buffer
    if not (o.isatty() or e.isatty()):
        return None
    return Escaped(EscapedStdout(o) if o.isatty() else None,
                   EscapedLines(e) if e.isatty() else None)


def for_tool(tool: str, *, workdir: str | None = None, out: IO[bytes] | None = None,
             err: IO[bytes] | None = None, width: int | None = None) -> View | None:
    """The view of a ``tool`` run on this process's stdout and stderr (or
    ``out``/``err``); None for a tool whose output is shown as it comes."""
    if tool not in TOOLS:
        return None
    return View(LineView(tool, out if out is not None else sys.stdout.buffer,
                         workdir=workdir, width=width),
                EscapedLines(err if err is not None else sys.stderr.buffer))
