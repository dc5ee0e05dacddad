"""What was asked of a run (:class:`Ask`: every candidate site is made
from it) and the checks before a seat that do not depend on where it goes:
custody of the record key, the tool, the operator's command line. Used by
the pipeline for a named slot and by the cast (run/cast.py) for each
candidate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.refusals import Refusal
from saphan.run import record as recorder
from saphan.tools import DISPATCHABLE

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import Holder
    from saphan.measure.order import Order
    from saphan.store.rows import Slot
    from saphan.tools.instruction import Request as AgentRequest


@dataclass(frozen=True)
class Ask:
    """What was asked of a run, as every candidate site is made from it."""

    command: list[str]
    run_id: str
    mode: str
    workdir: str | os.PathLike[str] | None
    stream: bool
    boundary: str | None
    repo: str | os.PathLike[str] | None
    base_ref: str | None
    keep_worktree: bool
    request: AgentRequest | None
    view: bool
    measure: Order | None


def custody(ctx: Context, base: dict[str, Any], tool: str, holder: Holder) -> None:
    """A run whose record could not be signed does not start (recorded)."""
    try:
        ctx.record_key()
    except Refusal as refusal:
        recorder.refused(ctx, base, tool, holder, refusal)
        raise


def check_tool(s: Slot, ask: Ask) -> None:
    if s.tool not in DISPATCHABLE:
        raise UserError(
            f"slot {s.name!r} runs tool {s.tool!r}, which this build of saphan cannot dispatch "
            f"yet (it dispatches: {', '.join(DISPATCHABLE)}); use a --tool command slot"
        )
    if ask.measure is not None and s.tool != "command":
        raise UserError(f"slot {s.name!r} runs {s.tool}; measure-base runs a test command: "
                        "give a --tool command slot")


def check_command(ctx: Context, base: dict[str, Any], command: list[str],
                  holder: Holder) -> None:
    """The bypass tokens are refused on the final command line whichever
    tool they belong to (argv_guard.check_bypass): for the operator's own
    line, here, before any seat — on every transport. The local site checks
    it again with its boundary prefix, right before launch."""
    from saphan.tools.argv_guard import check_bypass

    try:
        check_bypass(command)
    except Refusal as refusal:
        recorder.refused(ctx, base, "command", holder, refusal)
        raise
