"""The record's `usage`: kept as the tool reported it, checked for shape only."""

from __future__ import annotations

import math

from saphan.tools import usage


def test_what_is_not_a_name_a_count_or_a_cost_is_dropped() -> None:
    got = usage.record(models=["b", "a", "a", "", "two words", "\x1b]52;c;x\x07", 3, "x" * 201],
                       tokens={"input": 5, "output": True, "cache_read": -1,
                               "cache_creation": 10**13},
                       cost_usd=math.nan, reported_by="t")
    assert got == {"models": ["a", "b"], "tokens": {"input": 5, "output": None,
                                                    "cache_read": None, "cache_creation": None},
                   "cost_usd": None, "reported_by": "t"}
    assert usage.record(models=[], tokens={}, cost_usd=0.25, reported_by="t")["cost_usd"] == 0.25
    assert usage.record(models=[], tokens={}, cost_usd=-1, reported_by="t")["cost_usd"] is None
    assert usage.record(models=[], tokens={}, cost_usd="1", reported_by="t")["cost_usd"] is None


def test_counts_add_up_and_stay_none_until_reported() -> None:
    total: dict[str, int | None] = {k: None for k in usage.TOKEN_KINDS}
    usage.add(total, {"input": 3, "output": "x"})
    usage.add(total, {"input": 4, "cache_read": 2})
    assert total == {"input": 7, "output": None, "cache_read": 2, "cache_creation": None}


def test_the_summary_line_says_who_reported_it() -> None:
    line = usage.summary(usage.record(models=["m1", "m2"], tokens={"input": 9, "output": 2},
                                      cost_usd=0.01234, reported_by="claude result event"))
    assert line == ("models m1, m2; tokens in 9 (cache read -, cache write -) out 2; cost "
                    "$0.0123 (as reported by the claude result event; the run could have "
                    "written it)")
    assert usage.summary({}).startswith("models none reported; tokens in - ")
