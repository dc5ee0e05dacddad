"""Slots: a machine's named capacities (max_sessions ordinals, an agent pin)
and their run defaults.

A slot's run defaults are what every run it hosts gets unless ``saphan run``
names its own: the agent's model ``endpoint`` (claude: ``ANTHROPIC_BASE_URL``,
set by saphan and taken from nowhere else; codex: the pinned provider's base
URL), the ``model`` (claude, codex), the budgets ``max_seconds`` (claude,
codex, loop) and ``max_turns`` (claude, loop), and the ``agent_path``
(claude, codex, loop): where the agent binary is on the slot's machine. Each applies only to the tools
named; giving one to another tool is bad input, so a setting never sits on a
slot doing nothing.
"""

from __future__ import annotations

from typing import Any

from saphan.context import Context
from saphan.endpoints import check_endpoint, check_model
from saphan.errors import UserError
from saphan.fleet.machines import check_name
from saphan.store.rows import Slot
from saphan.timefmt import now_iso
from saphan.tools import TOOLS

#: bounds of the budgets, on a slot and on ``saphan run`` alike
MAX_SECONDS_RANGE = (1, 7 * 24 * 3600)
MAX_TURNS_RANGE = (1, 10_000)
#: which tools each run default applies to
DEFAULT_TOOLS: dict[str, tuple[str, ...]] = {
    "endpoint": ("claude", "codex"),
    "model": ("claude", "codex"),
    "max_seconds": ("claude", "codex", "loop"),
    "max_turns": ("claude", "loop"),
    "agent_path": ("claude", "codex", "loop"),
}


def _option(field: str) -> str:
    return "--" + field.replace("_", "-")


def check_run_defaults(tool: str, **given: Any) -> None:
    """Each default given (not None) applies to ``tool`` and is in bounds."""
    for field, value in given.items():
        if value is None:
            continue
        tools = DEFAULT_TOOLS[field]
        if tool not in tools:
            raise UserError(f"{_option(field)} applies to {', '.join(tools)} slots; this slot "
                            f"runs {tool}")
        if field == "endpoint":
            check_endpoint(value)
        elif field == "model":
            check_model(value)
        elif field == "agent_path":
            check_agent_path(value)
        else:
            lo, hi = MAX_SECONDS_RANGE if field == "max_seconds" else MAX_TURNS_RANGE
            if not lo <= value <= hi:
                raise UserError(f"{_option(field)} {value} is out of range; give {lo}..{hi}")


def check_agent_path(value: str) -> str:
    """An agent path as a slot holds it: absolute, normal, printable (it is
    never looked up on PATH, and it names a file on the slot's machine)."""
    import posixpath

    if (not value.startswith("/") or posixpath.normpath(value) != value
            or value.startswith("//") or not value.isprintable() or value == "/"):
        raise UserError(f"--agent-path {value!r} is not an absolute, normal path; give the "
                        "agent's full path on the slot's machine (e.g. /opt/claude/bin/claude)")
    return value


def add_slot(
    ctx: Context, machine: str, slot: str, *, tool: str, max_sessions: int | None = None,
    agent_sha256: str | None = None, endpoint: str | None = None, model: str | None = None,
    max_seconds: int | None = None, max_turns: int | None = None,
    agent_path: str | None = None,
) -> Slot:
    from saphan.tools.binaries import check_pin_format

    check_name("slot", slot)
    m = ctx.machine(machine)
    if tool not in TOOLS:
        raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
    from saphan.tools.registry import SITES, site_of, supports

    if not supports(tool, m.transport):
        # a slot `run` could never run is not added (tools/registry.py)
        where = site_of(m.transport)
        raise UserError(f"{tool} does not run on {where} machines in this build (it runs on: "
                        f"{', '.join(SITES.get(tool, ()))}); machine {machine!r} is "
                        f"{'reached over SSH' if where == 'ssh' else 'this host'}")
    if max_sessions is not None and max_sessions < 1:
        raise UserError(
            f"--max-sessions {max_sessions} is below 1; give N >= 1, or omit it for one seat"
        )
    if agent_sha256 is not None:
        check_pin_format(agent_sha256)
    check_run_defaults(tool, endpoint=endpoint, model=model, max_seconds=max_seconds,
                       max_turns=max_turns, agent_path=agent_path)
    s = Slot(machine, slot, tool, max_sessions, now_iso(), agent_sha256, endpoint, model,
             max_seconds, max_turns, agent_path)
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


def remove_slot(ctx: Context, machine: str, slot: str) -> Slot:
    """Remove a slot (its run history is kept); refused while it has live runs."""
    s = ctx.slot(machine, slot)
    live = ctx.store.live_runs(machine, slot)
    if live:
        raise UserError(
            f"slot {slot!r} on machine {machine!r} has {len(live)} live run(s) "
            f"({', '.join(r.id for r in live)}); let them finish or `saphan runs cancel ID` "
            "first")
    ctx.store.remove_slot(machine, slot)
    return s


def set_agent_pin(ctx: Context, machine: str, slot: str, agent_sha256: str | None) -> Slot:
    """Pin the SHA-256 of the slot's agent binary (None: unpin). Checked before launch."""
    from saphan.tools.binaries import check_pin_format

    if agent_sha256 is not None:
        check_pin_format(agent_sha256)
    ctx.slot(machine, slot)
    ctx.store.set_agent_pin(machine, slot, agent_sha256)
    return ctx.slot(machine, slot)


def set_run_defaults(ctx: Context, machine: str, slot: str, *, unset: tuple[str, ...] = (),
                     **given: Any) -> Slot:
    """Change a slot's run defaults: the ``given`` ones (not None) are set,
    the ``unset`` ones cleared; the others are kept."""
    s = ctx.slot(machine, slot)
    for field in unset:
        if field not in DEFAULT_TOOLS:
            raise UserError(f"--unset {field}: not a run default; choose from "
                            f"{', '.join(f.replace('_', '-') for f in DEFAULT_TOOLS)}")
        if given.get(field) is not None:
            raise UserError(f"give {_option(field)} or --unset {field.replace('_', '-')}, "
                            "not both")
    check_run_defaults(s.tool, **given)
    changes = {f: v for f, v in given.items() if v is not None}
    changes.update({f: None for f in unset})
    ctx.store.set_run_defaults(s._replace(**changes))
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
