"""The Store: every read and write saphan makes, on either database."""

from __future__ import annotations

from collections.abc import Sequence

from saphan.errors import StoreError
from saphan.store import queries as q
from saphan.store.connector import Connector
from saphan.store.migrations import LATEST, MIGRATIONS
from saphan.store.rows import Fact, Machine, RunRow, Slot
from saphan.timefmt import now_iso

# PostgreSQL: serialise concurrent first-use migrations across processes.
_PG_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(72426)"


class Store:
    def __init__(self, connector: Connector):
        self.db = connector

    @property
    def description(self) -> str:
        return self.db.description

    def close(self) -> None:
        self.db.close()

    def reopen(self) -> None:
        """Drop the connection and open a new one (after the server went away
        and came back: a PostgreSQL connection does not survive a restart)."""
        self.db.reopen()

    # -- migrations ----------------------------------------------------------
    def applied_versions(self) -> list[int]:
        self.db.execute(q.CREATE_MIGRATIONS_TABLE)
        return [int(r[0]) for r in self.db.execute(q.APPLIED_VERSIONS)]

    def migrate(self, upto: int | None = None) -> list[int]:
        """Apply what is missing; return the versions applied now.

        ``upto`` stops after that version (tests build an older schema with it).
        """
        target = LATEST if upto is None else upto
        try:
            if target in self.applied_versions():
                return []
        except StoreError:
            pass  # a concurrent first use may be creating the table; retry under the lock
        applied: list[int] = []
        with self.db.transaction():
            if self.db.dialect == "postgresql":
                self.db.execute(_PG_MIGRATION_LOCK)
            self.db.execute(q.CREATE_MIGRATIONS_TABLE)
            have = {int(r[0]) for r in self.db.execute(q.APPLIED_VERSIONS)}
            for version, name, statements in MIGRATIONS:
                if version in have or version > target:
                    continue
                for statement in statements:
                    if isinstance(statement, tuple):
                        dialect, statement = statement
                        if dialect != self.db.dialect:
                            continue
                    self.db.execute(statement)
                self.db.execute(q.RECORD_MIGRATION, (version, name, now_iso()))
                applied.append(version)
        return applied

    def schema_versions(self) -> list[int]:
        """The applied migrations, read as found: no table is created (a
        database saphan never migrated raises StoreError)."""
        return [int(r[0]) for r in self.db.execute(q.APPLIED_VERSIONS)]

    def check_writable(self) -> None:
        """Write one row inside a transaction and roll it back: StoreError
        when the store refuses the write. Nothing is kept (the row is a
        migration numbered 0, which no migration uses)."""

        class _RolledBack(Exception):
            pass

        try:
            with self.db.transaction():
                self.db.execute(q.RECORD_MIGRATION, (0, "write check (rolled back)", now_iso()))
                raise _RolledBack
        except _RolledBack:
            pass

    # -- machines ------------------------------------------------------------
    def add_machine(self, m: Machine) -> bool:
        """False if a machine of that name exists (nothing written)."""
        got = self.db.execute(
            q.INSERT_MACHINE,
            (m.name, m.transport, m.ssh_user, m.ssh_host, m.ssh_port, m.identity_file,
             m.host_key, m.created_at or now_iso(), 1 if m.ssh_agent else 0, m.proxy_jump),
        )
        return bool(got)

    def get_machine(self, name: str) -> Machine | None:
        got = self.db.execute(q.GET_MACHINE, (name,))
        return Machine.from_row(got[0]) if got else None

    def list_machines(self) -> list[Machine]:
        return [Machine.from_row(r) for r in self.db.execute(q.LIST_MACHINES)]

    def remove_machine(self, name: str) -> bool:
        """Remove a machine, its slots and its facts in one transaction.

        Run history is kept. The caller checks for live runs first.
        """
        with self.db.transaction():
            self.db.execute(q.DELETE_MACHINE_FACTS, (name,))
            self.db.execute(q.DELETE_MACHINE_SLOTS, (name,))
            return bool(self.db.execute(q.DELETE_MACHINE, (name,)))

    # -- slots ---------------------------------------------------------------
    def add_slot(self, s: Slot) -> bool:
        got = self.db.execute(
            q.INSERT_SLOT,
            (s.machine, s.name, s.tool, s.max_sessions, s.created_at or now_iso(), s.agent_sha256,
             s.endpoint, s.model, s.max_seconds, s.max_turns),
        )
        return bool(got)

    def get_slot(self, machine: str, name: str) -> Slot | None:
        got = self.db.execute(q.GET_SLOT, (machine, name))
        return Slot.from_row(got[0]) if got else None

    def list_slots(self, machine: str | None = None) -> list[Slot]:
        if machine is None:
            return [Slot.from_row(r) for r in self.db.execute(q.LIST_SLOTS)]
        return [Slot.from_row(r) for r in self.db.execute(q.LIST_MACHINE_SLOTS, (machine,))]

    def set_max_sessions(self, machine: str, name: str, max_sessions: int | None) -> bool:
        return bool(self.db.execute(q.SET_MAX_SESSIONS, (max_sessions, machine, name)))

    def set_agent_pin(self, machine: str, name: str, agent_sha256: str | None) -> bool:
        """Pin (or, with None, unpin) the SHA-256 of a slot's agent binary."""
        return bool(self.db.execute(q.SET_AGENT_PIN, (agent_sha256, machine, name)))

    def set_run_defaults(self, s: Slot) -> bool:
        """Write a slot's run defaults (endpoint, model, max_seconds, max_turns) as ``s`` has them."""
        return bool(self.db.execute(q.SET_RUN_DEFAULTS, (s.endpoint, s.model, s.max_seconds,
                                                         s.max_turns, s.machine, s.name)))

    # -- runs ----------------------------------------------------------------
    def reserve(
        self,
        *,
        run_id: str,
        machine: str,
        slot: str,
        capacity: int,
        tool: str,
        workdir: str | None,
        holder: tuple[str, int, int | None, str | None],
    ) -> int | None:
        """Take the first free ordinal in 0..capacity-1; None when all are held.

        Each attempt is one INSERT whose conflict clause matches the partial
        unique index; no count is read, so N live runs are N distinct keys.
        On PostgreSQL the loop runs in the server (migration 3), one round trip.
        """
        host, pid, start_ticks, boot_id = holder
        if self.db.dialect == "postgresql":
            got = self.db.execute(
                q.RESERVE_ORDINAL_PG,
                (run_id, machine, slot, capacity, now_iso(), host, pid, start_ticks, boot_id,
                 tool, workdir),
            )
            return None if not got or got[0][0] is None else int(got[0][0])
        for ordinal in range(capacity):
            got = self.db.execute(
                q.RESERVE_ORDINAL,
                (run_id, machine, slot, ordinal, now_iso(), host, pid, start_ticks, boot_id,
                 tool, workdir),
            )
            if got:
                return ordinal
        return None

    def insert_refused_run(
        self,
        *,
        run_id: str,
        machine: str,
        slot: str,
        tool: str,
        workdir: str | None,
        holder: tuple[str, int, int | None, str | None],
        refusal_class: str,
        record_json: str,
        at: str | None = None,
    ) -> None:
        """A run refused before it held an ordinal, born finished at ``at``
        (default now): pass the time its signed ``record_json`` names."""
        host, pid, start_ticks, boot_id = holder
        now = at or now_iso()
        self.db.execute(
            q.INSERT_REFUSED_RUN,
            (run_id, machine, slot, now, now, host, pid, start_ticks, boot_id, tool, workdir,
             refusal_class, record_json),
        )

    def live_runs(self, machine: str, slot: str) -> list[RunRow]:
        return [RunRow.from_row(r) for r in self.db.execute(q.LIVE_RUNS_ON_SLOT, (machine, slot))]

    def all_live_runs(self) -> list[RunRow]:
        """Every live run, on every slot (reconciliation: a handful of rows)."""
        return [RunRow.from_row(r) for r in self.db.execute(q.LIVE_RUNS_ALL)]

    def mark_running(self, run_id: str) -> None:
        self.db.execute(q.MARK_RUNNING, (run_id,))

    def set_holder(
        self, run_id: str, holder: tuple[str, int, int | None, str | None]
    ) -> None:
        """Name the process that now holds a live run's seat (a far process)."""
        host, pid, start_ticks, boot_id = holder
        self.db.execute(q.SET_HOLDER, (host, pid, start_ticks, boot_id, run_id))

    def finalize(
        self,
        run_id: str,
        *,
        state: str,
        outcome: str,
        exit_code: int | None = None,
        refusal_class: str | None = None,
        record_json: str | None = None,
        finished_at: str | None = None,
    ) -> bool:
        """Finish one live run by id. False if it was already finished.

        ``record_json`` is the signed record (records.signed_record_json); give
        ``finished_at`` as the record names it, or the row disagrees with it.
        """
        got = self.db.execute(
            q.FINALIZE_RUN,
            (finished_at or now_iso(), state, outcome, exit_code, refusal_class, record_json,
             run_id),
        )
        return bool(got)

    def set_record(self, run_id: str, record_json: str) -> None:
        self.db.execute(q.SET_RECORD, (record_json, run_id))

    def get_run(self, run_id: str) -> RunRow | None:
        got = self.db.execute(q.GET_RUN, (run_id,))
        return RunRow.from_row(got[0]) if got else None

    def find_runs(self, prefix: str) -> list[RunRow]:
        """Up to two runs whose id starts with ``prefix`` (to detect ambiguity)."""
        escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
        return [RunRow.from_row(r) for r in self.db.execute(q.FIND_RUNS_BY_PREFIX, (escaped + "%",))]

    def list_runs(self, limit: int = 50) -> list[RunRow]:
        return [RunRow.from_row(r) for r in self.db.execute(q.LIST_RUNS, (limit,))]

    def last_run(self) -> RunRow | None:
        got = self.db.execute(q.LAST_RUN)
        return RunRow.from_row(got[0]) if got else None

    def runs_on_slot(self, machine: str, slot: str) -> list[RunRow]:
        return [RunRow.from_row(r) for r in self.db.execute(q.RUNS_ON_SLOT_ALL, (machine, slot))]

    # -- signed machine facts --------------------------------------------------
    def put_fact(self, f: Fact) -> None:
        self.db.execute(q.PUT_FACT, (f.machine, f.kind, f.value_json, f.measured_at, f.signature))

    def get_fact(self, machine: str, kind: str) -> Fact | None:
        got = self.db.execute(q.GET_FACT, (machine, kind))
        return Fact.from_row(got[0]) if got else None

    def list_facts(self, machine: str) -> list[Fact]:
        return [Fact.from_row(r) for r in self.db.execute(q.LIST_FACTS, (machine,))]


__all__: Sequence[str] = ["Store", "StoreError"]
