"""The schema, as numbered migrations. The same SQL runs on SQLite and PostgreSQL.

Never edit a released migration; add the next number. tests/store/test_migrations.py
applies them on both stores and compares the resulting columns and indexes.
"""

from __future__ import annotations

#: (version, name, statements)
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "initial",
        [
            """
            CREATE TABLE machines (
                name          TEXT PRIMARY KEY,
                transport     TEXT NOT NULL CHECK (transport IN ('local', 'ssh')),
                ssh_user      TEXT,
                ssh_host      TEXT,
                ssh_port      INTEGER,
                identity_file TEXT,
                host_key      TEXT,
                created_at    TEXT NOT NULL
            )
            """,
            """
            CREATE TABLE slots (
                machine      TEXT NOT NULL REFERENCES machines(name),
                name         TEXT NOT NULL,
                tool         TEXT NOT NULL CHECK (tool IN ('command', 'claude', 'codex', 'loop')),
                max_sessions INTEGER CHECK (max_sessions IS NULL OR max_sessions >= 1),
                created_at   TEXT NOT NULL,
                PRIMARY KEY (machine, name)
            )
            """,
            # Runs keep no foreign key to machines/slots: the history of a run
            # outlives the machine it ran on.
            """
            CREATE TABLE runs (
                id                 TEXT PRIMARY KEY,
                machine            TEXT NOT NULL,
                slot               TEXT NOT NULL,
                session_ordinal    INTEGER NOT NULL,
                state              TEXT NOT NULL,
                started_at         TEXT NOT NULL,
                finished_at        TEXT,
                holder_host        TEXT,
                holder_pid         INTEGER,
                holder_start_ticks BIGINT,
                holder_boot_id     TEXT,
                tool               TEXT NOT NULL,
                workdir            TEXT,
                outcome            TEXT,
                exit_code          INTEGER,
                refusal_class      TEXT,
                record_json        TEXT
            )
            """,
            # Seat capacity: N distinct keys for live runs. The reservation's
            # ON CONFLICT clause repeats this predicate literally (store/queries.py).
            """
            CREATE UNIQUE INDEX runs_live_seat ON runs (machine, slot, session_ordinal)
                WHERE finished_at IS NULL
            """,
            "CREATE INDEX runs_started ON runs (started_at)",
            """
            CREATE TABLE machine_facts (
                machine     TEXT NOT NULL REFERENCES machines(name),
                kind        TEXT NOT NULL,
                value_json  TEXT NOT NULL,
                measured_at TEXT NOT NULL,
                signature   TEXT NOT NULL,
                PRIMARY KEY (machine, kind)
            )
            """,
        ],
    ),
    (
        2,
        "slot-agent-pin",
        [
            # A slot may pin the SHA-256 of its agent binary; NULL: no pin.
            "ALTER TABLE slots ADD COLUMN agent_sha256 TEXT",
        ],
    ),
]

LATEST = MIGRATIONS[-1][0]
