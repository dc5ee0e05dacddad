"""A batch file: JSONL, one task per line (docs/fleet.md#batches).

    {"id": "t1", "command": ["make", "test"], "workdir": "/src/a"}
    {"tool": "claude", "prompt": "fix the flaky test", "repo": "/src/b", "base": "main",
     "labels": {"zone": "eu"}, "max_seconds": 900}

Every line is checked before anything is written: an unknown key, a value
of the wrong kind, a duplicate id, or a combination ``saphan run`` refuses
names its line and writes nothing (what depends on the store — a machine,
an image digest, a matching slot — is found when the task runs). Relative paths are
resolved against the current directory now and stored absolute (a task
with neither ``workdir`` nor ``repo`` gets the current directory), so the
batch can be worked or resumed from anywhere; the SHA-256 of a
``permission_class`` or ``egress_policy`` file is stored with the task and
checked before it runs. A task becomes the arguments of one cast run
(:func:`run_arguments`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from saphan.errors import UserError

#: a batch file larger than this, or with more tasks, is refused
MAX_FILE_BYTES = 64 << 20
MAX_TASKS = 100_000
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
_STRINGS = ("prompt", "model", "lane", "workdir", "repo", "base", "machine", "image",
            "permission_class", "egress_policy")
_PATHS = ("workdir", "repo", "permission_class", "egress_policy")
_BUDGETS = ("max_seconds", "max_turns")
KEYS = frozenset(("id", "tool", "command", "labels", *_STRINGS, *_BUDGETS))


@dataclass(frozen=True)
class Parsed:
    """A batch file's tasks, as (task id, normalised spec), and its digest."""

    tasks: list[tuple[str, dict[str, Any]]]
    sha256: str


def parse_file(path: str) -> Parsed:
    """Read and check a batch file (UserError naming the line; nothing written)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise UserError(f"cannot read the batch file {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"the batch file {path} is over {MAX_FILE_BYTES >> 20} MiB; split it")
    return parse(data, where=path)


def parse(data: bytes, *, where: str = "batch", cwd: str | None = None) -> Parsed:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 (byte {e.start})") from None
    base = cwd if cwd is not None else os.getcwd()
    tasks: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    # "\n" only: str.splitlines would also split at U+2028 and U+0085, which
    # JSON allows inside a string
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(tasks) >= MAX_TASKS:
            raise UserError(f"{where}: over {MAX_TASKS} tasks; split the file")
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise UserError(f"{where}:{n}: not JSON: {e}") from None
        spec = check_task(value, n, base, where=where)
        task_id = spec.pop("id", None) or f"line-{n}"
        if task_id in seen:
            raise UserError(f"{where}:{n}: task id {task_id!r} is also line {seen[task_id]}'s; "
                            "ids name one task each")
        seen[task_id] = n
        tasks.append((task_id, spec))
    if not tasks:
        raise UserError(f"{where}: no tasks (one JSON object per line)")
    return Parsed(tasks, hashlib.sha256(data).hexdigest())


def check_task(value: object, n: int, cwd: str, *, where: str = "batch") -> dict[str, Any]:
    """One line's task, normalised (absolute paths, the tool named)."""
    from saphan.fleet.labels import check_key
    from saphan.fleet.labels import parse as parse_label
    from saphan.tools import AGENT_TOOLS, TOOLS

    at = f"{where}:{n}"
    if not isinstance(value, dict):
        raise UserError(f"{at}: a task is a JSON object, not {type(value).__name__}")
    unknown = sorted(set(value) - KEYS)
    if unknown:
        raise UserError(f"{at}: unknown key {unknown[0]!r}; a task has: "
                        f"{', '.join(sorted(KEYS))}")
    spec: dict[str, Any] = {}
    for key in _STRINGS:
        if key in value:
            v = value[key]
            if not isinstance(v, str) or not v or "\x00" in v:
                raise UserError(f"{at}: {key!r} must be a non-empty string")
            spec[key] = os.path.join(cwd, v) if key in _PATHS else v
    for key in _BUDGETS:
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10_000_000:
                raise UserError(f"{at}: {key!r} must be a whole number 1..10000000")
            spec[key] = v
    if "id" in value:
        if not isinstance(value["id"], str) or not _ID.fullmatch(value["id"]):
            raise UserError(f"{at}: 'id' must be 1-128 letters, digits or ._:/@+- "
                            "(starting with a letter or digit)")
        spec["id"] = value["id"]
    if "labels" in value:
        labels = value["labels"]
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise UserError(f"{at}: 'labels' must be an object of strings, e.g. "
                            '{"zone": "eu"}')
        try:
            spec["labels"] = dict(parse_label(f"{check_key(k)}={v}") for k, v in labels.items())
        except UserError as e:
            raise UserError(f"{at}: {e}") from None
    tool = value.get("tool", "command")
    if tool not in TOOLS:
        raise UserError(f"{at}: tool {tool!r} is unknown; one of {', '.join(TOOLS)}")
    spec["tool"] = tool
    if tool == "command":
        command = value.get("command")
        if (not isinstance(command, list) or not command
                or not all(isinstance(a, str) and "\x00" not in a for a in command)):
            raise UserError(f"{at}: a command task needs 'command': a non-empty list of "
                            'strings, e.g. ["make", "test"]')
        spec["command"] = command
        agent_only = [k for k in ("prompt", "model", "lane", *_BUDGETS) if k in spec]
        if agent_only:
            raise UserError(f"{at}: {agent_only[0]!r} is for agent tasks "
                            f"({', '.join(AGENT_TOOLS)}); a command task has 'command'")
    else:
        if "command" in value:
            raise UserError(f"{at}: a {tool} task has 'prompt', not 'command'")
        if "prompt" not in spec:
            raise UserError(f"{at}: a {tool} task needs 'prompt'")
    if "repo" in spec and "workdir" in spec:
        raise UserError(f"{at}: give 'repo' or 'workdir', not both")
    if "base" in spec and "repo" not in spec:
        raise UserError(f"{at}: 'base' needs 'repo'")
    if "repo" not in spec and "workdir" not in spec:
        # pinned now, in the signed task: never the directory a worker or a
        # resume happens to start in
        spec["workdir"] = os.path.abspath(cwd)
    for key in _POLICY_FILES:
        if key in spec:
            spec[f"{key}_sha256"] = _file_digest(spec[key], at, key)
    if "permission_class" in spec:
        from saphan.refusals import Refusal
        from saphan.tools.permission_class import load

        try:
            inner = load(spec["permission_class"]).egress_policy
        except Refusal as r:  # an invalid class names its line
            raise UserError(f"{at}: {r.message}") from None
        if inner is not None:
            raise UserError(f"{at}: the permission class names an egress policy of its own; in "
                            "a batch give it as the task's 'egress_policy' (its bytes are "
                            "pinned with the task)")
    return spec


