"""Scripted model servers on 127.0.0.1 speaking the real wire protocols.

A fixture, not a mock of saphan (TESTING.md): each server answers the agent
CLI's HTTP requests with a FIXED sequence of turns — tool calls, then a final
message — and records every request body so a test can read what the CLI sent
(and the tool results it reported back).

- :class:`ResponsesServer` — the OpenAI Responses API (``POST …/responses``,
  SSE ``response.*`` events), which Codex CLI 0.169 speaks.
- :class:`MessagesServer` — the Anthropic Messages API (``POST /v1/messages``
  with ``stream: true``, SSE ``message_start`` … ``message_stop``), which
  Claude Code speaks at ``ANTHROPIC_BASE_URL``.
- :class:`ChatCompletionsServer` — OpenAI chat completions
  (``POST …/chat/completions``, non-streaming), which saphan's own loop
  speaks to a lane, as llama.cpp, vLLM and Ollama serve it.

Every server takes ``host`` (the address it binds, default ``127.0.0.1``:
a far host's test binds the control plane's veth address), ``reject_auth``
(every request, GET and POST, answers HTTP 401 with an error body in the
protocol's shape — a revoked key) and ``models_status`` (what a GET of the
models listing answers: 200 with a small listing, or that status). A GET's
headers are kept in :attr:`_Server.get_headers` (the auth pre-flight's).

A turn is ``("shell", "<command line>")``, ``("write", path, content)`` (Claude's
Write tool), ``("tool", name, json_input)`` (any tool of Claude's, by name) or
``("text", "<final message>")``. A request after the script is
exhausted gets the final text again, so a CLI that retries cannot hang.
"""

from __future__ import annotations

import itertools
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = tuple[str, ...]


class _Server:
    def __init__(self, script: list[Turn], *, host: str = "127.0.0.1",
                 reject_auth: bool = False, models_status: int = 200,
                 tls: ssl.SSLContext | None = None):
        self.script = list(script)
        self.host = host
        #: served over TLS with this context (base_url then says https)
        self.tls = tls
        #: every request answers 401 (an error body in the protocol's shape)
        self.reject_auth = reject_auth
        #: what a GET of the models listing answers (200: a small listing)
        self.models_status = models_status
        #: the headers of every GET, in order (the auth pre-flight's)
        self.get_headers: list[dict[str, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        #: the headers of every POST, in order (a test reads Authorization)
        self.headers: list[dict[str, str]] = []
        #: the raw body of every POST, in order
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a: object) -> None:
                return

            def do_GET(self) -> None:  # model listings and health probes
                with owner._lock:
                    owner.paths.append("GET " + self.path)
                    owner.get_headers.append(dict(self.headers.items()))
                if owner.reject_auth:
                    owner.reject(self)
                    return
                owner.on_get(self)

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode(errors="replace")}
                with owner._lock:
                    owner.paths.append("POST " + self.path)
                    owner.requests.append(body)
                    owner.headers.append(dict(self.headers.items()))
                    owner.bodies.append(raw)
                if owner.reject_auth:
                    owner.reject(self)
                    return
                owner.on_post(self, body)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.host}:{self.port}"

    def next_turn(self, turns_so_far: int) -> Turn:
        if turns_so_far < len(self.script):
            return self.script[turns_so_far]
        return ("text", "done")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"

    #: the models listing's path (under any base path)
    MODELS_PATH = "/models"

    def on_get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?")[0].rstrip("/").endswith(self.MODELS_PATH):
            if self.models_status != 200:
                _json(h, self.models_status, self.error_body(self.models_status, "scripted"))
                return
            _json(h, 200, self.listing())
            return
        _json(h, 200, {"object": "list", "data": []})

    def listing(self) -> dict[str, Any]:
        """A small models listing (OpenAI's shape)."""
        return {"object": "list", "data": [{"id": "scripted-model", "object": "model",
                                            "created": 0, "owned_by": "scripted"}]}

    def error_body(self, code: int, message: str) -> dict[str, Any]:
        """An error body in the protocol's shape (OpenAI's)."""
        kind = {401: "invalid_api_key", 403: "permission_denied"}.get(code, "error")
        return {"error": {"message": message, "type": kind, "code": kind}}

    def reject(self, h: BaseHTTPRequestHandler) -> None:
        _json(h, 401, self.error_body(401, "Incorrect API key provided (scripted rejection)"))

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        raise NotImplementedError


