"""saphan's own writes and reads in places a run could have written.

A working directory, a worktree's git dir and a repository's ``.git`` may
hold links an earlier run planted. Everything saphan does there — before
the jail exists and after it is gone — goes through this module: paths are
walked one component at a time from a directory saphan trusts, every
component opened with ``O_NOFOLLOW``, so a symbolic link anywhere is
reported by name (:class:`PlantedLink`) instead of followed. Files are
opened ``O_NONBLOCK`` and ``fstat``-ed before a byte moves, so a FIFO or a
device planted under an expected name never stalls or feeds saphan.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from saphan.errors import PlantedLink

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC




def _what(path: str) -> str:
    """What is at ``path``, in words for a PlantedLink (never followed)."""
    try:
        kind = lexists_plain(path)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if kind == "link":
        try:
            return f"a symbolic link (-> {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    return {"dir": "a directory", "file": "a regular file", None: "missing"}.get(
        kind, "a special file (FIFO, socket or device)")


def _components(path: str) -> list[str]:
    if not os.path.isabs(path):
        raise ValueError(f"{path!r} is not an absolute path")
    return [c for c in path.split("/") if c]


@contextmanager
def open_dir(path: str) -> Iterator[int]:
    """A descriptor for the directory ``path``, reached from ``/`` without
    following a link at any component. Raises PlantedLink or FileNotFoundError."""
    fd = os.open("/", _DIR_FLAGS)
    walked = ""
    try:
        for comp in _components(path):
            walked += "/" + comp
            fd = _step(fd, comp, walked)
        yield fd
    finally:
        os.close(fd)


def _step(fd: int, comp: str, walked: str) -> int:
    """The directory ``comp`` below ``fd``, opened without following a link.
    On success ``fd`` is closed and the new descriptor returned; on failure
    ``fd`` stays open for the caller's ``finally`` to close."""
    try:
        nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PlantedLink(walked, _what(walked)) from None
        raise
    os.close(fd)
    return nxt


def makedirs(root: str, rel: str, mode: int = 0o755) -> str:
    """Create ``root/rel`` one component at a time (existing directories are
    fine; a link or a file in the way is PlantedLink). ``root`` itself is
    walked without following links. Returns the absolute path."""
    with open_dir(root) as top:
        fd = os.dup(top)
        walked = root.rstrip("/")
        try:
            for comp in [c for c in rel.split("/") if c]:
                if comp in (".", ".."):
                    raise ValueError(f"{rel!r} must not contain . or ..")
                walked += "/" + comp
                with suppress(FileExistsError):
                    os.mkdir(comp, mode, dir_fd=fd)
                fd = _step(fd, comp, walked)
        finally:
            os.close(fd)
    return walked


def _open_regular(dir_fd: int, name: str, flags: int, where: str, mode: int = 0o644) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PlantedLink(where, _what(where)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PlantedLink(where, _what(where))
    return fd


def read_small(path: str, limit: int = 4096) -> bytes:
    """The content of a small regular file, read without following a link at
    any component; more than ``limit`` bytes is PlantedLink ("too large")."""
    parent, name = os.path.split(path)
    with open_dir(parent) as d:
        fd = _open_regular(d, name, os.O_RDONLY, path)
        try:
            if os.fstat(fd).st_size > limit:
                raise PlantedLink(path, f"larger than {limit} bytes")
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    if len(data) > limit:
        raise PlantedLink(path, f"larger than {limit} bytes")
    return data


def append_line(path: str, line: str) -> None:
    """Append ``line`` (and a newline) to the regular file ``path``, creating
    it if missing; never through a link."""
    parent, name = os.path.split(path)
    with open_dir(parent) as d:
        fd = _open_regular(d, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, path)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)


def write_replace(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace the file at ``path`` with ``data`` (a new file renamed over the
    name, in a parent directory reached without following links)."""
    parent, name = os.path.split(path)
    with open_dir(parent) as d:
        tmp = f".{name}.saphan-{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=d)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)


def lexists_plain(path: str) -> str | None:
    """What is at ``path`` without following its last component: "dir",
    "file", "link", "other" — or None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"
