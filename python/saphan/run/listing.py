"""`saphan runs list`: its filters and the one shape of each row.

    filters(...)    the options as Store.list_runs takes them (bad input: exit 2)
    json_row(data)  a run as --json lists it: every key of RUN_KEYS, live or
                    ended, refused or not (null where a run has none), plus any
                    other key its record carries
    table_row(...)  the text columns: one word each, ``-`` when empty
"""

from __future__ import annotations

from typing import Any

from saphan.errors import UserError

#: --state: a row's state, or ``live`` (reserved or running: not finished)
STATES = ("live", "reserved", "running", "ended", "refused")
#: the outcomes a finished run's row can carry (--outcome takes these; the
#: dashboard offers them)
OUTCOMES = ("exited", "failed", "refused", "error", "cancelled", "time-limit-killed",
            "interrupted", "holder-dead", "finalized-by-operator")
#: the top-level keys every listed run carries (null when it has none)
RUN_KEYS = (
    "agent", "argv", "boundary_argv", "cancel", "composed_boundary", "confinement_setting",
    "connection_lost", "driven_by", "egress", "enforced_by", "environment", "error",
    "exit_code",
    "far_process", "finished_at", "id", "lane", "left_running", "live", "loop", "machine",
    "measure", "model", "network",
    "not_enforced", "notes", "outcome", "output", "policy", "processes_killed_at_end",
    "processes_left_running", "protected_changes", "record_key_id", "record_signature",
    "refusal", "requested_at", "resumes", "return_path", "saphan_version", "session_ordinal",
    "settle_error", "signature", "slot", "started_at", "state", "tool", "tool_policy", "usage",
    "workdir", "worktree", "writable",
)
HEADERS = ["id", "machine", "slot", "ord", "started", "outcome", "exit/class", "enforced", "sig"]


def filters(*, state: str | None = None, machine: str | None = None, slot: str | None = None,
            tool: str | None = None, outcome: str | None = None,
            since: str | None = None) -> dict[str, Any]:
    """Store.list_runs's keyword arguments for the options given."""
    from saphan.tools import TOOLS

    if tool is not None and tool not in TOOLS:
        raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
    out: dict[str, Any] = {"machine": machine, "slot": slot, "outcome": outcome, "tool": tool}
    if state is not None:
        if state not in STATES:
            raise UserError(f"--state {state!r} is unknown; choose one of {', '.join(STATES)}")
        out["live" if state == "live" else "state"] = True if state == "live" else state
    if since is not None:
        from saphan.timefmt import parse_since

        out["since"] = parse_since(since)
    for name in ("machine", "slot", "outcome"):
        value = out[name]
        if value is not None and (not value or len(value) > 200):
            raise UserError(f"--{name} {value!r}: give a name of 1..200 characters")
    return out


def json_row(data: dict[str, Any]) -> dict[str, Any]:
    """The run with every key of :data:`RUN_KEYS` (module docstring)."""
    return {**{k: None for k in RUN_KEYS}, **data}


def table_row(data: dict[str, Any], sig: str) -> list[str]:
    """One run's cells under :data:`HEADERS`."""
    from saphan.run.end import signal_text

    if data.get("exit_code") is not None:
        code = signal_text(data["exit_code"])
    else:
        code = (data.get("refusal") or {}).get("class") or "-"
    ordinal = data.get("session_ordinal")
    return [data["id"], data["machine"], data["slot"], "-" if ordinal is None else str(ordinal),
            data.get("started_at") or "-", data.get("outcome") or data.get("state") or "-",
            code, (data.get("enforced_by") or {}).get("mechanism") or "-", sig]
