"""Probes (fleet/probes.py): the only writers of a machine's measured
Landlock level — measured by the real saphan-launcher, parsed from its JSON
line, signed with the workspace key, and accepted by the gate."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from saphan import _native, launcher
from saphan.confine import landlock_gate
from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import facts, machines, probes
from saphan.refusals import Refusal
from saphan.store.rows import Machine

#: the kind of the signed row a delivery writes (`saphan machine show` lists it)
LAUNCHER_FACT = "launcher"

LINE = {"landlock_abi": 5, "landlock_reason": "supported", "kernel_release": "6.8.0",
        "launcher_version": "0.1.0", "launcher_sha256": "ab" * 32, "floor": 3,
        "highest_known": 7}


def _launcher() -> str:
    path = launcher.path()
    assert path is not None, "saphan-launcher is not packaged (run ci/setup)"
    return path


# -- the launcher's answer ----------------------------------------------------------------

def test_the_value_is_the_launchers_json_line_in_the_rows_shape() -> None:
    out = "a warning first\n" + json.dumps(LINE) + "\n"
    assert probes.probe_value("m1", "ssh", out, "", 0) == {
        "level": 5, "reason": "supported", "kernel_release": "6.8.0", "launcher_version": "0.1.0",
        "launcher_sha256": "ab" * 32, "floor": 3, "highest_known": 7, "transport": "ssh",
    }


def test_the_real_launchers_probe_parses() -> None:
    done = subprocess.run([_launcher(), "probe"], capture_output=True, text=True, timeout=60)
    value = probes.probe_value("m1", "local", done.stdout, done.stderr, done.returncode)
    assert value["level"] == _native.landlock_abi()[0]
    assert value["launcher_sha256"] == _native.sha256_file(_launcher())
    assert (value["floor"], value["highest_known"]) == (landlock_gate.floor(),
                                                        landlock_gate.highest_known())


@pytest.mark.parametrize(("stdout", "stderr"), [
    ("", "saphan-launcher: cannot read /proc"),
    ("not json\n", ""),
    (json.dumps({k: v for k, v in LINE.items() if k != "kernel_release"}), ""),
    (json.dumps({**LINE, "landlock_abi": "five"}), ""),
    (json.dumps([1, 2]), ""),
])
def test_anything_but_the_json_line_is_an_error_naming_machine_exit_and_output(
        stdout: str, stderr: str) -> None:
    with pytest.raises(UserError) as e:
        probes.probe_value("m1", "ssh", stdout, stderr, 3)
    msg = str(e.value)
    assert msg.startswith("the launcher's probe on m1 did not answer with its JSON line (exit 3): ")
    assert msg.endswith((stderr or stdout).strip()[:300])


def test_the_output_quoted_is_cut_at_300_characters() -> None:
    with pytest.raises(UserError) as e:
        probes.probe_value("m1", "ssh", "", "x" * 1000, 1)
    assert str(e.value).endswith(": " + "x" * 300)


def test_the_launcher_that_probed_must_be_the_one_delivered() -> None:
    value = probes.probe_value("m1", "ssh", json.dumps(LINE), "", 0)
    probes.check_probed_launcher("m1", value, {"sha256": "ab" * 32, "path": "/opt/l"})
    with pytest.raises(Refusal) as e:
        probes.check_probed_launcher("m1", value, {"sha256": "cd" * 32, "path": "/opt/l"})
    assert e.value.cls == "digest-mismatch"
    assert f"reports sha256 {'ab' * 32}" in e.value.message
    assert f"sha256 {'cd' * 32} was delivered to /opt/l; no level was recorded" in e.value.message
    assert e.value.remediation == "deliver it again: `saphan machine deliver m1 --probe`"


# -- measuring and recording ----------------------------------------------------------------

def test_probing_a_local_machine_records_the_signed_measured_level(ctx: Context) -> None:
    machines.add_machine(ctx, "m1", local=True)
    got = probes.probe_confinement(ctx, "m1")
    level = _native.landlock_abi()[0]
    assert got["machine"] == "m1" and got["level"] == level and got["transport"] == "local"
    assert got["launcher_sha256"] == _native.sha256_file(_launcher())
    row = ctx.verified_fact("m1", landlock_gate.FACT_KIND)
    assert row is not None
    value, measured_at = row
    assert measured_at == got["measured_at"]
    assert value == {k: v for k, v in got.items() if k not in ("machine", "measured_at")}
    if level >= landlock_gate.floor():
        assert landlock_gate.gate_row("m1", row)[0] == level


def test_probing_again_replaces_the_row(ctx: Context) -> None:
    machines.add_machine(ctx, "m1", local=True)
    probes.record_probe(ctx, "m1", {"level": 0, "reason": "old"})
    got = probes.probe_confinement(ctx, "m1")
    assert [f.kind for f in ctx.store.list_facts("m1")] == ["landlock"]
    assert machines.machine_facts(ctx, "m1")["landlock"]["measured_at"] == got["measured_at"]
    assert machines.machine_facts(ctx, "m1")["landlock"]["value"]["reason"] != "old"


def test_a_recorded_probe_that_is_edited_no_longer_verifies(ctx: Context) -> None:
    machines.add_machine(ctx, "m1", local=True)
    probes.record_probe(ctx, "m1", {"level": 2})
    fact = ctx.store.get_fact("m1", landlock_gate.FACT_KIND)
    assert fact is not None
    ctx.store.put_fact(fact._replace(value_json='{"level":7}'))
    with pytest.raises(Refusal, match=r"\[record-signature-invalid\]"):
        ctx.verified_fact("m1", landlock_gate.FACT_KIND)


def test_probing_an_unknown_machine_names_it(ctx: Context) -> None:
    with pytest.raises(UserError, match="no machine named 'ghost'"):
        probes.probe_confinement(ctx, "ghost")


def _ssh_machine(ctx: Context) -> None:
    # as `machine add --ssh` writes it once the host key was fetched
    assert ctx.store.add_machine(Machine("far", "ssh", "agent", "127.0.0.1", 1, "/k",
                                         "ssh-ed25519 AAAA", "t"))


def test_an_ssh_machine_without_a_delivered_launcher_is_told_to_deliver(ctx: Context) -> None:
    _ssh_machine(ctx)
    with pytest.raises(UserError) as e:
        probes.probe_confinement(ctx, "far")
    assert str(e.value) == ("no saphan-launcher has been delivered to far; deliver it first: "
                            "`saphan machine deliver far`")
    assert ctx.store.list_facts("far") == []


def test_the_delivered_launcher_is_read_from_its_verified_row(ctx: Context) -> None:
    _ssh_machine(ctx)
    value: dict[str, Any] = {"path": "/home/agent/.saphan/bin/saphan-launcher", "sha256": "ab" * 32}
    facts.write(ctx.store, ctx.record_key(), ctx.workspace.home, ctx.machine("far"),
                LAUNCHER_FACT, value, "t")
    got = probes.delivered_launcher(ctx, "far")
    assert {k: got[k] for k in value} == value and got["seq"] == 1
    fact = ctx.store.get_fact("far", LAUNCHER_FACT)
    assert fact is not None
    ctx.store.put_fact(fact._replace(value_json=json.dumps({**value, "path": "/tmp/planted"})))
    with pytest.raises(Refusal, match=r"\[record-signature-invalid\]"):
        probes.delivered_launcher(ctx, "far")
