"""The schema as numbered migrations (store/migrations.py), applied by
Store.migrate: the same tables and index on SQLite and PostgreSQL, applied
once even on a concurrent first use, and an older schema brought forward."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from saphan.errors import StoreError
from saphan.store import Store, open_store
from saphan.store.migrations import LATEST, MIGRATIONS
from saphan.store.rows import Machine, Slot

EXPECTED_COLUMNS = {
    "machines": ["name", "transport", "ssh_user", "ssh_host", "ssh_port", "identity_file",
                 "host_key", "created_at", "ssh_agent", "proxy_jump"],
    "slots": ["machine", "name", "tool", "max_sessions", "created_at", "agent_sha256", "endpoint",
              "model", "max_seconds", "max_turns", "agent_path"],
    "runs": ["id", "machine", "slot", "session_ordinal", "state", "started_at", "finished_at",
             "holder_host", "holder_pid", "holder_start_ticks", "holder_boot_id", "tool",
             "workdir", "outcome", "exit_code", "refusal_class", "record_json"],
    "machine_facts": ["machine", "kind", "value_json", "measured_at", "signature"],
    "labels": ["machine", "slot", "key", "value"],
    "batches": ["id", "created_at", "source", "source_sha256", "tasks"],
    "batch_tasks": ["batch", "seq", "task_id", "spec_json", "signature", "state", "run_id", "worker_host",
                    "worker_pid", "worker_start_ticks", "worker_boot_id", "child_host",
                    "child_pid", "child_start_ticks", "child_boot_id", "claimed_at",
                    "finished_at", "outcome", "exit_code", "error", "attempts",
                    "earlier_runs"],
}


def _columns(store: Store, table: str) -> list[str]:
    db = store.db
    if db.dialect == "sqlite":
        return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    return [r[0] for r in db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position", (table,))]


def _live_seat_index(store: Store) -> str:
    db = store.db
    if db.dialect == "sqlite":
        return str(db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'runs_live_seat'")[0][0])
    return str(db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'runs_live_seat'")[0][0])


def _open_at(database_url: str, tmp_path: Path, upto: int) -> Store:
    """A store migrated only up to ``upto`` (as an older saphan left it)."""
    if database_url.startswith("sqlite:///"):
        from saphan.store.sqlite import SQLiteConnector

        store = Store(SQLiteConnector(Path(database_url[len("sqlite://"):])))
    else:
        from saphan.store.postgres import PostgresConnector

        store = Store(PostgresConnector(database_url))
    assert store.migrate(upto=upto) == list(range(1, upto + 1))
    return store


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    assert [v for v, _, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert MIGRATIONS[-1][0] == LATEST
    assert len({name for _, name, _ in MIGRATIONS}) == len(MIGRATIONS)


def test_migrations_give_the_same_schema(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    assert store.applied_versions() == [v for v, _, _ in MIGRATIONS]
    for table, cols in EXPECTED_COLUMNS.items():
        assert _columns(store, table) == cols, table
    index = " ".join(_live_seat_index(store).lower().split())
    assert "unique index" in index
    assert "finished_at is null" in index
    assert store.migrate() == []


def _open(url: str, path: str) -> int:
    store = open_store(url, Path(path))
    n = len(store.applied_versions())
    store.close()
    return n


def test_concurrent_first_use_migrates_once(database_url: str, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    with ctx.Pool(6) as pool:
        counts = pool.starmap(_open, [(database_url, str(tmp_path / "x.db"))] * 6)
    assert counts == [LATEST] * 6


def test_an_older_schema_is_brought_forward_and_keeps_its_rows(database_url: str,
                                                              tmp_path: Path) -> None:
    old = _open_at(database_url, tmp_path, 1)
    assert "agent_sha256" not in _columns(old, "slots")
    old.db.execute("INSERT INTO machines (name, transport, created_at) VALUES ('m', 'local', 't')")
    old.db.execute("INSERT INTO slots (machine, name, tool, max_sessions, created_at) "
                   "VALUES ('m', 's', 'codex', 2, 't')")
    assert old.migrate() == list(range(2, LATEST + 1))
    assert old.applied_versions() == list(range(1, LATEST + 1))
    assert old.get_slot("m", "s") == Slot("m", "s", "codex", 2, "t", None)
    assert old.get_machine("m") == Machine("m", "local", created_at="t")
    old.close()


def test_the_reservation_function_exists_on_postgresql_only(database_url: str,
                                                           tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    if store.db.dialect == "postgresql":
        for name in ("saphan_reserve", "saphan_seat"):
            assert store.db.execute(
                "SELECT count(*) FROM pg_proc WHERE proname = ?", (name,)) == [(1,)]
    else:
        assert store.db.execute(
            "SELECT count(*) FROM sqlite_master WHERE sql LIKE '%saphan_%'") == [(0,)]


def test_the_schema_refuses_what_no_saphan_writes(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    with pytest.raises(StoreError):
        store.add_machine(Machine("m", "carrier-pigeon"))
    store.add_machine(Machine("m", "local"))
    with pytest.raises(StoreError):
        store.add_slot(Slot("m", "s", "vim", None))
    with pytest.raises(StoreError):
        store.add_slot(Slot("m", "s", "command", 0))
    with pytest.raises(StoreError):  # a slot of no machine
        store.add_slot(Slot("ghost", "s", "command", None))
    assert store.list_slots() == []


def test_labels_are_added_to_a_store_at_version_6(database_url: str, tmp_path: Path) -> None:
    old = _open_at(database_url, tmp_path, 6)
    assert _columns(old, "labels") == []
    assert old.add_machine(Machine("m", "local", created_at="t"))
    assert old.add_slot(Slot("m", "s", "command", None, "t"))
    assert old.migrate() == list(range(7, LATEST + 1))
    assert _columns(old, "labels") == EXPECTED_COLUMNS["labels"]
    old.set_label("m", "s", "zone", "eu")
    assert old.labels() == {("m", "s"): {"zone": "eu"}}
    with pytest.raises(StoreError):  # a label of no machine
        old.set_label("ghost", "", "zone", "eu")
    old.close()
