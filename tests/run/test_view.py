"""run/view.py: a claude or codex run's output as one line per step.

The unit tests read real captures (tests/run/data/README.md says how each
was made); the end-to-end tests run `saphan run` in a pseudo-terminal with
the pinned Claude Code and Codex against the scripted servers.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from conftest import Saphan, saphan_exe
from saphan.run import view
from saphan.run.view import EscapedLines, LineView, cut, for_tool, one_line
from saphan.transport import local
from tools.model_servers import MessagesServer, ResponsesServer

DATA = Path(__file__).parent / "data"
#: the working directory of the Codex capture (its file_change paths are under it)
CODEX_WD = "/tmp/meas-cx-4ib0d3ux/wd"
#: what a terminal acts on or reorders: C0 but newline, DEL, C1, bidi controls
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(tool: str, data: bytes, *, workdir: str | None = None, width: int | None = 100,
           step: int | None = None) -> list[str]:
    """What the view prints for ``data`` fed in chunks of ``step`` bytes
    (all at once when None), summary included."""
    out = io.BytesIO()
    v = for_tool(tool, out=out, err=io.BytesIO(), width=width, workdir=workdir)
    assert v is not None
    size = step or max(1, len(data))
    for i in range(0, len(data), size):
        v.out.write(data[i:i + size])
    v.finish()
    return out.getvalue().decode().splitlines()


def _capture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def test_a_claude_capture_is_one_line_per_step() -> None:
    assert _shown("claude", _capture("claude_tools.jsonl")) == [
        "claude 2.1.197, model claude-scripted, permission mode acceptEdits",
        "[1] write hello.txt  (10 in / 1 out tokens)",
        "[2] run echo ran; printf 'out \\033]52;c;aGk=\\007 end\\n'  (20 in / 2 out tokens)",
        "[3] run echo ran \\x1b]52;c;aGVsbG8=\\x07 done  (30 in / 3 out tokens)",
        '    error: <tool_use_error>InputValidationError: [ { "code": "custom", "path": '
        '[ "command" ], "me...',
        "[4] read a.txt  (40 in / 4 out tokens)",
        "[5] edit a.txt  (50 in / 5 out tokens)",
        "    model: finished \\x1b]52;c;aGk=\\x07 \\x1b[31mred\\x1b[0m",
        "saphan: 5 steps, 6 turns, 60 in / 30 out tokens, cost $0.00105 (claude's own figure)",
    ]


def test_a_claude_message_of_several_blocks_counts_its_usage_once() -> None:
    """Claude Code prints one ``assistant`` event per content block, each with
    the message's usage: the tally is per message id (150 in, not 300). A
    right-to-left override in the model's text is escaped."""
    assert _shown("claude", _capture("claude_subagent.jsonl")) == [
        "claude 2.1.197, model claude-scripted, permission mode acceptEdits",
        "    model: Let me look \\u202eevil\\u202c first. Second line",
        "[1] run sh -c 'echo hi'  (150 in / 1 out tokens)",
        "[2] agent general-purpose: look around  (160 in / 2 out tokens)",
        "    sub-agent started: look around",
        "    sub-agent completed: look around",
        "    model: all done",
        "saphan: 2 steps, 3 turns, 170 in / 30 out tokens, cost $0.00155 (claude's own figure)",
    ]


def test_a_codex_capture_is_one_line_per_step() -> None:
    assert _shown("codex", _capture("codex_tools.jsonl"), workdir=CODEX_WD) == [
        "codex thread 01a22e03-49d4-7ff1-9621-2e3b7a703211",
        "    error: Model metadata for `scripted-model` not found. Defaulting to fallback "
        "metadata; this c...",
        "    thinking: **Thinking** about \\x1b[31mit",
        "    model: I will run it",
        "[1] run echo failing; exit 3",
        "    [1] failed: exit 3",
        "    thinking: **Thinking** about \\x1b[31mit",
        "    model: I will run it",
        "[2] run echo ran; printf 'out \\033]52;c;aGk=\\007 end\\n'",
        "    thinking: **Thinking** about \\x1b[31mit",
        "    model: I will run it",
        "[3] edit a.txt (update), new.txt (add)",
        "    model: done \\x1b]52;c;aGk=\\x07 \\x1b[31mred\\x1b[0m",
        "saphan: 3 steps, 40 in / 20 out tokens, cost not reported (codex reports none)",
    ]


