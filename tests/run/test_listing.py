"""run/listing.py: `runs list`'s filters (bad input is exit 2 before any
read) and the one shape of each row (through the CLI:
tests/test_cli_verbs.py)."""

from __future__ import annotations

import pytest

from saphan.errors import UserError
from saphan.run import listing


def test_filters() -> None:
    assert listing.filters() == {"machine": None, "slot": None, "outcome": None, "tool": None}
    assert listing.filters(tool="claude")["tool"] == "claude"
    with pytest.raises(UserError, match="--tool 'x' is unknown"):
        listing.filters(tool="x")
    assert listing.filters(state="live")["live"] is True
    assert listing.filters(state="ended")["state"] == "ended"
    assert listing.filters(since="2026-11-30")["since"] == "2026-11-30T00:00:00"
    with pytest.raises(UserError, match="--state 'x' is unknown"):
        listing.filters(state="x")
    with pytest.raises(UserError, match="--machine"):
        listing.filters(machine="")


def test_rows_have_one_key_set_and_one_word_cells() -> None:
    ended = {"id": "A", "machine": "m", "slot": "s", "session_ordinal": 0, "exit_code": -15,
             "outcome": "failed", "started_at": "t", "enforced_by": {"mechanism": "bubblewrap"}}
    refused = {"id": "B", "machine": "m", "slot": "s", "session_ordinal": None,
               "outcome": "refused", "refusal": {"class": "seat-full"}, "started_at": "t"}
    live = {**ended, "outcome": None, "state": "running", "live": {"holder": {}}}
    assert len({tuple(sorted(listing.json_row(r))) for r in (ended, refused, live)}) == 1
    assert listing.json_row(ended)["live"] is None
    assert listing.table_row(ended, "valid") == ["A", "m", "s", "0", "t", "failed", "SIGTERM",
                                                 "bubblewrap", "valid"]
    assert listing.table_row(refused, "valid")[3:8] == ["-", "t", "refused", "seat-full", "-"]
    assert listing.table_row(live, "pending")[5] == "running"
