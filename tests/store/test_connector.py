"""The seam between the store and a driver (store/connector.py): both
connectors keep the same contract — one statement in autocommit, a short
explicit transaction that commits or rolls back whole, and every driver
error as a StoreError naming the store."""

from __future__ import annotations

import pytest

from saphan.errors import StoreError
from saphan.store import Store
from saphan.store.connector import Connector, rows

TABLE = "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"


@pytest.fixture
def db(store: Store) -> Connector:
    conn: Connector = store.db
    conn.execute(TABLE)
    return conn


def test_each_connector_names_its_dialect_and_store(store: Store, database_url: str) -> None:
    assert store.db.dialect == database_url.split(":", 1)[0]
    assert store.db.description.startswith(f"{store.db.dialect}://")


def test_execute_returns_rows_as_tuples_and_nothing_for_a_write(db: Connector) -> None:
    assert db.execute("INSERT INTO t (k, v) VALUES (?, ?)", ("a", 1)) == []
    assert db.execute("INSERT INTO t (k, v) VALUES (?, ?) RETURNING k", ("b", 2)) == [("b",)]
    assert db.execute("SELECT k, v FROM t ORDER BY k") == [("a", 1), ("b", 2)]
    assert db.execute("SELECT k FROM t WHERE v > ?", (5,)) == []


def test_a_transaction_commits_whole(db: Connector) -> None:
    with db.transaction():
        db.execute("INSERT INTO t (k, v) VALUES ('a', 1)")
        db.execute("INSERT INTO t (k, v) VALUES ('b', 2)")
    assert db.execute("SELECT count(*) FROM t") == [(2,)]


def test_a_transaction_that_raises_leaves_nothing_and_the_error_goes_on(db: Connector) -> None:
    with pytest.raises(RuntimeError, match="half-way"), db.transaction():
        db.execute("INSERT INTO t (k, v) VALUES ('a', 1)")
        raise RuntimeError("half-way")
    assert db.execute("SELECT count(*) FROM t") == [(0,)]


def test_a_failing_statement_in_a_transaction_rolls_it_back(db: Connector) -> None:
    with pytest.raises(StoreError), db.transaction():
        db.execute("INSERT INTO t (k, v) VALUES ('a', 1)")
        db.execute("INSERT INTO t (k, v) VALUES ('a', 2)")
    assert db.execute("SELECT count(*) FROM t") == [(0,)]
    db.execute("INSERT INTO t (k, v) VALUES ('a', 3)")  # and the connection works on
    assert db.execute("SELECT v FROM t") == [(3,)]


@pytest.mark.parametrize("sql", [
    "INSERT INTO t (k, v) VALUES ('a', NULL)",
    "SELECT nope FROM t",
    "SELEC 1",
])
def test_driver_errors_are_store_errors_naming_the_store(db: Connector, sql: str) -> None:
    with pytest.raises(StoreError) as e:
        db.execute(sql)
    assert str(e.value).startswith(db.description)
    assert db.execute("SELECT count(*) FROM t") == [(0,)]


def test_rows_is_a_list_of_what_it_was_given() -> None:
    assert rows(iter([(1,), (2,)])) == [(1,), (2,)]
    assert rows([]) == []