def test_errors_from_the_model_endpoint_are_shown_escaped() -> None:
    assert _shown("claude", _capture("claude_api_error.jsonl"))[1:] == [
        "    model: API Error: 400 scripted bad \\x1b]52;c;aGk=\\x07 request",
        "    ended with an error: API Error: 400 scripted bad \\x1b]52;c;aGk=\\x07 request",
        "saphan: 0 steps, 1 turn, 0 in / 0 out tokens, cost $0 (claude's own figure)",
    ]
    shown = _shown("codex", _capture("codex_turn_failed.jsonl"))
    assert shown[3].startswith('    turn failed: {"error": {"message": "scripted bad request')
    assert shown[-1] == ("saphan: 0 steps, no tokens reported, cost not reported "
                         "(codex reports none)")


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.jsonl")))
def test_no_control_character_of_a_capture_reaches_the_terminal(name: str) -> None:
    """Every capture holds ESC (OSC 52, colour codes) or a bidi override in
    model or tool text; what the view prints holds none, at any chunking."""
    tool = name.split("_", 1)[0]
    data = _capture(name)
    assert re.search(rb"\\u001b|\xe2\x80\xae", data)  # the capture carries them
    whole = _shown(tool, data)
    for line in whole:
        assert not UNSAFE.search(line), line
    assert _shown(tool, data, step=1) == whole == _shown(tool, data, step=7)


def test_a_partial_line_waits_for_its_end_and_the_last_one_is_shown_at_finish() -> None:
    out = io.BytesIO()
    v = LineView("claude", out, width=100)
    first, _, rest = _capture("claude_tools.jsonl").partition(b"\n")
    v.write(first[:500])
    assert out.getvalue() == b""
    v.write(first[500:] + b"\n" + rest[:40])
    assert out.getvalue() == b"claude 2.1.197, model claude-scripted, permission mode acceptEdits\n"
    v.write(rest[40:].rstrip(b"\n"))  # the last line never gets its newline
    v.finish()
    lines = out.getvalue().decode().splitlines()
    assert lines[-2:] == ["    model: finished \\x1b]52;c;aGk=\\x07 \\x1b[31mred\\x1b[0m",
                          "saphan: 5 steps, 6 turns, 60 in / 30 out tokens, cost $0.00105 "
                          "(claude's own figure)"]


def test_lines_that_are_not_events_pass_through_escaped() -> None:
    lines = _shown("codex", b"plain \x1b]52;c;aGk=\x07 text\r\n"
                            b"bad utf-8 \xff\xfe\n"
                            b"42\n"
                            b'{"no": "type"}\n'
                            + b"[" * 100_000 + b"\n"  # too deep for json: not an event
                            + b"\n   \n")
    assert lines[:4] == ["plain \\x1b]52;c;aGk=\\x07 text", "bad utf-8 \\xff\\xfe", "42",
                         '{"no": "type"}']
    assert lines[4] == "[" * 97 + "..."
    assert lines[5:] == ["saphan: 0 steps, no tokens reported, cost not reported "
                         "(codex reports none)"]


def test_an_event_of_an_unknown_kind_gets_a_short_line() -> None:
    assert _shown("codex", b'{"type":"something.new","x":1}\n')[0] == "    (something.new)"
    assert _shown("claude", b'{"type":"assistant","message":"not an object"}\n') == [
        "saphan: 0 steps, no tokens reported, cost not reported (no result event)"]


def test_counts_the_run_could_have_forged_are_not_believed() -> None:
    """The captured result event with its numbers replaced: a count or cost
    out of bounds is dropped (0, or no cost), never formatted as it came;
    one too long for Python's int parsing makes the line not an event."""
    result = _capture("claude_tools.jsonl").splitlines()[-1]
    event = json.loads(result)
    event["usage"]["input_tokens"] = 10**30
    event["total_cost_usd"] = -5
    event["num_turns"] = True
    forged = json.dumps(event).encode() + b"\n"
    assert _shown("claude", forged)[-1] == (
        "saphan: 0 steps, 0 turns, 0 in / 30 out tokens, cost not reported")
    huge = result.replace(b'"output_tokens":30', b'"output_tokens":' + b"9" * 5000)
    lines = _shown("claude", huge + b"\n", width=50)
    assert lines[0].startswith('{"type":"result"') and len(lines[0]) == 50
    assert lines[-1].startswith("saphan: 0 steps, no tokens reported")


def test_lines_are_cut_to_the_width_wide_characters_counting_two() -> None:
    data = _capture("claude_tools.jsonl")
    for line in _shown("claude", data, width=40):
        assert len(line) <= 40, line
    assert "[2] run echo ran; printf 'out \\03...  (20 in / 2 out tokens)" in _shown(
        "claude", data, width=60)  # the step's tally stays whole
    assert cut("日本語のテキスト", 9) == "日本語..."
    assert cut("short", 9) == "short"
    assert one_line("a\n\tb\u2028c  \x1b[2J") == "a b c \\x1b[2J"