def _json(h: BaseHTTPRequestHandler, code: int, value: object) -> None:
    data = json.dumps(value).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _sse(h: BaseHTTPRequestHandler, events: list[tuple[str, dict[str, Any]]]) -> None:
    data = b"".join(
        f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode() for name, payload in events
    )
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-cache")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


# -- OpenAI Responses API (Codex) -------------------------------------------------

class ResponsesServer(_Server):
    """Each POST is one model turn; the turn index is how many function-call
    outputs the request already carries (Codex resends the whole input).

    Besides the common turns, ``("call", "<name>", {arguments})`` or
    ``("call", "<name>", {arguments}, "<namespace>")`` answers with any
    function call (Codex's ``spawn_agent``, say). A sub-agent's requests —
    their input holds :attr:`SUBAGENT_MARKER`, put in the task of a scripted
    spawn — get a final text instead of the main script.

    ``usage``: what every response reports (the Responses API's ``usage``).

    Codex's built-in ``openai`` provider first tries the Responses API over a
    WebSocket (``GET …/responses`` with an upgrade): that path answers 404 so
    Codex falls back to HTTPS at once instead of retrying five times.
    """

    #: a sub-agent's task holding this text marks that agent's requests
    SUBAGENT_MARKER = "[scripted sub-agent task]"

    def __init__(self, script: list[Turn], *,
                 usage: dict[str, Any] | None = None, **kw: Any) -> None:
        super().__init__(script, **kw)
        self.usage: dict[str, Any] = usage or {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15}

    def on_get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?")[0].rstrip("/").endswith("/responses"):
            _json(h, 404, {"error": {"message": "no WebSocket here"}})
            return
        super().on_get(h)

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if not h.path.rstrip("/").endswith("/responses"):
            _json(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        done = sum(1 for item in body.get("input") or []
                   if isinstance(item, dict) and item.get("type") in
                   ("function_call_output", "custom_tool_call_output"))
        turn: Any = (("text", "sub-agent done") if self.is_subagent(body)
                     else self.next_turn(done))
        rid = self.new_id("resp")
        if turn[0] == "shell":
            item = self._shell_call(body, turn[1])
        elif turn[0] == "call":
            item = {"type": "function_call", "id": self.new_id("fc"),
                    "call_id": self.new_id("call"), "name": turn[1],
                    "arguments": json.dumps(turn[2]), "status": "completed"}
            if len(turn) > 3:
                item["namespace"] = turn[3]
        else:
            item = {"type": "message", "role": "assistant", "id": self.new_id("msg"),
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn[1], "annotations": []}]}
        _sse(h, [
            ("response.created", {"type": "response.created",
                                  "response": {"id": rid, "status": "in_progress"}}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed",
                                    "response": {"id": rid, "status": "completed",
                                                 "output": [item], "usage": self.usage}}),
        ])

    def is_subagent(self, body: dict[str, Any]) -> bool:
        """Whether a request is a sub-agent's: a user message of its input
        holds :attr:`SUBAGENT_MARKER` (in the main agent's own input the
        marker stands only inside the spawn call's arguments)."""
        return any(isinstance(item, dict) and item.get("type") == "message"
                   and item.get("role") == "user"
                   and self.SUBAGENT_MARKER in json.dumps(item.get("content"))
                   for item in body.get("input") or [])

    def models(self) -> list[str]:
        """The ``model`` of every Responses request, in order (a sub-agent's
        included)."""
        with self._lock:
            return [str(body.get("model")) for body in self.requests]

    def tool_names(self, index: int = 0) -> list[str]:
        """Every tool request ``index`` offers, namespaced ones as
        ``namespace.name`` — those in ``tools`` and those Codex sends as
        ``additional_tools`` input items (its code-mode models)."""
        if len(self.requests) <= index:
            return []
        body = self.requests[index]
        lists = [body.get("tools") or []]
        lists += [item.get("tools") or [] for item in body.get("input") or []
                  if isinstance(item, dict) and item.get("type") == "additional_tools"]
        names: list[str] = []

        def walk(tools: list[Any], prefix: str) -> None:
            for t in tools:
                if not isinstance(t, dict):
                    continue
                name = str(t.get("name") or t.get("type"))
                names.append(prefix + name)
                if isinstance(t.get("tools"), list):
                    walk(t["tools"], f"{prefix}{name}.")

        for tools in lists:
            walk(tools, "")
        return names

    def _shell_call(self, body: dict[str, Any], command: str) -> dict[str, Any]:
        tools = {str(t.get("name")): t for t in body.get("tools") or [] if isinstance(t, dict)}
        call_id = self.new_id("call")
        if "shell_command" in tools:
            name, args = "shell_command", {"command": command}
        elif "exec_command" in tools:
            name, args = "exec_command", {"cmd": command}
        else:
            name, args = "shell", {"command": ["sh", "-c", command]}
        return {"type": "function_call", "id": self.new_id("fc"), "call_id": call_id,
                "name": name, "arguments": json.dumps(args), "status": "completed"}

    def outputs(self) -> Iterator[str]:
        """Every tool output Codex reported back, in order (last request of
        the main script: a sub-agent's requests are skipped)."""
        main = [b for b in self.requests if not self.is_subagent(b)]
        if not main:
            return
        for item in main[-1].get("input") or []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                out = item.get("output")
                yield out if isinstance(out, str) else json.dumps(out)


