"""The door: a cut run's one way out, a small proxy on a unix socket.

The jail of a cut run holds only loopback; its bridge exposes this socket as
``127.0.0.1:PORT`` and the proxy variables name it with the run's token. The
door runs in this (the unconfined) process, on an event loop of its own in a
daemon thread, so the caller's synchronous code keeps running. It serves:

- ``CONNECT host:port`` (the HTTPS path): the token in Proxy-Authorization,
  the host and port on the allow-list, and every address the name resolves
  to passing :func:`denied_address`; then bytes are spliced both ways to the
  checked address (TLS stays end to end; the door never looks inside).
- Credential routes (plain HTTP, ``/<route>/rest``): the credential header
  must carry the run's placeholder; the door forwards to the route's
  upstream with the real secret in its place and relays the answer raw.

Every request appends one JSON line to the audit log (never the token, the
placeholder or a secret), and :meth:`Door.stop` returns a summary.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import os
import re
import socket
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from saphan.timefmt import now_iso

if TYPE_CHECKING:
    # Imported on the door's own thread (:meth:`Door._run`): asyncio and ssl
    # cost ~25 ms, which would otherwise sit on every cut run's start-up path
    # (the socket listens before the thread starts: a connection waits in
    # its backlog meanwhile).
    import asyncio
    import ssl

#: the longest request head read (request line and headers)
HEAD_MAX = 64 * 1024
#: how long a client may take to send its request head
HEAD_TIMEOUT = 30.0
#: how long resolving a name and connecting upstream may take (each)
UPSTREAM_TIMEOUT = 30.0
#: one splice read: asyncio's selector transports recv() at most this much;
#: each read goes straight to the peer's transport, whose buffer limits
#: (and the jail's socket's send buffer) are sized from it
CHUNK = 256 * 1024
#: connections served at once; more are closed at once
MAX_CONNECTIONS = 512
#: how long stop() waits for connections to end and the thread to join
STOP_WAIT = 10.0
#: the longest host, route or reason kept in the audit log (hostile input)
FIELD_MAX = 255
#: the most hosts listed in the summary (each list)
LIST_MAX = 50
#: what a route forwards (TRACE/TRACK would echo the secret the door adds)
ROUTE_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: distinct hosts kept while the door runs (each list), and audit lines
#: written: past them a hostile jail grows neither saphan's memory nor its
#: disk — the rest is counted (``hosts_not_kept``, ``audit_lines_suppressed``)
HOSTS_KEPT = 1000
AUDIT_LINES_MAX = 10_000
#: a request target: RFC 3986 characters only (no control character, space
#: or byte above 0x7e reaches the upstream's request line)
_TARGET = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+\Z")
#: a header value: visible ASCII, space and TAB (no NUL, no other control)
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*\Z")

_ROUTE_NAME = re.compile(r"[a-z0-9-]+\Z")
#: RFC 9110 token characters (methods and header names)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
#: what a host name may hold before it reaches the resolver
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]{1,253}\Z")
_VERSION = re.compile(r"HTTP/1\.[01]\Z")
#: the headers a route request loses (Host is the upstream's, Connection is forced)
_DROPPED = frozenset({"host", "proxy-authorization", "proxy-connection", "connection"})
_PHRASES = {200: "Connection established", 400: "Bad Request",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            407: "Proxy Authentication Required", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout",
            505: "HTTP Version Not Supported"}

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: cloud instance metadata services (AWS's IPv4 one is link-local too)
_METADATA = frozenset({"169.254.169.254", "fd00:ec2::254", "100.100.100.200", "168.63.129.16"})
_V4_DENIED = (
    ("0.0.0.0/8", "unspecified address"),
    ("127.0.0.0/8", "loopback address"),
    ("169.254.0.0/16", "link-local address"),
    ("224.0.0.0/4", "multicast address"),
    ("255.255.255.255/32", "broadcast address"),
)
_V6_DENIED = (
    ("::/128", "unspecified address"),
    ("::1/128", "loopback address"),
    ("fe80::/10", "link-local address"),
    ("ff00::/8", "multicast address"),
)
#: IPv6 prefixes whose last 32 bits name an IPv4 address (NAT64 well-known,
#: SIIT's IPv4-translated); mapped and compat forms are handled apart
_V6_EMBEDDING = ("64:ff9b::/96", "::ffff:0:0:0/96")


def denied_address(ip: str) -> str | None:
    """Why the door never connects to ``ip``, whatever the allow-list says
    (None: not denied). IPv6 forms embedding an IPv4 address are judged by
    that address too: ``::ffff:127.0.0.1`` reaches loopback."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    reason = _own_reason(addr)
    if reason is not None or not isinstance(addr, ipaddress.IPv6Address):
        return reason
    inner = _embedded_v4(addr)
    if inner is None:
        return None
    reason = _own_reason(inner)
    return None if reason is None else f"{reason} ({inner} in IPv6 form)"


