"""Slots: a machine's named capacities (max_sessions ordinals, an agent pin)."""

from __future__ import annotations

from typing import Any

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet.machines import check_name
from saphan.store.rows import Slot
from saphan.timefmt import now_iso
from saphan.tools import TOOLS


def add_slot(
    ctx: Context, machine: str, slot: str, *, tool: str, max_sessions: int | None = None,
    agent_sha256: str | None = None,
) -> Slot:
    from saphan.tools.binaries import check_pin_format

    check_name("slot", slot)
    ctx.machine(machine)
    if tool not in TOOLS:
        raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
    if max_sessions is not None and max_sessions < 1:
        raise UserError(
            f"--max-sessions {max_sessions} is below 1; give N >= 1, or omit it for one seat"
        )
    if agent_sha256 is not None:
        check_pin_format(agent_sha256)
    s = Slot(machine, slot, tool, max_sessions, now_iso(), agent_sha256)
    if not ctx.store.add_slot(s):
        raise UserError(f"slot {slot!r} already exists on machine {machine!r}; pick another name")
    return s


def slots(ctx: Context, machine: str | None = None) -> list[Slot]:
    if machine is not None:
        ctx.machine(machine)
    return ctx.store.list_slots(machine)


def set_max_sessions(ctx: Context, machine: str, slot: str, max_sessions: int | None) -> Slot:
    """Lowering never evicts a live run; raising takes effect at once."""
    if max_sessions is not None and max_sessions < 1:
        raise UserError(f"--max-sessions {max_sessions} is below 1; give N >= 1")
    ctx.slot(machine, slot)
    ctx.store.set_max_sessions(machine, slot, max_sessions)
    return ctx.slot(machine, slot)


def set_agent_pin(ctx: Context, machine: str, slot: str, agent_sha256: str | None) -> Slot:
    """Pin the SHA-256 of the slot's agent binary (None: unpin). Checked before launch."""
    from saphan.tools.binaries import check_pin_format

    if agent_sha256 is not None:
        check_pin_format(agent_sha256)
    ctx.slot(machine, slot)
    ctx.store.set_agent_pin(machine, slot, agent_sha256)
    return ctx.slot(machine, slot)


def holders(ctx: Context, machine: str, slot: str) -> list[dict[str, Any]]:
    from saphan.capacity import holder_liveness

    ctx.slot(machine, slot)
    far = ctx.remote_liveness(ctx.machine(machine))
    out = []
    for run in ctx.store.live_runs(machine, slot):
        life = holder_liveness(run, far)
        out.append(
            {
                "ordinal": run.session_ordinal,
                "run": run.id,
                "pid": run.holder_pid,
                "host": run.holder_host,
                "since": run.started_at,
                "liveness": life.state,
                "evidence": life.evidence,
            }
        )
    return out
