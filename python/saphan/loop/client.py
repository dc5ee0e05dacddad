"""One OpenAI-compatible chat-completions client, with bounded retries.

Runs inside the jail. Every way a model endpoint can fail ends in a
:class:`ModelError` naming one of :data:`ENDS`, after at most ``retries``
further attempts, and never after the run's deadline: no failure hangs a run.

    model-unreachable     connection refused / reset / DNS (retried)
    model-timeout         no complete answer within the lane's timeout (retried)
    model-rate-limited    HTTP 429 on every attempt (Retry-After honoured, capped)
    model-server-error    HTTP 5xx on every attempt
    model-auth-rejected   HTTP 401/403 (not retried: the key is wrong)
    model-request-rejected other HTTP 4xx (not retried)
    model-malformed       a 2xx answer that is not a chat completion, or any
                          answer over MAX_ANSWER_BYTES
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

ENDS = ("model-unreachable", "model-timeout", "model-rate-limited", "model-server-error",
        "model-auth-rejected", "model-request-rejected", "model-malformed")

_RETRY_AFTER_CAP = 10.0
#: the largest answer the loop reads (a chat completion is far smaller)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class ModelError(Exception):
    def __init__(self, end: str, detail: str, attempts: int):
        super().__init__(f"{end}: {detail}")
        self.end = end
        self.detail = detail
        self.attempts = attempts


@dataclass
class Client:
    base_url: str
    model: str
    secret: str
    timeout: float
    retries: int = 2
    #: HTTP attempts made so far (for the record)
    attempts: int = 0

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 deadline: float) -> dict[str, Any]:
        """One chat completion (the parsed JSON body), or :class:`ModelError`."""
        body = json.dumps({"model": self.model, "messages": messages, "tools": tools,
                           "tool_choice": "auto", "stream": False}).encode()
        last: ModelError | None = None
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = 0.0
            try:
                return self._post(body, min(self.timeout, remaining))
            except _Retryable as e:
                last = ModelError(e.end, e.detail, self.attempts)
                wait = e.retry_after if e.retry_after is not None else 0.5 * 2 ** attempt
            if attempt < self.retries:
                time.sleep(max(0.0, min(wait, _RETRY_AFTER_CAP, deadline - time.monotonic())))
        if last is None:
            raise ModelError("model-timeout", "the run's time budget ended before a request "
                             "could be made", self.attempts)
        raise ModelError(last.end, f"{last.detail} (after {self.attempts} attempt(s))",
                         self.attempts)

    def _post(self, body: bytes, timeout: float) -> dict[str, Any]:
        base = urllib.parse.urlsplit(self.base_url)
        # The route goes on the path; a query (?api-version=...) stays a query.
        url = base._replace(path=base.path.rstrip("/") + "/chat/completions")
        conn_type = (http.client.HTTPSConnection if url.scheme == "https"
                     else http.client.HTTPConnection)
        conn = conn_type(url.hostname or "", url.port, timeout=timeout)
        self.attempts += 1
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            conn.request("POST", target, body=body, headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.secret}",
            })
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
        except TimeoutError:
            raise _Retryable("model-timeout",
                             f"{self.base_url} did not answer within {timeout:.0f} s") from None
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise _Retryable("model-unreachable",
                             f"{self.base_url}: {type(e).__name__}: {e}") from None
        finally:
            conn.close()
        status = resp.status
        text = raw[:300].decode(errors="replace")
        if len(raw) > MAX_ANSWER_BYTES:
            raise ModelError("model-malformed",
                             f"{self.base_url} answered HTTP {status} with more than "
                             f"{MAX_ANSWER_BYTES} bytes; the loop reads no further", self.attempts)
        if status in (401, 403):
            raise ModelError("model-auth-rejected",
                             f"{self.base_url} answered HTTP {status} (the lane's key was "
                             f"refused): {text}", self.attempts)
        if status == 429:
            raise _Retryable("model-rate-limited", f"{self.base_url} answered HTTP 429: {text}",
                             _retry_after(resp.getheader("Retry-After")))
        if status >= 500:
            raise _Retryable("model-server-error",
                             f"{self.base_url} answered HTTP {status}: {text}")
        if status >= 300:
            raise ModelError("model-request-rejected",
                             f"{self.base_url} answered HTTP {status}: {text}", self.attempts)
        try:
            parsed = json.loads(raw)
            message = parsed["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ModelError("model-malformed",
                             f"{self.base_url} answered HTTP {status} with something that is "
                             f"not a chat completion ({e}): {text}", self.attempts) from None
        result: dict[str, Any] = parsed
        return result


class _Retryable(Exception):
    def __init__(self, end: str, detail: str, retry_after: float | None = None):
        super().__init__(detail)
        self.end = end
        self.detail = detail
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
