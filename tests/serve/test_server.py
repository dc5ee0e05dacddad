"""serve/server.py: the extra, the socket, a port in use."""

from __future__ import annotations

import socket

import pytest

from saphan.errors import UserError
from saphan.serve import server
from saphan.serve.access import Bind
from serve.served import require_serve


def test_the_extra_is_there() -> None:
    require_serve()
    server.check_extra()


def test_listen_on_a_free_port_and_refuse_one_in_use() -> None:
    sock = server.listen(Bind("127.0.0.1", 0))
    try:
        port = sock.getsockname()[1]
        assert port > 0 and not sock.get_inheritable()
        with pytest.raises(UserError, match="the port is in use"):
            server.listen(Bind("127.0.0.1", port))
    finally:
        sock.close()
    six = server.listen(Bind("::1", 0))
    try:
        assert six.family == socket.AF_INET6
    finally:
        six.close()
