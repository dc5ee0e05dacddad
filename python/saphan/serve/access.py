"""Who may reach the dashboard: the bind, the token, the Host header.

    parse_bind(text)          HOST:PORT (``[::1]:PORT`` for IPv6) as a Bind
    check_bind(bind, remote)  a bind that is not loopback is refused unless
                              --allow-remote was given (UserError naming it)
    new_token()               32 random bytes, URL-safe: a new one per start
    new_name()                ``s-<16 hex>.localhost``: the page's own host name,
                              new at every start (a loopback bind)
    token_ok(given, token)    compared in constant time
    host_of(header)           the name in a Host header (any port: an SSH
                              tunnel's local one), or None when malformed
    startup(...)              what `saphan serve` prints once: the URL with the
                              token, and who can reach it (startup_lines: as text)

The token travels as ``?token=`` in the URL printed at start; the first page
opened with it sets one cookie (HttpOnly, SameSite=Strict) and redirects to
the same page without it, so the token does not stay in the address bar. A
program may send it as ``Authorization: Bearer TOKEN`` instead.

Why a name of its own: a cookie is scoped to a host NAME, not to a port, so
a cookie set by ``127.0.0.1:8470`` is sent to every server on 127.0.0.1 —
another user's among them. Browsers resolve every ``*.localhost`` name to
loopback themselves (RFC 6761; Chromium and Firefox do, without DNS), so a
loopback dashboard is served as ``http://s-<random>.localhost:PORT/``: its
cookie goes to that name only, which no other server is ever visited under.
On a loopback bind the Host a request names must be that name (the cookie
and ``?token=`` are honoured only there) or a loopback address or
``localhost`` (a program with the bearer token; a ``?token=`` there is sent
on to the name, with no cookie set). Any other Host — a page elsewhere that
re-points its own name at 127.0.0.1 (DNS rebinding) — is turned away before
the token is looked at.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from dataclasses import dataclass

from saphan.errors import UserError

DEFAULT_BIND = "127.0.0.1:8470"


@dataclass(frozen=True)
class Bind:
    host: str
    port: int

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_bind(text: str) -> Bind:
    """``HOST:PORT`` (port 0: any free port), or ``[V6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--bind {text!r}: give HOST:PORT, e.g. {DEFAULT_BIND} "
                        "(port 0 picks a free one)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() or c in "/?#@[]" for c in host):
        raise UserError(f"--bind {text!r}: {host!r} is not a host name or address")
    return Bind(host, int(port))


def _addresses(host: str) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise UserError(f"--bind: {host!r} does not resolve ({e})") from None
    return sorted({str(i[4][0]) for i in infos})


def is_loopback(host: str) -> bool:
    """Every address ``host`` names is a loopback address."""
    found = _addresses(host)
    return bool(found) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback
                               for a in found)


def check_bind(bind: Bind, allow_remote: bool) -> None:
    if not allow_remote and not is_loopback(bind.host):
        raise UserError(
            f"--bind {bind.url_host}:{bind.port} is not a loopback address: the dashboard "
            "would be reachable from other machines (with the token, over plain HTTP). "
            "Bind 127.0.0.1 and reach it over an SSH tunnel (ssh -L PORT:127.0.0.1:PORT "
            "HOST), or give --allow-remote to accept that")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_ok(given: str | None, token: str) -> bool:
    if not given or len(given) > 256:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def cookie_name(port: int) -> str:
    return f"saphan-token-{port}"


_LOOPBACK_NAMES = ("localhost", "localhost.")


def new_name() -> str:
    return f"s-{secrets.token_hex(8)}.localhost"


def host_of(header: str | None) -> tuple[str, str] | None:
    """(name, port) of a Host header (port "" when none given); None when it
    is not ``NAME``, ``NAME:PORT``, ``[V6]`` or ``[V6]:PORT``."""
    if not header:
        return None
    host = header.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep:
            return None
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        name, _, port = host.partition(":")
    if not name or (port and (not port.isdigit() or len(port) > 5)):
        return None
    if any(c in name for c in "@/\\ \t[]"):
        return None
    return name, port


def is_loopback_name(name: str) -> bool:
    """A Host name that means this machine without asking DNS."""
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def startup(bind: Bind, port: int, token: str, remote: bool, store: str,
            name: str | None = None) -> dict[str, object]:
    """What `saphan serve` says once it listens (``--json`` prints it as is);
    ``name``: the loopback dashboard's own host name (:func:`new_name`)."""
    if remote:
        who = (f"anyone who can reach {bind.url_host}:{port} over the network and has the "
               "token (plain HTTP: the token and the pages cross the network unencrypted)")
    else:
        who = "this machine only (loopback), with the token"
    return {"url": f"http://{name or bind.url_host}:{port}/?token={token}",
            "name": name or bind.host, "port": port, "token": token, "store": store,
            "reachable": who}


def startup_lines(said: dict[str, object]) -> list[str]:
    return [
        f"saphan serve: a read-only view of {said['store']}",
        f"  open:      {said['url']}",
        f"  reachable: {said['reachable']}",
        "  the token is new at every start and shown only here; Ctrl-C stops the server",
    ]
