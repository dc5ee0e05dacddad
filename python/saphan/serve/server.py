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

EXTRA_HINT = ("saphan serve needs its optional parts, Starlette and uvicorn: "
              "pip install 'saphan[serve]'")


def check_extra() -> None:
    """The optional extra is installed (else a UserError saying how to install it)."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{EXTRA_HINT} (missing: {', '.join(missing)})")


def listen(bind: access.Bind) -> socket.socket:
    """A listening socket on ``bind`` (UserError naming the fix when it cannot be had)."""
    try:
        infos = socket.getaddrinfo(bind.host, bind.port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise UserError(f"--bind {bind.url_host}:{bind.port}: {e}") from None
    family, kind, proto, _name, address = infos[0]
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
          echo: Callable[[str], None]) -> None:
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

    sock = listen(bind)
    port = int(sock.getsockname()[1])
    bind = access.Bind(bind.host, port)
    settings = Settings(home=home, bind=bind, token=access.new_token(), remote=allow_remote,
                        store=description, port=port)
    app, readers = build(settings)
    for line in access.startup_lines(bind, port, settings.token, allow_remote, description):
        echo(line)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            server_header=False, proxy_headers=False,
                            timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        readers.close()
        sock.close()
