"""The shared store on PostgreSQL (store/postgres.py), against a real server:
`?` placeholders, autocommit, errors that name the store without its
password, and a transaction that commits or rolls back whole."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from conftest import PgServer
from saphan.errors import StoreError
from saphan.store.postgres import PostgresConnector, redact_url

_n = [0]


@pytest.fixture
def url(pg_server: PgServer) -> str:
    _n[0] += 1
    name = f"pgconn_{os.getpid()}_{_n[0]}"
    pg_server.psql(f"CREATE DATABASE {name}")
    return pg_server.url(name)


@pytest.fixture
def db(url: str) -> Iterator[PostgresConnector]:
    conn = PostgresConnector(url)
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    try:
        yield conn
    finally:
        conn.close()


@pytest.mark.parametrize(("given", "shown"), [
    ("postgresql://saphan:s3cr3t@db:5432/saphan", "postgresql://saphan:***@db:5432/saphan"),
    # libpq ends the password at the first "@"; a literal "@" is written %40
    ("postgresql://saphan:p%40ss@db/saphan", "postgresql://saphan:***@db/saphan"),
    ("postgresql://saphan:@db/saphan", "postgresql://saphan:***@db/saphan"),
    ("postgresql://saphan@db/saphan", "postgresql://saphan@db/saphan"),
    ("postgres://db/saphan", "postgres://db/saphan"),
])
def test_a_password_in_the_url_is_never_shown(given: str, shown: str) -> None:
    assert redact_url(given) == shown


def test_a_password_given_as_a_url_parameter_is_never_shown() -> None:
    # libpq takes `?password=` too (a URL the config accepts); it is shown whole
    with pytest.raises(StoreError) as e:
        PostgresConnector("postgresql://u@127.0.0.1:1/saphan?password=hunter2")
    assert "hunter2" not in str(e.value)


def test_the_description_hides_the_password_of_a_live_connection(pg_server: PgServer,
                                                                 url: str) -> None:
    with_password = url.replace(f"{pg_server.user}@", f"{pg_server.user}:hunter2@")
    db = PostgresConnector(with_password)  # the test server trusts any password
    assert db.dialect == "postgresql"
    assert db.description == url.replace(f"{pg_server.user}@", f"{pg_server.user}:***@")
    with pytest.raises(StoreError) as e:
        db.execute("SELECT * FROM no_such_table")
    assert "hunter2" not in str(e.value) and str(e.value).startswith(db.description)
    db.close()


def test_an_unreachable_server_is_a_store_error_without_the_password() -> None:
    with pytest.raises(StoreError) as e:
        PostgresConnector("postgresql://u:hunter2@127.0.0.1:1/saphan")
    assert str(e.value).startswith("cannot connect to postgresql://u:***@127.0.0.1:1/saphan: ")
    assert "hunter2" not in str(e.value)


def test_question_marks_are_parameters_and_percent_signs_stay_literal(db: PostgresConnector) -> None:
    assert db.execute("SELECT ? || '%' || ?", ("50", "s")) == [("50%s",)]
    db.execute("INSERT INTO t (k, v) VALUES (?, ?)", ("100%", "%s"))
    assert db.execute("SELECT v FROM t WHERE k LIKE ?", ("100!%",)) == []
    assert db.execute("SELECT v FROM t WHERE k = ?", ("100%",)) == [("%s",)]
    assert db.execute("SELECT v FROM t WHERE k LIKE '100%'") == [("%s",)]


def test_each_statement_is_committed_at_once(db: PostgresConnector, url: str) -> None:
    db.execute("INSERT INTO t (k, v) VALUES ('a', 'x')")
    with psycopg.connect(url) as other:
        assert other.execute("SELECT k FROM t").fetchall() == [("a",)]


def test_a_failed_statement_does_not_poison_the_next(db: PostgresConnector) -> None:
    db.execute("INSERT INTO t (k, v) VALUES ('a', 'x')")
    with pytest.raises(StoreError, match="duplicate key"):
        db.execute("INSERT INTO t (k, v) VALUES ('a', 'y')")
    assert db.execute("SELECT v FROM t") == [("x",)]


def test_a_transaction_is_invisible_to_others_until_it_commits(db: PostgresConnector,
                                                               url: str) -> None:
    with psycopg.connect(url, autocommit=True) as other:
        with db.transaction():
            db.execute("INSERT INTO t (k, v) VALUES ('a', 'x')")
            assert other.execute("SELECT count(*) FROM t").fetchall() == [(0,)]
        assert other.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
        with pytest.raises(StoreError, match="duplicate key"), db.transaction():
            db.execute("INSERT INTO t (k, v) VALUES ('b', 'x')")
            db.execute("INSERT INTO t (k, v) VALUES ('a', 'x')")
        assert other.execute("SELECT k FROM t").fetchall() == [("a",)]


def test_a_connection_the_server_cut_is_reopened(db: PostgresConnector, url: str) -> None:
    """What a PostgreSQL restart does to saphan's connection (its backend
    ends): the next statement fails as a StoreError naming the store, and
    reopen() connects anew (run/record.py retries through it)."""
    db.execute("INSERT INTO t VALUES (?, ?)", ("k", "before"))
    pid = db.execute("SELECT pg_backend_pid()")[0][0]
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreError) as e:
        db.execute("SELECT v FROM t")
    assert db.description in str(e.value)
    db.reopen()
    assert db.execute("SELECT v FROM t") == [("before",)]
    assert db.execute("SELECT pg_backend_pid()")[0][0] != pid
