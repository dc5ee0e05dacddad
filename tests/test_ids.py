"""ids.py: run identifiers are ULIDs: 26 Crockford base32 characters, the first
ten the creation time in milliseconds, so they sort by creation time and a
prefix of a recent id names it."""

from __future__ import annotations

import time

from saphan.ids import new_run_id

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _decode(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 32 + CROCKFORD.index(ch)
    return value


def test_shape_is_26_crockford_characters() -> None:
    for _ in range(200):
        run_id = new_run_id()
        assert len(run_id) == 26
        # No I, L, O or U: an id read aloud or retyped cannot be mistaken.
        assert set(run_id) <= set(CROCKFORD), run_id


def test_the_first_ten_characters_are_the_creation_time_in_ms() -> None:
    before = int(time.time() * 1000)
    run_id = new_run_id()
    after = int(time.time() * 1000)
    assert before <= _decode(run_id[:10]) <= after


def test_ids_sort_by_creation_time() -> None:
    made = []
    for _ in range(5):
        made.append(new_run_id())
        time.sleep(0.002)
    assert sorted(made) == made


def test_ids_made_in_the_same_millisecond_still_differ() -> None:
    ids = [new_run_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    # 80 random bits follow the time: the tails differ, not only the order.
    assert len({i[10:] for i in ids}) == len(ids)
