"""The store seam: same schema and same statements on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from saphan.store import open_store
from saphan.store.migrations import LATEST, MIGRATIONS
from saphan.store.rows import Machine, Slot

EXPECTED_COLUMNS = {
    "machines": ["name", "transport", "ssh_user", "ssh_host", "ssh_port", "identity_file",
                 "host_key", "created_at"],
    "slots": ["machine", "name", "tool", "max_sessions", "created_at", "agent_sha256"],
    "runs": ["id", "machine", "slot", "session_ordinal", "state", "started_at", "finished_at",
             "holder_host", "holder_pid", "holder_start_ticks", "holder_boot_id", "tool",
             "workdir", "outcome", "exit_code", "refusal_class", "record_json"],
    "machine_facts": ["machine", "kind", "value_json", "measured_at", "signature"],
}


def _columns(store: object, table: str) -> list[str]:
    db = store.db  # type: ignore[attr-defined]
    if db.dialect == "sqlite":
        return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    return [r[0] for r in db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position", (table,))]


def _live_seat_index(store: object) -> str:
    db = store.db  # type: ignore[attr-defined]
    if db.dialect == "sqlite":
        return str(db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'runs_live_seat'")[0][0])
    return str(db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'runs_live_seat'")[0][0])


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


def test_not_null_seat_columns_and_partial_index(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    store.add_machine(Machine("m", "local"))
    assert not store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", None))
    assert not store.add_slot(Slot("m", "s", "command", None))
    holder = ("h", 1, 1, "b")
    kw = dict(machine="m", slot="s", capacity=1, tool="command", workdir=None, holder=holder)
    assert store.reserve(run_id="a", **kw) == 0  # type: ignore[arg-type]
    assert store.reserve(run_id="b", **kw) is None  # type: ignore[arg-type]
    assert store.get_run("b") is None  # the losing insert affected zero rows
    store.finalize("a", state="ended", outcome="exited")
    assert store.reserve(run_id="c", **kw) == 0  # type: ignore[arg-type]
    # Finished rows are outside the index: history keeps both.
    assert {r.id for r in store.runs_on_slot("m", "s")} == {"a", "c"}


def test_remove_machine_keeps_history(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", 2))
    store.reserve(run_id="r1", machine="m", slot="s", capacity=2, tool="command", workdir=None,
                  holder=("h", 1, 1, "b"))
    store.finalize("r1", state="ended", outcome="exited")
    assert store.remove_machine("m")
    assert store.get_machine("m") is None and store.list_slots("m") == []
    assert store.get_run("r1") is not None


def test_find_runs_by_prefix(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "p.db")
    store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", 3))
    for rid in ("R1A", "R1B", "R2A"):
        store.reserve(run_id=rid, machine="m", slot="s", capacity=3, tool="command",
                      workdir=None, holder=("h", 1, 1, "b"))
    assert [r.id for r in store.find_runs("R2")] == ["R2A"]
    assert len(store.find_runs("R1")) == 2
    assert store.find_runs("X") == []
    # LIKE wildcards in the prefix are not wildcards
    assert store.find_runs("R_A") == []
