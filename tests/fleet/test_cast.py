"""fleet/cast.py: which slots may take a run of a tool, judged from rows
only (nothing is dialled), in the documented order, everything passed over
with why; and the refusal a cast ends in. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import cast, facts, labels, slots
from saphan.store.rows import Machine

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBhjZXZhbGlkLWtleS1hLTAwMDAwMDAwMDAwMDAwMDAw"


def _fleet(ctx: Context) -> None:
    """here (local), far-a (SSH, Landlock 6, launcher delivered), far-b (SSH,
    never probed), far-c (SSH, measured below the floor); command slots on
    each, a loop slot on here."""
    assert ctx.store.add_machine(Machine("here", "local", created_at="t"))
    for name in ("far-c", "far-a", "far-b"):
        assert ctx.store.add_machine(Machine(name, "ssh", "u", f"{name}.invalid", 22, "/k",
                                             KEY, "t"))
    key, home = ctx.record_key(), ctx.workspace.home
    for name, level in (("far-a", 6), ("far-c", 2)):
        m = ctx.machine(name)
        facts.write(ctx.store, key, home, m, "landlock", {"level": level}, "t")
        facts.write(ctx.store, key, home, m, "launcher", {"path": "/x", "sha256": "0" * 64}, "t")
    for m in ("far-b", "far-a", "here", "far-c"):
        for s in ("s2", "s1"):
            slots.add_slot(ctx, m, s, tool="command")
    slots.add_slot(ctx, "here", "l1", tool="loop")


def test_candidates_are_ranked_local_first_then_by_name(ctx: Context) -> None:
    _fleet(ctx)
    found = cast.candidates(ctx, "command")
    assert [c.name for c in found.eligible] == ["here/s1", "here/s2", "far-a/s1", "far-a/s2"]
    why = {(p["machine"], p["slot"]): p["why"] for p in found.passed_over}
    assert set(why) == {("far-b", "s1"), ("far-b", "s2"), ("far-c", "s1"), ("far-c", "s2")}
    assert why["far-b", "s1"].startswith("[landlock-unprobed] machine far-b has no measured "
                                         "Landlock level")
    assert why["far-c", "s2"].startswith("[landlock-below-floor] machine far-c measured "
                                         "Landlock level 2")
    rec = found.as_record()
    assert rec["candidates"] == ["here/s1", "here/s2", "far-a/s1", "far-a/s2"]
    assert rec["ranking"] == cast.RANKING and "image_note" not in rec


def test_a_machine_and_labels_narrow_the_candidates(ctx: Context) -> None:
    _fleet(ctx)
    labels.set_labels(ctx, "far-a", "", ["zone=eu"], [])
    labels.set_labels(ctx, "far-a", "s2", ["zone=us"], [])
    found = cast.candidates(ctx, "command", labels={"zone": "eu"})
    assert [c.name for c in found.eligible] == ["far-a/s1"]
    why = {(p["machine"], p["slot"]): p["why"] for p in found.passed_over}
    assert why["far-a", "s2"] == "labels: zone=eu wanted, has zone=us"
    assert why["here", "s1"] == "labels: zone=eu wanted, has none"
    only = cast.candidates(ctx, "command", machine="here")
    assert [c.name for c in only.eligible] == ["here/s1", "here/s2"] and not only.passed_over
    assert [c.name for c in cast.candidates(ctx, "loop").eligible] == ["here/l1"]


def test_bad_orders_are_user_errors(ctx: Context) -> None:
    _fleet(ctx)
    with pytest.raises(UserError, match="--tool 'bash' is unknown"):
        cast.candidates(ctx, "bash")
    with pytest.raises(UserError, match="machine 'gone' is not known"):
        cast.candidates(ctx, "command", machine="gone")
    with pytest.raises(UserError, match="not an image digest"):
        cast.candidates(ctx, "command", image="alpine:latest")


def test_the_refusal_is_fleet_full_only_when_something_was_full(ctx: Context) -> None:
    _fleet(ctx)
    found = cast.candidates(ctx, "command", labels={"zone": "mars"})
    r = cast.refusal(found, [])
    assert r.cls == "no-eligible-slot"
    assert r.message.startswith("no slot can take a run of tool command, zone=mars: ")
    assert "here/s1: labels: zone=mars wanted, has none" in r.message
    full = [{"machine": "here", "slot": "s1", "why": "full: slot s1 on here carries 1 run"}]
    r = cast.refusal(cast.candidates(ctx, "command"), full)
    assert r.cls == "fleet-full" and "here/s1: full: slot s1 on here carries 1 run" in r.message
    assert "far-b/s1: [landlock-unprobed]" in r.message
    none = cast.candidates(ctx, "codex")
    assert cast.refusal(none, []).message == (
        "no slot can take a run of tool codex: no slot of tool codex exists (`saphan slot "
        "list`)")


def test_an_image_cast_reads_only_image_rows(ctx: Context) -> None:
    _fleet(ctx)
    digest = "sha256:" + "a" * 64
    found = cast.candidates(ctx, "command", image=f"reg.example/img@{digest}")
    assert found.eligible == []
    assert all(p["why"].startswith(("image: no probe-confirmed docker-oci row",
                                    "[landlock-")) for p in found.passed_over)
    rec = found.as_record()
    assert rec["image_fresh_seconds"] == 86400
    assert "not confinement" in rec["image_note"]
    assert cast.refusal(found, []).cls == "no-eligible-slot"  # not only the image kept them out
    only_image = cast.candidates(ctx, "command", image=digest, machine="here")
    assert cast.refusal(only_image, []).cls == "container-ineligible"