def _own_reason(addr: _Address) -> str | None:
    if str(addr) in _METADATA:
        return "cloud metadata address"
    rules = _V4_DENIED if isinstance(addr, ipaddress.IPv4Address) else _V6_DENIED
    for net, reason in rules:
        if addr in ipaddress.ip_network(net):
            return reason
    return None


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    value = int(addr)
    # IPv4-compatible (::a.b.c.d, deprecated but still parsed by some stacks)
    if value >> 32 == 0 or any(addr in ipaddress.ip_network(n) for n in _V6_EMBEDDING):
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class Allow:
    """One allow-list entry: an exact host name, an IP literal, or
    ``*.suffix`` (any name ending ``.suffix``, not ``suffix`` itself)."""

    host: str
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        mine, theirs = _norm_host(self.host), _norm_host(host)
        if mine.startswith("*."):
            return _ip(theirs) is None and theirs.endswith(mine[1:])
        a, b = _ip(mine), _ip(theirs)
        if a is not None or b is not None:
            return a == b
        return mine == theirs


@dataclass(frozen=True)
class Route:
    """A credential route, served at ``/<name>/...``."""

    name: str
    upstream: str
    header: str
    prefix: str
    secret: str


def _norm_host(host: str) -> str:
    return host.lower().removesuffix(".")


def _ip(host: str) -> _Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class _Upstream:
    """A route's upstream, parsed once."""

    tls: bool
    host: str
    port: int
    #: what the Host header says (the port only when the URL names one)
    authority: str
    #: the base path, no trailing slash
    base: str


def _parse_upstream(url: str) -> _Upstream:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or parts.username is not None:
        raise ValueError("a route's upstream is http:// or https://host[:port][/base/path]")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    authority = shown if parts.port is None else f"{shown}:{parts.port}"
    return _Upstream(tls, host, port, authority, parts.path.rstrip("/"))


class _BadRequest(Exception):
    """A request the door answers with ``status`` (reason: for the audit)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class _Head:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]


def _parse_head(raw: bytes) -> _Head:
    lines = raw[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _TARGET.match(parts[1]):
        # a control character, TAB or bare LF in the target would reach the
        # upstream's request line ahead of the headers the door adds
        raise _BadRequest(400, "malformed request line")
    if not _VERSION.match(parts[2]):
        raise _BadRequest(505, "unsupported HTTP version")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        # bare CR/LF or folded lines are how requests get smuggled: refused
        if not sep or not _TOKEN.match(name) or not _FIELD_VALUE.match(value):
            raise _BadRequest(400, "malformed header line")
        headers.append((name, value.strip(" \t")))
    return _Head(parts[0], parts[1], parts[2], headers)


def _split_authority(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (CONNECT's target)."""
    if text.startswith("["):
        end = text.find("]")
        host, port = text[1:end], text[end + 2:]
        if end < 0 or text[end + 1:end + 2] != ":" \
                or not isinstance(_ip(host), ipaddress.IPv6Address):
            raise _BadRequest(400, "malformed CONNECT target")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host or not _HOST_NAME.match(host):
            raise _BadRequest(400, "malformed CONNECT target")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise _BadRequest(400, "malformed CONNECT target")
    return host, int(port)


