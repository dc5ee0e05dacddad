"""loop/client.py: one chat-completions client with bounded retries. Every way
an endpoint fails ends in a ModelError naming one of ENDS, after at most
``retries`` further attempts and never past the deadline. Driven against the
scripted chat-completions server on 127.0.0.1 (tests/tools/model_servers.py)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from saphan.loop.client import ENDS, Client, ModelError
from tools.model_servers import ChatCompletionsServer

SECRET = "sk-test-" + "k" * 24
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "finish"}}]


def _client(base_url: str, *, retries: int = 2, timeout: float = 10) -> Client:
    return Client(base_url=base_url, model="m1", secret=SECRET, timeout=timeout, retries=retries)


def _fails(client: Client, deadline_in: float = 60) -> ModelError:
    with pytest.raises(ModelError) as info:
        client.complete(MESSAGES, TOOLS, time.monotonic() + deadline_in)
    assert info.value.end in ENDS or info.value.end == "model-timeout"
    return info.value


def test_a_completion_and_what_was_sent() -> None:
    with ChatCompletionsServer([("calls", [("finish", {"summary": "ok"})])]) as srv:
        client = _client(f"{srv.base_url}/v1/")
        answer = client.complete(MESSAGES, TOOLS, time.monotonic() + 30)
        body, headers, path = srv.requests[0], srv.headers[0], srv.paths[0]
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "finish"
    assert json.loads(call["function"]["arguments"]) == {"summary": "ok"}
    assert client.attempts == 1
    assert path == "POST /v1/chat/completions"  # one slash, whatever the base ends with
    assert body == {"model": "m1", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto",
                    "stream": False}
    assert headers["Authorization"] == f"Bearer {SECRET}"
    assert headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(("status", "end"), [
    (401, "model-auth-rejected"), (403, "model-auth-rejected"),
    (400, "model-request-rejected"), (404, "model-request-rejected"),
    (302, "model-request-rejected"),
])
def test_answers_that_are_not_retried(status: int, end: str) -> None:
    with ChatCompletionsServer([("status", status)] * 3) as srv:
        e = _fails(_client(srv.base_url))
        sent = len(srv.requests)
    assert (e.end, e.attempts, sent) == (end, 1, 1)
    assert f"HTTP {status}" in e.detail and "scripted HTTP" in e.detail


def test_server_errors_are_retried_a_bounded_number_of_times() -> None:
    with ChatCompletionsServer([("status", 503)] * 5) as srv:
        e = _fails(_client(srv.base_url, retries=1))
        sent = len(srv.requests)
    assert (e.end, e.attempts, sent) == ("model-server-error", 2, 2)
    assert e.detail.endswith("(after 2 attempt(s))")


def test_rate_limits_honour_retry_after_then_succeed() -> None:
    script = [("status", 429, 0), ("status", 429, "soon"), ("text", "done")]
    with ChatCompletionsServer(script) as srv:
        client = _client(srv.base_url, retries=2)
        t0 = time.monotonic()
        answer = client.complete(MESSAGES, TOOLS, time.monotonic() + 30)
        took = time.monotonic() - t0
    assert answer["choices"][0]["message"]["content"] == "done"
    assert client.attempts == 3
    # Retry-After 0 waited nothing; an unreadable one fell back to the 1 s backoff.
    assert 0.9 <= took < 5, took


def test_rate_limited_on_every_attempt() -> None:
    with ChatCompletionsServer([("status", 429, 0)] * 3) as srv:
        e = _fails(_client(srv.base_url, retries=2))
    assert (e.end, e.attempts) == ("model-rate-limited", 3)


def test_a_retry_after_never_outlasts_the_deadline() -> None:
    with ChatCompletionsServer([("status", 429, 3600)] * 3) as srv:
        t0 = time.monotonic()
        e = _fails(_client(srv.base_url, retries=5), deadline_in=1.5)
        took = time.monotonic() - t0
    assert e.end == "model-rate-limited" and e.attempts == 1
    assert took < 3, took


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    e = _fails(_client(f"http://127.0.0.1:{port}/v1", retries=1))
    assert (e.end, e.attempts) == ("model-unreachable", 2)
    assert f"127.0.0.1:{port}" in e.detail and "ConnectionRefused" in e.detail


def test_a_slow_endpoint_is_a_timeout() -> None:
    with ChatCompletionsServer([("sleep", 3)] * 2) as srv:
        t0 = time.monotonic()
        e = _fails(_client(srv.base_url, retries=0, timeout=1))
        took = time.monotonic() - t0
    assert (e.end, e.attempts) == ("model-timeout", 1)
    assert "did not answer within 1 s" in e.detail
    assert took < 2.5, took


def test_no_time_left_means_no_request() -> None:
    with ChatCompletionsServer([("text", "x")]) as srv:
        client = _client(srv.base_url)
        with pytest.raises(ModelError) as info:
            client.complete(MESSAGES, TOOLS, time.monotonic() - 1)
        sent = len(srv.requests)
    assert info.value.end == "model-timeout" and info.value.attempts == 0 and sent == 0
    assert "time budget ended before a request could be made" in info.value.detail


@pytest.mark.parametrize("body", [
    "not json",
    json.dumps({"choices": []}),
    json.dumps({"choices": [{"message": "a string"}]}),
    json.dumps({"object": "list", "data": []}),
])
def test_answers_that_are_not_chat_completions(body: str) -> None:
    with ChatCompletionsServer([("raw", body)] * 3) as srv:
        e = _fails(_client(srv.base_url))
        sent = len(srv.requests)
    assert (e.end, e.attempts, sent) == ("model-malformed", 1, 1)
    assert "not a chat completion" in e.detail


def test_a_base_url_with_a_query_keeps_it_apart() -> None:
    with ChatCompletionsServer([("text", "x")]) as srv:
        _client(f"{srv.base_url}/openai/deployments/d1?api-version=2024").complete(
            MESSAGES, TOOLS, time.monotonic() + 30)
        path = srv.paths[0]
    assert path == "POST /openai/deployments/d1/chat/completions?api-version=2024"
