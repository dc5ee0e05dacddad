"""serve/access.py: the bind, the token, the Host check, the startup line."""

from __future__ import annotations

import pytest

from saphan.errors import UserError
from saphan.serve import access


def test_parse_bind_forms() -> None:
    assert access.parse_bind("127.0.0.1:8470") == access.Bind("127.0.0.1", 8470)
    assert access.parse_bind("[::1]:0") == access.Bind("::1", 0)
    assert access.parse_bind("localhost:9") == access.Bind("localhost", 9)
    assert access.Bind("::1", 5).url_host == "[::1]"


@pytest.mark.parametrize("text", ["127.0.0.1", ":80", "127.0.0.1:", "127.0.0.1:http",
                                  "127.0.0.1:70000", "a/b:80", "h st:80", "[]:80"])
def test_parse_bind_refuses(text: str) -> None:
    with pytest.raises(UserError, match="--bind"):
        access.parse_bind(text)


def test_loopback() -> None:
    assert access.is_loopback("127.0.0.1")
    assert access.is_loopback("127.8.9.10")
    assert access.is_loopback("::1")
    assert access.is_loopback("localhost")
    assert not access.is_loopback("0.0.0.0")
    assert not access.is_loopback("::")
    assert not access.is_loopback("10.0.0.1")


def test_non_loopback_bind_needs_allow_remote() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.7"):
        with pytest.raises(UserError, match="--allow-remote"):
            access.check_bind(access.Bind(host, 8470), allow_remote=False)
        access.check_bind(access.Bind(host, 8470), allow_remote=True)
    access.check_bind(access.Bind("127.0.0.1", 8470), allow_remote=False)


def test_unresolvable_name_is_refused() -> None:
    with pytest.raises(UserError, match="does not resolve"):
        access.check_bind(access.Bind("no-such-host.invalid", 1), allow_remote=False)


def test_token_is_new_and_compared_whole() -> None:
    a, b = access.new_token(), access.new_token()
    assert a != b and len(a) >= 40
    assert access.token_ok(a, a)
    assert not access.token_ok(b, a)
    assert not access.token_ok(a[:-1], a)
    assert not access.token_ok(a + "x", a)
    assert not access.token_ok("", a)
    assert not access.token_ok(None, a)
    assert not access.token_ok("x" * 10_000, a)


def test_host_header_parsing() -> None:
    assert access.host_of("127.0.0.1:8470") == ("127.0.0.1", "8470")
    assert access.host_of("S-ab.LOCALHOST:9000") == ("s-ab.localhost", "9000")
    assert access.host_of("[::1]:1") == ("::1", "1")
    assert access.host_of("[::1]") == ("::1", "")
    assert access.host_of("localhost") == ("localhost", "")
    for bad in (None, "", "[127.0.0.1]x:1", "[::1", "127.0.0.1:80@evil.example", "h:x",
                "h:123456", "a b:1", ":80", "h/x:1"):
        assert access.host_of(bad) is None, bad


def test_loopback_names_and_the_pages_own() -> None:
    for ok in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "localhost."):
        assert access.is_loopback_name(ok), ok
    for bad in ("evil.example", "0.0.0.0", "::", "s-0123.localhost", "localhost.evil"):
        assert not access.is_loopback_name(bad), bad
    a, b = access.new_name(), access.new_name()
    assert a != b and a.startswith("s-") and a.endswith(".localhost") and len(a) == 28


def test_startup_lines_say_who_can_reach_it() -> None:
    said = access.startup(access.Bind("127.0.0.1", 5), 5, "TOKEN", False, "sqlite",
                          "s-1.localhost")
    assert said["url"] == "http://s-1.localhost:5/?token=TOKEN" and said["name"] == "s-1.localhost"
    local = access.startup_lines(said)
    assert local[1].endswith("http://s-1.localhost:5/?token=TOKEN")
    assert "loopback" in local[2]
    far = access.startup_lines(access.startup(access.Bind("0.0.0.0", 5), 5, "TOKEN", True,
                                              "sqlite"))
    assert "over the network" in far[2] and "unencrypted" in far[2]
    assert access.cookie_name(5) != access.cookie_name(6)
