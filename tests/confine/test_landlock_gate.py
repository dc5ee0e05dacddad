"""The Landlock gate (confine/landlock_gate.py): a run is composed through
saphan-launcher only on a measured level between the floor and the highest
level this engine knows; every other row is a named refusal whose message
carries the measured numbers and whose fix names the probe."""

from __future__ import annotations

from typing import Any

import pytest

from saphan import _native
from saphan.confine import landlock_gate
from saphan.refusals import Refusal

PROBE = "saphan machine probe-confinement m1"


def _row(level: int, **kw: Any) -> dict[str, Any]:
    return {"level": level, "reason": "supported", "kernel_release": "6.8.0-test",
            "launcher_version": "9.9.9", **kw}


def test_the_floor_is_abi_3_and_both_bounds_come_from_rust_core() -> None:
    assert landlock_gate.floor() == 3 == _native.landlock_floor()
    assert landlock_gate.highest_known() == _native.landlock_highest_known()
    assert landlock_gate.highest_known() >= landlock_gate.floor()


def test_every_level_from_the_floor_to_the_highest_known_is_confined_with() -> None:
    for level in range(landlock_gate.floor(), landlock_gate.highest_known() + 1):
        assert landlock_gate.gate("m1", _row(level), "2025-01-01T00:00:00Z") == level


def test_a_machine_never_probed_is_refused_with_the_probe_to_run() -> None:
    with pytest.raises(Refusal) as e:
        landlock_gate.gate("m1", None)
    assert e.value.cls == "landlock-unprobed"
    assert "machine m1 has no measured Landlock level" in e.value.message
    assert e.value.remediation == f"measure it: `{PROBE}`"


def test_level_zero_is_incapable_and_says_why_and_when() -> None:
    with pytest.raises(Refusal) as e:
        landlock_gate.gate("m1", _row(0, reason="not enabled in lsm="), "2025-01-02T03:04:05Z")
    assert e.value.cls == "landlock-incapable"
    assert "level 0 (not enabled in lsm=; kernel 6.8.0-test)" in e.value.message
    assert "(measured 2025-01-02T03:04:05Z with saphan-launcher 9.9.9)" in e.value.message
    assert "CONFIG_SECURITY_LANDLOCK=y" in e.value.remediation
    assert e.value.remediation.endswith(f"then `{PROBE}`")


@pytest.mark.parametrize("level", [1, 2])
def test_below_the_floor_is_refused_naming_both_numbers(level: int) -> None:
    with pytest.raises(Refusal) as e:
        landlock_gate.gate("m1", _row(level))
    assert e.value.cls == "landlock-below-floor"
    assert f"measured Landlock level {level}, below the floor of 3" in e.value.message
    assert "truncation is not covered" in e.value.message
    assert "Landlock ABI >= 3" in e.value.remediation


def test_a_level_above_the_highest_known_is_not_believed() -> None:
    high = landlock_gate.highest_known() + 1
    with pytest.raises(Refusal) as e:
        landlock_gate.gate("m1", _row(high))
    assert e.value.cls == "landlock-level-unknown"
    assert (f"claims Landlock level {high}, above the highest this engine knows "
            f"({landlock_gate.highest_known()})") in e.value.message
    assert "upgrade saphan" in e.value.remediation


def test_gate_row_returns_the_level_and_the_row_it_came_from() -> None:
    row = _row(landlock_gate.floor())
    assert landlock_gate.gate_row("m1", (row, "2025-01-01T00:00:00Z")) == (landlock_gate.floor(), row)
    with pytest.raises(Refusal, match=r"\[landlock-unprobed\]"):
        landlock_gate.gate_row("m1", None)
    with pytest.raises(Refusal, match=r"\[landlock-below-floor\]"):
        landlock_gate.gate_row("m1", (_row(2), "2025-01-01T00:00:00Z"))


def test_the_row_kind_is_landlock() -> None:
    # the kind `saphan machine show` lists the measured level under
    assert landlock_gate.FACT_KIND == "landlock"
