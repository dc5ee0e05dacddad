"""serve/params.py: every parameter checked against its shape."""

from __future__ import annotations

import pytest

from saphan.ids import new_run_id
from saphan.serve import params
from saphan.serve.params import BadParameter

TRAVERSALS = ["../../etc/passwd", "..", "/etc/passwd", "a/../b", "%2e%2e%2f", "x\x00y",
              "..\\..\\windows", "~root", "a b", ""]


def test_run_id_shape() -> None:
    rid = new_run_id()
    assert params.run_id(rid) == rid
    for bad in [*TRAVERSALS, rid.lower(), rid + "0", rid[:-1], "8" + rid[1:]]:
        with pytest.raises(BadParameter):
            params.run_id(bad)


@pytest.mark.parametrize("bad", TRAVERSALS)
def test_every_filter_refuses_a_path(bad: str) -> None:
    for name in ("state", "machine", "slot", "tool", "outcome", "before", "limit"):
        if bad == "":
            continue  # an empty filter is no filter
        with pytest.raises(BadParameter) as e:
            params.run_filters({name: bad})
        assert e.value.name == name


def test_filters() -> None:
    rid = new_run_id()
    before = params.cursor_text("2026-12-01T12:00:00.000001Z", rid)
    f = params.run_filters({"state": "live", "machine": "m-1", "slot": "s.1", "tool": "claude",
                            "outcome": "holder-dead", "before": before, "limit": "100"})
    assert f.store == {"machine": "m-1", "slot": "s.1", "tool": "claude",
                       "outcome": "holder-dead", "live": True,
                       "before": ("2026-12-01T12:00:00.000001Z", rid)}
    assert f.limit == 100
    assert f.query()["before"] == before
    # only a start time in the shape saphan writes is carried (a forged row's other
    # shape ends the paging with a note: serve/reader.runs)
    for bad in ("2026-12-01T00:00:00Z+junk/../\u202e", "a\x00b", "x" * 2000, "0"):
        with pytest.raises(BadParameter):
            params.cursor(params.cursor_text(bad, rid))
        assert not params.cursor_ok(bad, rid)
    assert not params.cursor_ok("2026-12-01T00:00:00Z", "not-a-run-id")
    assert params.cursor_ok("2030-01-01T00:00:00Z", rid)
    assert params.run_filters({"state": "ended"}).store["state"] == "ended"
    assert params.run_filters({"machine": ""}).machine is None
    with pytest.raises(BadParameter, match="no such parameter"):
        params.run_filters({"path": "x"})
    with pytest.raises(BadParameter):
        params.run_filters({"limit": "10000"})


def test_offset_and_only() -> None:
    assert params.offset("0") == 0
    assert params.offset("123") == 123
    for bad in ["-1", "1e3", "", " 1", str(params.MAX_OFFSET + 1), "9" * 40]:
        with pytest.raises(BadParameter):
            params.offset(bad)
    params.only(["a"], ["a", "b"])
    with pytest.raises(BadParameter):
        params.only(["c"], ["a"])