# -- Anthropic Messages API (Claude Code) ------------------------------------------

class MessagesServer(_Server):
    """Each POST /v1/messages with tools is one turn of the main loop; the turn
    index is how many tool_result blocks the conversation already carries.
    Side requests (titles, topic checks: no ``tools``) get a short text, and
    so do a sub-agent's (its first message holds :attr:`SUBAGENT_MARKER`).

    Besides the common turns, ``("tool", "<Name>", "<JSON input>")`` calls
    any tool by name (Claude Code's ``Agent``, say)."""

    #: a sub-agent's task holding this text (the prompt of a scripted
    #: ``Agent`` call) marks that agent's requests
    SUBAGENT_MARKER = "[scripted sub-agent task]"

    def listing(self) -> dict[str, Any]:
        """A small models listing (Anthropic's shape)."""
        return {"data": [{"type": "model", "id": "claude-scripted", "display_name": "Scripted",
                          "created_at": "2026-01-01T00:00:00Z"}],
                "has_more": False, "first_id": "claude-scripted", "last_id": "claude-scripted"}

    def error_body(self, code: int, message: str) -> dict[str, Any]:
        """An error body in the protocol's shape (Anthropic's)."""
        kind = {401: "authentication_error", 403: "permission_error",
                404: "not_found_error"}.get(code, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def reject(self, h: BaseHTTPRequestHandler) -> None:
        _json(h, 401, self.error_body(401, "invalid x-api-key (scripted rejection)"))

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        path = h.path.split("?")[0]
        if path.endswith("/count_tokens"):
            _json(h, 200, {"input_tokens": 10})
            return
        if not path.endswith("/v1/messages"):
            _json(h, 404, {"type": "error", "error": {"type": "not_found_error",
                                                      "message": f"no route {h.path}"}})
            return
        model = str(body.get("model") or "scripted")
        messages = body.get("messages") or []
        if not body.get("tools"):
            turn: Turn = ("text", "ok")
        elif messages and self.SUBAGENT_MARKER in json.dumps(messages[0]):
            turn = ("text", "sub-agent done")
        else:
            done = sum(1 for m in messages if isinstance(m.get("content"), list)
                       for block in m["content"]
                       if isinstance(block, dict) and block.get("type") == "tool_result")
            turn = self.next_turn(done)
        if turn[0] == "write":
            block: dict[str, Any] = {"type": "tool_use", "id": self.new_id("toolu"),
                                     "name": "Write", "input": {}}
            args = {"file_path": turn[1], "content": turn[2]}
            stop = "tool_use"
        elif turn[0] == "shell":
            block = {"type": "tool_use", "id": self.new_id("toolu"), "name": "Bash", "input": {}}
            args = {"command": turn[1], "description": "scripted"}
            stop = "tool_use"
        elif turn[0] == "tool":
            block = {"type": "tool_use", "id": self.new_id("toolu"), "name": turn[1],
                     "input": {}}
            args = json.loads(turn[2])
            stop = "tool_use"
        else:
            block, args, stop = {"type": "text", "text": ""}, {}, "end_turn"
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {
                "id": self.new_id("msg"), "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": block}),
        ]
        if block["type"] == "text":
            events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta",
                                                             "text": turn[1]}}))
        else:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": json.dumps(args)}}))
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        _sse(h, events)

    def models(self) -> list[str]:
        """The ``model`` of every Messages request, in order (side requests and
        sub-agents' included; token counts are not model turns)."""
        with self._lock:
            posted = [p for p in self.paths if p.startswith("POST ")]
            return [str(body.get("model")) for path, body in zip(posted, self.requests,
                                                                  strict=True)
                    if path.split("?")[0].endswith("/v1/messages")]

    def context_files(self) -> list[str]:
        """The files Claude Code put into any request's context, as it names
        them there (``Contents of <path> (…):`` — how 2.1.197 introduces each
        CLAUDE.md, rule and memory file), first-seen order."""
        import re

        seen: dict[str, None] = {}
        with self._lock:
            bodies = list(self.bodies)
        for raw in bodies:
            for path in re.findall(r"Contents of (\S+) \(", raw.decode(errors="replace")):
                seen.setdefault(path)
        return list(seen)

    def tool_results(self) -> list[str]:
        """Every tool_result Claude Code sent back, as text, in order."""
        out: list[str] = []
        for body in reversed(self.requests):
            if not body.get("tools"):
                continue
            for m in body.get("messages") or []:
                content = m.get("content")
                if not isinstance(content, list):
                    continue
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        c = block.get("content")
                        out.append(c if isinstance(c, str) else json.dumps(c))
            break
        return out


