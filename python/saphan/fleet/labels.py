"""Labels: an operator's ``key=value`` marks on machines and slots, which
casting matches (issue 21).

A machine's own labels are stored with slot ``""``. A slot's label overrides
its machine's label of the same key: :func:`effective` is what a slot offers,
and :func:`matches` says what it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from saphan.context import Context
from saphan.errors import UserError

_KEY = re.compile(r"[a-z0-9][a-z0-9._/-]{0,62}")
MAX_VALUE = 128
SHAPE = ("give key=value: the key 1-63 lowercase letters, digits, '.', '_', '/' or '-', "
         "starting with a letter or digit; the value 1-128 printable characters, no "
         "whitespace or ',' (e.g. zone=eu)")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise UserError(f"label key {key!r} is not allowed; {SHAPE}")
    return key


def parse(text: str) -> tuple[str, str]:
    """``key=value`` as (key, value); the value may hold '=' after the first."""
    key, eq, value = text.partition("=")
    if not eq:
        raise UserError(f"label {text!r} has no '='; {SHAPE}")
    check_key(key)
    if not value:
        raise UserError(f"label {text!r} has an empty value; {SHAPE}")
    if len(value) > MAX_VALUE:
        raise UserError(f"label {key!r} has a value of {len(value)} characters, over "
                        f"{MAX_VALUE}; {SHAPE}")
    bad = next((c for c in value if c.isspace() or not c.isprintable() or c == ","), None)
    if bad is not None:
        raise UserError(f"label {key!r} has {bad!r} in its value (whitespace, a control "
                        f"character, or ',' which listings separate labels with); {SHAPE}")
    return key, value


def parse_all(texts: Sequence[str]) -> dict[str, str]:
    """Several ``key=value`` (as one option given many times); a key given
    twice with two values is an error."""
    out: dict[str, str] = {}
    for text in texts:
        key, value = parse(text)
        if out.get(key, value) != value:
            raise UserError(f"label {key!r} is given twice ({key}={out[key]} and {text}); "
                            "give it once")
        out[key] = value
    return out


def _target(machine: str, slot: str) -> str:
    return f"machine {machine!r}" if slot == "" else f"slot {slot!r} on machine {machine!r}"


def set_labels(ctx: Context, machine: str, slot: str, add: Sequence[str],
               remove: Sequence[str]) -> dict[str, str]:
    """Set the ``add`` labels (``key=value``) and remove the ``remove`` keys
    of a machine (``slot`` "") or of its slot: everything is checked first and
    written in one transaction, or nothing is. Returns the target's labels."""
    put = parse_all(add)
    drop = list(dict.fromkeys(check_key(k) for k in remove))
    both = [k for k in drop if k in put]
    if both:
        raise UserError(f"label {both[0]!r} is both set and removed; give one or the other")
    if slot == "":
        ctx.machine(machine)
    else:
        ctx.slot(machine, slot)
    have = ctx.store.labels().get((machine, slot), {})
    missing = [k for k in drop if k not in have]
    if not missing:
        try:
            missing = ctx.store.change_labels(machine, slot, put, drop)
        except LookupError:
            raise UserError(f"{_target(machine, slot)} was removed meanwhile; nothing was "
                            "changed") from None
    if missing:
        raise UserError(f"{_target(machine, slot)} has no label {missing[0]!r} to remove "
                        f"(it has: {', '.join(sorted(have)) or 'none'}); nothing was changed")
    return ctx.store.labels().get((machine, slot), {})


def all_labels(ctx: Context) -> dict[tuple[str, str], dict[str, str]]:
    """Every label, keyed by (machine, slot), slot "" for the machine's own."""
    return ctx.store.labels()


def effective(machine_labels: Mapping[str, str], slot_labels: Mapping[str, str]) -> dict[str, str]:
    """What a slot offers: its machine's labels, each overridden by the
    slot's label of the same key."""
    return {**machine_labels, **slot_labels}


def matches(effective: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The requirements of ``wanted`` that ``effective`` does not meet, as
    text (``"zone=eu wanted, has zone=us"``); empty when all are met."""
    unmet = []
    for key, value in wanted.items():
        have = effective.get(key)
        if have != value:
            has = "none" if have is None else f"{key}={have}"
            unmet.append(f"{key}={value} wanted, has {has}")
    return unmet
