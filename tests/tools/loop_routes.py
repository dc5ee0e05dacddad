"""Pieces the loop's blinding tests share (run as root and as an unprivileged
account): the link and outside-write turns of the scripted model, and the
walk over what a run left on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def link_and_outside_turns(key: Path, outside: Path) -> list[Any]:
    """Two model turns: a hard and a symbolic link to the key made inside the
    working directory and read back; a write outside (tool and shell), and
    one inside as the positive control."""
    return [
        ("calls", [("run_command", {"argv": ["ln", str(key), "link.key"]}),
                   ("read_file", {"path": "link.key"}),
                   ("run_command", {"argv": ["ln", "-s", str(key), "sym.key"]}),
                   ("read_file", {"path": "sym.key"}),
                   ("run_command", {"argv": ["cat", "sym.key"]})]),
        ("calls", [("write_file", {"path": str(outside), "content": "overwritten\n"}),
                   ("run_command", {"argv": ["sh", "-c", f"echo x > {outside}"]}),
                   ("write_file", {"path": "inside.txt", "content": "made inside\n"})]),
    ]


def files_under(*roots: Path) -> list[Path]:
    """Regular files (a symbolic link the model made names a file outside)."""
    return [p for root in roots for d, _, fs in os.walk(root)
            for p in (Path(d) / f for f in fs) if not p.is_symlink()]
