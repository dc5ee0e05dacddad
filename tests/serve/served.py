"""The dashboard under test: `saphan serve` started for real, as the
operator starts it, on a port it picks (--bind 127.0.0.1:0), and requests
sent with http.client byte for byte (a path is not normalised on the way:
``/run/../x`` reaches the server as written)."""

from __future__ import annotations

import http.client
import importlib.util
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conftest import Saphan, require, saphan_exe


def require_serve() -> None:
    require(all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn")),
            "the serve extra (pip install 'saphan[serve]': starlette, uvicorn)")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass
class Served:
    name: str  # the URL's host: the page's own name (s-<random>.localhost) or the bind's
    port: int
    token: str
    url: str
    proc: subprocess.Popen[str]
    startup: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"  # where the requests connect

    @property
    def base(self) -> str:
        return f"http://{self.name}:{self.port}"

    def get(self, path: str, *, token: bool = True, headers: dict[str, str] | None = None,
            method: str = "GET") -> Reply:
        """``path`` as written, sent to 127.0.0.1 naming the page's own host (as a
        browser sends it); with the token as a bearer header unless ``token`` is False."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            sent = {"Host": f"{self.name}:{self.port}"}
            if token:
                sent["Authorization"] = f"Bearer {self.token}"
            sent.update(headers or {})
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in sent.items():
                conn.putheader(k, v)
            conn.endheaders()
            r = conn.getresponse()
            return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()


@contextmanager
def serving(s: Saphan, *args: str, ready: float = 30.0) -> Iterator[Served]:
    """`saphan serve --bind 127.0.0.1:0 ARGS…` until the block ends; the URL read from
    its startup lines. The server is stopped with SIGINT (as Ctrl-C) and must end."""
    require_serve()
    proc = subprocess.Popen([saphan_exe(), "serve", "--bind", "127.0.0.1:0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=s.env(), stdin=subprocess.DEVNULL)
    lines: list[str] = []
    deadline = time.monotonic() + ready
    assert proc.stdout is not None
    fd, got = proc.stdout.fileno(), b""
    try:
        while not any("open:" in line for line in lines):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
                raise AssertionError(f"saphan serve did not print its URL: {lines} {err}")
            # the pipe's own bytes, not its text buffer: select sees what is unread
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                got += chunk
                lines = got.decode("utf-8", "replace").splitlines()
        url = next(line.split("open:", 1)[1].strip() for line in lines if "open:" in line)
        m = re.fullmatch(r"http://([0-9a-z.-]+):(\d+)/\?token=([A-Za-z0-9_-]+)", url)
        assert m, url
        yield Served(m.group(1), int(m.group(2)), m.group(3), url, proc, lines)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any], timeout: float = 15) -> int:
    """End a process as Ctrl-C does (SIGINT), SIGKILL past ``timeout``; its
    pipes closed. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return proc.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
