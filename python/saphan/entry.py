"""The `saphan` console script's entry point.

Kept tiny: it is what runs before anything else, so the custody check
(saphan.custody) happens ahead of flag parsing, workspace resolution and
every verb. ``python -m saphan`` comes through here too.
"""

from __future__ import annotations


def main() -> None:
    from saphan.custody import check_entry

    check_entry()

    from saphan.cli import main as cli_main

    cli_main()
