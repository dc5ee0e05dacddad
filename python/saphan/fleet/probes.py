"""Probes: the only writers of a machine's measured facts (its Landlock
level), signed with the workspace key. No verb accepts a typed value."""

from __future__ import annotations

import json
from typing import Any

from saphan import refusals
from saphan.context import Context
from saphan.errors import UserError
from saphan.timefmt import now_iso


def probe_confinement(ctx: Context, name: str) -> dict[str, Any]:
    """Measure the machine's Landlock level with saphan-launcher and write
    it onto the machine's signed row. The only writer of that fact; there
    is no way to type a level in. On an SSH machine the delivered launcher
    measures, on that machine, over its pinned connection."""
    m = ctx.machine(name)
    if m.transport == "ssh":
        from saphan.site import far as remote

        delivered = delivered_launcher(ctx, name)
        out, err, code = remote.probe(ctx.ssh(m), delivered["path"])
        value = probe_value(name, m.transport, out, err, code)
        check_probed_launcher(name, value, delivered)
        return record_probe(ctx, name, value)
    import subprocess

    from saphan import launcher

    path = launcher.path()
    if path is None:
        raise UserError("saphan-launcher not found; run ci/setup (it builds and packages it)")
    done = subprocess.run([path, "probe"], capture_output=True, text=True, timeout=60,
                          check=False)
    return record_probe(ctx,
        name, probe_value(name, m.transport, done.stdout, done.stderr, done.returncode)
    )


def record_probe(ctx: Context, name: str, value: dict[str, Any]) -> dict[str, Any]:
    from saphan.confine.landlock_gate import FACT_KIND
    from saphan.fleet import facts

    fact = facts.write(ctx.store, ctx.record_key(), ctx.workspace.home, ctx.machine(name),
                       FACT_KIND, value, now_iso())
    return {"machine": name, "measured_at": fact.measured_at, **json.loads(fact.value_json)}


def delivered_launcher(ctx: Context, name: str) -> dict[str, Any]:
    from saphan.site.far import FACT_KIND

    fact = ctx.verified_fact(name, FACT_KIND)
    if fact is None:
        raise UserError(
            f"no saphan-launcher has been delivered to {name}; deliver it first: "
            f"`saphan machine deliver {name}`"
        )
    return fact[0]


def probe_value(name: str, transport: str, stdout: str, stderr: str, code: int) -> dict[str, Any]:
    """The Landlock row's value from the launcher's ``probe`` JSON line — the
    same shape whether the launcher ran here or on a far machine."""
    try:
        measured = json.loads(stdout.strip().splitlines()[-1])
        return {
            "level": int(measured["landlock_abi"]),
            "reason": str(measured["landlock_reason"]),
            "kernel_release": str(measured["kernel_release"]),
            "launcher_version": str(measured["launcher_version"]),
            "launcher_sha256": str(measured["launcher_sha256"]),
            "floor": int(measured["floor"]),
            "highest_known": int(measured["highest_known"]),
            "transport": transport,
        }
    except (ValueError, KeyError, IndexError, TypeError):
        raise UserError(
            f"the launcher's probe on {name} did not answer with its JSON line "
            f"(exit {code}): {(stderr or stdout).strip()[:300]}"
        ) from None


def check_probed_launcher(name: str, value: dict[str, Any], delivered: dict[str, Any]) -> None:
    """The launcher that measured must be the one delivered."""
    if value["launcher_sha256"] != delivered["sha256"]:
        raise refusals.digest_mismatch(
            f"the launcher that probed {name} reports sha256 {value['launcher_sha256']}, but "
            f"sha256 {delivered['sha256']} was delivered to {delivered['path']}; no level was "
            "recorded",
            f"deliver it again: `saphan machine deliver {name} --probe`",
        )
