"""serve/server.py: the extra, the sockets a loopback dashboard holds, a port in use."""

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


def _close(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_a_loopback_dashboard_holds_both_loopbacks_on_one_port() -> None:
    for given in ("127.0.0.1", "localhost", "::1"):
        socks = server.listen(Bind(given, 0))
        try:
            got = {(s.family, s.getsockname()[0]) for s in socks}
            assert got == {(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")}, given
            assert len({s.getsockname()[1] for s in socks}) == 1
            assert not any(s.get_inheritable() for s in socks)
            # TCP named: asyncio sets TCP_NODELAY only then (else 40 ms per answer)
            assert all(s.proto == socket.IPPROTO_TCP for s in socks)
        finally:
            _close(socks)


def test_a_port_held_on_either_loopback_is_refused() -> None:
    socks = server.listen(Bind("127.0.0.1", 0))
    port = socks[0].getsockname()[1]
    try:
        with pytest.raises(UserError, match="in use"):
            server.listen(Bind("127.0.0.1", port))
    finally:
        _close(socks)
    # another process holds [::1] on a port (a browser would reach it first)
    squat = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    squat.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    squat.bind(("::1", 0))
    squat.listen(1)
    taken = squat.getsockname()[1]
    try:
        with pytest.raises(UserError, match=r"\[::1\]:\d+ is held by another process"):
            server.listen(Bind("127.0.0.1", taken))
        # port 0 never lands on it, and 127.0.0.1 on it was given back
        socks = server.listen(Bind("127.0.0.1", 0))
        assert socks[0].getsockname()[1] != taken
        _close(socks)
        again = socket.socket()
        again.bind(("127.0.0.1", taken))
        again.close()
    finally:
        squat.close()


def test_other_loopback_addresses_and_far_ones() -> None:
    with pytest.raises(UserError, match=r"listens on 127\.0\.0\.1 and"):
        server.listen(Bind("127.0.0.2", 0))
    with pytest.raises(UserError, match="--allow-remote"):
        server.listen(Bind("0.0.0.0", 0))
    # every address: both families' wildcards on one port (no other user takes either)
    for wildcard in ("0.0.0.0", "::"):
        socks = server.listen(Bind(wildcard, 0), allow_remote=True)
        try:
            assert {s.getsockname()[0] for s in socks} == {"0.0.0.0", "::"}
            assert len({s.getsockname()[1] for s in socks}) == 1
        finally:
            _close(socks)
