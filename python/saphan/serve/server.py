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


def listen(bind: access.Bind, allow_remote: bool = False) -> socket.socket:
    """A listening socket on ``bind`` (UserError naming the fix when it cannot be
    had); without ``allow_remote`` the address it binds must be loopback (the
    name is resolved once, here: what was checked is what is bound)."""
    try:
        infos = socket.getaddrinfo(bind.host, bind.port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise UserError(f"--bind {bind.url_host}:{bind.port}: {e}") from None
    family, kind, proto, _name, address = infos[0]
    if not allow_remote and not access.is_loopback(str(address[0])):
        raise UserError(f"--bind {bind.url_host}:{bind.port} resolved to {address[0]}, not a "
                        "loopback address; give --allow-remote to accept that")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"--bind {bind.url_host}:{bind.port}: the port is in use; give "
                            f"another, or port 0 for a free one ({bind.url_host}:0)") from None
        raise UserError(f"--bind {bind.url_host}:{bind.port}: {e.strerror}") from None
    sock.set_inheritable(False)
    return sock


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

    sock = listen(bind, allow_remote)
    bound, port = str(sock.getsockname()[0]), int(sock.getsockname()[1])
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
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        readers.close()
        sock.close()
