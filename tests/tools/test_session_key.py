"""Claude Code's session project key (saphan.tools.session_key): the one
definition both sides of a remote run are held to."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from saphan.tools.session_key import MAX_LENGTH, session_key, wyhash

#: wyhash final v4 reference vectors (wyhash test_vector.cpp; Zig's
#: std.hash.Wyhash, which Bun.hash calls, pins the same seven).
VECTORS = [
    (0, 0x409638EE2BDE459, ""),
    (1, 0xA8412D091B5FE0A9, "a"),
    (2, 0x32DD92E4B2915153, "abc"),
    (3, 0x8619124089A3A16B, "message digest"),
    (4, 0x7A43AFB61D7F5F40, "abcdefghijklmnopqrstuvwxyz"),
    (5, 0xFF42329B90E50D58, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
    (6, 0xC39CAB13B115AAD3, "1234567890" * 8),
]


@pytest.mark.parametrize(("seed", "expected", "data"), VECTORS)
def test_wyhash_reference_vectors(seed: int, expected: int, data: str) -> None:
    assert wyhash(seed, data.encode()) == expected


@pytest.mark.parametrize(("cwd", "key"), [
    ("/tmp/cl/wd", "-tmp-cl-wd"),  # SPEC.md §5, measured with Claude Code 2.1.197
    ("/home/u/my project.v2", "-home-u-my-project-v2"),
    ("/a//b", "-a--b"),  # no collapsing
    ("/x/_-.~", "-x-----"),
    ("/caf\u00e9", "-caf-"),  # one UTF-16 unit, one dash
    ("/\U0001f600", "---"),  # outside the BMP: two UTF-16 units, two dashes
    ("/" + "a" * 199, "-" + "a" * 199),  # exactly 200: no hash
])
def test_examples(cwd: str, key: str) -> None:
    assert session_key(cwd) == key


def test_long_key_is_cut_and_hashed() -> None:
    cwd = "/" + "/".join(["d" * 60] * 4)
    key = session_key(cwd)
    head, _, suffix = key.rpartition("-")
    assert head == session_key(cwd)[:MAX_LENGTH] and len(head) == MAX_LENGTH
    assert suffix == _base36(wyhash(0, cwd.encode()))
    assert session_key(cwd + "x") != key  # the hash tells long paths apart


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
def test_matches_the_far_shell_on_plain_paths(path: str) -> None:
    """The far preflight derives short printable-ASCII keys with tr (C locale)."""
    cwd = "/" + path[:199]
    out = subprocess.run(["tr", "-c", "A-Za-z0-9", "-"], input=cwd.encode(),
                         capture_output=True, env={"LC_ALL": "C"}, check=True).stdout
    assert out.decode() == session_key(cwd)
