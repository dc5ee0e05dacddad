"""Every SQL statement saphan runs, named, in one place.

Placeholders are ``?``; the PostgreSQL connector rewrites them to ``%s``.
No other module writes SQL.
"""

from __future__ import annotations

RUN_COLUMNS = (
    "id, machine, slot, session_ordinal, state, started_at, finished_at, holder_host, "
    "holder_pid, holder_start_ticks, holder_boot_id, tool, workdir, outcome, exit_code, "
    "refusal_class, record_json"
)

# -- migrations ---------------------------------------------------------------
CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL
)"""
APPLIED_VERSIONS = "SELECT version FROM schema_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"

# -- machines -----------------------------------------------------------------
INSERT_MACHINE = """
INSERT INTO machines (name, transport, ssh_user, ssh_host, ssh_port, identity_file, host_key,
                      created_at, ssh_agent, proxy_jump)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO NOTHING
RETURNING name"""
MACHINE_COLUMNS = ("name, transport, ssh_user, ssh_host, ssh_port, identity_file, host_key, "
                   "created_at, ssh_agent, proxy_jump")
GET_MACHINE = f"SELECT {MACHINE_COLUMNS} FROM machines WHERE name = ?"
LIST_MACHINES = f"SELECT {MACHINE_COLUMNS} FROM machines ORDER BY name"
DELETE_MACHINE_FACTS = "DELETE FROM machine_facts WHERE machine = ?"
DELETE_MACHINE_LABELS = "DELETE FROM labels WHERE machine = ?"
DELETE_MACHINE_SLOTS = "DELETE FROM slots WHERE machine = ?"
DELETE_MACHINE = "DELETE FROM machines WHERE name = ? RETURNING name"

# -- slots --------------------------------------------------------------------
INSERT_SLOT = """
INSERT INTO slots (machine, name, tool, max_sessions, created_at, agent_sha256, endpoint, model,
                   max_seconds, max_turns, agent_path)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (machine, name) DO NOTHING
RETURNING name"""
# In the order of rows.Slot's fields.
SLOT_COLUMNS = ("machine, name, tool, max_sessions, created_at, agent_sha256, endpoint, model, "
                "max_seconds, max_turns, agent_path")
GET_SLOT = f"SELECT {SLOT_COLUMNS} FROM slots WHERE machine = ? AND name = ?"
LIST_SLOTS = f"SELECT {SLOT_COLUMNS} FROM slots ORDER BY machine, name"
LIST_MACHINE_SLOTS = f"SELECT {SLOT_COLUMNS} FROM slots WHERE machine = ? ORDER BY name"
DELETE_SLOT = "DELETE FROM slots WHERE machine = ? AND name = ? RETURNING name"
SET_MAX_SESSIONS = "UPDATE slots SET max_sessions = ? WHERE machine = ? AND name = ? RETURNING name"
SET_AGENT_PIN = "UPDATE slots SET agent_sha256 = ? WHERE machine = ? AND name = ? RETURNING name"
SET_RUN_DEFAULTS = """
UPDATE slots SET endpoint = ?, model = ?, max_seconds = ?, max_turns = ?, agent_path = ?
WHERE machine = ? AND name = ? RETURNING name"""

# -- runs: reservation ----------------------------------------------------------
# One attempt at one ordinal. The conflict target's WHERE repeats the index
# predicate as literal SQL: a bound parameter there fails on PostgreSQL once it
# switches to a generic plan (SQLSTATE 42P10) and SQLite refuses it outright.
# A losing concurrent attempt affects zero rows and returns nothing.
RESERVE_ORDINAL = f"""
INSERT INTO runs ({RUN_COLUMNS})
VALUES (?, ?, ?, ?, 'reserved', ?, NULL, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL)
ON CONFLICT (machine, slot, session_ordinal) WHERE finished_at IS NULL DO NOTHING
RETURNING id"""

# PostgreSQL: the same attempts, looped in the server (migration 3).
RESERVE_ORDINAL_PG = "SELECT saphan_reserve(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# PostgreSQL: the same, returning this run's new row, or else the slot's
# live rows (migration 9): conflict handling's holders in the same trip.
SEAT_PG = f"SELECT {RUN_COLUMNS} FROM saphan_seat(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

# A run refused before it could hold an ordinal: born finished, outside the index.
INSERT_REFUSED_RUN = f"""
INSERT INTO runs ({RUN_COLUMNS})
VALUES (?, ?, ?, -1, 'refused', ?, ?, ?, ?, ?, ?, ?, ?, 'refused', NULL, ?, ?)"""

LIVE_RUNS_ON_MACHINE = f"""
SELECT {RUN_COLUMNS} FROM runs
WHERE machine = ? AND finished_at IS NULL
ORDER BY id"""

LIVE_RUNS_ON_SLOT = f"""
SELECT {RUN_COLUMNS} FROM runs
WHERE machine = ? AND slot = ? AND finished_at IS NULL
ORDER BY session_ordinal"""

# Every live run of every slot: the few rows reconciliation looks at (the
# partial index runs_live_seat holds exactly these).
LIVE_RUNS_ALL = f"""
SELECT {RUN_COLUMNS} FROM runs WHERE finished_at IS NULL ORDER BY started_at"""

MARK_RUNNING = "UPDATE runs SET state = 'running' WHERE id = ? AND finished_at IS NULL"

# A reservation whose request turned out bad before anything ran (nothing to
# record: the row goes, as if the seat had never been taken).
# A remote run's holder becomes the far process once it has started.
SET_HOLDER = """
UPDATE runs
SET holder_host = ?, holder_pid = ?, holder_start_ticks = ?, holder_boot_id = ?
WHERE id = ? AND finished_at IS NULL"""

# Finalise one run, by id, only if it is still live: finalising twice is a no-op.
FINALIZE_RUN = """
UPDATE runs
SET finished_at = ?, state = ?, outcome = ?, exit_code = ?, refusal_class = ?,
    record_json = ?
