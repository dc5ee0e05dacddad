"""The loop's tools, as the model sees them and as they run (inside the jail).

    run_command  argv (a list; no shell unless the class allows one), run in
                 the working directory with the credential variables scrubbed
                 from its environment. Under a permission class argv[0] must
                 be a bare name (no "/") the class allows, found on PATH
                 (absolute entries only) at a program outside the run's
                 writable set: the model cannot run a program it wrote by
                 giving it an allowed name (``./git``)
    read_file    a file's text (relative paths from the working directory)
    write_file   create or replace a file; the kernel refuses it outside the
                 writable set, and the model reads that refusal
    list_dir     a directory's entries
    finish       end the run with a summary

Nothing here checks where a write goes: the boundary is the OS's, and a
refused write comes back to the model as the OS's own error. A call that
cannot run as given (unknown tool, arguments of the wrong shape) is
:class:`BadCall`, which the loop answers with the error; it never ends the
loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

#: bytes of a tool result returned to the model (head and tail are kept)
OUTPUT_LIMIT = 64 * 1024
READ_LIMIT = 256 * 1024
#: seconds to collect output after a timed-out command's group was killed
GRACE = 2.0

SCHEMAS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "run_command",
        "description": "Run a program in the working directory and return its exit status "
                       "and output. argv is the program and its arguments (no shell).",
        "parameters": {"type": "object", "properties": {
            "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "timeout": {"type": "integer", "description": "seconds (optional)"}},
            "required": ["argv"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or replace a file with the given text.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": []}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Finish the task, with a short summary.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}},
                       "required": ["summary"]}}},
]
NAMES = tuple(s["function"]["name"] for s in SCHEMAS)


class BadCall(Exception):
    """The model's call cannot be run as given (unknown tool, bad arguments)."""


