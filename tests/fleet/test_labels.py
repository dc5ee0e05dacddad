"""Labels (fleet/labels.py): key=value marks on machines and slots — the
shape a label must have, setting and removing them all or nothing, a slot's
label overriding its machine's, and what a requirement lacks."""

from __future__ import annotations

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import labels, machines, slots


@pytest.fixture
def m1(ctx: Context) -> str:
    machines.add_machine(ctx, "m1", local=True)
    slots.add_slot(ctx, "m1", "s", tool="command")
    return "m1"


# -- the shape of a label ------------------------------------------------------------

@pytest.mark.parametrize(("text", "want"), [
    ("zone=eu", ("zone", "eu")),
    ("a=b", ("a", "b")),
    ("0=1", ("0", "1")),
    ("example.com/gpu_kind-2=a100", ("example.com/gpu_kind-2", "a100")),
    ("opts=a=b=c", ("opts", "a=b=c")),
    ("eq==", ("eq", "=")),
    ("k=" + "v" * 128, ("k", "v" * 128)),
    ("k" * 63 + "=v", ("k" * 63, "v")),
    ("city=Zürich", ("city", "Zürich")),
    ("ver=1.2:3;x/y", ("ver", "1.2:3;x/y")),
])
def test_a_label_is_key_and_value(text: str, want: tuple[str, str]) -> None:
    assert labels.parse(text) == want


@pytest.mark.parametrize(("text", "needle"), [
    ("zone", "label 'zone' has no '='"),
    ("", "label '' has no '='"),
    ("=eu", "label key '' is not allowed"),
    ("Zone=eu", "label key 'Zone' is not allowed"),
    ("ZONE=eu", "label key 'ZONE' is not allowed"),
    ("-zone=eu", "label key '-zone' is not allowed"),
    (".zone=eu", "label key '.zone' is not allowed"),
    ("my zone=eu", "label key 'my zone' is not allowed"),
    ("zone\t=eu", "label key 'zone\\t' is not allowed"),
    ("zo:ne=eu", "label key 'zo:ne' is not allowed"),
    ("k" * 64 + "=v", "is not allowed"),
    ("zone=", "label 'zone=' has an empty value"),
    ("zone=e u", "label 'zone' has ' ' in its value"),
    # review: `zone=eu,gpu=yes` read as two labels in the listings
    ("zone=eu,gpu=yes", "label 'zone' has ',' in its value"),
    ("zone= eu", "has ' ' in its value"),
    ("zone=eu\n", "has '\\n' in its value"),
    ("zone=eu\x00", "has '\\x00' in its value"),
    ("zone=e\x1bu", "has '\\x1b' in its value"),
    ("zone=e\x7fu", "has '\\x7f' in its value"),
    ("zone=e\u00a0u", "has '\\xa0' in its value"),
    ("zone=e\u2028u", "in its value"),
    ("k=" + "v" * 129, "label 'k' has a value of 129 characters, over 128"),
])
def test_a_bad_label_names_the_problem_and_the_shape(text: str, needle: str) -> None:
    with pytest.raises(UserError) as e:
        labels.parse(text)
    assert needle in str(e.value)
    assert "give key=value" in str(e.value)


def test_one_key_given_twice_with_two_values_is_refused() -> None:
    assert labels.parse_all(["a=1", "b=2", "a=1"]) == {"a": "1", "b": "2"}
    with pytest.raises(UserError, match=r"label 'a' is given twice \(a=1 and a=2\)"):
        labels.parse_all(["a=1", "a=2"])


# -- setting and removing, all or nothing ------------------------------------------

def test_labels_are_set_on_a_machine_and_on_a_slot_apart(ctx: Context, m1: str) -> None:
    assert labels.set_labels(ctx, m1, "", ["zone=eu", "arch=x86_64"], []) == {
        "arch": "x86_64", "zone": "eu"}
    assert labels.set_labels(ctx, m1, "s", ["zone=us"], []) == {"zone": "us"}
    assert labels.all_labels(ctx) == {("m1", ""): {"arch": "x86_64", "zone": "eu"},
                                      ("m1", "s"): {"zone": "us"}}


def test_setting_a_key_again_replaces_its_value_and_removing_it_drops_it(ctx: Context,
                                                                         m1: str) -> None:
    labels.set_labels(ctx, m1, "s", ["zone=eu", "gpu=a100"], [])
    assert labels.set_labels(ctx, m1, "s", ["zone=us"], ["gpu"]) == {"zone": "us"}
    assert labels.set_labels(ctx, m1, "s", [], ["zone"]) == {}
    assert labels.all_labels(ctx) == {}


