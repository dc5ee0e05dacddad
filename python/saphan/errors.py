"""Operator errors that are not refusals: bad input, unknown names, duplicates.

The CLI prints them as one line naming the thing and the fix and exits 2;
nothing is written when one is raised.
"""

from __future__ import annotations

EXIT_CODE = 2


class UserError(Exception):
    """Bad input. ``str(err)`` is the whole one-line message, fix included."""