def test_the_width_is_the_terminal_s_or_200() -> None:
    long = b"x" * 300 + b"\n"
    assert _shown("codex", long, width=None)[0] == "x" * 197 + "..."  # BytesIO: no terminal
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 50, 0, 0))
        with os.fdopen(os.dup(slave), "wb", buffering=0) as term:
            v = LineView("codex", term)
            v.write(long)
            os.set_blocking(master, False)
            got = os.read(master, 4096).replace(b"\r\n", b"\n")
        assert got == b"x" * 47 + b"...\n"
    finally:
        os.close(master)
        os.close(slave)


def test_a_line_over_the_limit_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view, "MAX_LINE", 1000)
    out = io.BytesIO()
    v = LineView("codex", out, width=100)
    for _ in range(5):
        v.write(b"y" * 400)
    v.write(b"y" * 10 + b'\n{"type":"error","message":"after"}\n')
    v.finish()
    assert out.getvalue().decode().splitlines()[:2] == [
        "(a line of more than 1,000 bytes, not shown: the run's stdout.log keeps it)",
        "    error: after"]


def test_a_whole_line_over_the_limit_in_one_write_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: 25 MB of escapes in one write took seconds of the pump's time."""
    monkeypatch.setattr(view, "MAX_LINE", 1000)
    out = io.BytesIO()
    e = EscapedLines(out)
    e.write(b"\x1b" * 5000 + b"\nshort\n")
    e.finish()
    assert out.getvalue().decode().splitlines() == [
        "(a line of more than 1,000 bytes, not shown: the run's stderr.log keeps it)", "short"]


class _Tty(io.BytesIO):
    def isatty(self) -> bool:
        return True


def test_raw_streams_that_reach_a_terminal_are_escaped() -> None:
    """Review: with --raw, or stdout not a terminal, the tool's stderr (which
    the run can write through /proc/<pid>/fd/2) reached the terminal raw: an
    OSC 52 clipboard write and a line erase."""
    term_out, term_err = _Tty(), _Tty()
    raw = view.escaped_for_tool("claude", out=term_out, err=term_err)
    assert raw is not None and raw.out is not None and raw.err is not None
    raw.err.write(b"\x1b]52;c;aGk=\x07\x1b[2K\rforged\n")
    raw.out.write('{"type":"system","text":"\u202e\u009b ok"}\n'.encode())
    raw.finish()
    assert term_err.getvalue() == b"\\x1b]52;c;aGk=\\x07\\x1b[2K\\rforged\n"
    assert term_out.getvalue() == b'{"type":"system","text":"\\u202e\\x9b ok"}\n'
    # a pipe or a file gets the bytes as they are (as stdout.log keeps them)
    assert view.escaped_for_tool("codex", out=io.BytesIO(), err=io.BytesIO()) is None
    # a command run's streams too (review: a command's OSC 52 reached the terminal)
    err_only = _Tty()
    cmd = view.escaped_for_tool("command", out=io.BytesIO(), err=err_only)
    assert cmd is not None and cmd.out is None and cmd.err is not None
    cmd.err.write(b"\x1b]52;c;aGk=\x07\n")
    cmd.finish()
    assert err_only.getvalue() == b"\\x1b]52;c;aGk=\\x07\n"


def test_stderr_is_escaped_line_by_line() -> None:
    err = io.BytesIO()
    e = EscapedLines(err)
    e.write(b"saphan-launcher: self sha256=ab\nERROR \x1b]52;c;aGk=")
    assert err.getvalue() == b"saphan-launcher: self sha256=ab\n"
    e.write(b"\x07 unsupported call\r\nlast, no newline \x9b")
    assert err.getvalue().decode().splitlines()[1:] == [
        "ERROR \\x1b]52;c;aGk=\\x07 unsupported call"]
    e.finish()
    assert err.getvalue().decode().splitlines()[2:] == ["last, no newline \\x9b"]


def test_only_claude_and_codex_have_a_view() -> None:
    assert for_tool("command") is None and for_tool("loop") is None
    v = for_tool("codex")
    assert v is not None and isinstance(v.out, LineView)


