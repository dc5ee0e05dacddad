"""Egress policy files (egress/policy.py): the permission-class discipline —
accepted versions, duplicate and unknown keys refused by name — hosts,
ports and routes validated, secrets read only at launch (from saphan's
environment, or a file under a key's custody), and `saphan egress check`
through the real CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan
from saphan import Refusal
from saphan.egress import policy
from saphan.errors import UserError

ROUTE: dict[str, Any] = {"name": "anthropic", "tool": "claude",
                         "upstream": "https://api.anthropic.com", "header": "x-api-key",
                         "secret_env": "ANTHROPIC_API_KEY"}
GOOD: dict[str, Any] = {"schema": 1, "name": "t",
                        "allow": [{"host": "api.github.com", "ports": [443]},
                                  {"host": "*.Example.COM.", "ports": [443, 8443]},
                                  {"host": "10.1.2.3", "ports": [80]}],
                        "routes": [ROUTE]}


def _write(tmp_path: Path, data: Any, name: str = "egress.json") -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def _refused(data: Any, tmp_path: Path) -> Refusal:
    with pytest.raises(Refusal) as e:
        policy.load(_write(tmp_path, data))
    return e.value


def test_a_good_policy_loads_normalised_with_its_digest(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    pol = policy.load(path)
    assert pol.schema == 1 and pol.name == "t" and pol.source == path
    assert [(a.host, a.ports) for a in pol.allow] == [
        ("api.github.com", (443,)), ("*.example.com", (443, 8443)), ("10.1.2.3", (80,))]
    import hashlib

    assert pol.sha256 == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    r = pol.route_for("claude")
    assert r is not None and r.header == "x-api-key" and r.prefix == ""
    assert pol.route_for("loop") is None
    rec = pol.as_record()
    assert rec["routes"][0]["secret_from"] == "variable ANTHROPIC_API_KEY"


@pytest.mark.parametrize(("host", "port", "ok"), [
    ("api.github.com", 443, True), ("API.GitHub.com.", 443, True), ("api.github.com", 80, False),
    ("x.api.github.com", 443, False), ("a.example.com", 8443, True),
    ("a.b.example.com", 443, True), ("example.com", 443, False),
    ("evilexample.com", 443, False), ("10.1.2.3", 80, True),
])
def test_matching_is_exact_or_a_whole_label_suffix(host: str, port: int, ok: bool,
                                                   tmp_path: Path) -> None:
    pol = policy.load(_write(tmp_path, GOOD))
    assert any(a.matches(host, port) for a in pol.allow) is ok


def test_versions_are_an_explicit_set(tmp_path: Path) -> None:
    for schema in (None, 0, 2, "1", 1.0, True):
        data = {**GOOD, "schema": schema}
        if schema is None:
            del data["schema"]
        e = _refused(data, tmp_path)
        assert e.cls == "policy-schema-unknown", schema
        assert "accepted: 1" in e.message


def test_a_key_given_twice_anywhere_is_refused_by_name(tmp_path: Path) -> None:
    text = ('{"schema": 1, "allow": [{"host": "a.example", "ports": [443], '
            '"host": "evil.example"}]}')
    e = _refused(text, tmp_path)
    assert e.cls == "policy-invalid" and "'host' twice" in e.message
    assert "saphan egress check" in e.remediation


@pytest.mark.parametrize(("patch", "says"), [
    ({"allows": []}, "unknown field(s) 'allows' in the top level"),
    ({"allow": [{"host": "a.example", "ports": [443], "proto": "tcp"}]},
     "unknown field(s) 'proto' in allow[0]"),
    ({"routes": [{**ROUTE, "secret": "sk-x"}]}, "unknown field(s) 'secret' in routes[0]"),
    ({"allow": {"host": "a"}}, "`allow` must be a list"),
    ({"allow": [{"host": "*", "ports": [443]}]}, "is not a host name"),
    ({"allow": [{"host": "a.*.example", "ports": [443]}]}, "is not a host name"),
    ({"allow": [{"host": "bad host", "ports": [443]}]}, "is not a host name"),
    ({"allow": [{"host": "a.example", "ports": []}]}, "non-empty list of ports"),
    ({"allow": [{"host": "a.example", "ports": [0]}]}, "non-empty list of ports"),
    ({"allow": [{"host": "a.example", "ports": [70000]}]}, "non-empty list of ports"),
    ({"allow": [{"host": "a.example", "ports": ["443"]}]}, "non-empty list of ports"),
    ({"routes": [{**ROUTE, "name": "Bad/Name"}]}, "routes[0].name"),
    ({"routes": [ROUTE, ROUTE]}, "route name 'anthropic' is given twice"),
    ({"routes": [ROUTE, {**ROUTE, "name": "other"}]}, "route tool 'claude' is given twice"),
    ({"routes": [{**ROUTE, "tool": "vim"}]}, "`tool` must be one of"),
    ({"routes": [{**ROUTE, "upstream": "http://api.anthropic.com"}]}, "plain http"),
    ({"routes": [{**ROUTE, "upstream": "http://127.0.0.1:8080"}]}, "is not https"),
    ({"routes": [{**ROUTE, "upstream": "https://u:p@api.anthropic.com"}]}, "credentials"),
    ({"routes": [{**ROUTE, "header": "host"}]}, "hop-by-hop or framing"),
    ({"routes": [{**ROUTE, "header": "Proxy-Authorization"}]}, "hop-by-hop or framing"),
    ({"routes": [{**ROUTE, "header": "x api key"}]}, "`header` must be"),
    ({"routes": [{**ROUTE, "prefix": "Bearer\n"}]}, "`prefix` must be"),
    ({"routes": [{**ROUTE, "secret_file": "/k"}]}, "exactly one of `secret_env`"),
    ({"routes": [{k: v for k, v in ROUTE.items() if k != "secret_env"}]},
     "exactly one of `secret_env`"),
    ({"routes": [{**{k: v for k, v in ROUTE.items() if k != "secret_env"},
                  "secret_file": "rel/key"}]}, "`secret_file` must be an absolute path"),
    ({"routes": [{**ROUTE, "secret_env": "lower"}]}, "is not a variable name"),
])
def test_malformed_policies_are_invalid_by_name(patch: dict[str, Any], says: str,
                                                tmp_path: Path) -> None:
    e = _refused({**GOOD, **patch}, tmp_path)
    assert e.cls == "policy-invalid", e
    assert says in e.message, e.message


def test_an_unreadable_or_non_json_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as e:
        policy.load(str(tmp_path / "missing.json"))
    assert e.value.cls == "policy-invalid" and "cannot be read" in e.value.message
    assert _refused("{not json", tmp_path).cls == "policy-invalid"
    assert "top level must be a JSON object" in _refused("[]", tmp_path).message


def test_secrets_come_from_the_environment_or_a_custody_checked_file(tmp_path: Path) -> None:
    pol = policy.load(_write(tmp_path, GOOD))
    route = pol.routes[0]
    assert policy.read_secret(route, {"ANTHROPIC_API_KEY": "sk-real-0123456789abcdef\n"}) \
        == "sk-real-0123456789abcdef"
    with pytest.raises(Refusal) as e:
        policy.read_secret(route, {})
    assert e.value.cls == "agent-auth-missing" and "ANTHROPIC_API_KEY" in e.value.message
    with pytest.raises(UserError, match="16 or more"):
        policy.read_secret(route, {"ANTHROPIC_API_KEY": "short"})
    key = tmp_path / "route.key"
    key.write_text("sk-file-0123456789abcdef\n")
    os.chmod(key, 0o600)
    filed = policy.RouteSpec("r", "https://x.example", "authorization", "Bearer ", None, str(key))
    assert policy.read_secret(filed, {}) == "sk-file-0123456789abcdef"
    os.chmod(key, 0o644)
    with pytest.raises(Refusal) as e:
        policy.read_secret(filed, {})
    assert e.value.cls == "custody-key-unsafe"
    os.chmod(key, 0o600)
    os.link(key, tmp_path / "second-link")
    with pytest.raises(Refusal) as e:
        policy.read_secret(filed, {})
    assert e.value.cls == "custody-key-unsafe"
    link = tmp_path / "via-link.key"
    link.symlink_to(key)
    with pytest.raises((Refusal, UserError)):
        policy.read_secret(policy.RouteSpec("r", "https://x.example", "authorization", "",
                                            None, str(link)), {})


def test_egress_check_prints_what_it_allows_and_never_a_secret(saphan_sqlite: Saphan,
                                                                tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    env = saphan_sqlite.env(ANTHROPIC_API_KEY="sk-never-printed-0123456789")
    out = saphan_sqlite.ok("egress", "check", path, env=env).out
    assert "*.example.com ports 443, 8443" in out
    assert "route /anthropic/ -> https://api.anthropic.com (the claude agent's model endpoint)" \
        in out
    assert "sk-never" not in out
    data = json.loads(saphan_sqlite.ok("egress", "check", "--json", path, env=env).out)
    assert data["allow"][0] == {"host": "api.github.com", "ports": [443]}
    assert data["sha256"] and "sk-never" not in json.dumps(data)
    bad = saphan_sqlite("egress", "check", _write(tmp_path, {**GOOD, "schema": 9}, "bad.json"))
    assert bad.code == 3 and "policy-schema-unknown" in bad.err
    helped = saphan_sqlite.ok("egress", "--help").out
    assert "door" in helped and "check" in helped
