"""tools/registry.py: which tool runs on which site. A cast onto a site the
tool does not support is bad input before anything is written (run/request.py
asks here); this is the table itself."""

from __future__ import annotations

import pytest

from saphan.tools import AGENT_TOOLS, DISPATCHABLE, TOOLS
from saphan.tools.registry import SITES, site_of, supports


def test_every_tool_has_its_sites() -> None:
    assert set(SITES) == set(TOOLS) == set(DISPATCHABLE)
    assert set(AGENT_TOOLS) < set(TOOLS) and "command" not in AGENT_TOOLS


@pytest.mark.parametrize(("tool", "local", "ssh"), [
    ("command", True, True),
    ("claude", True, True),
    ("codex", True, True),
    ("loop", True, True),
])
def test_the_support_matrix(tool: str, local: bool, ssh: bool) -> None:
    assert supports(tool, "local") is local
    assert supports(tool, "ssh") is ssh


def test_an_unknown_tool_runs_nowhere() -> None:
    for transport in ("local", "ssh"):
        assert supports("bogus", transport) is False
        assert supports("", transport) is False


def test_site_of_a_transport() -> None:
    assert site_of("ssh") == "ssh"
    assert site_of("local") == "local"
    # Anything that is not SSH is this host: never a far site by accident.
    assert site_of("container") == "local"