def test_through_the_transport_the_log_keeps_every_byte(tmp_path: Path) -> None:
    """transport/local.run with the view in place of the terminal: stdout.log
    is the child's output byte for byte; the view shows the lines."""
    data = _capture("codex_tools.jsonl")
    (tmp_path / "in.jsonl").write_bytes(data)
    out, err = io.BytesIO(), io.BytesIO()
    v = for_tool("codex", out=out, err=err, width=100, workdir=CODEX_WD)
    assert v is not None
    local.run(["sh", "-c", "cat in.jsonl; printf 'oops \\033[2J\\n' >&2"], cwd=str(tmp_path),
              run_dir=str(tmp_path), term_out=v.out, term_err=v.err)
    v.finish()
    assert (tmp_path / "stdout.log").read_bytes() == data
    assert (tmp_path / "stderr.log").read_bytes() == b"oops \x1b[2J\n"
    assert out.getvalue().decode().splitlines() == _shown("codex", data, workdir=CODEX_WD)
    assert err.getvalue() == b"oops \\x1b[2J\n"


# -- end to end: `saphan run` in a pseudo-terminal ---------------------------------------

COLUMNS = 100


def _in_a_terminal(args: list[str], env: dict[str, str], timeout: float = 180) -> tuple[int, str]:
    """Run ``saphan ARGS`` with a pseudo-terminal (COLUMNS wide) as its stdout
    and stderr; what the terminal received, and the exit status."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # the bytes as written, without \r added
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen([saphan_exe(), *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    got = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"saphan {args} did not end within {timeout} s: {bytes(got)!r}")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every end of the terminal is closed
                break
            if not chunk:
                break
            got += chunk
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
    return code, got.decode("utf-8", "backslashreplace")


def _view_lines(shown: str) -> list[str]:
    """The view's lines: without the launcher's and saphan's own on stderr."""
    return [line for line in shown.splitlines()
            if not line.startswith("saphan-launcher: ") and not re.match(r"run \w+ ", line)]


def _run_id(shown: str) -> str:
    m = re.search(r"^run (\w+) \w+ \(exit", shown, re.MULTILINE)
    assert m, shown
    return m.group(1)


def _claude_slot(s: Saphan, srv: MessagesServer, claude_bin: str, home: Path) -> dict[str, str]:
    """A local machine and a claude slot whose endpoint is ``srv``; the environment."""
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "cl", "--tool", "claude", "--endpoint", srv.base_url)
    env = s.env(HOME=str(home), ANTHROPIC_API_KEY="sk-ant-test-not-a-key",
                SAPHAN_CLAUDE_BIN=claude_bin)
    env.pop("ANTHROPIC_BASE_URL", None)
    return env


def _claude_run(s: Saphan, claude_bin: str, tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    wd = tmp_path / "wd"
    wd.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["sh"], "network": "open"}))
    script = [
        ("write", str(wd / "hello.txt"), "hi from claude\n"),
        ("shell", "sh -c 'printf \"out \\033]52;c;aGk=\\007 end\\n\"'"),
        ("text", "finished \x1b]52;c;aGk=\x07 \x1b[31mred\x1b[0m " + "z" * 300),
    ]
    with MessagesServer(script) as srv:
        env = _claude_slot(s, srv, claude_bin, home)
        code, shown = _in_a_terminal(
            ["run", "--machine", "here", "--slot", "cl", "--workdir", str(wd), "--prompt",
             "write hello", "--model", "claude-scripted", "--permission-class", str(pc),
             *extra], env)
    assert code == 0, shown
    assert (wd / "hello.txt").read_text() == "hi from claude\n"
    return code, shown, s.home / "runs" / _run_id(shown) / "stdout.log"


