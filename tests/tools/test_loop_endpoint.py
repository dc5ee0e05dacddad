"""Model endpoint errors end a loop run with a clear outcome in the record,
never a hang; retries are bounded.

Each case drives the real CLI (`saphan run` on a loop slot, under bubblewrap)
against a scripted chat-completions server on 127.0.0.1 (or a closed port)
and reads the run record: the outcome is the loop's end, the detail names the
cause, the HTTP attempts are the bounded number (client retries = 2: a
retryable failure makes exactly 3 attempts, a non-retryable one exactly 1),
the CLI exits 1, and the whole run ends well within its subprocess budget.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from model_servers import ChatCompletionsServer

from conftest import Result, Saphan
from saphan.loop.adapter import RETRIES
from saphan.loop.agent import MALFORMED_LIMIT

RETRYABLE_ATTEMPTS = RETRIES + 1  # 3
#: the subprocess budget of each run; every case must finish well inside it
RUN_TIMEOUT = 60


def _keyfile(tmp_path: Path) -> Path:
    key = tmp_path / "keys" / "lane.key"
    key.parent.mkdir(exist_ok=True)
    key.write_text(f"sk-test-{secrets.token_hex(12)}\n")
    key.chmod(0o600)
    return key


def _setup(s: Saphan, tmp_path: Path, base_url: str, *, timeout: int = 2) -> Path:
    """A lane L at base_url, a local machine and a loop slot; returns the workdir."""
    s.ok("lane", "add", "L", "--base-url", base_url, "--model", "m1",
         "--credential-file", str(_keyfile(tmp_path)), "--timeout", str(timeout))
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "lp", "--tool", "loop")
    wd = tmp_path / "wd"
    wd.mkdir()
    return wd


def _run(s: Saphan, wd: Path, *extra: str) -> tuple[Result, dict[str, Any], float]:
    t0 = time.monotonic()
    r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
          "--prompt", "task", "--json", *extra, timeout=RUN_TIMEOUT)
    took = time.monotonic() - t0
    assert r.out.strip(), f"no record printed (exit {r.code})\n{r.err}"
    return r, json.loads(r.out), took


def _assert_ended(r: Result, rec: dict[str, Any], end: str, *, attempts: int,
                  cause: str) -> None:
    loop = rec["loop"]
    assert rec["outcome"] == end == loop["end"], (rec["outcome"], loop, r.err)
    assert cause.lower() in loop["detail"].lower(), loop["detail"]
    assert loop["http_attempts"] == attempts, loop
    assert rec["exit_code"] == 1 and r.code == 1, (rec["exit_code"], r.code, r.err)
    assert loop["redactions"] == 0


def _free_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_refused_connection_is_model_unreachable(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    port = _free_closed_port()  # bound, then closed: nothing listens there
    wd = _setup(saphan_sqlite, tmp_path, f"http://127.0.0.1:{port}/v1")
    r, rec, took = _run(saphan_sqlite, wd)
    _assert_ended(r, rec, "model-unreachable", attempts=RETRYABLE_ATTEMPTS,
                  cause="ConnectionRefused")
    assert f"127.0.0.1:{port}" in rec["loop"]["detail"]
    assert f"after {RETRYABLE_ATTEMPTS} attempt(s)" in rec["loop"]["detail"]
    assert rec["loop"]["turns"] == 0
    assert took < RUN_TIMEOUT / 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize(
    ("script", "end", "attempts", "cause"),
    [
        pytest.param([("status", 401)], "model-auth-rejected", 1, "HTTP 401", id="401"),
        pytest.param([("status", 403)], "model-auth-rejected", 1, "HTTP 403", id="403"),
        pytest.param([("status", 429, 0)] * 3, "model-rate-limited", 3, "HTTP 429", id="429x3"),
        pytest.param([("status", 500)] * 3, "model-server-error", 3, "HTTP 500", id="500x3"),
        pytest.param([("status", 400)], "model-request-rejected", 1, "HTTP 400", id="400"),
        pytest.param([("raw", "not json")], "model-malformed", 1, "not a chat completion",
                     id="raw-not-json"),
        pytest.param([("raw", json.dumps({"choices": []}))], "model-malformed", 1,
                     "not a chat completion", id="raw-no-choices"),
    ],
)
def test_http_failures_end_with_their_outcome(
    saphan_sqlite: Saphan, tmp_path: Path, script: list[tuple[Any, ...]], end: str,
    attempts: int, cause: str,
) -> None:
    # After the script the server would answer with a final text: a run that
    # retried more than the bound would end "exited", not with `end`.
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, took = _run(saphan_sqlite, wd)
        received = len(srv.requests)
        auth = [h.get("Authorization", "") for h in srv.headers]
    _assert_ended(r, rec, end, attempts=attempts, cause=cause)
    assert received == attempts
    assert all(a.startswith("Bearer sk-test-") for a in auth), auth
    assert rec["loop"]["turns"] == 0 and rec["loop"]["tool_calls"] == 0
    assert took < RUN_TIMEOUT / 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_rate_limit_then_success_finishes(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    script = [("status", 429, 0), ("calls", [("finish", {"summary": "ok"})])]
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, took = _run(saphan_sqlite, wd)
        received = len(srv.requests)
    assert r.code == 0 and rec["exit_code"] == 0, r.err
    assert rec["outcome"] == "exited"
    loop = rec["loop"]
    assert loop["end"] == "finished" and loop["summary"] == "ok"
    assert loop["http_attempts"] == 2 and received == 2
    assert loop["turns"] == 1 and loop["tool_calls"] == 1
    assert took < RUN_TIMEOUT / 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_slow_endpoint_is_model_timeout(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    with ChatCompletionsServer([("sleep", 3)] * 3) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1", timeout=1)
        r, rec, took = _run(saphan_sqlite, wd)
        received = len(srv.requests)
    _assert_ended(r, rec, "model-timeout", attempts=RETRYABLE_ATTEMPTS,
                  cause="did not answer within 1 s")
    assert received == RETRYABLE_ATTEMPTS
    # 3 x 1 s timeouts + 0.5 s + 1 s backoff, plus start-up: far from 3 x 3 s sleeps
    assert took < 20, took


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param(("run_command", "{not json"), "the arguments of run_command are not JSON",
                     id="bad-json"),
        pytest.param(("no_such_tool", {}), "there is no tool 'no_such_tool'", id="unknown-tool"),
        pytest.param(("run_command", {"argv": []}), "`argv` must be a non-empty list",
                     id="bad-argv"),
    ],
)
def test_malformed_tool_calls_end_bounded(saphan_sqlite: Saphan, tmp_path: Path,
                                          call: tuple[str, Any], error: str) -> None:
    """Each malformed call is answered with the error; after MALFORMED_LIMIT+1
    consecutive malformed turns the run ends model-malformed."""
    script = [("calls", [call])] * (MALFORMED_LIMIT + 5)
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, took = _run(saphan_sqlite, wd)
        received = len(srv.requests)
        results = srv.tool_results()  # what the last request carried back
    _assert_ended(r, rec, "model-malformed", attempts=MALFORMED_LIMIT + 1,
                  cause="consecutive turns of malformed tool calls")
    assert error in rec["loop"]["detail"]
    assert received == MALFORMED_LIMIT + 1
    assert rec["loop"]["turns"] == MALFORMED_LIMIT + 1
    # The last request carries the results of every turn before it.
    assert len(results) == MALFORMED_LIMIT, results
    assert all(x.startswith("error: ") and error in x for x in results), results
    # The final turn's result is in the transcript.
    entries = _transcript(rec)
    tool_results = [e["result"] for e in entries if e["kind"] == "tool"]
    assert len(tool_results) == MALFORMED_LIMIT + 1
    assert all(error in x for x in tool_results), tool_results
    assert took < RUN_TIMEOUT / 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_good_call_resets_the_malformed_count(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """Only CONSECUTIVE malformed turns end the run: a good turn in between
    starts the count again."""
    bad = ("calls", [("run_command", "{not json")])
    good = ("calls", [("list_dir", {})])
    script = [bad] * MALFORMED_LIMIT + [good] + [bad] * MALFORMED_LIMIT + [
        ("calls", [("finish", {"summary": "recovered"})])]
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, _took = _run(saphan_sqlite, wd)
    assert r.code == 0, (rec["loop"], r.err)
    assert rec["outcome"] == "exited" and rec["loop"]["summary"] == "recovered"
    assert rec["loop"]["turns"] == 2 * MALFORMED_LIMIT + 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_turn_budget(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    with ChatCompletionsServer([("calls", [("list_dir", {})])] * 10) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        (wd / "seen.txt").write_text("x")
        r, rec, took = _run(saphan_sqlite, wd, "--max-turns", "2")
        received = len(srv.requests)
        results = srv.tool_results()
    _assert_ended(r, rec, "turn-budget-exhausted", attempts=2, cause="2 turns used")
    assert rec["loop"]["turns"] == 2 and rec["loop"]["tool_calls"] == 2
    assert received == 2
    # list_dir's answer reached the model (.saphan/ is the run's scratch dir)
    assert len(results) == 1 and "seen.txt" in results[0].splitlines(), results
    assert rec["budgets"]["max_turns"] == 2
    assert took < RUN_TIMEOUT / 2


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_time_budget_kills_the_command(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    script = [("calls", [("run_command", {"argv": ["sleep", "5"]})])] * 5
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, took = _run(saphan_sqlite, wd, "--max-seconds", "2")
        received = len(srv.requests)
    _assert_ended(r, rec, "time-budget-exhausted", attempts=1, cause="2 s used")
    assert received == 1
    assert rec["loop"]["turns"] == 1 and rec["loop"]["tool_calls"] == 1
    assert rec["budgets"]["max_seconds"] == 2
    killed = [e["result"] for e in _transcript(rec) if e["kind"] == "tool"]
    assert len(killed) == 1 and killed[0].startswith("killed after"), killed
    assert rec["loop"]["seconds"] < 4, rec["loop"]
    assert took < 10, took


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_normal_finish_records_tokens_and_transcript(saphan_sqlite: Saphan,
                                                     tmp_path: Path) -> None:
    script = [
        ("calls", [("write_file", {"path": "out.txt", "content": "hello\n"})]),
        ("calls", [("read_file", {"path": "out.txt"})]),
        ("calls", [("finish", {"summary": "wrote out.txt"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        wd = _setup(saphan_sqlite, tmp_path, srv.base_url + "/v1")
        r, rec, took = _run(saphan_sqlite, wd)
        received = len(srv.requests)
        results = srv.tool_results()
        first = srv.requests[0]
    assert r.code == 0 and rec["exit_code"] == 0, r.err
    assert rec["outcome"] == "exited"
    loop = rec["loop"]
    assert loop["end"] == "finished" and loop["summary"] == "wrote out.txt"
    assert loop["turns"] == 3 and loop["tool_calls"] == 3 and loop["http_attempts"] == 3
    assert received == 3
    assert loop["tokens"] == {"prompt": 300, "completion": 60, "total": 360}
    assert loop["redactions"] == 0
    assert (wd / "out.txt").read_text() == "hello\n"
    assert results == ["wrote 6 bytes to out.txt", "hello\n"]
    assert first["model"] == "m1" and first["stream"] is False
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "task"
    entries = _transcript(rec)
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "task" and kinds[-1] == "end"
    assert {"task", "assistant", "tool", "end"} <= set(kinds)
    assert kinds.count("assistant") == 3 and kinds.count("tool") == 3
    assert entries[0]["prompt"] == "task" and entries[0]["model"] == "m1"
    assert entries[-1]["end"] == "finished"
    assert entries[-1]["tokens"] == loop["tokens"]
    assert took < RUN_TIMEOUT / 2


def _transcript(rec: dict[str, Any]) -> list[dict[str, Any]]:
    path = rec["loop"]["transcript"]
    assert os.path.isfile(path), path
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _answer(message: dict[str, Any], usage: Any = None) -> str:
    """A chat completion body, as the ("raw", body) script entry sends it."""
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage})


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_odd_answers_are_malformed_turns_not_crashes(saphan_sqlite: Saphan,
                                                     tmp_path: Path) -> None:
    """`tool_calls` that is not a list is a malformed turn (answered, counted,
    bounded); `usage` that is not an object is ignored."""
    odd = ("raw", _answer({"role": "assistant", "content": None, "tool_calls": 5}, usage=[1]))
    with ChatCompletionsServer([odd] * (MALFORMED_LIMIT + 1)) as srv:
        wd = _setup(s := saphan_sqlite, tmp_path, f"{srv.base_url}/v1")
        r, rec, _ = _run(s, wd)
        last = srv.requests[-1]["messages"][-1]
    _assert_ended(r, rec, "model-malformed", attempts=MALFORMED_LIMIT + 1, cause="not a list")
    assert last == {"role": "user", "content": "error: `tool_calls` must be a list of tool "
                                               "calls; call the tools again"}
    assert rec["loop"]["tokens"] == {"prompt": 0, "completion": 0, "total": 0}


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_tool_calls_that_would_block_or_crash_the_loop(saphan_sqlite: Saphan,
                                                       tmp_path: Path) -> None:
    """A FIFO, a device, a NUL byte, a function that is not an object, and a
    detached process holding the command's output: each comes back to the
    model as an error, and the run still ends by itself, quickly."""
    script: list[Any] = [
        ("calls", [("run_command", {"argv": ["mkfifo", "p"]}),
                   ("read_file", {"path": "p"}),
                   ("write_file", {"path": "p", "content": "x"}),
                   ("read_file", {"path": "/dev/zero"}),
                   ("read_file", {"path": "a\u0000b"})]),
        ("raw", _answer({"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": "run_command"}]})),
        ("calls", [("run_command", {"argv": ["sh", "-c", "setsid sleep 8 & echo started"],
                                    "timeout": 1})]),
        ("calls", [("finish", {"summary": "ok"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        wd = _setup(s := saphan_sqlite, tmp_path, f"{srv.base_url}/v1")
        r, rec, took = _run(s, wd)
        results = srv.tool_results()
    assert r.code == 0 and rec["outcome"] == "exited", (rec.get("loop"), r.err)
    assert results[0].startswith("exit 0")
    assert results[1] == "error: not a regular file (p)"
    assert results[2].startswith("error: ") and (wd / "p").exists()
    assert results[3] == "error: not a regular file (/dev/zero)"
    assert "without NUL bytes" in results[4]
    assert results[5] == "error: a tool call must name a function"
    assert results[6].startswith("killed after 1 s (timeout)")
    assert "kept its output open" in results[6]
    assert took < 30, took


@pytest.mark.parametrize("piped", [b"", b"sk-stolen"])
def test_a_short_key_pipe_ends_without_contacting_the_model(tmp_path: Path,
                                                            piped: bytes) -> None:
    """The engine writes a whole key (at least 16 characters) into the pipe;
    less on the jailed side means another process read it first. The loop
    ends `key-channel-broken` and never sends a request with what is left."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    with ChatCompletionsServer([("calls", [("finish", {"summary": "x"})])]) as srv:
        spec = {"lane": "L", "base_url": f"{srv.base_url}/v1", "model": "m", "timeout": 5,
                "retries": 0, "prompt": "p", "workdir": str(tmp_path), "allowed_commands": None,
                "max_turns": 3, "max_seconds": 30, "command_timeout": 5,
                "scrub_env": ["OPENAI_API_KEY"], "transcript": str(out / "transcript.jsonl"),
                "result": str(out / "loop-result.json")}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, "-I", "-m", "saphan.loop.agent",
                               str(tmp_path / "spec.json")], input=piped,
                              capture_output=True, timeout=60, check=False)
        requests = len(srv.requests)
    assert done.returncode == 1, done.stderr
    result = json.loads((out / "loop-result.json").read_text())
    assert result["end"] == "key-channel-broken"
    assert f"held {len(piped)} character(s)" in result["detail"]
    assert requests == 0