WHERE id = ? AND finished_at IS NULL
RETURNING id"""

SET_RECORD = "UPDATE runs SET record_json = ? WHERE id = ?"
GET_RUN = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"
FIND_RUNS_BY_PREFIX = f"SELECT {RUN_COLUMNS} FROM runs WHERE id LIKE ? ESCAPE '!' ORDER BY id LIMIT 2"
# `runs list` and the dashboard's runs page: the newest runs. Each filter
# given adds its one fixed clause (Store.list_runs joins them with AND), so
# the planner can use the indexes of migration 10; ``before`` is the keyset
# cursor of a page: the runs older than (started_at, id).
LIST_RUNS = f"SELECT {RUN_COLUMNS} FROM runs{{where}} ORDER BY started_at DESC, id DESC LIMIT ?"
RUN_FILTERS = {
    "state": "state = ?",
    "live": "finished_at IS NULL",
    "machine": "machine = ?",
    "slot": "slot = ?",
    "tool": "tool = ?",
    "outcome": "outcome = ?",
    "since": "started_at >= ?",
    # the bound first, so the index is entered at the cursor (not walked up to it)
    "before": "started_at <= ? AND (started_at < ? OR id < ?)",
}
# Runs that ended at or before a time (`saphan worktrees prune`), oldest first.
ENDED_RUNS_UNTIL = f"""
SELECT {RUN_COLUMNS} FROM runs
WHERE finished_at IS NOT NULL AND finished_at <= ? ORDER BY finished_at, id"""
LAST_RUN = f"SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, id DESC LIMIT 1"
RUNS_ON_SLOT_ALL = f"""
SELECT {RUN_COLUMNS} FROM runs WHERE machine = ? AND slot = ? ORDER BY started_at"""

# -- signed machine facts -----------------------------------------------------
PUT_FACT = """
INSERT INTO machine_facts (machine, kind, value_json, measured_at, signature)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT (machine, kind) DO UPDATE
SET value_json = excluded.value_json, measured_at = excluded.measured_at,
    signature = excluded.signature"""
FACT_COLUMNS = "machine, kind, value_json, measured_at, signature"
GET_FACT = f"SELECT {FACT_COLUMNS} FROM machine_facts WHERE machine = ? AND kind = ?"
LIST_FACTS = f"SELECT {FACT_COLUMNS} FROM machine_facts WHERE machine = ? ORDER BY kind"

# -- labels (slot '': the machine's own) ----------------------------------------
SET_LABEL = """
INSERT INTO labels (machine, slot, key, value) VALUES (?, ?, ?, ?)
ON CONFLICT (machine, slot, key) DO UPDATE SET value = excluded.value"""
DELETE_LABEL = "DELETE FROM labels WHERE machine = ? AND slot = ? AND key = ? RETURNING key"
LIST_LABELS = "SELECT machine, slot, key, value FROM labels ORDER BY machine, slot, key"
DELETE_SLOT_LABELS = "DELETE FROM labels WHERE machine = ? AND slot = ?"

# -- batches (batch/) --------------------------------------------------------------
INSERT_BATCH = """
INSERT INTO batches (id, created_at, source, source_sha256, tasks) VALUES (?, ?, ?, ?, ?)"""
INSERT_BATCH_TASK = """
INSERT INTO batch_tasks (batch, seq, task_id, spec_json, signature, state)
VALUES (?, ?, ?, ?, ?, 'pending')"""
BATCH_COLUMNS = "id, created_at, source, source_sha256, tasks"
GET_BATCH = f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?"
FIND_BATCHES_BY_PREFIX = f"""
SELECT {BATCH_COLUMNS} FROM batches WHERE id LIKE ? ESCAPE '!' ORDER BY id LIMIT 2"""
LIST_BATCHES = f"SELECT {BATCH_COLUMNS} FROM batches ORDER BY id DESC LIMIT ?"
# In the order of rows.Task's fields.
TASK_COLUMNS = (
    "batch, seq, task_id, spec_json, signature, state, run_id, worker_host, worker_pid, "
    "worker_start_ticks, worker_boot_id, child_host, child_pid, child_start_ticks, "
    "child_boot_id, claimed_at, finished_at, outcome, exit_code, error, attempts, earlier_runs"
)
BATCH_TASKS = f"SELECT {TASK_COLUMNS} FROM batch_tasks WHERE batch = ? ORDER BY seq"
BATCH_TASKS_IN = f"""
SELECT {TASK_COLUMNS} FROM batch_tasks WHERE batch = ? AND state = ? ORDER BY seq"""
# Claim the first pending task for one run id. The inner SELECT picks the row
# (on PostgreSQL locking it, skipping rows another worker's claim holds); the
# outer WHERE repeats state = 'pending', so a row claimed meanwhile is not
# taken twice. One statement: no count is read, nothing is held between.
_claim = """
UPDATE batch_tasks
SET state = 'claimed', run_id = ?, worker_host = ?, worker_pid = ?, worker_start_ticks = ?,
    worker_boot_id = ?, child_host = NULL, child_pid = NULL, child_start_ticks = NULL,
    child_boot_id = NULL, claimed_at = ?, error = NULL, attempts = attempts + 1
