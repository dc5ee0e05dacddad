"""Operator errors that are not refusals: bad input, unknown names, duplicates.

The CLI prints them as one line naming the thing and the fix and exits 2;
nothing is written when one is raised.
"""

from __future__ import annotations

EXIT_CODE = 2


class UserError(Exception):
    """Bad input. ``str(err)`` is the whole one-line message, fix included."""


class TransportError(Exception):
    """A machine could not be reached or spoken to over its transport.

    Raised once, at the transport seam (saphan.transport.ssh), from whatever
    the SSH library or the socket said; ``str(err)`` names the machine and
    the cause. The CLI prints it as ``error: ssh: …`` and exits 1.
    """

    def __init__(self, machine: str, message: str):
        super().__init__(message)
        self.machine = machine
