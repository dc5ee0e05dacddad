"""The Landlock gate: may a run be composed through saphan-launcher on a machine?

Only when the machine's row — written by ``saphan machine probe-confinement``
alone, signed with the workspace key and verified here — asserts a measured
Landlock level at or above the floor. The floor is ABI 3: below it the kernel
does not cover truncation, so a "confined" run could still destroy the
contents of any file it can open. The floor and the highest known level come
from rust/core (the launcher re-checks the same floor against the live kernel
when it applies the domain), so both sides decide with the same code.

Every other outcome is a named refusal with the remediation computed from the
row: never probed, measured incapable, below the floor, or a level above the
highest this engine knows (not believed).
"""

from __future__ import annotations

from typing import Any

from saphan import refusals

FACT_KIND = "landlock"


def floor() -> int:
    from saphan import _native

    return _native.landlock_floor()


def highest_known() -> int:
    from saphan import _native

    return _native.landlock_highest_known()


def gate_row(machine: str,
             row: tuple[dict[str, Any], str] | None) -> tuple[int, dict[str, Any]]:
    """The level to confine with and the verified row it came from (a row as
    Context.verified_fact returns it), or the refusal."""
    if row is None:
        gate(machine, None)  # landlock-unprobed, always
        raise AssertionError("unreachable: gate refuses a missing row")
    value, measured_at = row
    return gate(machine, value, measured_at), value


def gate(machine: str, fact: dict[str, Any] | None, measured_at: str | None = None) -> int:
    """The measured level to confine with, or the refusal. ``fact`` is verified."""
    probe = f"saphan machine probe-confinement {machine}"
    if fact is None:
        raise refusals.landlock_unprobed(
            f"machine {machine} has no measured Landlock level: it was never probed, so "
            "nothing says its kernel can confine a run",
            f"measure it: `{probe}`",
        )
    level = int(fact["level"])
    when = f" (measured {measured_at} with saphan-launcher {fact.get('launcher_version')})"
    if level == 0:
        raise refusals.landlock_incapable(
            f"machine {machine} measured Landlock level 0 ({fact.get('reason')}; kernel "
            f"{fact.get('kernel_release')}){when}",
            "enable Landlock in that kernel (CONFIG_SECURITY_LANDLOCK=y and `landlock` in the "
            f"lsm= boot parameter; a container may hide it), then `{probe}`",
        )
    if level < floor():
        raise refusals.landlock_below_floor(
            f"machine {machine} measured Landlock level {level}, below the floor of {floor()} "
            f"(truncation is not covered below it; kernel {fact.get('kernel_release')}){when}",
            f"upgrade that kernel to one with Landlock ABI >= {floor()} (Linux 6.2 or later), "
            f"then `{probe}`",
        )
    if level > highest_known():
        raise refusals.landlock_level_unknown(
            f"machine {machine}'s row claims Landlock level {level}, above the highest this "
            f"engine knows ({highest_known()}); the claim is not believed{when}",
            f"upgrade saphan (and deliver its launcher), then `{probe}`",
        )
    return level
