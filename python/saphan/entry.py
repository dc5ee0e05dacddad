"""The `saphan` console script's entry point.

Kept tiny: it is what runs before anything else, so the custody check (when
present) happens ahead of flag parsing, workspace resolution and every verb.
"""

from __future__ import annotations


def main() -> None:
    from saphan.cli import main as cli_main

    cli_main()
