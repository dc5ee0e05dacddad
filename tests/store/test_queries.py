"""Every SQL statement saphan runs (store/queries.py): each one compiles on
both databases with exactly the parameters it declares, the column lists
are in the order the typed rows read them, and the reservation's conflict
clause repeats the live-seat index predicate."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest

from conftest import PgServer
from saphan.errors import StoreError
from saphan.store import Store, open_store
from saphan.store import queries as q
from saphan.store.migrations import MIGRATIONS
from saphan.store.rows import Fact, Machine, RunRow, Slot

STATEMENTS = {name: value for name, value in vars(q).items()
              if name.isupper() and isinstance(value, str) and not name.endswith("_COLUMNS")}
# The listing's template, with every filter clause it can be given (Store.list_runs).
STATEMENTS["LIST_RUNS"] = q.LIST_RUNS.format(
    where=" WHERE " + " AND ".join(q.RUN_FILTERS.values()))
SEAT_PREDICATE = "ON CONFLICT (machine, slot, session_ordinal) WHERE finished_at IS NULL"


def test_every_named_statement_is_found() -> None:
    # a floor, so a renamed module attribute cannot make the tests below vacuous
    assert len(STATEMENTS) >= 25
    assert {"RESERVE_ORDINAL", "RESERVE_ORDINAL_PG", "FINALIZE_RUN", "PUT_FACT"} <= set(STATEMENTS)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def migrated(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One migrated store per database for the whole module (nothing here writes)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('queries') / 'q.db'}"
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        name = f"queries_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        server.psql(f"CREATE DATABASE {name}")
        url = server.url(name)
    store = open_store(url, tmp_path_factory.mktemp("unused") / "x.db")
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_placeholders_are_question_marks_only(name: str) -> None:
    sql = STATEMENTS[name]
    assert "%s" not in sql and not re.search(r"\$\d|(?<![:\w]):[a-z_]", sql), sql


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_each_statement_compiles_with_the_parameters_it_declares(migrated: Store, name: str) -> None:
    sql = STATEMENTS[name]
    n = sql.count("?")
    db = migrated.db
    if db.dialect == "sqlite":
        if name == "RESERVE_ORDINAL_PG":
            # PostgreSQL's server-side loop (migration 3) is not on SQLite
            with pytest.raises(StoreError, match="no such function: saphan_reserve"):
                db.execute(f"EXPLAIN {sql}", (None,) * n)
            return
        if name == "SEAT_PG":
            # the reservation with its holders (migration 9) is PostgreSQL's
            with pytest.raises(StoreError, match="no such table: saphan_seat"):
                db.execute(f"EXPLAIN {sql}", (None,) * n)
            return
        if name == "CLAIM_TASK_PG":
            # row locks are PostgreSQL's; SQLite serialises every write anyway
            with pytest.raises(StoreError, match='near "FOR"'):
                db.execute(f"EXPLAIN {sql}", (None,) * n)
            return
        db.execute(f"EXPLAIN {sql}", (None,) * n)
        return
    if sql.lstrip().upper().startswith("CREATE"):
        db.execute(sql)  # IF NOT EXISTS: compiles and does nothing more
        return
    numbered = iter(range(1, n + 1))
    # PREPARE parses, resolves every name and infers every parameter, running nothing
    db.execute("PREPARE saphan_check AS " + re.sub(r"\?", lambda _: f"${next(numbered)}", sql))
    try:
        params = db.execute("SELECT cardinality(parameter_types) FROM pg_prepared_statements "
                            "WHERE name = 'saphan_check'")
    finally:
        db.execute("DEALLOCATE saphan_check")
    assert params == [(n,)]


@pytest.mark.parametrize("only", [None, *sorted(q.RUN_FILTERS)])
def test_the_runs_listing_reads_an_index(tmp_path_factory: pytest.TempPathFactory,
                                         only: str | None) -> None:
    """Each filter alone, in the listing's order, is read through an index
    (migration 10) on SQLite, never a scan of the table and a sort."""
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('plan') / 'p.db'}",
                       tmp_path_factory.mktemp("unused") / "x.db")
    try:
        where = f" WHERE {q.RUN_FILTERS[only]}" if only else ""
        sql = q.LIST_RUNS.format(where=where)
        plan = " | ".join(str(r[-1]) for r in store.db.execute(
            f"EXPLAIN QUERY PLAN {sql}", (None,) * sql.count("?")))
    finally:
        store.close()
    assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the order
    expected = {None: "SCAN runs USING INDEX runs_newest",
                "before": "SEARCH runs USING INDEX runs_newest (started_at<?)",  # a seek
                "live": "SCAN runs USING INDEX runs_live_newest",  # live rows only
                "since": "SEARCH runs USING INDEX runs_newest (started_at>?)"}
    assert plan == expected.get(only, f"SEARCH runs USING INDEX runs_{only}_newest ({only}=?)")


@pytest.mark.parametrize(("columns", "row"), [
    (q.RUN_COLUMNS, RunRow), (q.SLOT_COLUMNS, Slot), (q.MACHINE_COLUMNS, Machine),
    (q.FACT_COLUMNS, Fact),
])
def test_column_lists_are_in_the_order_the_rows_read_them(columns: str, row: type) -> None:
    assert [c.strip() for c in columns.split(",")] == list(row._fields)  # type: ignore[attr-defined]


def test_the_reservation_repeats_the_live_seat_index_predicate_literally() -> None:
    index = next(s for _, _, stmts in MIGRATIONS for s in stmts
                 if isinstance(s, str) and "runs_live_seat" in s)
    assert " ".join(index.split()).endswith(
        "ON runs (machine, slot, session_ordinal) WHERE finished_at IS NULL")
    assert SEAT_PREDICATE in " ".join(q.RESERVE_ORDINAL.split())
    pg_loop = next(s[1] for _, _, stmts in MIGRATIONS for s in stmts if isinstance(s, tuple))
    assert "ON CONFLICT (machine, slot, session_ordinal) WHERE finished_at IS NULL" in " ".join(
        pg_loop.split())


def test_finalising_and_holder_changes_touch_live_runs_only() -> None:
    for name in ("FINALIZE_RUN", "SET_HOLDER", "MARK_RUNNING"):
        assert "finished_at IS NULL" in STATEMENTS[name], name
