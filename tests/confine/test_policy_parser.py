"""The launcher's policy parser, fuzzed from Python through saphan._native."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saphan import _native

KEYS = ["version", "workdir", "writable", "readable", "agent_sha256"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from([*KEYS, "network", "Writable", "extra"]), json_values,
                       max_size=6))
def test_parser_never_crashes_and_canonical_form_is_stable(value: dict[str, object]) -> None:
    try:
        canonical = _native.parse_policy(json.dumps(value))
    except ValueError as e:
        unknown = set(value) - set(KEYS)
        if unknown:
            assert any(k in str(e) for k in unknown), str(e)
        return
    assert _native.parse_policy(canonical) == canonical
    assert set(json.loads(canonical)) <= set(KEYS)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_is_a_value_error_not_a_crash(text: str) -> None:
    with contextlib.suppress(ValueError):
        _native.parse_policy(text)


@pytest.mark.parametrize(("value", "needle"), [
    ({"version": 1, "workdir": "wd", "writable": ["wd"], "readable": "everything"}, "workdir"),
    ({"version": 2, "workdir": "/tmp", "writable": ["/tmp"], "readable": "everything"},
     "version"),
    ({"version": 1, "workdir": "/tmp", "writable": [], "readable": "everything"}, "writable"),
    ({"version": 1, "workdir": "/tmp", "writable": ["/tmp"], "readable": "some"}, "readable"),
    ({"version": 1, "workdir": "/tmp", "writable": ["/tmp"], "readable": "everything",
      "mounts": []}, "mounts"),
])
def test_clear_errors_name_the_field(value: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        _native.parse_policy(json.dumps(value))