# -- OpenAI chat completions (saphan's own loop) ------------------------------------

class ChatCompletionsServer(_Server):
    """Each POST is the next entry of the script (retries consume entries too):

    - ``("calls", [(name, arguments), ...])``: one assistant message with
      those tool calls (``arguments`` a dict, or a str sent verbatim — a
      malformed call);
    - ``("text", message)``: a final answer without tool calls;
    - ``("status", code)`` / ``("status", code, retry_after)``: an HTTP error;
    - ``("sleep", seconds)``: answer "late" after that long (a timeout);
    - ``("raw", body)``: HTTP 200 with a body that is not a chat completion.
    """

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        import time

        if not h.path.split("?", 1)[0].rstrip("/").endswith("/chat/completions"):
            _json(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        turn: Any = self.next_turn(len(self.requests) - 1)
        kind = turn[0]
        if kind == "status":
            data = json.dumps({"error": {"message": f"scripted HTTP {turn[1]}"}}).encode()
            h.send_response(turn[1])
            if len(turn) > 2:
                h.send_header("Retry-After", str(turn[2]))
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        if kind == "raw":
            data = turn[1].encode()
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        if kind == "sleep":
            time.sleep(turn[1])
            turn = ("text", "late")
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if kind == "calls":
            message["tool_calls"] = [
                {"id": self.new_id("call"), "type": "function",
                 "function": {"name": name,
                              "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for name, args in turn[1]]
            finish = "tool_calls"
        else:
            message["content"] = turn[1]
            finish = "stop"
        _json(h, 200, {"id": self.new_id("chatcmpl"), "object": "chat.completion",
                       "model": body.get("model"), "choices": [
                           {"index": 0, "message": message, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                                 "total_tokens": 120}})

    def tool_results(self) -> list[str]:
        """Every tool message the loop sent back, in order (last request)."""
        if not self.requests:
            return []
        return [str(m.get("content")) for m in self.requests[-1].get("messages") or []
                if isinstance(m, dict) and m.get("role") == "tool"]


class TokenServer:
    """A token endpoint: answers each POST with the next (status, body),
    and keeps every JSON body it was sent."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]]):
        self.answers, self.bodies = list(answers), []  # type: list[dict[str, Any]]
        owner = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                owner.bodies.append(json.loads(self.rfile.read(n)))
                status, body = owner.answers.pop(0) if owner.answers else (500, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/oauth/token"

    def __enter__(self) -> TokenServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
