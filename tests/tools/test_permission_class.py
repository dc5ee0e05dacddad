"""Permission classes (SPEC.md §8): accepted versions, mixed versions, exact
command tokens, absolute paths, credentials by name, writable protected names
(schema 3); a fuzzed parser; and `saphan policy check` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Saphan
from saphan.confine import protected
from saphan.refusals import Refusal
from saphan.tools.permission_class import ACCEPTED, FIELDS, load, parse

V1: dict[str, Any] = {"schema": 1, "name": "edit", "commands": ["git", "sh"],
                      "write_scope": ["/srv/work"], "network": "off",
                      "credentials": ["ANTHROPIC_API_KEY"]}
V2: dict[str, Any] = {"schema": 2, "name": "plan", "allowed_commands": ["git"],
                      "write_scope": ["/srv/work"], "network": "open", "credentials": [],
                      "permission_mode": "plan"}
V3: dict[str, Any] = {"schema": 3, "name": "tasks", "allowed_commands": ["git"],
                      "write_scope": ["/srv/work"], "network": "off", "credentials": [],
                      "permission_mode": "acceptEdits",
                      "writable_protected": [".vscode", ".envrc", ".vscode"]}


def refused(data: object) -> Refusal:
    with pytest.raises(Refusal) as e:
        parse(data)
    return e.value


def test_every_accepted_version_loads() -> None:
    assert ACCEPTED == (1, 2, 3, 4)
    one, two, three = parse(V1), parse(V2), parse(V3)
    four = parse({**V3, "schema": 4, "egress_policy": "/etc/saphan/egress.json"})
    assert four.egress_policy == "/etc/saphan/egress.json"
    assert four.as_record()["egress_policy"] == "/etc/saphan/egress.json"
    assert three.egress_policy is None
    assert one.commands == ("git", "sh") and one.network == "off"
    assert one.credentials == ("ANTHROPIC_API_KEY",)
    assert two.commands == ("git",) and two.permission_mode == "plan"
    assert three.commands == ("git",) and three.permission_mode == "acceptEdits"
    # Versions 1 and 2 cannot name a protected entry: none is writable.
    assert one.writable_protected == () and two.writable_protected == ()
    assert three.writable_protected == (".vscode", ".envrc")
    assert three.as_record()["writable_protected"] == [".vscode", ".envrc"]
    assert two.as_record()["writable_protected"] == []


def test_version_3_is_version_2_plus_writable_protected() -> None:
    assert FIELDS[3] == FIELDS[2] | {"writable_protected"}
    without = {k: v for k, v in V3.items() if k != "writable_protected"}
    assert parse(without).writable_protected == ()


def test_version_4_is_version_3_plus_an_absolute_egress_policy() -> None:
    assert FIELDS[4] == FIELDS[3] | {"egress_policy"}
    for bad in ("egress.json", "", 7, ["/a"]):
        r = refused({**V3, "schema": 4, "egress_policy": bad})
        assert r.cls == "policy-invalid" and "egress_policy" in r.message
    mixed = refused({**V3, "egress_policy": "/etc/saphan/egress.json"})
    assert mixed.cls == "policy-schema-mixed" and "schema 4" in mixed.message


@pytest.mark.parametrize("schema", [0, 5, 99, -1, "1", 1.0, None, True, [1]])
def test_unknown_versions_are_refused(schema: object) -> None:
    r = refused({**V1, "schema": schema})
    assert r.cls == "policy-schema-unknown"
    assert "1, 2, 3" in r.message


def test_missing_version_is_refused() -> None:
    data = dict(V1)
    del data["schema"]
    assert refused(data).cls == "policy-schema-unknown"


@pytest.mark.parametrize(("claims", "base", "foreign"), [
    (1, V1, {"permission_mode": "plan"}),
    (1, V1, {"allowed_commands": ["git"]}),
    (2, V2, {"commands": ["git"]}),
    (2, V2, {"writable_protected": [".vscode"]}),
    (1, V1, {"writable_protected": [".vscode"]}),
    (3, V3, {"commands": ["git"]}),
])
def test_every_mixed_version_shape_is_refused(claims: int, base: dict[str, Any],
                                              foreign: dict[str, Any]) -> None:
    r = refused({**base, **foreign})
    assert r.cls == "policy-schema-mixed"
    assert f"claims schema {claims}" in r.message and next(iter(foreign)) in r.message


@pytest.mark.parametrize("bad", [
    {"bogus": 1}, {"commands": "git"}, {"commands": ["/usr/bin/git"]},
    {"commands": ["git commit"]}, {"commands": ["git*"]}, {"write_scope": ["relative/dir"]},
    {"write_scope": ["~/x"]}, {"network": "partial"}, {"credentials": [{"ANTHROPIC_API_KEY": "sk-1"}]},
    {"credentials": ["sk-ant-123"]}, {"name": "a b"},
])
def test_malformed_fields_are_invalid(bad: dict[str, Any]) -> None:
    assert refused({**V1, **bad}).cls == "policy-invalid"


@pytest.mark.parametrize("bad", [
    {"writable_protected": ".vscode"}, {"writable_protected": [".vscode/settings.json"]},
    {"writable_protected": ["src"]}, {"writable_protected": [".VSCODE"]},
    {"writable_protected": ["/abs/.envrc"]}, {"writable_protected": [""]},
    {"writable_protected": [1]}, {"writable_protected": [".saphan"]},
])
def test_writable_protected_names_only_protected_entries(bad: dict[str, Any]) -> None:
    r = refused({**V3, **bad})
    assert r.cls == "policy-invalid"
    assert "writable_protected" in r.message


def test_every_protected_name_may_be_named() -> None:
    pc = parse({**V3, "writable_protected": list(protected.NAMES)})
    assert pc.writable_protected == protected.NAMES


@pytest.mark.parametrize("name", ["SSH_AUTH_SOCK", "TMPDIR", "SAPHAN_HOME", "SAPHAN_RUN_ID"])
def test_credentials_that_never_reach_a_run_are_invalid(name: str) -> None:
    """Naming one would look like passing it; the environment never does."""
    for base in (V1, V2, V3):
        r = refused({**base, "credentials": ["ANTHROPIC_API_KEY", name]})
        assert r.cls == "policy-invalid" and name in r.message


def test_bypass_modes_are_not_representable() -> None:
    for mode in ("bypassPermissions", "dontAsk", "auto", "default"):
        assert refused({**V2, "permission_mode": mode}).cls == "policy-invalid"


def test_commands_match_exact_token_on_the_base_name() -> None:
    pc = parse(V1)
    assert pc.allows("git") and pc.allows("/usr/bin/git") and pc.allows("sh")
    for other in ("gitk", "git-lfs", "gi", "/usr/bin/git2", "bash", "g", "sh2", "xsh"):
        assert not pc.allows(other)


def test_write_scope_is_a_narrowing() -> None:
    pc = parse(V1)
    assert pc.scope_covers("/srv/work") and pc.scope_covers("/srv/work/a/b")
    assert not pc.scope_covers("/srv/workshop") and not pc.scope_covers("/srv")


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from([*sorted(set().union(*FIELDS.values())), "x", "schema"]), inner,
        max_size=6),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(data=_json)
def test_fuzzed_values_load_or_refuse_by_name_never_crash(data: object) -> None:
    try:
        pc = parse(data)
    except Refusal as r:
        assert r.cls in ("policy-schema-unknown", "policy-schema-mixed", "policy-invalid")
        return
    assert pc.schema in ACCEPTED
    assert all(p.startswith("/") for p in pc.write_scope)
    assert all("/" not in c for c in pc.commands)
    assert set(pc.writable_protected) <= set(protected.NAMES)
    assert pc.schema == 3 or pc.writable_protected == ()


@pytest.mark.parametrize(("text", "key"), [
    ('{"schema": 2, "network": "off", "network": "open"}', "network"),
    ('{"schema": 2, "allowed_commands": ["git"], "allowed_commands": ["sh"]}',
     "allowed_commands"),
    ('{"schema": 1, "schema": 2}', "schema"),
    # anywhere in the document, not only at the top
    ('{"schema": 1, "credentials": [{"ANTHROPIC_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}]}',
     "ANTHROPIC_API_KEY"),
])
def test_a_key_given_twice_is_invalid_by_name(tmp_path: Path, text: str, key: str) -> None:
    """JSON readers keep the last of two equal keys: `"network": "off"` then
    `"network": "open"` was loaded as open. A repeated key is refused."""
    path = tmp_path / "dup.json"
    path.write_text(text)
    with pytest.raises(Refusal) as e:
        load(str(path))
    assert e.value.cls == "policy-invalid"
    assert f"has the key {key!r} twice" in e.value.message and str(path) in e.value.message


def test_a_key_given_twice_through_the_cli(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    dup = tmp_path / "dup.json"
    dup.write_text('{"schema": 2, "allowed_commands": ["git"], "network": "off", '
                   '"network": "open"}')
    r = saphan_sqlite("policy", "check", str(dup))
    assert r.code == 3 and "refused [policy-invalid]" in r.err, r.err
    assert "'network' twice" in r.err and "network: open" not in r.out


def test_policy_check_cli(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(V2))
    out = saphan_sqlite.ok("policy", "check", str(good)).out
    assert "schema 2" in out and "git" in out and "network: open" in out and "plan" in out
    assert "protected entries a run may change: none" in out
    three = tmp_path / "three.json"
    three.write_text(json.dumps(V3))
    out = saphan_sqlite.ok("policy", "check", str(three)).out
    assert "schema 3" in out and "protected entries a run may change: .vscode, .envrc" in out
    mixed2 = tmp_path / "mixed2.json"
    mixed2.write_text(json.dumps({**V2, "writable_protected": [".envrc"]}))
    r = saphan_sqlite("policy", "check", str(mixed2))
    assert r.code == 3 and "refused [policy-schema-mixed]" in r.err
    assert "writable_protected" in r.err and "schema 3" in r.err
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({**V1, "permission_mode": "plan"}))
    r = saphan_sqlite("policy", "check", str(mixed))
    assert r.code == 3 and "refused [policy-schema-mixed]" in r.err
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**V1, "schema": 7}))
    r = saphan_sqlite("policy", "check", str(unknown))
    assert r.code == 3 and "refused [policy-schema-unknown]" in r.err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    r = saphan_sqlite("policy", "check", str(broken))
    assert r.code == 3 and "refused [policy-invalid]" in r.err
