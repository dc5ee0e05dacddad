"""Typed rows the store returns. Plain values; no behaviour beyond parsing.

NamedTuples rather than dataclasses: these are built on every CLI start, and
a NamedTuple class costs a fraction of a frozen dataclass to create.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from saphan.store.connector import Row


class Machine(NamedTuple):
    name: str
    transport: str  # "local" | "ssh"
    ssh_user: str | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    identity_file: str | None = None
    host_key: str | None = None
    created_at: str = ""
    #: authenticate through the operator's ssh-agent (opt-in at `machine add`)
    ssh_agent: bool = False
    #: reached through this jump host: "user@host:port <pinned host key line>"
    proxy_jump: str | None = None

    @classmethod
    def from_row(cls, r: Row) -> Machine:
        name, transport, user, host, port, ident, key, created, agent, jump = r
        return cls(name, transport, user, host, port, ident, key, created, bool(agent), jump)

    def address(self) -> str:
        if self.transport == "local":
            return "local"
        return f"{self.ssh_user}@{self.ssh_host}:{self.ssh_port}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "address": self.address(),
            "identity_file": self.identity_file,
            "host_key": self.host_key,
            "created_at": self.created_at,
            "ssh_agent": self.ssh_agent,
            "proxy_jump": self.proxy_jump,
        }


class Slot(NamedTuple):
    machine: str
    name: str
    tool: str
    max_sessions: int | None
    created_at: str = ""
    #: the pinned SHA-256 (64 lowercase hex) of the agent binary; None: no pin
    agent_sha256: str | None = None
    #: the run defaults (fleet/slots.py; None: none): the agent's model
    #: endpoint and model, its wall-clock budget and its turn budget
    endpoint: str | None = None
    model: str | None = None
    max_seconds: int | None = None
    max_turns: int | None = None
    #: where the agent binary is on the slot's machine (absolute); None: the
    #: delivered one (codex on an SSH machine) or this host's resolution
    agent_path: str | None = None

    @classmethod
    def from_row(cls, r: Row) -> Slot:
        return cls(*r)

    @property
    def capacity(self) -> int:
        """How many ordinals this slot has. No max_sessions: exactly one."""
        return self.max_sessions if self.max_sessions is not None else 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "slot": self.name,
            "tool": self.tool,
            "max_sessions": self.max_sessions,
            "agent_sha256": self.agent_sha256,
            "endpoint": self.endpoint,
            "model": self.model,
            "max_seconds": self.max_seconds,
            "max_turns": self.max_turns,
            "agent_path": self.agent_path,
            "created_at": self.created_at,
        }


def _text(r: Row) -> tuple[Any, ...]:
    """The row's values, any bytes among them as text (SQLite keeps a BLOB in a
    TEXT column; a row saphan wrote never has one): decoded, errors replaced."""
    if not any(isinstance(v, bytes) for v in r):
        return tuple(r)
    return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in r)


def _whole(value: object) -> bool:
    """None or an int (not a bool)."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


class RunRow(NamedTuple):
    id: str
    machine: str
    slot: str
    session_ordinal: int
    state: str
    started_at: str
    finished_at: str | None
    holder_host: str | None
    holder_pid: int | None
    holder_start_ticks: int | None
    holder_boot_id: str | None
    tool: str
    workdir: str | None
    outcome: str | None
    exit_code: int | None
    refusal_class: str | None
    record_json: str | None

    @classmethod
    def from_row(cls, r: Row) -> RunRow:
        row = cls(*_text(r))
        # SQLite keeps any value in any column: a holder's pid or start time
        # that is not a number names no process (a row saphan did not write)
        if not _whole(row.holder_pid) or not _whole(row.holder_start_ticks):
            row = row._replace(holder_pid=row.holder_pid if _whole(row.holder_pid) else None,
                               holder_start_ticks=(row.holder_start_ticks
                                                   if _whole(row.holder_start_ticks) else None))
        return row

    @property
    def live(self) -> bool:
        return self.finished_at is None

    def record(self) -> dict[str, Any]:
        return json.loads(self.record_json) if self.record_json else {}


class Fact(NamedTuple):
    machine: str
    kind: str
    value_json: str
    measured_at: str
    signature: str

    @classmethod
    def from_row(cls, r: Row) -> Fact:
        return cls(*r)


class Batch(NamedTuple):
    id: str
    created_at: str
    #: the batch file as given, and the SHA-256 of its bytes
    source: str
    source_sha256: str
    tasks: int

    @classmethod
    def from_row(cls, r: Row) -> Batch:
        return cls(*_text(r))


Holder4 = tuple[str, int, int | None, str | None]


class Task(NamedTuple):
    """One task of a batch (migration 8): pending, claimed or done."""

    batch: str
    seq: int
    task_id: str
    spec_json: str
    #: records.task_signature of (batch, seq, task_id, spec_json)
    signature: str
    state: str
    run_id: str | None
    worker_host: str | None
    worker_pid: int | None
    worker_start_ticks: int | None
    worker_boot_id: str | None
    child_host: str | None
    child_pid: int | None
    child_start_ticks: int | None
    child_boot_id: str | None
    claimed_at: str | None
    finished_at: str | None
    outcome: str | None
    exit_code: int | None
    error: str | None
    attempts: int
    earlier_runs: str

    @classmethod
    def from_row(cls, r: Row) -> Task:
        return cls(*_text(r))

    @property
    def worker(self) -> Holder4 | None:
        if self.worker_host is None or self.worker_pid is None:
            return None
        return (self.worker_host, self.worker_pid, self.worker_start_ticks, self.worker_boot_id)

    @property
    def child(self) -> Holder4 | None:
        if self.child_host is None or self.child_pid is None:
            return None
        return (self.child_host, self.child_pid, self.child_start_ticks, self.child_boot_id)

    def spec(self) -> dict[str, Any]:
        """The stored task ({} when it is not a JSON object: a row written by
        no saphan, which the child refuses by its signature)."""
        try:
            value = json.loads(self.spec_json)
        except (ValueError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {}
