"""The cast step for a run that names a tool instead of a slot: the fleet's
candidates (fleet/cast.py), each inspected when its turn comes (an SSH
candidate's one preflight dial), then the reservation tried on each in the
ranked order — the database decides; no count is read. The first seat taken
wins and the run goes on exactly as a named slot's (run/pipeline.py).

With ``--wait``, a fleet found full is tried again with the same backoff as
a named slot's (0.25 s doubling to 4 s), holding nothing between tries;
candidates refused at inspection stay passed over.

Refusals, recorded once on the run's row (machine ``(fleet)``, slot
``(cast)``): ``no-eligible-slot`` when no candidate qualified (or every one
was refused at inspection), ``fleet-full`` when some were at capacity,
``container-ineligible`` when only the image kept machines out. Each names
every slot with why. The record's ``cast`` says what was asked, the
candidates in order, those passed over with why, and the one chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from saphan.errors import Interrupted, TransportError, UserError
from saphan.refusals import Refusal
from saphan.run import record as recorder

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.fleet.cast import Candidate, Cast
    from saphan.liveness import Holder
    from saphan.run.ask import Ask
    from saphan.site import Site
    from saphan.store.rows import Machine, Slot

    #: run/pipeline.make_site
    MakeSite = Callable[[Context, Slot, Machine, Ask], Site]


def seat(ctx: Context, ask: Ask, base: dict[str, Any], holder: Holder, *, tool: str | None,
         machine: str | None, labels: Mapping[str, str] | None, image: str | None,
         wait: float, make: MakeSite) -> tuple[Site, dict[str, Any]]:
    """The candidate that took a seat, and its record (the pipeline executes
    it); or the refusal, recorded. Called inside streams.run_signals;
    ``make``: the pipeline's make_site (the pipeline alone makes sites)."""
    from saphan.fleet import cast as fleet_cast
    from saphan.run import ask as asks
    from saphan.tools import TOOLS

    if tool is None:
        raise UserError("give --slot (with --machine) or --tool T to cast the run on the fleet")
    if tool not in TOOLS:
        raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
    base["tool"] = tool
    # custody first: the cast reads signed rows with the key (a refusal here is recorded)
    asks.custody(ctx, base, tool, holder)
    found = fleet_cast.candidates(ctx, tool, machine=machine, labels=labels, image=image)
    base["cast"] = found.as_record()
    if tool == "command":
        asks.check_command(ctx, base, ask.command, holder)
    return _reserve_one(ctx, found, ask, base, holder, wait=wait, make=make)


def _reserve_one(ctx: Context, found: Cast, ask: Ask, base: dict[str, Any], holder: Holder,
                 *, wait: float, make: MakeSite) -> tuple[Site, dict[str, Any]]:
    from saphan.capacity import WAIT_FIRST, WAIT_MOST
    from saphan.transport import streams

    passed: list[dict[str, str]] = list(found.passed_over)
    ready: dict[str, tuple[Site, dict[str, Any]]] = {}
    live = list(found.eligible)
    deadline = time.monotonic() + wait
    delay = WAIT_FIRST
    while True:
        full: list[dict[str, str]] = []
        for c in list(live):
            got = ready.get(c.name) or _inspected(ctx, c, ask, base, passed, make)
            if got is None:
                live.remove(c)
                continue
            ready[c.name] = got
            site, b = got
            ordinal = _seat(ctx, site, b, holder, full)
            if ordinal is None:
                continue
            b["session_ordinal"] = ordinal
            b["cast"] = {**base["cast"], "passed_over": [*passed, *full],
                         "chosen": {"machine": c.machine.name, "slot": c.slot.name}}
            return site, b
        left = deadline - time.monotonic()
        if not full or left <= 0:
            break
        time.sleep(min(delay, left))
        try:
            streams.checkpoint()
        except Interrupted as e:
            e.recorded = False  # waiting for a seat: no row was written
            raise
        delay = min(delay * 2, WAIT_MOST)
    from saphan.fleet.cast import refusal

    found.passed_over = passed
    base["cast"] = {**found.as_record(), "passed_over": [*full, *passed]}
    if full and wait > 0:
        base["cast"]["waited_seconds"] = wait
    r = refusal(found, full)
    recorder.refused(ctx, base, found.tool, holder, r)
    raise r


def _inspected(ctx: Context, c: Candidate, ask: Ask, base: dict[str, Any],
               passed: list[dict[str, str]], make: MakeSite
               ) -> tuple[Site, dict[str, Any]] | None:
    """The candidate's site, inspected (before any seat), with its own copy
    of the record; None (and why, in ``passed``) when it cannot take the run."""
    from saphan.run import ask as asks
    from saphan.run import request as requests

    b = {**base, "machine": c.machine.name, "slot": c.slot.name}
    try:
        asks.check_tool(c.slot, ask)
        requests.check_fits(c.slot, c.machine, ask.command, ask.request, ask.boundary)
        site = make(ctx, c.slot, c.machine, ask)
        b["workdir"] = site.workdir
        site.inspect(b)
    except Refusal as r:
        passed.append({"machine": c.machine.name, "slot": c.slot.name,
                       "why": f"[{r.cls}] {r.message}"})
        return None
    except UserError as e:
        passed.append({"machine": c.machine.name, "slot": c.slot.name, "why": str(e)})
        return None
    except TransportError as e:  # an SSH machine that could not be reached: the next one
        passed.append({"machine": c.machine.name, "slot": c.slot.name,
                       "why": f"unreachable: {e}"})
        return None
    return site, b


def _seat(ctx: Context, site: Site, b: dict[str, Any], holder: Holder,
          full: list[dict[str, str]]) -> int | None:
    """One reservation on the candidate's slot, with conflict handling; None
    (and its numbers, in ``full``) when it is at capacity."""
    from saphan.capacity import reserve_seat

    try:
        return reserve_seat(ctx.store, site.slot, run_id=b["id"], tool=site.slot.tool,
                            workdir=site.workdir, holder=holder, remote=site.liveness(),
                            record_key=ctx.record_key)
    except Refusal as r:
        if r.cls != "seat-full":
            raise
        full.append({"machine": site.slot.machine, "slot": site.slot.name,
                     "why": f"full: {r.message}"})
        return None