@dataclass
class Toolbox:
    workdir: str
    #: the environment every command gets (already scrubbed)
    env: Mapping[str, str]
    #: base names a command may have; None: any (no permission class)
    allowed: frozenset[str] | None
    command_timeout: float
    #: seconds left in the run's time budget
    remaining: Callable[[], float]
    #: directories the run can write besides the workdir (the return path, git
    #: grants): an allowed command that resolves inside one is refused
    writable: tuple[str, ...] = ()
    finished: str | None = field(default=None)

    def call(self, name: str, args: Any) -> str:
        if name not in NAMES:
            raise BadCall(f"there is no tool {name!r}; the tools are {', '.join(NAMES)}")
        if not isinstance(args, dict):
            raise BadCall(f"{name}: arguments must be a JSON object")
        handler: Callable[[dict[str, Any]], str] = getattr(self, f"_{name}")
        return handler(args)

    def _path(self, args: dict[str, Any], key: str = "path", default: str | None = None) -> str:
        value = args.get(key, default)
        if not _text(value) or not value:
            raise BadCall(f"`{key}` must be a non-empty string without NUL bytes (and valid "
                          "Unicode)")
        return os.path.join(self.workdir, value)

    def _run_command(self, args: dict[str, Any]) -> str:
        argv = args.get("argv")
        if isinstance(argv, str):
            try:
                argv = shlex.split(argv)
            except ValueError as e:  # an unclosed quote
                raise BadCall(f"run_command: `argv` as text cannot be split ({e}); give a "
                              "list of strings") from None
        if not isinstance(argv, list) or not argv or not all(_text(a) for a in argv):
            raise BadCall("run_command: `argv` must be a non-empty list of strings "
                          "(without NUL bytes, valid Unicode)")
        wanted = args.get("timeout")
        if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, (int, float))
                                   or not wanted > 0):
            raise BadCall("run_command: `timeout` must be a positive number of seconds")
        executable = None
        if self.allowed is not None:
            refused, executable = self._resolve(argv[0], self.allowed)
            if refused:
                return refused
        # min() compares an int of any size with a float without converting it
        limit = float(min(wanted if wanted is not None else self.command_timeout,
                          self.command_timeout, self.remaining()))
        if limit <= 0:
            return "not run: the run's time budget has ended"
        return run_argv(argv, cwd=self.workdir, env=self.env, timeout=limit,
                        executable=executable)

    def _resolve(self, name: str, allowed: frozenset[str]) -> tuple[str, str | None]:
        """("", the program to execute) for an allowed command, or (the refusal, None).

        A name only, never a path: ``./git`` would be a program the run wrote.
        Found on PATH (absolute entries; an empty or relative one would mean
        the working directory) and refused when it lands — links resolved —
        in the run's writable set, where the model could have put it. The
        resolved path is what runs (argv[0] stays the name), so nothing can
        swap it between this check and exec.
        """
        commands = ", ".join(sorted(allowed)) or "none"
        if "/" in name:
            return (f"refused by the permission class: {name!r} is a path; give an allowed "
                    f"command by its name alone ({commands}): it is looked up on PATH, never "
                    "in the working directory", None)
        if name not in allowed:
            return (f"refused by the permission class: {name!r} is not one of the allowed "
                    f"commands ({commands}); exact name", None)
        path = self.env.get("PATH", "")
        found = _on_path(name, path)
        if found is None:
            return f"error: {name!r} was not found on PATH ({path})", None
        real = os.path.realpath(found)
        for d in (self.workdir, *self.writable):
            top = os.path.realpath(d)
            if real == top or real.startswith(top.rstrip("/") + "/"):
                shown = found if found == real else f"{found} -> {real}"
                return (f"refused by the permission class: {name!r} is {shown}, inside the "
                        f"run's writable set ({top}): an allowed name runs only a program "
                        "the run cannot have written", None)
        return "", real

    def _read_file(self, args: dict[str, Any]) -> str:
        try:
            with _open_regular(self._path(args), os.O_RDONLY) as f:
                data = f.read(READ_LIMIT + 1)
        except OSError as e:
            return f"error: {e.strerror or e} ({args.get('path')})"
        more = "\n[… truncated]" if len(data) > READ_LIMIT else ""
        return data[:READ_LIMIT].decode(errors="replace") + more

    def _write_file(self, args: dict[str, Any]) -> str:
        content = args.get("content")
        if not isinstance(content, str):
            raise BadCall("write_file: `content` must be a string")
        try:
            content.encode()
        except UnicodeEncodeError as e:
            raise BadCall(f"write_file: `content` is not valid Unicode ({e.reason} at "
                          f"{e.start})") from None
        path = self._path(args)
        try:
            with _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
                f.write(content.encode())
        except OSError as e:
            return f"error: {e.strerror or e} ({args.get('path')})"
        return f"wrote {len(content.encode())} bytes to {args.get('path')}"

    def _list_dir(self, args: dict[str, Any]) -> str:
        path = self._path(args, default=".")
        try:
            with os.scandir(path) as it:
                entries = sorted((e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
                                 for e in it)
        except OSError as e:
            return f"error: {e.strerror or e} ({args.get('path', '.')})"
        return "\n".join(entries) or "(empty)"

    def _finish(self, args: dict[str, Any]) -> str:
        summary = args.get("summary", "")
        self.finished = summary if isinstance(summary, str) else str(summary)
        return "finished"


def _text(value: object) -> bool:
    """A string the OS can take: no NUL byte, no lone surrogate."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _on_path(name: str, path: str) -> str | None:
    """The first executable regular file ``name`` in PATH's absolute entries."""
    for d in path.split(os.pathsep):
        if not os.path.isabs(d):
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _open_regular(path: str, flags: int) -> BinaryIO:
    """Open a regular file only: never block on a FIFO, never read a device.

    O_NONBLOCK makes opening a FIFO return at once (or fail with ENXIO), and
    the descriptor's own fstat decides; a model cannot stall the loop past
    its budgets with `mkfifo p` and `read_file p`.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb" if flags & os.O_ACCMODE == os.O_RDONLY else "wb")
    except BaseException:
        os.close(fd)
        raise


def run_argv(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float,
             executable: str | None = None) -> str:
    """Run one command (its own process group, killed whole on timeout);
    ``executable``, when given, is the program (``argv[0]`` its name)."""
    try:
        proc = subprocess.Popen(list(argv), executable=executable, cwd=cwd, env=dict(env),
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    except OSError as e:
        return f"error: cannot start {argv[0]!r}: {e.strerror or e}"
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        status = f"killed after {timeout:.0f} s (timeout)"
        try:
            out, _ = proc.communicate(timeout=GRACE)
        except subprocess.TimeoutExpired:
            # Something that left the process group still holds the output
            # pipe open: stop reading rather than wait on it.
            out = b"[output unavailable: a process outside the command's group kept its "
            out += b"output open]"
            proc.kill()
            assert proc.stdout is not None
            proc.stdout.close()
            proc.wait()
    # What the command left running in its group ends with the call.
    _kill_group(proc.pid)
    return f"{status}\n{clip(out.decode(errors='replace'))}"


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def clip(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n[… {len(text) - OUTPUT_LIMIT} characters omitted …]\n{text[-half:]}"
