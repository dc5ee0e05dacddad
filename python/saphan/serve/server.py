"""`saphan serve`: check, bind, print the URL once, serve until Ctrl-C.

Before anything is bound, the workspace, its store and the record key's
custody are checked (the same errors any verb gives), and the bind is held
against --allow-remote (serve/access.py). The socket is bound here, so
``--bind 127.0.0.1:0`` prints the port it got; uvicorn then serves on it.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable

from saphan.errors import UserError
from saphan.serve import access

#: connections served at once (uvicorn's limit_concurrency)
CONNECTIONS = 256
EXTRA_HINT = ("saphan serve needs its optional parts, Starlette and uvicorn: "
              "pip install 'saphan[serve]'")


def check_extra() -> None:
    """The optional extra is installed (else a UserError saying how to install it)."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{EXTRA_HINT} (missing: {', '.join(missing)})")


#: the loopback addresses a loopback dashboard holds, both on its one port:
#: its page's name (s-….localhost) resolves to both, and a browser tries ::1
#: first — a port left free on either would be another user's to take
LOOPBACK = ("127.0.0.1", "::1")
#: tries at a free port pair for port 0
PAIR_TRIES = 20


def listen(bind: access.Bind, allow_remote: bool = False) -> list[socket.socket]:
    """The listening sockets for ``bind`` (UserError naming the fix when they
    cannot be had). A loopback bind holds 127.0.0.1 and [::1] on one port
    (:data:`LOOPBACK`); any other address needs ``allow_remote`` — checked on
    the address itself: the name is resolved once, here, and what was checked
    is what is bound."""
    try:
        infos = socket.getaddrinfo(bind.host, bind.port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise UserError(f"--bind {bind.url_host}:{bind.port}: {e}") from None
    family, _kind, _proto, _name, address = infos[0]
    where = f"--bind {bind.url_host}:{bind.port}"
    if access.is_loopback(str(address[0])):
        if any(str(i[4][0]) not in LOOPBACK for i in infos):
            raise UserError(f"{where}: a loopback dashboard listens on 127.0.0.1 and [::1] "
                            "(the name its page is served under resolves to both); give "
                            f"--bind 127.0.0.1:{bind.port}")
        return _pair(where, bind.port, "127.0.0.1", "::1")
    if not allow_remote:
        raise UserError(f"{where} resolved to {address[0]}, not a loopback address; give "
                        "--allow-remote to accept that")
    if str(address[0]) in ("0.0.0.0", "::"):
        # every address: both families, or another user could take the other
        # family's wildcard on this port and be reached first by some clients
        return _pair(where, bind.port, "0.0.0.0", "::")
    return [_bound(where, family, address)]


def _bound(where: str, family: int, address: tuple[object, ...]) -> socket.socket:
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    # that say TCP (measured: without it every answer waited 40 ms for an ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"{where}: {_text(address)} is in use; give another port, or "
                            "port 0 for a free one") from None
        raise
    sock.set_inheritable(False)
    return sock


def _text(address: tuple[object, ...]) -> str:
    host = str(address[0])
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


def _pair(where: str, port: int, v4: str, v6: str) -> list[socket.socket]:
    """``v4`` and ``v6`` on one port (port 0: one free on both)."""
    for _ in range(PAIR_TRIES if port == 0 else 1):
        try:
            four = _bound(where, socket.AF_INET, (v4, port))
        except OSError as e:
            raise UserError(f"{where}: {v4}: {e.strerror}") from None
        got = int(four.getsockname()[1])
        try:
            six = _bound(where, socket.AF_INET6, (v6, got, 0, 0))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                return [four]  # no IPv6 here: no one can hold [v6] either
            four.close()
            raise UserError(f"{where}: [{v6}]: {e.strerror}") from None
        except UserError:
            four.close()
            if port == 0:
                continue  # [v6] on that port is someone else's: another port
            raise UserError(
                f"{where}: [{v6}]:{got} is held by another process; a browser opening this "
                f"dashboard's name would reach that process first (it tries IPv6 before "
                "IPv4) and hand it the token; give another port, or port 0") from None
        return [four, six]
    raise UserError(f"{where}: no port was free on both {v4} and [{v6}] in {PAIR_TRIES} tries")


def serve(home: str | None, bind_text: str, *, allow_remote: bool,
          echo: Callable[[str], None], as_json: bool = False) -> None:
    """Run the dashboard (module docstring) until interrupted."""
    check_extra()
    bind = access.parse_bind(bind_text)
    access.check_bind(bind, allow_remote)
    from saphan.engine import Engine

    probe = Engine(home, reconcile=False)
    try:
        probe.ctx.record_key()  # custody first: nothing verifies without it
        description = probe.store.description
    finally:
        probe.close()
    import uvicorn

    from saphan.serve.app import Settings, build

    socks = listen(bind, allow_remote)
    bound, port = str(socks[0].getsockname()[0]), int(socks[0].getsockname()[1])
    bind = access.Bind(bind.host, port)
    remote = not access.is_loopback(bound)
    settings = Settings(home=home, bind=bind, token=access.new_token(), remote=remote,
                        store=description, port=port,
                        name="" if remote else access.new_name())
    app, readers = build(settings)
    said = access.startup(bind, port, settings.token, remote, description,
                          settings.name or None)
    if as_json:
        import json

        echo(json.dumps(said))
    else:
        for line in access.startup_lines(said):
            echo(line)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            server_header=False, proxy_headers=False,
                            timeout_graceful_shutdown=2,
                            # connections at once, past which uvicorn answers 503:
                            # held-open requests cannot use up the descriptors
                            limit_concurrency=CONNECTIONS)
    try:
        uvicorn.Server(config).run(sockets=socks)
    finally:
        readers.close()
        for sock in socks:
            sock.close()
