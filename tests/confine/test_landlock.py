"""Policy -> the launcher's JSON (confine/landlock.py): what Landlock can
express is rendered in the launcher's closed key set (and its own parser,
rust/core, accepts it unchanged); what it cannot express is refused, never dropped."""

from __future__ import annotations

import json

import pytest

from saphan import _native
from saphan.confine import landlock
from saphan.confine.policy import DEVICE_LITERALS, Policy
from saphan.errors import Inexpressible

PLAIN = Policy(workdir="/w", writable_dirs=("/w", "/ws/runs/R/out"),
               scratch_dir="/w/.saphan-run/tmp")
SHA = "ab" * 32


def test_the_writable_set_travels_as_entries_of_writable() -> None:
    assert json.loads(landlock.render(PLAIN)) == {
        "version": 1, "workdir": "/w", "readable": "everything",
        "writable": ["/w", "/ws/runs/R/out", *DEVICE_LITERALS],
    }


def test_the_agent_digest_is_carried_only_when_given() -> None:
    assert json.loads(landlock.render(PLAIN, agent_sha256=SHA))["agent_sha256"] == SHA
    assert "agent_sha256" not in json.loads(landlock.render(PLAIN))


@pytest.mark.parametrize("sha", [None, SHA])
def test_the_launchers_own_parser_takes_the_rendering_as_it_is(sha: str | None) -> None:
    rendered = landlock.render(PLAIN, agent_sha256=sha)
    assert _native.parse_policy(rendered) == rendered


def test_landlock_refuses_what_it_cannot_express() -> None:
    denied = Policy(workdir="/w", writable_dirs=("/w",), read_denials=("/ws/record.key",))
    with pytest.raises(Inexpressible, match=r"read denials.*/ws/record\.key"):
        landlock.render(denied)


def test_a_read_only_directory_inside_a_writable_one_is_refused() -> None:
    carved = Policy(workdir="/w", writable_dirs=("/w",), readonly_dirs=("/w/.git", "/w/.envrc"))
    with pytest.raises(Inexpressible, match=r"read-only directory.*/w/\.git, /w/\.envrc"):
        landlock.render(carved)