def _authorized(values: list[str], token: str) -> bool:
    """One Proxy-Authorization: ``Basic base64(any:<token>)`` or ``Bearer <token>``."""
    if len(values) != 1:
        return False
    scheme, _, cred = values[0].partition(" ")
    cred = cred.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(cred.encode("latin-1"), token.encode())
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(cred, validate=True)
    except (binascii.Error, ValueError):
        return False
    _, sep, password = decoded.partition(b":")
    return bool(sep) and hmac.compare_digest(password, token.encode())


def _route_target(target: str) -> tuple[str | None, str]:
    """The host named (None: origin-form) and the path (and query) of a route
    request's target; absolute-form is accepted only naming the door itself
    (it is no plain-HTTP forward proxy)."""
    if target.startswith("/"):
        return None, target
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise _BadRequest(400, "malformed request target")
    authority, slash, path = rest.partition("/")
    host = authority.rsplit("@", 1)[-1]
    host = host[1:host.find("]")] if host.startswith("[") else host.partition(":")[0]
    if scheme.lower() != "http" or _norm_host(host) not in ("127.0.0.1", "localhost"):
        raise _BadRequest(403, f"plain HTTP goes only to the door's routes, not {host}")
    return _norm_host(host), slash + path


def _split_route(path: str) -> tuple[str, str]:
    """``/<route>/rest?query`` -> (route, ``/rest?query``)."""
    path_only, q, query = path.partition("?")
    name, slash, rest = path_only[1:].partition("/")
    segments = rest.split("/")
    lowered = [s.lower().replace("%2e", ".") for s in segments]
    # the route's base path is the upstream's: no climbing out of it
    if "." in lowered or ".." in lowered:
        raise _BadRequest(400, "dot segments in a route path")
    # nor by what a decoding upstream turns into a separator or a dot segment
    # (`..%2f`, `%252e`, `..;`, a backslash)
    if any(bad in path_only.lower() for bad in ("%2f", "%5c", "%25", ";", "\\")):
        raise _BadRequest(400, "an encoded separator, '%25', ';' or '\\' in a route path")
    return name, slash + rest + q + query


def _check_framing(head: _Head) -> None:
    """One unambiguous body framing (RFC 9112 §6.1): the door relays the body
    raw, so a Content-Length next to a Transfer-Encoding, a coding other than
    one `chunked`, or two different lengths would let the upstream read a
    second request the door never looked at."""
    te = head.values("transfer-encoding")
    cl = head.values("content-length")
    if te and cl:
        raise _Denied(400, "both Content-Length and Transfer-Encoding")
    if te and (len(te) != 1 or te[0].strip().lower() != "chunked"):
        raise _Denied(400, "a Transfer-Encoding other than one `chunked`")
    if cl and (len(set(cl)) != 1 or not cl[0].isdigit()):
        raise _Denied(400, "a malformed or repeated Content-Length")


