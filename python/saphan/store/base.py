"""The Store: every read and write saphan makes, on either database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from saphan.errors import StoreError
from saphan.store import queries as q
from saphan.store.batches import BatchQueue
from saphan.store.connector import Connector
from saphan.store.migrations import LATEST, MIGRATIONS
from saphan.store.rows import Fact, Machine, RunRow, Slot
from saphan.timefmt import now_iso

# PostgreSQL: serialise concurrent first-use migrations across processes.
_PG_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(72426)"

# saphan doctor's (one dialect each, so here like the lock above): later
# statements of the session give up instead of waiting on a lock; the
# privileges a run needs, asked of PostgreSQL.
_PG_BOUND_WAITS = ("SELECT set_config('lock_timeout', ?, false), "
                   "set_config('statement_timeout', ?, false)")
_SQLITE_BUSY_TIMEOUT = "PRAGMA busy_timeout = {ms:d}"
_PG_ROLE_AND_SCHEMA = """
SELECT quote_ident(current_user), quote_ident(current_schema()),
       has_schema_privilege(current_schema(), 'CREATE')"""
# [] when the table (as the session's search_path finds it) does not exist.
_PG_TABLE_PRIVILEGE = """
SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), has_table_privilege(c.oid, ?)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(?)"""
_PG_FUNCTION_PRIVILEGE = """
SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '('
       || pg_get_function_identity_arguments(p.oid) || ')',
       has_function_privilege(p.oid, 'EXECUTE')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE p.oid = to_regprocedure(?)"""

#: (table, privilege) for every table a run reads or writes (PostgreSQL):
#: it reads its machine, slot and facts and the schema's version, and
#: inserts and updates its own row of runs (check_writable tries each)
RUN_PRIVILEGES: tuple[tuple[str, str], ...] = (
    ("runs", "SELECT"), ("runs", "INSERT"), ("runs", "UPDATE"),
    ("machines", "SELECT"), ("slots", "SELECT"), ("machine_facts", "SELECT"), ("labels", "SELECT"),
    ("schema_migrations", "SELECT"),
)
#: the reservation loop a run calls on PostgreSQL (migration 3)
RESERVE_FUNCTION = ("saphan_reserve(text, text, text, integer, text, text, integer, bigint, "
                    "text, text, text)")
#: the reservation with its holders (migration 9), which calls the one above
SEAT_FUNCTION = ("saphan_seat(text, text, text, integer, text, text, integer, bigint, "
                 "text, text, text)")


class Store(BatchQueue):
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

    def bound_waits(self, lock_seconds: float, statement_seconds: float) -> None:
        """Every later statement of this connection gives up (StoreError)
        after waiting ``lock_seconds`` for a lock another session holds, or
        running ``statement_seconds`` (PostgreSQL's lock_timeout and
        statement_timeout; SQLite's busy timeout, its only wait)."""
        if self.db.dialect == "postgresql":
            self.db.execute(_PG_BOUND_WAITS, (f"{round(lock_seconds * 1000)}ms",
                                               f"{round(statement_seconds * 1000)}ms"))
        else:
            self.db.execute(_SQLITE_BUSY_TIMEOUT.format(ms=round(lock_seconds * 1000)))

    def check_writable(self) -> None:
        """What every command and every run write, tried inside one
        transaction that is rolled back (nothing is kept): open_store's
        CREATE TABLE IF NOT EXISTS schema_migrations (on PostgreSQL it needs
        CREATE in the schema even when the table exists), then a run's own
        statements: its machine, slot and facts read, a seat reserved,
        marked running, its holder and record written, finalised, and a
        refused run's row. StoreError names the first one refused."""
        import uuid

        class _RolledBack(Exception):
            pass

        run_id, machine, slot = f"doctor-{uuid.uuid4().hex}", "saphan-doctor", "write-check"
        holder = ("saphan-doctor", 0, None, None)
        try:
            with self.db.transaction():
                self.db.execute(q.CREATE_MIGRATIONS_TABLE)
                self.get_machine(machine)
                self.get_slot(machine, slot)
                self.get_fact(machine, "landlock")
                self.live_runs(machine, slot)
                self.reserve(run_id=run_id, machine=machine, slot=slot, capacity=1,
                             tool="command", workdir=None, holder=holder)
                self.mark_running(run_id)
                self.set_holder(run_id, holder)
                self.set_record(run_id, "{}")
                self.finalize(run_id, state="ended", outcome="exited", exit_code=0,
                              record_json="{}")
                self.insert_refused_run(run_id=f"{run_id}-refused", machine=machine, slot=slot,
                                        tool="command", workdir=None, holder=holder,
                                        refusal_class="doctor-write-check", record_json="{}")
                raise _RolledBack
        except _RolledBack:
            pass

    def missing_grants(self) -> list[str]:
        """PostgreSQL: the GRANT statements that would give this session's
        role what open_store and a run need (CREATE in its schema, the
        :data:`RUN_PRIVILEGES`, EXECUTE on the reservation functions), for
        the tables that exist. Empty on SQLite, or when nothing is missing."""
        if self.db.dialect != "postgresql":
            return []
        role, schema, can_create = self.db.execute(_PG_ROLE_AND_SCHEMA)[0]
        grants = []
        if schema is None:
            grants.append(f"ALTER ROLE {role} SET search_path = <a schema that exists>")
        elif not can_create:
            grants.append(f"GRANT CREATE ON SCHEMA {schema} TO {role}")
        missing: dict[str, list[str]] = {}
        for table, privilege in RUN_PRIVILEGES:
            for name, held in self.db.execute(_PG_TABLE_PRIVILEGE, (privilege, table)):
                if not held:
                    missing.setdefault(name, []).append(privilege)
        grants += [f"GRANT {', '.join(privileges)} ON {name} TO {role}"
                   for name, privileges in missing.items()]
        for function in (RESERVE_FUNCTION, SEAT_FUNCTION):
            for name, held in self.db.execute(_PG_FUNCTION_PRIVILEGE, (function,)):
                if not held:
                    grants.append(f"GRANT EXECUTE ON FUNCTION {name} TO {role}")
        return grants

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
        """Remove a machine, its slots, its labels (its own and its slots')
        and its facts in one transaction.

        Run history is kept. The caller checks for live runs first.
        """
        with self.db.transaction():
            self.db.execute(q.DELETE_MACHINE_LABELS, (name,))
            self.db.execute(q.DELETE_MACHINE_FACTS, (name,))
            self.db.execute(q.DELETE_MACHINE_SLOTS, (name,))
            return bool(self.db.execute(q.DELETE_MACHINE, (name,)))

    # -- slots ---------------------------------------------------------------
    def add_slot(self, s: Slot) -> bool:
        got = self.db.execute(
            q.INSERT_SLOT,
            (s.machine, s.name, s.tool, s.max_sessions, s.created_at or now_iso(), s.agent_sha256,
             s.endpoint, s.model, s.max_seconds, s.max_turns, s.agent_path),
        )
        return bool(got)

    def get_slot(self, machine: str, name: str) -> Slot | None:
        got = self.db.execute(q.GET_SLOT, (machine, name))
        return Slot.from_row(got[0]) if got else None

    def list_slots(self, machine: str | None = None) -> list[Slot]:
        if machine is None:
            return [Slot.from_row(r) for r in self.db.execute(q.LIST_SLOTS)]
        return [Slot.from_row(r) for r in self.db.execute(q.LIST_MACHINE_SLOTS, (machine,))]

    def remove_slot(self, machine: str, name: str) -> bool:
        """Remove a slot's row and its labels in one transaction (its runs'
        history is kept); the caller checks live runs."""
        with self.db.transaction():
            self.db.execute(q.DELETE_SLOT_LABELS, (machine, name))
            return bool(self.db.execute(q.DELETE_SLOT, (machine, name)))

    def set_max_sessions(self, machine: str, name: str, max_sessions: int | None) -> bool:
        return bool(self.db.execute(q.SET_MAX_SESSIONS, (max_sessions, machine, name)))

    def set_agent_pin(self, machine: str, name: str, agent_sha256: str | None) -> bool:
        """Pin (or, with None, unpin) the SHA-256 of a slot's agent binary."""
        return bool(self.db.execute(q.SET_AGENT_PIN, (agent_sha256, machine, name)))

    def set_run_defaults(self, s: Slot) -> bool:
        """Write a slot's run defaults (endpoint, model, max_seconds, max_turns,
        agent_path) as ``s`` has them."""
        return bool(self.db.execute(q.SET_RUN_DEFAULTS, (s.endpoint, s.model, s.max_seconds,
                                                         s.max_turns, s.agent_path, s.machine,
                                                         s.name)))

    # -- labels (slot "": the machine's own) -----------------------------------
    def set_label(self, machine: str, slot: str, key: str, value: str) -> None:
        """Set one label of a machine (``slot`` "") or of its slot, replacing its value."""
        self.db.execute(q.SET_LABEL, (machine, slot, key, value))

    def remove_label(self, machine: str, slot: str, key: str) -> bool:
        """False if the target had no label ``key``."""
        return bool(self.db.execute(q.DELETE_LABEL, (machine, slot, key)))

    def labels(self) -> dict[tuple[str, str], dict[str, str]]:
        """Every label, keyed by (machine, slot), slot "" for the machine's own."""
        out: dict[tuple[str, str], dict[str, str]] = {}
        for machine, slot, key, value in self.db.execute(q.LIST_LABELS):
            out.setdefault((machine, slot), {})[key] = value
        return out

    def change_labels(self, machine: str, slot: str, put: Mapping[str, str],
                      remove: Sequence[str]) -> list[str]:
        """Remove the keys ``remove`` and set ``put`` on one target, in one
        transaction. Returns the keys of ``remove`` it did not have; when
        there are any, nothing is written."""

        class _Missing(Exception):
            pass

        missing: list[str] = []
        try:
            with self.db.transaction():
                if slot and self.get_slot(machine, slot) is None:
                    # removed since it was checked: nothing is written
                    raise LookupError(f"slot {slot!r} on {machine!r} is gone")
                missing = [k for k in remove if not self.remove_label(machine, slot, k)]
                if missing:
                    raise _Missing
                for key, value in put.items():
                    self.set_label(machine, slot, key, value)
        except _Missing:
            pass
        return missing

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

    def reserve_or_holders(
        self,
        *,
        run_id: str,
        machine: str,
        slot: str,
        capacity: int,
        tool: str,
        workdir: str | None,
        holder: tuple[str, int, int | None, str | None],
    ) -> tuple[int | None, list[RunRow]]:
        """:meth:`reserve`; when every ordinal is held, also the live runs
        holding them (conflict handling's reading), in the same round trip
        on PostgreSQL (migration 9). (ordinal, []) or (None, holders)."""
        if self.db.dialect != "postgresql":
            got = self.reserve(run_id=run_id, machine=machine, slot=slot, capacity=capacity,
                               tool=tool, workdir=workdir, holder=holder)
            return (got, []) if got is not None else (None, self.live_runs(machine, slot))
        host, pid, start_ticks, boot_id = holder
        rows = [RunRow.from_row(r) for r in self.db.execute(
            q.SEAT_PG, (run_id, machine, slot, capacity, now_iso(), host, pid, start_ticks,
                        boot_id, tool, workdir))]
        mine = next((r for r in rows if r.id == run_id), None)
        return (mine.session_ordinal, []) if mine is not None else (None, rows)

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

    def live_runs_on(self, machine: str) -> list[RunRow]:
        """Every live run on ``machine``, every slot (workdir exclusivity)."""
        return [RunRow.from_row(r) for r in self.db.execute(q.LIVE_RUNS_ON_MACHINE, (machine,))]

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

    def list_runs(self, limit: int = 50, *, state: str | None = None, live: bool = False,
                  machine: str | None = None, slot: str | None = None, tool: str | None = None,
                  outcome: str | None = None, since: str | None = None,
                  before: tuple[str, str] | None = None) -> list[RunRow]:
        """The newest runs; each filter given (not None; ``live``: unfinished
        only) narrows them; ``since`` bounds started_at (text, as stored);
        ``before`` = (started_at, id) of the last run of the page before
        (keyset paging: the runs after it in the listing's order)."""
        clauses: list[str] = []
        params: list[object] = []
        given = {"state": state, "live": live or None, "machine": machine, "slot": slot,
                 "tool": tool, "outcome": outcome, "since": since}
        for name, value in given.items():
            if value is not None:
                clauses.append(q.RUN_FILTERS[name])
                if name != "live":
                    params.append(value)
        if before is not None:
            clauses.append(q.RUN_FILTERS["before"])
            params.extend((before[0], before[0], before[1]))
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = q.LIST_RUNS.format(where=where)
        return [RunRow.from_row(r) for r in self.db.execute(sql, (*params, limit))]

    def ended_runs_until(self, until: str) -> list[RunRow]:
        """Every run that ended at or before ``until`` (text, as stored), oldest first."""
        return [RunRow.from_row(r) for r in self.db.execute(q.ENDED_RUNS_UNTIL, (until,))]

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
