"""Every exception saphan raises across its modules, in one home.

    UserError        bad input: one line naming the thing and the fix; the CLI
                     exits 2 and nothing was written
    Refusal          a named refusal from the closed table CLASSES (SPEC.md §4):
                     the run (or verb) does not happen; exit 3, recorded
    TransportError   a machine could not be reached or spoken to (exit 1)
    StoreError       the database could not do what was asked
    RecordPending    a run's outcome is in its record file, not yet in the store
    Interrupted      SIGINT/SIGTERM/SIGHUP reached saphan while it drove a run
    NotGrantable     a path fails the grant rule (no link at any component)
    PlantedLink      saphan's own file operation met a link or odd file type
    ImportRefused    a --repo run's commits are not imported (why in the message)
    Inexpressible    a policy asks for what Landlock cannot express

(The agent loop's own errors, raised and handled inside the jail, live with
it in saphan.loop.)
"""

from __future__ import annotations

import signal

from saphan.refusal_table import CLASSES

#: UserError's exit code; a refusal's is :data:`REFUSAL_EXIT_CODE`
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


class StoreError(Exception):
    """The database could not do what was asked; the message names the store."""


class RecordPending(StoreError):
    """A run ended and its signed outcome is in ``runs/<id>/record.json``, but
    the store could not be written within its retry budget. ``str`` says what
    is pending and where the record is; the next saphan command that reaches
    the store records it (run/live.py reconciles)."""

    def __init__(self, message: str, *, run_id: str, path: str):
        super().__init__(message)
        self.run_id = run_id
        self.path = path


class Interrupted(Exception):
    def __init__(self, signum: int, exit_code: int | None, when: str = ""):
        super().__init__(f"interrupted by {signal.Signals(signum).name}"
                         + (f" {when}" if when else ""))
        self.signum = signum
        self.exit_code = exit_code
        #: False: it came while the run waited for a seat, and no row was written
        self.recorded = True


class NotGrantable(Exception):
    """A path that fails the grant rule; ``str`` says which component and why."""


class PlantedLink(Exception):
    """A path saphan was about to use holds a link or an unexpected file type."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path} is {what}; saphan does not follow it")
        self.path = path
        self.what = what


class ImportRefused(Exception):
    """The run's commits are not imported; ``str`` says why."""


class Inexpressible(ValueError):
    """The policy asks for something Landlock cannot express."""


# -- refusals: the closed table and the one exception type ------------------------

REFUSAL_EXIT_CODE = 3


class Refusal(Exception):
    """A named refusal: the run (or verb) does not happen.

    ``cls`` is a key of :data:`CLASSES`; constructing a Refusal with any other
    class is a programming error and raises ``ValueError`` at once, so the
    table stays closed.
    """

    def __init__(self, cls: str, message: str, remediation: str, *, run_id: str | None = None):
        if cls not in CLASSES:
            raise ValueError(f"unknown refusal class {cls!r}")
        super().__init__(f"refused [{cls}]: {message}")
        self.cls = cls
        self.message = message
        self.remediation = remediation
        self.run_id = run_id

    def render(self) -> str:
        """The two lines the CLI prints on stderr."""
        return f"refused [{self.cls}]: {self.message}\nfix: {self.remediation}"

    def as_dict(self) -> dict[str, str]:
        return {"class": self.cls, "message": self.message, "remediation": self.remediation}