def _response(status: int, reason: str, extra: str = "") -> bytes:
    body = f"saphan door: {reason}\n".encode("latin-1", "replace")
    return (f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n{extra}"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("latin-1") + body


@dataclass
class _Record:
    """One request's audit line, filled as it is served."""

    kind: str = "other"
    host: str | None = None
    port: int | None = None
    route: str | None = None
    verdict: str = "denied"
    reason: str | None = None
    status: int | None = None
    up: int = 0
    down: int = 0
    written: bool = False


class _Denied(Exception):
    """The request is refused: answered with ``status``, audited denied."""

    def __init__(self, status: int, reason: str, extra: str = "", *,
                 verdict: str = "denied") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.extra = extra
        #: "allowed" when the policy let the request through but its upstream
        #: could not be reached (answered 502 all the same)
        self.verdict = verdict


class _Side:  # an asyncio protocol (duck-typed: asyncio is imported on the door's thread)
    """One socket of a connection (the client's or the upstream's): it
    gathers what arrives until it is relayed, then passes each read straight
    to its peer's transport, pausing when the peer's buffer is full."""

    def __init__(self, on_made: Callable[[_Side], None] | None = None) -> None:
        self._on_made = on_made
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connection
        self.buffer = bytearray()
        self.peer: _Side | None = None
        self.counted: Callable[[bytes], bool] | None = None
        #: set on any change (data, end, loss): what a waiting task wakes on
        self.changed = asyncio.Event()
        #: nothing more will be read (EOF, or the connection is gone)
        self.eof = False
        self.lost = asyncio.Event()

    # -- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # backpressure (what drain() waits on): over `high` buffered, the peer
        # stops reading (pause_writing) until it is down to `low`
        transport.set_write_buffer_limits(high=4 * CHUNK, low=CHUNK)
        # a unix socket's default send buffer (~200 KiB) halved the download
        # rate: each 256 KiB read took two turns of the loop to pass on
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * CHUNK)
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            if self.counted is not None and not self.counted(data):
                return  # cut: not passed on
            self.peer.send(data)
            return
        seen = len(self.buffer)
        self.buffer += data
        # before relaying, hold at most a head's worth: the rest waits in the kernel
        if b"\r\n\r\n" in self.buffer[max(0, seen - 3):] or len(self.buffer) > HEAD_MAX:
            self.transport.pause_reading()
        self.changed.set()

    def eof_received(self) -> bool:
        self.eof = True
        if self.peer is not None:
            self.peer.send_eof()
        self.changed.set()
        return True  # keep the other way open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost.set()
        self.changed.set()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.eof:
            self.peer.transport.resume_reading()

    # -- the door's side -------------------------------------------------------------

    async def head(self) -> tuple[bytes, bytes]:
        """The request head (through its blank line) and whatever followed
        it (forwarded first when relaying)."""
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                if end + 4 > HEAD_MAX:
                    break
                head, rest = bytes(self.buffer[:end + 4]), bytes(self.buffer[end + 4:])
                self.buffer.clear()
                return head, rest
            if len(self.buffer) > HEAD_MAX:
                break
            if self.eof:
                raise asyncio.IncompleteReadError(bytes(self.buffer), None)
            self.changed.clear()
            await self.changed.wait()
        raise _BadRequest(431, "request head over 64 KiB")

    def send(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def send_eof(self) -> None:
        if not self.transport.is_closing() and self.transport.can_write_eof():
            self.transport.write_eof()

    def relay(self, peer: _Side, counted: Callable[[bytes], bool], changed: asyncio.Event) -> None:
        """From now on what arrives goes to ``peer`` (``counted`` first)."""
        self.peer, self.counted, self.changed = peer, counted, changed

    def start(self) -> None:
        """Pass on what arrived before relaying, then read again."""
        if self.buffer:
            data, self.buffer = bytes(self.buffer), bytearray()
            self.data_received(data)
        if self.eof:
            if self.peer is not None:
                self.peer.send_eof()
        elif not self.transport.is_closing():
            self.transport.resume_reading()
        self.changed.set()


class Door:
    """A run's door: start() binds its socket and serves on a thread of its
    own; stop() ends it and returns the summary."""

    def __init__(self, socket_path: str, *, token: str, placeholder: str,
                 allow: tuple[Allow, ...], routes: tuple[Route, ...], audit_path: str) -> None:
        if not token or not placeholder:
            raise ValueError("the door needs a token and a placeholder")
        for r in routes:
            if not _ROUTE_NAME.match(r.name) or not _TOKEN.match(r.header):
                raise ValueError(f"bad route name or header: {r.name!r}")
        self.socket_path = socket_path
        self.audit_path = audit_path
        self._token = token
        self._placeholder = placeholder
        self._allow = allow
        self._routes = {r.name: (r, _parse_upstream(r.upstream)) for r in routes}
        # never in the audit log, whatever a hostile client puts in a host name
        self._scrub = tuple(s for s in (token, placeholder, *(r.secret for r in routes)) if s)
        self._tls: ssl.SSLContext | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop_requested = threading.Event()
        self._failure: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._active: set[asyncio.Task[None]] = set()
        self._audit_file: IO[str] | None = None
        self._sock_ino: tuple[int, int] | None = None
        self._summary: dict[str, Any] | None = None
        self._counts = {"requests": 0, "allowed": 0, "denied": 0, "bytes_up": 0, "bytes_down": 0,
                        "audit_lines_suppressed": 0, "hosts_not_kept": 0}
        self._hosts: set[str] = set()
        self._denied_hosts: set[str] = set()
        self._lines = 0

    # -- lifecycle (caller's thread) ------------------------------------------

    def start(self) -> None:
        """Bind the socket (0600), start the thread; return once it accepts."""
        if self._thread is not None:
            raise RuntimeError("the door was started already")
        sock = self._bind()
        try:
            self._audit_file = open(self.audit_path, "a", encoding="utf-8",  # noqa: SIM115
                                    opener=lambda p, f: os.open(p, f, 0o600))
        except OSError:
            self._unlink(sock)
            raise
        self._thread = threading.Thread(target=self._run, args=(sock,), name="saphan-door",
                                        daemon=True)
        self._thread.start()
        # Not waiting for the loop: the socket listens already, and a client
        # (the bridge's check first) waits in its backlog until it serves.

    def stop(self) -> dict[str, Any]:
        """Close the listener and every connection, join the thread (bounded),
        return the summary. Idempotent."""
        if self._summary is not None:
            return self._summary
        self._stop_requested.set()  # seen by a loop not made yet (_serve)
        loop, thread = self._loop, self._thread
        if thread is not None and thread.is_alive():
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop ended on its own
                    loop.call_soon_threadsafe(self._signal_stop)
                thread.join(STOP_WAIT)
            else:
                # Still importing its modules: nothing was served (a run as
                # short as `true`). The thread ends by itself on seeing the
                # request; not waited for, its socket file removed here.
                self._remove_socket_file()
        self._close_audit()
        self._summary = self._summarize()
        return self._summary

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.socket_path)
            st = os.stat(self.socket_path)
            self._sock_ino = (st.st_dev, st.st_ino)  # ours: removed on failure and at stop
            # before listen(): nobody can connect until the mode is 0600
            os.chmod(self.socket_path, 0o600)
            sock.setblocking(False)
            sock.listen(128)
        except OSError:
            self._unlink(sock)
            raise
        return sock

    def _unlink(self, sock: socket.socket) -> None:
        """Close ``sock`` and remove its file, if the file is still ours."""
        sock.close()
        self._remove_socket_file()

    def _remove_socket_file(self) -> None:
        with contextlib.suppress(OSError):
            st = os.lstat(self.socket_path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._sock_ino:
                os.unlink(self.socket_path)

    def _close_audit(self) -> None:
        if self._audit_file is not None:
            suppressed = self._counts["audit_lines_suppressed"]
            if suppressed:
                with contextlib.suppress(OSError, ValueError):
                    self._audit_file.write(json.dumps(
                        {"time": now_iso(), "kind": "suppressed", "count": suppressed,
                         "why": f"the log keeps the first {AUDIT_LINES_MAX} requests; the "
                                "rest are counted in the summary"}) + "\n")
            self._audit_file.close()
            self._audit_file = None

    def _summarize(self) -> dict[str, Any]:
        failed = {"door_failed": f"{type(self._failure).__name__}: {self._failure}"} \
            if self._failure is not None else {}
        return {**self._counts, **failed,
                "hosts": sorted(self._hosts)[:LIST_MAX],
                "denied_hosts": sorted(self._denied_hosts)[:LIST_MAX],
                "audit_log": self.audit_path}

    # -- the loop's thread ----------------------------------------------------

    def _run(self, sock: socket.socket) -> None:
        global asyncio, ssl
        import asyncio
        import ssl

        self._loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(sock))
        except BaseException as e:  # reported to start(), or the door just ends
            self._failure = e
        finally:
            self._ready.set()
            self._unlink(sock)
            # getaddrinfo's worker threads (a resolver hung past its timeout is left behind)
            with contextlib.suppress(Exception):
                loop.run_until_complete(
                    asyncio.wait_for(loop.shutdown_default_executor(), STOP_WAIT / 4))
            loop.close()

    async def _serve(self, sock: socket.socket) -> None:
        self._stopping = asyncio.Event()
        if self._stop_requested.is_set():  # stop() came before this loop was made
            self._stopping.set()
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(
            lambda: cast("asyncio.Protocol", _Side(self._accepted)), sock=sock)
        self._ready.set()
        await self._stopping.wait()
        server.close()
        # every connection's task ends: each aborts its sockets and audits
        # what it served
        tasks = set(self._active)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT / 2)
        # aborted transports close their sockets in callbacks of the next turns
        for _ in range(2):
            await asyncio.sleep(0)

    def _signal_stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def _accepted(self, client: _Side) -> None:
        """A client connected: its own task serves it (or, over the limit, it
        is answered 503 and closed at once)."""
        stopping = self._stopping is not None and self._stopping.is_set()
        if stopping or len(self._active) >= MAX_CONNECTIONS:
            reason = "the door is stopping" if stopping else "too many connections"
            client.send(_response(503, reason))
            client.transport.close()
            self._audit(_Record(reason=reason, status=503))
            return
        task = asyncio.get_running_loop().create_task(self._serve_client(client))
        self._active.add(task)
        task.add_done_callback(self._active.discard)

    async def _serve_client(self, client: _Side) -> None:
        rec = _Record()
        sides = [client]
        try:
            await self._handle(client, rec, sides)
        except _Denied as e:
            rec.verdict, rec.reason, rec.status = e.verdict, e.reason, e.status
            self._audit(rec)
            client.send(_response(e.status, e.reason, e.extra))
        except asyncio.CancelledError:
            # the door is stopping: this task is the connection's own, ended
            # here; a connection that had not yet made a request is not one
            if rec.kind != "other" or rec.status is not None:
                rec.reason = rec.reason or "the door stopped"
        except Exception as e:  # one bad connection never stops the door
            rec.reason = f"door error: {type(e).__name__}"
        finally:
            if rec.status is not None or rec.reason is not None:
                self._audit(rec)
            await self._close(sides)

    async def _close(self, sides: list[_Side]) -> None:
        """Flush what is still buffered and close; at once when stopping, or
        when a peer does not take the rest within seconds."""
        if self._stopping is None or not self._stopping.is_set():
            for side in sides:
                side.transport.close()
            try:
                async with asyncio.timeout(5):
                    for side in sides:
                        await side.lost.wait()
                return
            except (asyncio.CancelledError, TimeoutError):
                pass  # stopped meanwhile (this is the connection's own task), or stuck
        for side in sides:
            side.transport.abort()

    async def _handle(self, client: _Side, rec: _Record, sides: list[_Side]) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                raw, rest = await client.head()
            head = _parse_head(raw)
        except TimeoutError:
            raise _Denied(408, "no request head within 30 s") from None
        except asyncio.IncompleteReadError as e:
            if e.partial:
                rec.reason = "client closed before a whole request head"
            return
        except _BadRequest as e:
            raise _Denied(e.status, e.reason) from None
        if head.method.upper() == "CONNECT":
            await self._connect(head, rest, client, rec, sides)
        else:
            await self._route(head, rest, client, rec, sides)

    # -- CONNECT ----------------------------------------------------------------

    async def _connect(self, head: _Head, rest: bytes, client: _Side, rec: _Record,
                       sides: list[_Side]) -> None:
        rec.kind = "connect"
        try:
            host, port = _split_authority(head.target)
        except _BadRequest as e:
            rec.host = head.target
            if not _authorized(head.values("proxy-authorization"), self._token):
                raise self._auth_denied() from None
            raise _Denied(e.status, e.reason) from None
        rec.host, rec.port = _norm_host(host), port
        if not _authorized(head.values("proxy-authorization"), self._token):
            raise self._auth_denied()
        if not any(a.matches(host, port) for a in self._allow):
            raise _Denied(403, "host and port not on the egress allow-list")
        addresses = await self._resolve(rec.host, port, denied_status=403)
        up = await self._dial(addresses, port)
        sides.append(up)
        rec.verdict, rec.status = "allowed", 200
        client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await self._splice(client, up, rec, rest, route=False)

    def _auth_denied(self) -> _Denied:
        return _Denied(407, "missing or wrong proxy token",
                       'Proxy-Authenticate: Basic realm="saphan"\r\n')

    async def _resolve(self, host: str, port: int, *, denied_status: int) -> list[str]:
        """Every address ``host`` names, each passing :func:`denied_address`
        (a name resolving to a mix is refused whole: rebinding); else the
        request is refused with ``denied_status``."""
        if _ip(host) is not None:
            addresses = [host]
        else:
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(UPSTREAM_TIMEOUT):
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                   proto=socket.IPPROTO_TCP)
            except (OSError, TimeoutError) as e:
                raise _Denied(502, f"cannot resolve: {type(e).__name__}",
                              verdict="allowed") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            reason = denied_address(address)
            if reason is not None:
                raise _Denied(denied_status, f"{host} resolves to a denied {reason}: {address}")
        if not addresses:
            raise _Denied(502, "the name resolves to nothing", verdict="allowed")
        return addresses

    async def _dial(self, addresses: list[str], port: int, *,
                    tls: ssl.SSLContext | None = None, server_hostname: str | None = None,
                    ) -> _Side:
        """Connect to the first checked address that answers (never re-resolving)."""
        loop = asyncio.get_running_loop()
        failure = "no address"
        for address in addresses:
            try:
                async with asyncio.timeout(UPSTREAM_TIMEOUT):
                    _, up = await loop.create_connection(
                        lambda: cast("asyncio.Protocol", _Side()), address, port, ssl=tls,
                        server_hostname=server_hostname)
                return cast(_Side, up)
            except (OSError, TimeoutError, ssl.SSLError) as e:
                failure = type(e).__name__
        # the policy let it through; the upstream failed
        raise _Denied(502, f"upstream unreachable: {failure}", verdict="allowed")

    # -- credential routes -------------------------------------------------------

    async def _route(self, head: _Head, rest: bytes, client: _Side, rec: _Record,
                     sides: list[_Side]) -> None:
        try:
            host, target = _route_target(head.target)
            rec.host = host
            name, path = _split_route(target)
        except _BadRequest as e:
            raise _Denied(e.status, e.reason) from None
        rec.kind, rec.route = "route", name
        found = self._routes.get(name)
        if found is None:
            raise _Denied(404, "no such route")
        if head.method not in ROUTE_METHODS:
            # TRACE echoes the request — the secret the door adds — back
            raise _Denied(405, f"method {head.method} is not forwarded on a route")
        _check_framing(head)
        route, up_url = found
        rec.host, rec.port = up_url.host, up_url.port
        values = head.values(route.header.lower())
        expected = (route.prefix + self._placeholder).encode()
        if len(values) != 1 or not hmac.compare_digest(values[0].encode("latin-1"), expected):
            raise _Denied(403, f"the route's {route.header} header does not hold the placeholder")
        addresses = await self._resolve(up_url.host, up_url.port, denied_status=502)
        if up_url.tls and self._tls is None:
            self._tls = ssl.create_default_context()
        up = await self._dial(addresses, up_url.port, tls=self._tls if up_url.tls else None,
                              server_hostname=up_url.host if up_url.tls else None)
        sides.append(up)
        rec.verdict = "allowed"
        first = self._forward_head(head, route, up_url, path) + rest
        await self._splice(client, up, rec, first, route=True,
                           secret=route.secret.encode("latin-1"))
        if rec.down == 0 and rec.verdict == "allowed":
            rec.reason = "the upstream closed without an answer"
            rec.status = 502
            client.send(_response(502, rec.reason))

    def _forward_head(self, head: _Head, route: Route, up: _Upstream, path: str) -> bytes:
        target = (up.base + path) or "/"
        if not target.startswith("/"):
            target = "/" + target
        lines = [f"{head.method} {target} {head.version}", f"Host: {up.authority}"]
        for k, v in head.headers:
            low = k.lower()
            if low == route.header.lower():
                lines.append(f"{k}: {route.prefix}{route.secret}")
            elif low not in _DROPPED and low != "accept-encoding":
                lines.append(f"{k}: {v}")
        # uncompressed, so the answer can be searched for the secret (_splice)
        lines.append("Accept-Encoding: identity")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    # -- splicing ----------------------------------------------------------------

    async def _splice(self, client: _Side, up: _Side, rec: _Record, first: bytes, *,
                      route: bool, secret: bytes = b"") -> None:
        """Bytes both ways, half-closes passed on; done when both ways end
        (CONNECT) or when the upstream's answer ends (a route: the upstream
        was told Connection: close). A route's answer that holds its secret
        (an upstream echoing the request) is cut before those bytes reach
        the jail."""
        tail = b""

        def went_up(data: bytes) -> bool:
            rec.up += len(data)
            return True

        def went_down(data: bytes) -> bool:
            nonlocal tail
            if rec.status is None:  # a route: the upstream's answer is what was sent
                rec.status = _status_line(data)
            if secret:
                window = tail + data
                if secret in window:
                    rec.verdict = "denied"
                    rec.reason = "the upstream's answer held the route's secret: cut"
                    client.transport.abort()
                    up.transport.abort()
                    return False
                tail = window[-(len(secret) - 1):]
            rec.down += len(data)
            return True

        changed = asyncio.Event()
        client.relay(up, went_up, changed)
        up.relay(client, went_down, changed)
        if first:
            went_up(first)
            up.send(first)
        client.start()
        up.start()
        while not (client.lost.is_set() or (up.eof if route else
                                            (up.lost.is_set() or (client.eof and up.eof)))):
            changed.clear()
            await changed.wait()

    # -- audit --------------------------------------------------------------------

    def _audit(self, rec: _Record) -> None:
        if rec.written:
            return
        rec.written = True
        host = self._clean(rec.host)
        line = {"time": now_iso(), "kind": rec.kind, "host": host, "port": rec.port,
                "route": self._clean(rec.route), "verdict": rec.verdict,
                "reason": self._clean(rec.reason), "status": rec.status,
                "up": rec.up, "down": rec.down}
        self._count(line)
        if self._lines >= AUDIT_LINES_MAX:
            self._counts["audit_lines_suppressed"] += 1
            return
        self._lines += 1
        if self._audit_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._audit_file.write(json.dumps(line) + "\n")
                self._audit_file.flush()

    def _count(self, line: dict[str, Any]) -> None:
        c = self._counts
        c["requests"] += 1
        c[line["verdict"]] += 1
        c["bytes_up"] += line["up"]
        c["bytes_down"] += line["down"]
        if line["host"] is not None:
            host = line["host"]
            shown = f"[{host}]" if ":" in host and _ip(host) is not None else host
            where = shown if line["port"] is None else f"{shown}:{line['port']}"
            kept = self._hosts if line["verdict"] == "allowed" else self._denied_hosts
            if where in kept or len(kept) < HOSTS_KEPT:
                kept.add(where)
            else:
                self._counts["hosts_not_kept"] += 1

    def _clean(self, text: str | None) -> str | None:
        if text is None:
            return None
        for s in self._scrub:
            text = text.replace(s, "[redacted]")
        return text[:FIELD_MAX]


def _status_line(data: bytes) -> int | None:
    """The status an upstream's answer starts with (what the client got)."""
    m = re.match(rb"HTTP/\d(?:\.\d)? (\d{3})", data)
    return int(m.group(1)) if m else None