def _raw_events(log: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["type"] for e in events][:1] == ["system"] and events[-1]["type"] == "result"
    assert "\\u001b]52;c;aGk=\\u0007" in log.read_text()  # the model's text, as it came
    return events


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_a_claude_run_on_a_terminal_shows_one_line_per_step(
        saphan_sqlite: Saphan, claude_bin: str, tmp_path: Path) -> None:
    """Issue 16: the terminal showed raw JSONL. On a terminal now: a line per
    step with the tokens so far, the model's text escaped and cut to the
    terminal's width, a summary with the cost; stdout.log keeps the JSONL."""
    _, shown, log = _claude_run(saphan_sqlite, claude_bin, tmp_path)
    lines = _view_lines(shown)
    assert "\x1b" not in shown and '{"type"' not in shown, shown
    assert lines[0] == "claude 2.1.197, model claude-scripted, permission mode acceptEdits"
    assert lines[1] == "[1] write hello.txt  (10 in / 1 out tokens)"
    assert lines[2] == ("[2] run sh -c 'printf \"out \\033]52;c;aGk=\\007 end\\n\"'  "
                        "(20 in / 2 out tokens)")
    model = next(line for line in lines if line.startswith("    model: "))
    assert model.startswith("    model: finished \\x1b]52;c;aGk=\\x07 \\x1b[31mred\\x1b[0m zzz")
    assert model.endswith("...")
    assert re.search(r"^saphan: 2 steps, 3 turns, \d+ in / \d+ out tokens, cost \$[0-9.]+ "
                     r"\(claude's own figure\)$", shown, re.MULTILINE), shown
    assert all(len(line) <= COLUMNS for line in lines), shown
    events = _raw_events(log)
    assert len(events) >= 6


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_raw_shows_the_event_stream_live(saphan_sqlite: Saphan, claude_bin: str,
                                         tmp_path: Path) -> None:
    _, shown, log = _claude_run(saphan_sqlite, claude_bin, tmp_path, "--raw")
    assert '{"type":"system","subtype":"init"' in shown and '{"type":"result"' in shown
    assert "[1] write" not in shown and "saphan: 2 steps" not in shown
    raw = log.read_text()
    assert raw in shown  # byte for byte, as the log keeps it
    _raw_events(log)


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_output_that_is_not_a_terminal_gets_the_raw_stream(
        saphan_sqlite: Saphan, claude_bin: str, tmp_path: Path) -> None:
    """A program reading saphan's stdout gets the JSONL, as before."""
    s = saphan_sqlite
    wd, home = tmp_path / "wd", tmp_path / "home"
    wd.mkdir()
    home.mkdir()
    with MessagesServer([("text", "finished \x1b]52;c;aGk=\x07")]) as srv:
        r = s.ok("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd), "--prompt",
                 "hi", "--model", "claude-scripted",
                 env=_claude_slot(s, srv, claude_bin, home))
    log = s.home / "runs" / _run_id(r.err) / "stdout.log"
    assert r.out == log.read_text() and "saphan: " not in r.out
    _raw_events(log)


@pytest.mark.slow
def test_a_codex_run_on_a_terminal_shows_one_line_per_step(
        saphan_sqlite: Saphan, codex_bin: str, codex_home: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    wd = tmp_path / "wd"
    wd.mkdir()
    s = saphan_sqlite
    script = [("shell", "printf 'out \\033]52;c;aGk=\\007 end\\n'"),
              ("text", "done \x1b]52;c;aGk=\x07")]
    with ResponsesServer(script) as srv:
        with open(s.home / "config.toml", "a") as f:
            f.write(f'\n[codex]\nbase_url = "{srv.base_url}/v1"\nenv_key = "SAPHAN_TEST_KEY"\n')
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cx", "--tool", "codex")
        env = s.env(CODEX_HOME=codex_home, HOME=str(home), SAPHAN_TEST_KEY="sk-test",
                    SAPHAN_CODEX_BIN=codex_bin)
        code, shown = _in_a_terminal(
            ["run", "--machine", "here", "--slot", "cx", "--workdir", str(wd), "--prompt",
             "print it", "--model", "scripted-model"], env)
    assert code == 0, shown
    assert "\x1b" not in shown and '{"type"' not in shown, shown
    lines = _view_lines(shown)
    assert lines[0].startswith("codex thread ")
    assert "[1] run printf 'out \\033]52;c;aGk=\\007 end\\n'" in lines, shown
    assert "    model: done \\x1b]52;c;aGk=\\x07" in lines, shown
    assert ("saphan: 1 step, 20 in / 10 out tokens, cost not reported (codex reports none)"
            in lines), shown
    log = (s.home / "runs" / _run_id(shown) / "stdout.log").read_text()
    assert [json.loads(line)["type"] for line in log.splitlines()][-1] == "turn.completed"
    assert "\\u001b]52;c;aGk=\\u0007" in log


@pytest.mark.usefixtures("bwrap_available")
def test_a_command_runs_output_reaches_a_terminal_escaped(saphan_sqlite: Saphan,
                                                           tmp_path: Path) -> None:
    """Review: a command slot's OSC 52 clipboard write, on stdout and on
    stderr, reached the operator's terminal raw; its logs keep the bytes."""
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "c", "--tool", "command")
    wd = tmp_path / "wd"
    wd.mkdir()
    code, shown = _in_a_terminal(
        ["run", "--machine", "here", "--slot", "c", "--workdir", str(wd), "--", "sh", "-c",
         "printf 'out \\033]52;c;aGk=\\007 end\\n'; printf 'err \\033[2K\\r\\n' >&2"], s.env())
    assert code == 0, shown
    assert "\x1b" not in shown, shown
    assert "out \\x1b]52;c;aGk=\\x07 end" in shown and "err \\x1b[2K" in shown
    log = s.home / "runs" / _run_id(shown) / "stdout.log"
    assert log.read_bytes() == b"out \x1b]52;c;aGk=\x07 end\n"