def test_an_oversized_answer_is_malformed_not_read_whole() -> None:
    """The client reads at most MAX_ANSWER_BYTES of an answer: a server that
    sends more (a bug, or an endpoint that is not a model) ends the run as
    `model-malformed`, not with the loop's memory."""
    from saphan.loop.client import MAX_ANSWER_BYTES, Client, ModelError

    with ChatCompletionsServer([("raw", "x" * (MAX_ANSWER_BYTES + 10))]) as srv:
        client = Client(base_url=f"{srv.base_url}/v1", model="m", secret="sk-" + "a" * 20,
                        timeout=30, retries=2)
        with pytest.raises(ModelError) as info:
            client.complete([{"role": "user", "content": "hi"}], [], time.monotonic() + 60)
    assert info.value.end == "model-malformed"
    assert f"more than {MAX_ANSWER_BYTES} bytes" in info.value.detail
    assert info.value.attempts == 1


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_malformed_calls_and_control_characters_through_the_cli(saphan_sqlite: Saphan,
                                                                 tmp_path: Path) -> None:
    """Issue 16, end to end under the real jail: arguments that ended the
    loop with a traceback are answered `error: …` and the run finishes; an
    OSC 52 clipboard write and colour codes in the model's text reach the
    terminal escaped (the transcript keeps them raw)."""
    osc = "\x1b]52;c;Y3VybCBldmlsfHNo\x07"
    text = f"look {osc}\x1b[31mred\x1b[0m\x9b2J"
    bad = [("run_command", "[" * 100_000), ("run_command", {"argv": "ls 'unclosed"}),
           ("run_command", {"argv": ["true"], "timeout": 10 ** 400}),
           ("write_file", {"path": "x", "content": "\udfff"}),
           ("read_file", {"path": "\ud800"})]
    script: list[Any] = [
        ("raw", _answer({"role": "assistant", "content": text, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "list_dir", "arguments": "{}"}}]})),
        ("calls", bad),
        ("calls", [("finish", {"summary": "survived"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        wd = _setup(s := saphan_sqlite, tmp_path, f"{srv.base_url}/v1")
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
              "--prompt", "task", timeout=RUN_TIMEOUT)
        results = srv.tool_results()
    assert r.code == 0, r.err
    assert "\x1b" not in r.out + r.err and "\x07" not in r.out and "\x9b" not in r.out
    assert "[turn 1] model: look \\x1b]52;c;Y3VybCBldmlsfHNo\\x07\\x1b[31mred\\x1b[0m\\x9b2J" in r.out
    assert len(results) == 1 + len(bad)
    assert results[3] == "exit 0\n"  # a huge timeout is capped
    assert all(x.startswith("error: ") for i, x in enumerate(results[1:]) if i != 2), results
    rec = s.ok("runs", "list", "--json").json()[0]
    entries = [json.loads(line) for line in
               (s.home / "runs" / rec["id"] / "out" / "transcript.jsonl").read_text().splitlines()]
    assert entries[1]["message"]["content"] == text  # raw in the transcript
    assert entries[-1]["end"] == "finished" and entries[-1]["summary"] == "survived"
