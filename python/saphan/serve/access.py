"""Who may reach the dashboard: the bind, the token, the Host header.

    parse_bind(text)          HOST:PORT (``[::1]:PORT`` for IPv6) as a Bind
    check_bind(bind, remote)  a bind that is not loopback is refused unless
                              --allow-remote was given (UserError naming it)
    new_token()               32 random bytes, URL-safe: a new one per start
    token_ok(given, token)    compared in constant time
    host_ok(host, bind)       a loopback bind answers only requests whose Host
                              names a loopback address or ``localhost``, on any
                              port (an SSH tunnel's local one) (a page
                              elsewhere that re-points its own name at 127.0.0.1
                              — DNS rebinding — is turned away before the token
                              is even looked at)
    startup_lines(...)        what `saphan serve` prints once: the URL with the
                              token, and who can reach it

The token travels as ``?token=`` in the URL printed at start; the first page
opened with it sets one cookie (HttpOnly, SameSite=Strict, named for the
port: two dashboards on one host keep their own) and redirects to the same
page without it, so the token does not stay in the address bar or history.
A program may send it as ``Authorization: Bearer TOKEN`` instead.
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


def host_ok(host_header: str | None, bind: Bind, remote: bool) -> bool:
    """The request's Host names this dashboard (see the module docstring)."""
    if remote:
        return True
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    # Any port: an SSH tunnel (ssh -L 9000:127.0.0.1:8470) arrives with its
    # own. What the check is for is the name: a page whose name resolves to
    # 127.0.0.1 sends that name.
    if port and not port.isdigit():
        return False
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def startup_lines(bind: Bind, port: int, token: str, remote: bool, store: str) -> list[str]:
    url = f"http://{bind.url_host}:{port}/?token={token}"
    if remote and not is_loopback(bind.host):
        who = (f"anyone who can reach {bind.url_host}:{port} over the network and has the "
               "token (plain HTTP: the token and the pages cross the network unencrypted)")
    else:
        who = "this machine only (loopback), with the token"
    return [
        f"saphan serve: a read-only view of {store}",
        f"  open:      {url}",
        f"  reachable: {who}",
        "  the token is new at every start and shown only here; Ctrl-C stops the server",
    ]
