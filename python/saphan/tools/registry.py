"""Which tool runs where: the sites each tool's adapter supports.

    local  this host (bubblewrap / Seatbelt, or the local Landlock boundary)
    ssh    a runner over SSH (Landlock through the delivered launcher)

Every tool has an adapter (tools/adapter.py: CommandAdapter for `command`;
claude.py, codex.py, loop/adapter.py for the agents); a cast onto a site the
tool does not support is bad input, before anything is written.
"""

from __future__ import annotations

SITES: dict[str, tuple[str, ...]] = {
    "command": ("local", "ssh"),
    "claude": ("local", "ssh"),
    "codex": ("local", "ssh"),
    "loop": ("local", "ssh"),
}


def site_of(transport: str) -> str:
    """A machine's transport as a site name."""
    return "ssh" if transport == "ssh" else "local"


def supports(tool: str, transport: str) -> bool:
    return site_of(transport) in SITES.get(tool, ())
