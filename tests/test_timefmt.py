"""timefmt.py: timestamps are UTC, ISO-8601 with microseconds and a Z, so that
records and rows written on any host sort correctly as text."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import pytest

from saphan.timefmt import now_iso

SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_shape_is_iso_8601_utc_with_microseconds() -> None:
    stamp = now_iso()
    assert SHAPE.match(stamp), stamp


def test_it_is_the_current_time_in_utc() -> None:
    before = datetime.now(UTC)
    parsed = datetime.strptime(now_iso(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    after = datetime.now(UTC)
    assert before.replace(microsecond=0) <= parsed <= after


def test_it_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: a local clock would show it
    time.tzset()
    try:
        stamp = now_iso()
        utc_hour = datetime.now(UTC).hour
    finally:
        monkeypatch.undo()
        time.tzset()
    assert int(stamp[11:13]) in (utc_hour, (utc_hour - 1) % 24)


def test_later_stamps_sort_later_as_text() -> None:
    stamps = []
    for _ in range(20):
        stamps.append(now_iso())
        time.sleep(0.0005)
    assert sorted(stamps) == stamps
    assert len(set(stamps)) == len(stamps)


def test_durations_and_since_are_bounded_bad_input() -> None:
    from saphan.errors import UserError
    from saphan.timefmt import parse_duration, parse_since

    assert [parse_duration(t, "--x") for t in ("0", "45", "30s", "15m", "2h", "7d", "1w")] == [
        0, 45, 30, 900, 7200, 604800, 604800]
    for bad in ("", "x", "-1", "1.5h", "3y", "99999999999999999999d", "3651d"):
        with pytest.raises(UserError, match="--x"):
            parse_duration(bad, "--x")
    assert parse_since("2026-11-30T12:00") == "2026-11-30T12:00:00"
    assert parse_since("1h") < now_iso()
    with pytest.raises(UserError, match="not a date"):
        parse_since("2026-02-30")
