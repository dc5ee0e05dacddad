"""Endpoints and model names (saphan/endpoints.py): the checks every source of
an endpoint goes through, and how one is printed. The slot-level cases are in
tests/fleet/test_slots.py; these hold the leaf module's own contract."""

from __future__ import annotations

import re

import pytest

from saphan.endpoints import check_endpoint, check_endpoint_masked, check_model, redact_endpoint
from saphan.errors import UserError


@pytest.mark.parametrize("url", ["https://gw.example/anthropic", "http://127.0.0.1:8080/v1",
                                 "http://[::1]:9/x", "http://localhost/v1",
                                 "http://127.5.6.7/v1"])
def test_endpoints_accepted(url: str) -> None:
    assert check_endpoint(url) == url


@pytest.mark.parametrize(("url", "needle"), [
    ("http://127.attacker.example/v1", "plain http to 127.attacker.example"),
    ("http://10.1.2.3/v1", "would send the API key in the clear"),
    ("https://u:p@h/v1", "carries credentials"),
    ("https://h/v1?token=x", "is not an http(s) URL"),
    ("https://h\u202e/", "printable ASCII"),
])
def test_endpoints_refused(url: str, needle: str) -> None:
    with pytest.raises(UserError, match=re.escape(needle)):
        check_endpoint(url)


def test_a_refusal_never_prints_the_password_or_query_values() -> None:
    url = "http://user:secretpw@evil.example/v1?key=sekrit"
    with pytest.raises(UserError) as e:
        check_endpoint_masked(url, "config.toml: codex.base_url")
    text = str(e.value)
    assert "secretpw" not in text and "sekrit" not in text
    assert text.startswith("config.toml: codex.base_url")
    assert redact_endpoint(url) == "http://user:***@evil.example/v1?key=***"
    assert redact_endpoint("not a url") == "***"


def test_model_names() -> None:
    assert check_model("claude-opus-4-8[1m]") == "claude-opus-4-8[1m]"
    for bad in ("", "-x", "two words", "m\x1b]52;c;eA==\x07", "x" * 201):
        with pytest.raises(UserError, match="is not a model name"):
            check_model(bad)
