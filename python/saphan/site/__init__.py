"""Where a run executes: the Site seam.

A site is what differs between running on this host and on a runner over
SSH; everything else about a run (cast, reserve, record) is the pipeline's
(run/pipeline.py), which drives every site through the same five calls:

    inspect(base)          before the seat: what the run needs exists there
                           (the working directory, the tool; for SSH the one
                           preflight dial). A Refusal is recorded by the
                           pipeline; a UserError writes nothing.
    liveness()             how conflict handling reads a holder on this site
                           (None: this host's own /proc)
    prepare(record)        after the seat: compose the boundary from one
                           Policy, the argv, the environment; fill the record
    start(record, end)     dispatch and wait; what ended it goes into ``end``
    settle(record, end)    always, last: release what the run held; True when
                           the row must stay live (a far process may still run)

    local.LocalSite   this host: bubblewrap / Seatbelt, the local Landlock
                      boundary, or the tool's own sandbox (Codex)
    ssh.SshSite       a runner over SSH: Landlock through the delivered
                      saphan-launcher (far.py holds the far scripts)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from saphan.errors import Interrupted
    from saphan.liveness import RemoteCheck
    from saphan.run.end import RunEnd
    from saphan.store.rows import Slot


class Site(Protocol):
    """One run's execution place; an instance serves exactly one run."""

    #: "local" or "ssh" (tools/registry.py declares which tools each supports)
    kind: str
    #: the working directory as the site names it (the seat's row carries it)
    workdir: str
    #: the slot as cast: the one reserved and the one whose pin is enforced
    slot: Slot

    def inspect(self, base: dict[str, Any]) -> None: ...

    def liveness(self) -> RemoteCheck | None: ...

    def prepare(self, record: dict[str, Any]) -> None: ...

    def start(self, record: dict[str, Any], end: RunEnd) -> None: ...

    def interrupted(self, e: Interrupted) -> str: ...

    def settle(self, record: dict[str, Any], end: RunEnd) -> bool: ...
