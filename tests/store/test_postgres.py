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
    # an empty password is none: libpq reads no password from it
    ("postgresql://saphan:@db/saphan", "postgresql://saphan@db/saphan"),
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


# -- redact_url: parsed as libpq parses it, every secret masked ------------------------

_SECRETS = ("s3cretA", "s3cretD", "s3cretE", "s3cretF", "s3cretG")


@pytest.mark.parametrize(("given", "shown"), [
    # no user name: the password is still a password
    ("postgresql://:s3cretA@db/saphan", "postgresql://:***@db/saphan"),
    # a percent-encoded key is the key libpq reads
    ("postgresql://u@db/saphan?%70assword=s3cretD", "postgresql://u:***@db/saphan"),
    ("postgresql://u@db/saphan?sslpassword=s3cretE", "postgresql://u@db/saphan?sslpassword=***"),
    ("postgresql://u@db:5432/saphan?sslmode=disable&password=s3cretA",
     "postgresql://u:***@db:5432/saphan?sslmode=disable"),
    # several hosts, a socket directory, IPv6: the rest of the URL as libpq reads it
    ("postgresql://u:s3cretG@a:1,b:2/saphan", "postgresql://u:***@a:1,b:2/saphan"),
    ("postgresql://u@%2Fvar%2Frun/saphan?password=s3cretG",
     "postgresql://u:***@%2Fvar%2Frun/saphan"),
    ("postgresql://u:s3cretG@[::1]:5433/saphan", "postgresql://u:***@[::1]:5433/saphan"),
])
def test_every_password_libpq_reads_is_masked(given: str, shown: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    got = redact_url(given)
    assert got == shown
    assert not any(s in got for s in _SECRETS), got
    # what libpq reads from the masked URL: the same settings, secrets "***"
    secret = {"password", "sslpassword"}
    assert conninfo_to_dict(got) == {k: ("***" if k in secret else v)
                                     for k, v in conninfo_to_dict(given).items()}


def test_a_key_value_connection_string_is_masked_too() -> None:
    from psycopg.conninfo import conninfo_to_dict

    got = redact_url("host=db password=s3cretF dbname=saphan sslpassword='s3cretE x'")
    assert "s3cretF" not in got and "s3cretE" not in got
    assert conninfo_to_dict(got) == {"host": "db", "dbname": "saphan", "password": "***",
                                     "sslpassword": "***"}


@pytest.mark.parametrize("given", [
    "postgresql://u:s3cretA%zz@db/saphan",        # libpq: invalid percent-encoded token
    "postgresql://u:s3cretA@db/saphan?nokey=1",   # libpq: invalid URI query parameter
    "postgresql://u@db/saphan?PassWord=s3cretA",  # (keys are case-sensitive)
    "host=db password= s3cretA dbname",           # libpq: missing "="
    "mysql://u:s3cretA@db/saphan",
])
def test_what_libpq_cannot_parse_is_never_shown_whole(given: str) -> None:
    got = redact_url(given)
    assert "s3cretA" not in got and "db" not in got, got
    assert "***" in got


@pytest.mark.parametrize("url", [
    "postgresql://u:s3cretA%zz@127.0.0.1:1/saphan",
    "postgresql://:s3cretA@127.0.0.1:1/saphan",
    "postgresql://u@127.0.0.1:1/saphan?%70assword=s3cretA&sslpassword=s3cretE",
])
def test_a_connection_error_never_shows_a_secret(url: str) -> None:
    """libpq's own parse errors quote the token they choke on: not shown."""
    with pytest.raises(StoreError) as e:
        PostgresConnector(url)
    assert "s3cretA" not in str(e.value) and "s3cretE" not in str(e.value), str(e.value)
    assert str(e.value).startswith(f"cannot connect to {redact_url(url)}")
