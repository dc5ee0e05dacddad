"""fleet/facts.py: a signed machine fact is believed only for the machine it
was measured on, and only while no newer one has been seen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saphan.context import Context
from saphan.fleet import facts, machines
from saphan.records import sign_fact
from saphan.refusals import Refusal
from saphan.store.rows import Machine

FP_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBhjZXZhbGlkLWtleS1hLTAwMDAwMDAwMDAwMDAwMDAw"
FP_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBhjZXZhbGlkLWtleS1iLTAwMDAwMDAwMDAwMDAwMDAw"


def _far(ctx: Context) -> Machine:
    assert ctx.store.add_machine(Machine("far", "ssh", "agent", "10.0.0.1", 22, "/k", FP_A, "t"))
    return ctx.machine("far")


def _write(ctx: Context, m: Machine, level: int, at: str = "t") -> None:
    facts.write(ctx.store, ctx.record_key(), ctx.workspace.home, m, "landlock",
                {"level": level}, at)


def _read(ctx: Context) -> dict[str, object] | None:
    got = ctx.verified_fact("far", "landlock")
    return None if got is None else got[0]


def test_a_fact_is_bound_to_user_host_port_and_host_key(ctx: Context) -> None:
    m = _far(ctx)
    _write(ctx, m, 7)
    value = _read(ctx)
    assert value is not None and value["level"] == 7 and value["seq"] == 1
    assert value["bound_to"] == f"ssh:agent@10.0.0.1:22 {facts.identity(m).split()[1]}"
    assert facts.identity(m).split()[1].startswith("SHA256:")


@pytest.mark.parametrize("change", ["host", "key"])
def test_a_repointed_machine_needs_a_new_probe(ctx: Context, change: str) -> None:
    _write(ctx, _far(ctx), 7)
    # Someone with write access to the store re-points the row (its facts stay).
    column, value = ("ssh_host", "10.0.0.2") if change == "host" else ("host_key", FP_B)
    ctx.store.db.execute(f"UPDATE machines SET {column} = ? WHERE name = ?", (value, "far"))
    assert ctx.store.get_fact("far", "landlock") is not None
    with pytest.raises(Refusal) as e:
        _read(ctx)
    assert e.value.cls == "record-signature-invalid"
    assert "re-pointed" in e.value.message and "probe-confinement far" in e.value.remediation


def test_an_older_row_put_back_is_refused(ctx: Context) -> None:
    m = _far(ctx)
    _write(ctx, m, 7, "t1")
    old = ctx.store.get_fact("far", "landlock")
    assert old is not None
    _write(ctx, m, 0, "t2")  # a re-probe measured 0
    assert _read(ctx) == {"level": 0, "bound_to": facts.identity(m), "seq": 2}
    ctx.store.put_fact(old)  # someone restores the level-7 row (signed, but superseded)
    with pytest.raises(Refusal) as e:
        _read(ctx)
    assert e.value.cls == "record-signature-invalid"
    assert "number 1 of its kind, but this workspace has seen number 2" in e.value.message


def test_a_row_without_a_binding_is_not_believed(ctx: Context) -> None:
    _far(ctx)
    ctx.store.put_fact(sign_fact(ctx.record_key(), "far", "landlock", {"level": 7}, "t"))
    with pytest.raises(Refusal) as e:
        _read(ctx)
    assert "is not bound to a machine" in e.value.message


def test_a_newer_row_from_another_writer_raises_the_mark(ctx: Context) -> None:
    m = _far(ctx)
    _write(ctx, m, 7)
    newer = sign_fact(ctx.record_key(), "far", "landlock",
                      {"level": 6, "bound_to": facts.identity(m), "seq": 5}, "t9")
    ctx.store.put_fact(newer)
    assert _read(ctx) == {"level": 6, "bound_to": facts.identity(m), "seq": 5}
    seen = json.loads((ctx.workspace.home / facts.SEQ_FILE).read_text())
    assert seen == {json.dumps(["far", "landlock"]): 5}
    _write(ctx, m, 7)
    assert _read(ctx) == {"level": 7, "bound_to": facts.identity(m), "seq": 6}


def test_an_edited_row_and_machine_show_refuse_it(ctx: Context) -> None:
    m = _far(ctx)
    _write(ctx, m, 2)
    fact = ctx.store.get_fact("far", "landlock")
    assert fact is not None
    ctx.store.put_fact(fact._replace(value_json=fact.value_json.replace('"level":2', '"level":7')))
    with pytest.raises(Refusal, match=r"\[record-signature-invalid\]"):
        machines.machine_facts(ctx, "far")


def test_an_unreadable_high_water_file_is_refused_not_reset(ctx: Context) -> None:
    m = _far(ctx)
    _write(ctx, m, 7)
    (ctx.workspace.home / facts.SEQ_FILE).write_text("{")
    with pytest.raises(Refusal) as e:
        _read(ctx)
    assert e.value.cls == "record-signature-invalid" and "cannot be read" in e.value.message
    (ctx.workspace.home / facts.SEQ_FILE).write_text('{"x": "not a number"}')
    with pytest.raises(Refusal):
        _read(ctx)
    (ctx.workspace.home / facts.SEQ_FILE).unlink()
    assert _read(ctx) is not None  # a fresh workspace believes the newest row it first sees


def test_the_high_water_file_is_replaced_whole_and_never_followed(ctx: Context,
                                                                 tmp_path: Path) -> None:
    m = _far(ctx)
    seq = ctx.workspace.home / facts.SEQ_FILE
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    seq.symlink_to(victim)
    with pytest.raises(Refusal):
        _write(ctx, m, 7)
    assert victim.read_text() == "victim\n"
    seq.unlink()
    _write(ctx, m, 7)
    before = seq.stat().st_ino
    _write(ctx, m, 6)
    assert seq.stat().st_ino != before and json.loads(seq.read_text())
