"""The embedded store (store/sqlite.py): SQLite in WAL mode with foreign keys
and a busy timeout, autocommit, and a transaction that takes the write lock
when it begins."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from saphan.errors import StoreError
from saphan.store import open_store
from saphan.store.sqlite import BUSY_TIMEOUT_MS, SQLiteConnector


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "saphan.db"


def test_the_connection_is_wal_with_foreign_keys_and_a_busy_timeout(path: Path) -> None:
    db = SQLiteConnector(path)
    assert db.dialect == "sqlite" and db.description == f"sqlite:///{path}"
    assert db.execute("PRAGMA journal_mode") == [("wal",)]
    assert db.execute("PRAGMA foreign_keys") == [(1,)]
    assert db.execute("PRAGMA busy_timeout") == [(BUSY_TIMEOUT_MS,)]
    assert BUSY_TIMEOUT_MS == 10_000
    db.close()


def test_a_store_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "saphan.db"
    with pytest.raises(StoreError, match=f"cannot open the SQLite store {missing}"):
        SQLiteConnector(missing)


def test_a_constraint_failure_is_an_integrity_store_error(path: Path) -> None:
    db = SQLiteConnector(path)
    db.execute("CREATE TABLE p (k TEXT PRIMARY KEY)")
    db.execute("CREATE TABLE c (k TEXT REFERENCES p(k))")
    with pytest.raises(StoreError, match=rf"^sqlite:///{path}: integrity: FOREIGN KEY"):
        db.execute("INSERT INTO c VALUES ('orphan')")
    db.execute("INSERT INTO p VALUES ('a')")
    with pytest.raises(StoreError, match="integrity: UNIQUE"):
        db.execute("INSERT INTO p VALUES ('a')")


def test_every_statement_outside_a_transaction_is_committed_at_once(path: Path) -> None:
    db = SQLiteConnector(path)
    db.execute("CREATE TABLE t (v INTEGER)")
    db.execute("INSERT INTO t VALUES (1)")
    other = sqlite3.connect(path)
    assert other.execute("SELECT v FROM t").fetchall() == [(1,)]
    other.close()


def test_a_transaction_holds_the_write_lock_from_its_start(path: Path) -> None:
    """BEGIN IMMEDIATE: another writer is kept out before this one wrote anything
    (a deferred transaction would fail later, on its upgrade)."""
    db = SQLiteConnector(path)
    db.execute("CREATE TABLE t (v INTEGER)")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with db.transaction():
        db.execute("SELECT count(*) FROM t")  # a read only, so far
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            other.execute("INSERT INTO t VALUES (9)")
        db.execute("INSERT INTO t VALUES (1)")
    other.execute("INSERT INTO t VALUES (2)")
    assert db.execute("SELECT v FROM t ORDER BY v") == [(1,), (2,)]
    other.close()


def test_open_store_takes_the_workspace_default_or_the_path_in_the_url(tmp_path: Path) -> None:
    default = tmp_path / "default.db"
    s = open_store("sqlite", default)
    assert s.db.dialect == "sqlite" and default.exists()
    s.close()
    named = tmp_path / "named.db"
    s = open_store(f"sqlite://{named}", default)
    assert named.exists() and s.applied_versions()
    s.close()


def test_reopen_connects_anew_with_the_same_settings(path: Path) -> None:
    db = SQLiteConnector(path)
    try:
        db.execute("CREATE TABLE t (k TEXT)")
        db.execute("INSERT INTO t VALUES ('x')")
        db.reopen()
        assert db.execute("SELECT k FROM t") == [("x",)]
        assert db.execute("PRAGMA journal_mode") == [("wal",)]
        assert db.execute("PRAGMA busy_timeout") == [(BUSY_TIMEOUT_MS,)]
    finally:
        db.close()


def test_a_database_that_cannot_be_written_here_is_opened_for_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only copy (or mount) of a WAL database: opened mode=ro (or
    immutable), not migrated (the CLI through a real read-only mount:
    tests/test_cli_verbs.py)."""
    import os

    path = tmp_path / "ro" / "saphan.db"
    path.parent.mkdir()
    open_store("sqlite", path).close()
    real_access = os.access

    def access(p: object, mode: int) -> bool:
        if mode & os.W_OK and str(p).startswith(str(path.parent)):
            return False  # as on a read-only mount (EROFS), even for root
        return real_access(p, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)
    ro = open_store("sqlite", path)
    assert isinstance(ro.db, SQLiteConnector) and ro.db.read_only
    assert ro.list_machines() == []
    ro.close()
