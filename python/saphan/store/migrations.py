"""The schema, as numbered migrations. The same SQL runs on SQLite and PostgreSQL.

Never edit a released migration; add the next number. tests/test_store.py
applies them on both stores and compares the resulting columns and indexes.
A statement written as ``(dialect, sql)`` runs on that dialect only: the one
such statement is PostgreSQL's server-side reservation loop (migration 3),
which runs the very INSERT of store/queries.py RESERVE_ORDINAL per ordinal in
one round trip; the tables and the index are the same on both stores.
"""

from __future__ import annotations

Statement = str | tuple[str, str]

#: (version, name, statements)
MIGRATIONS: list[tuple[int, str, list[Statement]]] = [
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
    (
        3,
        "pg-reserve-function",
        [
            # Reservation in one round trip on PostgreSQL: the same enumeration
            # of ordinals 0..N-1, each attempt the same INSERT whose conflict
            # clause repeats the partial index predicate; a losing attempt
            # affects zero rows; no count is read. Only the loop moved into
            # the server (16 contenders paid up to N round trips otherwise).
            (
                "postgresql",
                """
                CREATE OR REPLACE FUNCTION saphan_reserve(
                    p_id TEXT, p_machine TEXT, p_slot TEXT, p_capacity INTEGER,
                    p_started TEXT, p_host TEXT, p_pid INTEGER, p_ticks BIGINT,
                    p_boot TEXT, p_tool TEXT, p_workdir TEXT
                ) RETURNS INTEGER LANGUAGE plpgsql AS $fn$
                DECLARE
                    o INTEGER;
                    got TEXT;
                BEGIN
                    FOR o IN 0 .. p_capacity - 1 LOOP
                        got := NULL;
                        INSERT INTO runs (
                            id, machine, slot, session_ordinal, state, started_at,
                            finished_at, holder_host, holder_pid, holder_start_ticks,
                            holder_boot_id, tool, workdir, outcome, exit_code,
                            refusal_class, record_json)
                        VALUES (p_id, p_machine, p_slot, o, 'reserved', p_started, NULL,
                                p_host, p_pid, p_ticks, p_boot, p_tool, p_workdir, NULL,
                                NULL, NULL, NULL)
                        ON CONFLICT (machine, slot, session_ordinal)
                            WHERE finished_at IS NULL DO NOTHING
                        RETURNING id INTO got;
                        IF got IS NOT NULL THEN
                            RETURN o;
                        END IF;
                    END LOOP;
                    RETURN NULL;
                END
                $fn$
                """,
            ),
        ],
    ),
    (
        4,
        "machine-ssh-agent-and-jump",
        [
            # An SSH machine may authenticate through the operator's ssh-agent
            # (opt-in, 0/1), and may be reached through a jump host:
            # "user@host:port <pinned host key line>" (NULL: direct).
            "ALTER TABLE machines ADD COLUMN ssh_agent INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE machines ADD COLUMN proxy_jump TEXT",
        ],
    ),
    (
        5,
        "slot-run-defaults",
        [
            # A slot's own defaults for the runs it hosts (NULL: none): the
            # agent's model endpoint and model, and its budgets.
            "ALTER TABLE slots ADD COLUMN endpoint TEXT",
            "ALTER TABLE slots ADD COLUMN model TEXT",
            "ALTER TABLE slots ADD COLUMN max_seconds INTEGER",
            "ALTER TABLE slots ADD COLUMN max_turns INTEGER",
        ],
    ),
    (
        6,
        "slot-agent-path",
        [
            # Where a slot's agent binary is on its machine (absolute; NULL:
            # the delivered one, or this host's resolution for a local slot).
            "ALTER TABLE slots ADD COLUMN agent_path TEXT",
        ],
    ),
    (
        7,
        "labels",
        [
            # Operator labels (key=value) of a machine (slot '') or of one of
            # its slots; casting matches them. A slot's row has no foreign key
            # ('' names no slot): removing a slot or a machine deletes its
            # labels first, in the same transaction (store/base.py).
            """
            CREATE TABLE labels (
                machine TEXT NOT NULL REFERENCES machines(name),
                slot    TEXT NOT NULL,
                key     TEXT NOT NULL,
                value   TEXT NOT NULL,
                PRIMARY KEY (machine, slot, key)
            )
            """,
        ],
    ),
    (
        8,
        "batches",
        [
            # A batch of tasks (`saphan batch run FILE`) and its queue. Each
            # task is signed with the record key, bound to its batch and seq
            # (records.task_signature): a child runs only a task that verifies.
            # A task is pending, claimed by one worker for one run id, or done. A
            # claim names its worker, and the child that registered itself for
            # that run id (batch/child.py): a claim whose worker and child are
            # both dead goes back to pending (batch/recover.py). earlier_runs:
            # the run ids of attempts that did not finish the task, in order.
            """
            CREATE TABLE batches (
                id            TEXT PRIMARY KEY,
                created_at    TEXT NOT NULL,
                source        TEXT NOT NULL,
                source_sha256 TEXT NOT NULL,
                tasks         INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE batch_tasks (
                batch              TEXT NOT NULL REFERENCES batches(id),
                seq                INTEGER NOT NULL,
                task_id            TEXT NOT NULL,
                spec_json          TEXT NOT NULL,
                signature          TEXT NOT NULL,
                state              TEXT NOT NULL
                                   CHECK (state IN ('pending', 'claimed', 'done')),
                run_id             TEXT,
                worker_host        TEXT,
                worker_pid         INTEGER,
                worker_start_ticks BIGINT,
                worker_boot_id     TEXT,
                child_host         TEXT,
                child_pid          INTEGER,
                child_start_ticks  BIGINT,
                child_boot_id      TEXT,
                claimed_at         TEXT,
                finished_at        TEXT,
                outcome            TEXT,
                exit_code          INTEGER,
                error              TEXT,
                attempts           INTEGER NOT NULL DEFAULT 0,
                earlier_runs       TEXT NOT NULL DEFAULT '',
                PRIMARY KEY (batch, seq),
                UNIQUE (batch, task_id)
            )
            """,
            "CREATE INDEX batch_tasks_state ON batch_tasks (batch, state, seq)",
        ],
    ),
    (
        9,
        "pg-seat-function",
        [
            # The reservation and, when every ordinal is held, the live runs
            # holding them, in one round trip on PostgreSQL: the same loop as
            # saphan_reserve (migration 3, the same INSERT per ordinal); then
            # either this run's new row or the slot's live rows. Conflict
            # handling reads its holders from here instead of a second query.
            (
                "postgresql",
                """
                CREATE OR REPLACE FUNCTION saphan_seat(
                    p_id TEXT, p_machine TEXT, p_slot TEXT, p_capacity INTEGER,
                    p_started TEXT, p_host TEXT, p_pid INTEGER, p_ticks BIGINT,
                    p_boot TEXT, p_tool TEXT, p_workdir TEXT
                ) RETURNS SETOF runs LANGUAGE plpgsql AS $fn$
                DECLARE
                    o INTEGER;
                BEGIN
                    o := saphan_reserve(p_id, p_machine, p_slot, p_capacity, p_started,
                                        p_host, p_pid, p_ticks, p_boot, p_tool, p_workdir);
                    IF o IS NOT NULL THEN
                        RETURN QUERY SELECT * FROM runs WHERE id = p_id;
                    ELSE
                        RETURN QUERY SELECT * FROM runs
                            WHERE machine = p_machine AND slot = p_slot
                              AND finished_at IS NULL
                            ORDER BY session_ordinal;
                    END IF;
                END
                $fn$
                """,
            ),
        ],
    ),
    (
        10,
        "runs-listing-indexes",
        [
            # The runs listing (`runs list`, the dashboard's runs page) in its
            # order, narrowed by one filter or none, paged by (started_at, id):
            # every such query reads an index in order (store/queries.py LIST_RUNS).
            "CREATE INDEX runs_newest ON runs (started_at, id)",
            "CREATE INDEX runs_machine_newest ON runs (machine, started_at, id)",
            "CREATE INDEX runs_slot_newest ON runs (slot, started_at, id)",
            "CREATE INDEX runs_tool_newest ON runs (tool, started_at, id)",
            "CREATE INDEX runs_outcome_newest ON runs (outcome, started_at, id)",
            "CREATE INDEX runs_state_newest ON runs (state, started_at, id)",
            # live runs, newest first (the seat index is keyed by slot, not time)
            "CREATE INDEX runs_live_newest ON runs (started_at, id) WHERE finished_at IS NULL",
            # a prefix of runs_newest: PostgreSQL would pick it and sort
            "DROP INDEX runs_started",
        ],
    ),
]

LATEST = MIGRATIONS[-1][0]