WHERE batch = ? AND state = 'pending' AND seq = (
    SELECT seq FROM batch_tasks WHERE batch = ? AND state = 'pending' ORDER BY seq LIMIT 1{lock})
RETURNING {columns}"""
CLAIM_TASK = _claim.format(lock="", columns=TASK_COLUMNS)
CLAIM_TASK_PG = _claim.format(lock=" FOR UPDATE SKIP LOCKED", columns=TASK_COLUMNS)
# The child names itself on its claim, once, and only while the claim is
# still for its run id (a claim given back meanwhile is not run).
REGISTER_CHILD = """
UPDATE batch_tasks
SET child_host = ?, child_pid = ?, child_start_ticks = ?, child_boot_id = ?
WHERE batch = ? AND seq = ? AND run_id = ? AND state = 'claimed' AND child_pid IS NULL
RETURNING seq"""
# A claim ends for the run id it was made for, and only that one.
FINISH_TASK = """
UPDATE batch_tasks
SET state = 'done', finished_at = ?, outcome = ?, exit_code = ?, error = ?
WHERE batch = ? AND seq = ? AND run_id = ? AND state = 'claimed'
RETURNING seq"""
# Back to pending: only for that run id, and only if no child registered
# since the caller judged it (the child's pid as read, -1 for none).
REQUEUE_TASK = """
UPDATE batch_tasks
SET state = 'pending', run_id = NULL, worker_host = NULL, worker_pid = NULL,
    worker_start_ticks = NULL, worker_boot_id = NULL, child_host = NULL, child_pid = NULL,
    child_start_ticks = NULL, child_boot_id = NULL, claimed_at = NULL, error = ?,
    earlier_runs = earlier_runs || ?
WHERE batch = ? AND seq = ? AND run_id = ? AND state = 'claimed'
  AND COALESCE(child_pid, -1) = ?
RETURNING seq"""
GET_TASK = f"SELECT {TASK_COLUMNS} FROM batch_tasks WHERE batch = ? AND seq = ?"
