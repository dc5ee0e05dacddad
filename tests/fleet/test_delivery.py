"""Delivery of saphan-launcher (fleet/delivery.py), the parts that need no far
host: which machines are delivered to, and how an unreachable one is
reported. Delivery to real SSH hosts is tests/integration/sshd/test_delivery.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import delivery, machines
from saphan.store.rows import Machine


def _ssh_machine(ctx: Context, name: str, key: Path) -> None:
    # as `machine add --ssh` writes it once the host key was fetched; port 1 is closed
    assert ctx.store.add_machine(Machine(name, "ssh", "agent", "127.0.0.1", 1, str(key),
                                         "ssh-ed25519 AAAA", "t"))


@pytest.fixture
def key(tmp_path: Path) -> Path:
    k = tmp_path / "id"
    k.write_text("not read: nothing answers on port 1\n")
    return k


def test_names_and_all_are_one_or_the_other(ctx: Context, key: Path) -> None:
    _ssh_machine(ctx, "far", key)
    with pytest.raises(UserError, match=r"name the machines to deliver to, or give --all \(not both\)"):
        delivery.deliver(ctx, ["far"], all_machines=True)
    with pytest.raises(UserError, match="name the machines to deliver to"):
        delivery.deliver(ctx, [])


def test_a_local_machine_is_never_delivered_to(ctx: Context, key: Path) -> None:
    machines.add_machine(ctx, "here", local=True)
    _ssh_machine(ctx, "far", key)
    with pytest.raises(UserError) as e:
        delivery.deliver(ctx, ["far", "here"])
    assert str(e.value).startswith("machine 'here' is local: its launcher ships inside the saphan package")
    assert ctx.store.list_facts("far") == []


def test_all_with_no_ssh_machine_says_to_add_one(ctx: Context) -> None:
    machines.add_machine(ctx, "here", local=True)
    with pytest.raises(UserError, match="there are no --ssh machines to deliver to; add one first"):
        delivery.deliver(ctx, [], all_machines=True)


def test_an_unknown_machine_is_named(ctx: Context) -> None:
    with pytest.raises(UserError, match="no machine named 'ghost'"):
        delivery.deliver(ctx, ["ghost"])


def test_an_unreachable_machine_is_an_error_result_and_writes_nothing(ctx: Context, key: Path) -> None:
    _ssh_machine(ctx, "far2", key)
    _ssh_machine(ctx, "far1", key)
    machines.add_machine(ctx, "here", local=True)
    seen: list[dict[str, Any]] = []
    # --all takes the SSH machines only; the given order is kept, each machine once
    got = delivery.deliver(ctx, [], all_machines=True, probe=True, on_done=seen.append)
    assert [r["machine"] for r in got] == ["far1", "far2"]
    for r in got:
        assert r["result"] == "error"
        assert r["address"] == "agent@127.0.0.1:1"
        assert r["error"].startswith("error: ") and r["machine"] in r["error"]
        assert "probe" not in r and "delivered_at" not in r
    assert sorted(r["machine"] for r in seen) == ["far1", "far2"]
    assert ctx.store.list_facts("far1") == ctx.store.list_facts("far2") == []
    again = delivery.deliver(ctx, ["far2", "far1", "far2"])
    assert [r["machine"] for r in again] == ["far2", "far1"]


def test_every_result_has_one_key_set() -> None:
    """`machine deliver --json`: installed, refused and failed machines alike."""
    from saphan.fleet.delivery import RESULT_KEYS, as_row

    rows = [as_row({"machine": "a", "address": "x", "result": "installed", "path": "/p",
                    "sha256": "f" * 64, "version": "1", "delivered_at": "t"}),
            as_row({"machine": "b", "address": "y", "result": "refused",
                    "refusal": {"class": "digest-mismatch"}, "error": "refused"}),
            as_row({"machine": "c", "address": "z", "result": "error", "error": "e"})]
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(RESULT_KEYS))}
    assert rows[2]["sha256"] is None and rows[0]["error"] is None