@pytest.mark.parametrize(("machine", "slot", "add", "remove", "needle"), [
    ("m1", "", ["zone=us", "bad key=x"], [], "label key 'bad key' is not allowed"),
    ("m1", "", ["zone=us", "gpu="], [], "label 'gpu=' has an empty value"),
    ("m1", "", ["zone=us"], ["zone"], "label 'zone' is both set and removed"),
    ("m1", "", ["zone=us"], ["arch", "gpu"], "machine 'm1' has no label 'gpu' to remove "
                                             "(it has: arch, zone); nothing was changed"),
    ("m1", "s", ["zone=us"], ["zone2"], "slot 's' on machine 'm1' has no label 'zone2' to remove "
                                        "(it has: none)"),
    ("m1", "", ["zone=us"], ["Arch"], "label key 'Arch' is not allowed"),
    ("m1", "", ["zone=us", "zone=eu"], [], "label 'zone' is given twice"),
    ("ghost", "", ["zone=us"], [], "no machine named 'ghost'"),
    ("m1", "ghost", ["zone=us"], [], "no slot 'ghost' on machine 'm1'"),
])
def test_bad_input_changes_nothing(ctx: Context, m1: str, machine: str, slot: str,
                                   add: list[str], remove: list[str], needle: str) -> None:
    labels.set_labels(ctx, m1, "", ["zone=eu", "arch=x86_64"], [])
    before = labels.all_labels(ctx)
    with pytest.raises(UserError) as e:
        labels.set_labels(ctx, machine, slot, add, remove)
    assert needle in str(e.value)
    assert labels.all_labels(ctx) == before


def test_the_store_writes_a_change_in_one_transaction(ctx: Context, m1: str) -> None:
    """A key found gone at write time (removed meanwhile) leaves nothing written."""
    ctx.store.set_label("m1", "s", "a", "1")
    assert ctx.store.change_labels("m1", "s", {"b": "2"}, ["a", "ghost"]) == ["ghost"]
    assert ctx.store.labels() == {("m1", "s"): {"a": "1"}}
    assert ctx.store.change_labels("m1", "s", {"b": "2"}, ["a"]) == []
    assert ctx.store.labels() == {("m1", "s"): {"b": "2"}}


def test_removing_a_slot_or_a_machine_removes_its_labels(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, "m1", "t", tool="command")
    machines.add_machine(ctx, "m2", local=True)
    slots.add_slot(ctx, "m2", "s", tool="command")
    for machine, slot in (("m1", ""), ("m1", "s"), ("m1", "t"), ("m2", ""), ("m2", "s")):
        labels.set_labels(ctx, machine, slot, [f"at={machine}.{slot or '-'}"], [])
    slots.remove_slot(ctx, "m1", "s")
    assert set(labels.all_labels(ctx)) == {("m1", ""), ("m1", "t"), ("m2", ""), ("m2", "s")}
    machines.remove_machine(ctx, "m1")
    assert labels.all_labels(ctx) == {("m2", ""): {"at": "m2.-"}, ("m2", "s"): {"at": "m2.s"}}
    # A slot or machine added again under the old name starts with no labels.
    machines.add_machine(ctx, "m1", local=True)
    slots.add_slot(ctx, "m1", "s", tool="command")
    assert set(labels.all_labels(ctx)) == {("m2", ""), ("m2", "s")}


# -- the override rule and matching ---------------------------------------------------

def test_a_slots_label_overrides_its_machines(ctx: Context, m1: str) -> None:
    labels.set_labels(ctx, m1, "", ["zone=eu", "arch=x86_64"], [])
    labels.set_labels(ctx, m1, "s", ["zone=us", "gpu=a100"], [])
    got = labels.all_labels(ctx)
    assert labels.effective(got[("m1", "")], got[("m1", "s")]) == {
        "zone": "us", "arch": "x86_64", "gpu": "a100"}
    assert labels.effective(got[("m1", "")], {}) == {"zone": "eu", "arch": "x86_64"}
    assert labels.effective({}, {}) == {}


def test_matches_names_each_unmet_requirement() -> None:
    have = {"zone": "us", "arch": "x86_64"}
    assert labels.matches(have, {}) == []
    assert labels.matches(have, {"zone": "us", "arch": "x86_64"}) == []
    assert labels.matches(have, {"zone": "eu", "gpu": "a100", "arch": "x86_64"}) == [
        "zone=eu wanted, has zone=us", "gpu=a100 wanted, has none"]
    assert labels.matches({}, {"gpu": "a100"}) == ["gpu=a100 wanted, has none"]


def test_a_slot_removed_between_the_check_and_the_write_gets_no_labels(ctx: Context,
                                                                      m1: str) -> None:
    # review: labels written for a slot removed meanwhile were inherited by a
    # new slot of the same name
    from saphan.fleet import slots

    slots.add_slot(ctx, m1, "gone", tool="command")
    ctx.store.remove_slot(m1, "gone")
    with pytest.raises(LookupError):
        ctx.store.change_labels(m1, "gone", {"gpu": "yes"}, [])
    assert (m1, "gone") not in ctx.store.labels()
