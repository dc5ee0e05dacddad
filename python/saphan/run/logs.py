"""`saphan runs logs ID [-f]`: a run's output as saphan kept it.

Every run's output is written, as it arrives, to ``runs/<id>/stdout.log``
and ``stderr.log`` in the workspace (a far run's too: it streams back).
They are copied here byte for byte — stdout.log to stdout, stderr.log to
stderr — opened without following a link. On a terminal, control
characters other than newline and tab are shown escaped (``\\x1b``): a
run's bytes never drive the operator's terminal. With ``follow`` the copy
goes on while the run's row is live and ends once it is finished, after
what was written last.

:func:`window` reads a part of one of them the same way (the dashboard's
output tail, serve/): from an offset, or the last bytes, at most a limit.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store.rows import RunRow

#: how often a followed run's files and row are read again (seconds)
POLL_SECONDS = 0.25
CHUNK = 1 << 16
STREAMS = ("stdout", "stderr")


def escaped(data: bytes) -> bytes:
    """Control characters (but newline and tab) and DEL as ``\\xNN``."""
    if not any((b < 0x20 and b not in (0x09, 0x0A)) or b == 0x7F for b in data):
        return data
    return b"".join(bytes([b]) if (b >= 0x20 and b != 0x7F) or b in (0x09, 0x0A)
                    else f"\\x{b:02x}".encode() for b in data)


@dataclass
class _Tail:
    path: str
    sink: BinaryIO
    escape: bool
    fd: int | None = None
    copied: int = field(default=0)

    def pump(self) -> int:
        """Copy what was written since the last call; the bytes copied."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                                  | os.O_NONBLOCK)
            except OSError:
                return 0  # not there (yet): a refused run has no output
            import stat

            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                os.close(self.fd)
                self.fd = None
                return 0
        n = 0
        while chunk := os.read(self.fd, CHUNK):
            self.sink.write(escaped(chunk) if self.escape else chunk)
            n += len(chunk)
        if n:
            self.sink.flush()
        self.copied += n
        return n

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class Window:
    """Bytes ``start``..``end`` of a run's log, whose size was ``size`` when read."""

    data: bytes
    start: int
    end: int
    size: int


def window(ctx: Context, run_id: str, stream: str, start: int | None, limit: int) -> Window:
    """At most ``limit`` bytes of the run's ``stream`` log (stdout or stderr)
    from byte ``start``, or its last ``limit`` bytes when ``start`` is None;
    opened without following a link, a regular file only (else empty)."""
    import stat

    if stream not in STREAMS:
        raise ValueError(f"no such stream {stream!r}")
    path = ctx.workspace.run_dir(run_id) / f"{stream}.log"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return Window(b"", start or 0, start or 0, 0)  # a refused run has none
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Window(b"", start or 0, start or 0, 0)
        size = st.st_size
        at = max(0, size - limit) if start is None else min(max(0, start), size)
        data = os.pread(fd, min(limit, size - at), at) if size > at else b""
    finally:
        os.close(fd)
    return Window(data, at, at + len(data), size)


def copy(ctx: Context, row: RunRow, out: BinaryIO, err: BinaryIO, *, follow: bool = False,
         escape_out: bool = False, escape_err: bool = False) -> RunRow:
    """Copy the run's logs to ``out``/``err`` (module docstring); the row as
    last read (finished, unless the copy was not following)."""
    run_dir = ctx.workspace.run_dir(row.id)
    tails = [_Tail(str(run_dir / f"{name}.log"), sink, esc)
             for name, sink, esc in (("stdout", out, escape_out), ("stderr", err, escape_err))]
    try:
        for t in tails:
            t.pump()
        while follow and row.live:
            time.sleep(POLL_SECONDS)
            got = ctx.store.get_run(row.id)
            for t in tails:
                t.pump()
            if got is None:
                break
            row = got
        for t in tails:  # what was written between the last read and the row's end
            t.pump()
    finally:
        for t in tails:
            t.close()
    return row
