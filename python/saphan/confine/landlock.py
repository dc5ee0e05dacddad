"""Policy -> the one JSON value saphan-launcher applies as a Landlock domain.

The launcher's key set is closed (an unknown key is refused by name), so new
grants travel as more entries in ``writable``, never as new keys. Landlock
grants read everywhere and cannot carve a read-only or unreadable path out of
a granted tree: a policy that needs either cannot be expressed here, and the
renderer refuses rather than dropping it.
"""

from __future__ import annotations

import json

from saphan.confine.policy import Policy
from saphan.errors import Inexpressible


def render(policy: Policy, *, agent_sha256: str | None = None) -> str:
    if policy.read_denials:
        raise Inexpressible(
            "read denials cannot be expressed in a Landlock policy (reads are granted "
            f"everywhere): {', '.join(policy.read_denials)}"
        )
    if policy.readonly_dirs:
        raise Inexpressible(
            "a read-only directory inside a writable one cannot be expressed in Landlock: "
            + ", ".join(policy.readonly_dirs)
        )
    value: dict[str, object] = {
        "version": 1,
        "workdir": policy.workdir,
        "writable": [*policy.writable_dirs, *policy.writable_literals],
        "readable": "everything",
    }
    if agent_sha256 is not None:
        value["agent_sha256"] = agent_sha256
    return json.dumps(value, separators=(",", ":"))
