"""run/reserve.py: a run takes one of its slot's ordinals, or the seat-full
refusal is recorded on the run's own row (signed) and raised. Through a real
store (SQLite and PostgreSQL) and workspace."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from saphan.context import Context
from saphan.ids import new_run_id
from saphan.liveness import Holder, current_holder
from saphan.refusals import Refusal
from saphan.run.reserve import reserve
from saphan.store.rows import Slot
from saphan.timefmt import now_iso


def _slot(ctx: Context, name: str) -> Slot:
    s = ctx.store.get_slot("m", name)
    assert s is not None
    return s


def _base(slot: str) -> dict[str, Any]:
    return {"id": new_run_id(), "machine": "m", "slot": slot, "workdir": "/wd",
            "started_at": now_iso()}


def test_each_run_gets_its_own_ordinal(ctx: Context) -> None:
    s2 = _slot(ctx, "s2")
    me = current_holder()
    first, second = _base("s2"), _base("s2")
    assert reserve(ctx, s2, first, "/wd", me) == 0
    assert reserve(ctx, s2, second, "/wd", me) == 1
    live = {r.id: r for r in ctx.store.live_runs("m", "s2")}
    assert set(live) == {first["id"], second["id"]}
    row = live[first["id"]]
    assert (row.session_ordinal, row.tool, row.workdir, row.holder_pid) == (
        0, "command", "/wd", me.pid)


def test_a_full_slot_is_refused_and_the_refusal_recorded(ctx: Context) -> None:
    s1 = _slot(ctx, "s1")
    holding = _base("s1")
    reserve(ctx, s1, holding, "/wd", current_holder())
    refused = _base("s1")
    with pytest.raises(Refusal) as info:
        reserve(ctx, s1, refused, "/elsewhere", current_holder())
    r = info.value
    assert r.cls == "seat-full" and r.run_id == refused["id"]
    assert "slot s1 on m carries 1 run and may carry 1" in r.message
    assert f"run {holding['id']}" in r.message
    assert "saphan slot set m s1 --max-sessions N" in r.remediation
    row = ctx.store.get_run(refused["id"])
    assert row is not None and not row.live
    assert (row.state, row.outcome, row.refusal_class, row.workdir) == (
        "refused", "refused", "seat-full", "/wd")
    rec = ctx.run_record(refused["id"])
    assert rec.signature == "valid" and rec.data["refusal"] == r.as_dict()
    # The holder keeps its seat.
    assert [x.id for x in ctx.store.live_runs("m", "s1")] == [holding["id"]]


def test_a_dead_holder_is_finalised_signed_and_its_seat_given(ctx: Context) -> None:
    s1 = _slot(ctx, "s1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = current_holder()
    dead = _base("s1")
    reserve(ctx, s1, dead, "/wd", Holder(me.host, gone.pid, 12345, me.boot_id))
    mine = _base("s1")
    assert reserve(ctx, s1, mine, "/wd", me) == 0
    rec = ctx.run_record(dead["id"])
    assert rec.outcome == "holder-dead"
    assert rec.signature == "valid"  # signed with the workspace key on the way
    assert [x.id for x in ctx.store.live_runs("m", "s1")] == [mine["id"]]