#: files a task names whose contents decide its permissions: their SHA-256
#: is signed with the task, and checked again before it runs (check_files)
_POLICY_FILES = ("permission_class", "egress_policy")
_POLICY_LIMIT = 1 << 20


def _file_digest(path: str, at: str, key: str) -> str:
    import hashlib

    return hashlib.sha256(_file_bytes(path, at, key)).hexdigest()


def _file_bytes(path: str, at: str, key: str) -> bytes:
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise UserError(f"{at}: {key!r} {path}: {e.strerror or e} (a regular file, not a "
                        "link)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{at}: {key!r} {path} is not a regular file")
        data = os.read(fd, _POLICY_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > _POLICY_LIMIT:
        raise UserError(f"{at}: {key!r} {path} is over 1 MiB")
    return data


def _signed_bytes(spec: dict[str, Any], key: str) -> bytes:
    """The file's bytes, if they are still those signed with the task."""
    import hashlib

    data = _file_bytes(spec[key], "task", key)
    now = hashlib.sha256(data).hexdigest()
    if now != spec.get(f"{key}_sha256"):
        raise UserError(f"the {key} file {spec[key]} changed since the batch was made "
                        f"(SHA-256 {now}, signed {spec.get(f'{key}_sha256')}); the task is "
                        "not run: make a new batch")
    return data


def check_files(spec: dict[str, Any]) -> None:
    """The policy files a task names still hold what was signed with it
    (UserError naming the file otherwise: the task is not run)."""
    for key in _POLICY_FILES:
        if key in spec:
            _signed_bytes(spec, key)


def pinned_files(spec: dict[str, Any], into: str) -> dict[str, Any]:
    """The task with each policy file it names replaced by a private copy of
    the bytes signed with it, made in ``into`` (a directory of the
    workspace, which no run can write): the run loads exactly what was
    checked, never the operator's path again (UserError as check_files)."""
    out = dict(spec)
    for key in _POLICY_FILES:
        if key not in spec:
            continue
        data = _signed_bytes(spec, key)
        os.makedirs(into, mode=0o700, exist_ok=True)
        copy = os.path.join(into, f"{key}-{spec[f'{key}_sha256'][:16]}.json")
        # written whole, then renamed over: an existing copy (an earlier
        # attempt's, perhaps cut short) is never trusted as it stands
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=into, prefix=".copy-")
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, copy)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        out[key] = copy
    return out


def run_arguments(spec: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The argv and the keyword arguments of :meth:`saphan.Engine.run` for a
    task: a cast of its tool (never a named slot)."""
    from saphan.tools.instruction import Request

    kwargs: dict[str, Any] = {
        "tool": spec["tool"], "labels": spec.get("labels") or None, "image": spec.get("image"),
        "workdir": spec.get("workdir"), "repo": spec.get("repo"), "base_ref": spec.get("base"),
    }
    if spec["tool"] != "command" or "permission_class" in spec or "egress_policy" in spec:
        kwargs["request"] = Request(
            prompt=spec.get("prompt"), model=spec.get("model"), lane=spec.get("lane"),
            max_turns=spec.get("max_turns"), max_seconds=spec.get("max_seconds"),
            permission_class=spec.get("permission_class"),
            egress_policy=spec.get("egress_policy"))
    return list(spec.get("command") or ()), kwargs


def describe(spec: dict[str, Any]) -> str:
    """One short line for a listing: the tool and what it runs (whatever
    the stored spec holds: it is read before it is verified)."""
    if spec.get("tool") == "command":
        command = spec.get("command")
        text = " ".join(str(a) for a in command) if isinstance(command, list) else "?"
    else:
        text = f"{spec.get('tool')}: {spec.get('prompt', '')}"
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 60 else text[:59] + "…"
