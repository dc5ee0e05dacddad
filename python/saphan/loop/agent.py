"""The jailed half of the loop: ``python -I -m saphan.loop.agent SPEC``.

Started by the engine inside the run's boundary (never by hand). Order:

1. read the lane's key from standard input — a pipe the engine filled and
   closed — to EOF, then put /dev/null on fd 0: the key now exists only in
   this process's memory;
2. make this process non-dumpable (PR_SET_DUMPABLE 0), so a same-user
   process the tool calls start cannot read its memory or environment
   through /proc;
3. drop the credential variables (by name, and any variable whose value
   holds the key) from the environment every tool call gets;
4. loop: ask the model, run the tool calls it makes, return their results,
   until it finishes or a turn/time budget ends;
5. write the transcript (as it goes) and the result into the return path.

The exit status is 0 when the model finished, 1 otherwise; the result file
says why.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from saphan.terminal import terminal_safe

if TYPE_CHECKING:
    from saphan.loop.tools import Toolbox

# The model client and the tools are imported by run(), after main() has
# drained the key pipe and made this process non-dumpable: the shorter the
# time from exec to that point, the shorter the key waits in the pipe.

SYSTEM = ("You are a coding agent working in the directory {workdir}. Use the tools to do the "
          "task. Files you may change are inside that directory; writes elsewhere are refused "
          "by the operating system. Call `finish` with a short summary when done.")
#: consecutive malformed tool calls tolerated (each answered with the error)
MALFORMED_LIMIT = 2


def read_secret(fd: int = 0) -> str:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return b"".join(chunks).decode("ascii")


def scrubbed(env: Mapping[str, str], names: Iterable[str], keys: Iterable[str]) -> dict[str, str]:
    """``env`` without the credential variables: by name, and any variable
    whose value holds one of ``keys`` (whatever it is called)."""
    drop, values = set(names), [k for k in keys if k]
    return {k: v for k, v in env.items() if k not in drop and not any(x in v for x in values)}


class Redactor:
    """Last line of defence: the key's bytes never leave in a tool result or
    the transcript. Counted, so a test can tell a held boundary (0) from a
    leak that was caught here (> 0)."""

    def __init__(self, secret: str):
        self.secret = secret
        self.count = 0

    def __call__(self, text: str, *, count: bool = True) -> str:
        if self.secret and self.secret in text:
            if count:
                self.count += text.count(self.secret)
            return text.replace(self.secret, "[credential withheld]")
        return text


class Transcript:
    def __init__(self, path: str, redact: Redactor):
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self.redact = redact

    def write(self, entry: dict[str, Any]) -> None:
        self.f.write(self.redact(json.dumps(entry, sort_keys=True)) + "\n")
        self.f.flush()
        self.show(entry)

    def show(self, entry: dict[str, Any]) -> None:
        """One line per step on stdout (the run's output), for the operator:
        redacted, and with control characters escaped (:func:`terminal_safe`);
        the transcript file keeps the text as it was."""
        kind = entry["kind"]
        if kind == "assistant":
            text = entry["message"].get("content")
            line = f"[turn {entry['turn']}] model: {text}" if text else ""
        elif kind == "tool":
            call = entry["call"]
            fn = call.get("function") if isinstance(call, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            first = entry["result"].split("\n", 1)[0]
            line = (f"[turn {entry['turn']}] {fn.get('name')} {_short(fn.get('arguments'))}"
                    f" -> {_short(first)}")
        else:
            return
        if line:
            # The same text was just counted on its way into the transcript.
            print(terminal_safe(self.redact(line, count=False)), flush=True)


def run(spec: dict[str, Any], secret: str) -> dict[str, Any]:
    from saphan.loop.client import Client, ModelError
    from saphan.loop.tools import SCHEMAS, Toolbox

    start = time.monotonic()
    deadline = start + float(spec["max_seconds"])
    redact = Redactor(secret)
    transcript = Transcript(spec["transcript"], redact)
    env = scrubbed(os.environ, spec["scrub_env"], [secret])
    allowed = spec.get("allowed_commands")
    # The run's writable set as the engine composed it, and what the spec
    # itself shows of it (the return path holds the transcript and result).
    writable = (*spec.get("writable", ()), os.path.dirname(spec["transcript"]),
                os.path.dirname(spec["result"]))
    box = Toolbox(workdir=spec["workdir"], env=env,
                  allowed=frozenset(allowed) if allowed is not None else None,
                  command_timeout=float(spec["command_timeout"]),
                  remaining=lambda: deadline - time.monotonic(),
                  writable=tuple(dict.fromkeys(writable)))
    client = Client(base_url=spec["base_url"], model=spec["model"], secret=secret,
                    timeout=float(spec["timeout"]), retries=int(spec["retries"]))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM.format(workdir=spec["workdir"])},
        {"role": "user", "content": spec["prompt"]},
    ]
    transcript.write({"kind": "task", "model": spec["model"], "lane": spec["lane"],
                      "prompt": spec["prompt"]})
    tokens = {"prompt": 0, "completion": 0, "total": 0}
    #: the model names the endpoint's answers carried (what actually answered)
    models: set[str] = set()
    turns = calls = malformed = 0
    end, detail, summary = "turn-budget-exhausted", f"{spec['max_turns']} turns used", None
    try:
        while turns < int(spec["max_turns"]):
            if time.monotonic() >= deadline:
                end, detail = "time-budget-exhausted", f"{spec['max_seconds']} s used"
                break
            try:
                answer = client.complete(messages, SCHEMAS, deadline)
            except ModelError as e:
                end, detail = e.end, e.detail
                if time.monotonic() >= deadline:
                    end, detail = "time-budget-exhausted", (
                        f"{spec['max_seconds']} s used, the last of it on the model: {e.detail}")
                break
            turns += 1
            if isinstance(answer.get("model"), str):
                models.add(answer["model"][:200])
            got_usage = answer.get("usage")
            usage: dict[str, Any] = got_usage if isinstance(got_usage, dict) else {}
            for k, src in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                           ("total", "total_tokens")):
                if isinstance(usage.get(src), int):
                    tokens[k] += usage[src]
            message = answer["choices"][0]["message"]
            transcript.write({"kind": "assistant", "turn": turns, "message": message,
                              "usage": usage})
            tool_calls = message.get("tool_calls") or []
            if not isinstance(tool_calls, list):
                # Nothing to answer call by call: say so, and count the turn.
                messages.append({"role": "assistant", "content": message.get("content")})
                messages.append({"role": "user", "content": "error: `tool_calls` must be a "
                                 "list of tool calls; call the tools again"})
                malformed += 1
                if malformed > MALFORMED_LIMIT:
                    end, detail = "model-malformed", (
                        f"{malformed} consecutive malformed turns; the last: `tool_calls` "
                        f"was {type(tool_calls).__name__}, not a list")
                    break
                continue
            messages.append({"role": "assistant", "content": message.get("content"),
                             **({"tool_calls": tool_calls} if tool_calls else {})})
            if not tool_calls:
                end, detail, summary = "finished", "the model answered without a tool call", \
                    message.get("content")
                break
            bad_turn = False
            for call in tool_calls:
                calls += 1
                text, bad = _one_call(box, call)
                bad_turn = bad_turn or bad
                text = redact(text)
                transcript.write({"kind": "tool", "turn": turns, "call": call, "result": text})
                messages.append({"role": "tool", "tool_call_id": _call_id(call),
                                 "content": text})
            malformed = malformed + 1 if bad_turn else 0
            if box.finished is not None:
                end, detail, summary = "finished", "the model called finish", box.finished
                break
            if malformed > MALFORMED_LIMIT:
                end, detail = "model-malformed", (
                    f"{malformed} consecutive turns of malformed tool calls (each was answered "
                    "with the error); the last result: " + messages[-1]["content"][:200])
                break
    finally:
        result = {"end": end, "detail": redact(detail), "summary":
                  redact(summary) if isinstance(summary, str) else None,
                  "turns": turns, "tool_calls": calls, "tokens": tokens,
                  "models": sorted(models), "http_attempts": client.attempts, "redactions": redact.count,
                  "seconds": round(time.monotonic() - start, 3)}
        transcript.write({"kind": "end", **result})
        transcript.f.close()
    return result


def _short(value: Any, limit: int = 160) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call_id(call: Any) -> str:
    return str(call.get("id", "")) if isinstance(call, dict) else ""


def _one_call(box: Toolbox, call: Any) -> tuple[str, bool]:
    """(result text, whether the call was malformed)."""
    from saphan.loop.tools import BadCall

    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return "error: a tool call must name a function", True
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        return f"error: the arguments of {fn['name']} are not JSON ({e})", True
    try:
        return box.call(fn["name"], args), False
    except BadCall as e:
        return f"error: {e}", True
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # Arguments of a shape no check above foresaw: the model reads what
        # went wrong and the run goes on (a malformed call), never a traceback.
        return (f"error: {fn['name']} could not run with these arguments "
                f"({type(e).__name__}: {e})"), True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -I -m saphan.loop.agent SPEC (started by `saphan run`)",
              file=sys.stderr)
        return 2
    secret = read_secret()
    from saphan.transport.local import set_dumpable

    set_dumpable(False)
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    # Nothing this process starts inherits a credential variable.
    kept = scrubbed(os.environ, spec["scrub_env"], [secret])
    for name in set(os.environ) - set(kept):
        del os.environ[name]
    from saphan.lanes import MIN_CREDENTIAL_CHARS

    if len(secret) < MIN_CREDENTIAL_CHARS:
        # The engine wrote a whole key; less means someone else read the pipe
        # first. Never talk to the model with what is left.
        result = {"end": "key-channel-broken", "detail": (
            f"the key pipe held {len(secret)} character(s), not the lane's key (at least "
            f"{MIN_CREDENTIAL_CHARS}): another process read it first; the model was not "
            "contacted"), "summary": None, "turns": 0, "tool_calls": 0,
            "tokens": {"prompt": 0, "completion": 0, "total": 0}, "http_attempts": 0,
            "redactions": 0, "seconds": 0.0}
    else:
        result = run(spec, secret)
    tmp = spec["result"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, sort_keys=True)
    os.replace(tmp, spec["result"])
    print(terminal_safe(f"saphan-loop: {result['end']} after {result['turns']} turn(s), "
                        f"{result['tool_calls']} tool call(s): {result['detail']}"),
          file=sys.stderr)
    return 0 if result["end"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
