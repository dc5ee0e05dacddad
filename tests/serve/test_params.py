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
    # whatever a row's started_at holds (a forged one too), its page has a next one
    odd = "2026-12-01T00:00:00Z+junk/../\u202e"
    assert params.cursor(params.cursor_text(odd, rid)) == (odd, rid)
    for bad in ("a\x00b", "x" * (params.CURSOR_STARTED_LIMIT + 1)):
        with pytest.raises(BadParameter):
            params.cursor(params.cursor_text(bad, rid))
    assert not params.cursor_ok("t", "not-a-run-id")
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
