"""The seat races, on SQLite AND PostgreSQL: many OS processes (not
threads) reserving on one slot for many rounds; live runs never exceed
max_sessions, and the read-then-act baseline is shown to over-admit, so the
harness can see the bug the design removes (tests/race_harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from race_harness import NAIVE_TABLE, run_race
from test_capacity import _slot, _store


@pytest.mark.slow
def test_race_never_over_admits(database_url: str, tmp_path: Path) -> None:
    store = _store(database_url, tmp_path)
    _slot(store, 3)
    store.close()
    result = run_race(url=database_url, sqlite_default=str(tmp_path / "unused.db"),
                      machine="m1", slot="s1", processes=16, rounds=100, mode="saphan",
                      workdir=tmp_path)
    assert len(result.max_seen_per_round) == 100
    for rnd, seen in result.max_seen_per_round.items():
        assert seen <= 3, f"round {rnd}: witness saw {seen} holders with capacity 3"
    assert result.max_overlap <= 3
    # The harness did contend: seats were filled to capacity in most rounds.
    assert result.admitted >= 100 * 3 * 0.5
    assert result.max_seen == 3
    store = _store(database_url, tmp_path)
    assert store.live_runs("m1", "s1") == []
    store.close()


@pytest.mark.slow
def test_read_then_act_baseline_over_admits(database_url: str, tmp_path: Path) -> None:
    """Proof the harness can see the bug the product's design removes."""
    store = _store(database_url, tmp_path)
    _slot(store, 3)
    store.db.execute(NAIVE_TABLE)
    store.close()
    result = run_race(url=database_url, sqlite_default=str(tmp_path / "unused.db"),
                      machine="m1", slot="s1", processes=16, rounds=30, mode="naive",
                      workdir=tmp_path)
    assert result.max_seen > 3, f"naive baseline never over-admitted: {result.max_seen}"
