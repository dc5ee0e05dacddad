"""The Landlock lane: probe-confinement, signed rows, the gate, and the
launcher's domain on the real kernel — through the real CLI."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

import escapes
from conftest import Saphan, require
from saphan import _native
from saphan.fleet import facts
from saphan.store import open_store

RUN = ("run", "--machine", "here", "--slot", "s1", "--boundary", "landlock")


@pytest.fixture
def lane(saphan_sqlite: Saphan) -> Saphan:
    require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    return saphan_sqlite


def _write_row(s: Saphan, **overrides: object) -> None:
    """A row as a probe on another kernel would have written it (store API, signed)."""
    live = json.loads(subprocess.run([s("launcher", "path").out.strip(), "probe"],
                                     capture_output=True, text=True, check=True).stdout)
    value = {"level": live["landlock_abi"], "reason": live["landlock_reason"],
             "kernel_release": live["kernel_release"],
             "launcher_version": live["launcher_version"],
             "launcher_sha256": live["launcher_sha256"], "floor": 3, "highest_known": 7,
             "transport": "local"}
    value.update(overrides)
    key = (s.home / "record.key").read_bytes()
    store = open_store("sqlite", s.home / "saphan.db")
    machine = store.get_machine("here")
    assert machine is not None
    facts.write(store, key, s.home, machine, "landlock", value, "2026-11-29T00:00:00.000000Z")
    store.close()


def test_unprobed_machine_is_refused(lane: Saphan, tmp_path: Path) -> None:
    r = lane(*RUN, "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3
    assert "refused [landlock-unprobed]: machine here has no measured Landlock level" in r.err
    assert "saphan machine probe-confinement here" in r.err
    rec = lane.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["refusal"]["class"] == "landlock-unprobed"
    assert rec["finished_at"] is not None


def test_probe_writes_the_signed_measured_level(lane: Saphan) -> None:
    r = lane.ok("machine", "probe-confinement", "here", "--json")
    value = r.json()
    assert isinstance(value, dict)
    assert value["level"] == _native.landlock_abi()[0]
    assert len(value["launcher_sha256"]) == 64
    shown = lane.ok("machine", "show", "here", "--json").json()
    assert isinstance(shown, dict)
    assert shown["facts"]["landlock"]["value"]["level"] == value["level"]
    # No verb accepts a typed level: the probe has no options but --json.
    help_text = lane.ok("machine", "probe-confinement", "--help").out
    assert "--level" not in help_text and "--force" not in help_text


def test_tampered_row_is_refused(lane: Saphan, tmp_path: Path) -> None:
    lane.ok("machine", "probe-confinement", "here")
    db = sqlite3.connect(lane.home / "saphan.db")
    value = json.loads(db.execute("SELECT value_json FROM machine_facts").fetchone()[0])
    value["level"] = 6
    db.execute("UPDATE machine_facts SET value_json = ?", (json.dumps(value, sort_keys=True,
                                                                      separators=(",", ":")),))
    db.commit()
    db.close()
    r = lane(*RUN, "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3
    assert "refused [record-signature-invalid]" in r.err
    r = lane("machine", "show", "here")
    assert r.code == 3 and "record-signature-invalid" in r.err


@pytest.mark.parametrize(("level", "cls", "needle"), [
    (2, "landlock-below-floor", "measured Landlock level 2, below the floor of 3"),
    (1, "landlock-below-floor", "measured Landlock level 1, below the floor of 3"),
    (0, "landlock-incapable", "measured Landlock level 0"),
    (99, "landlock-level-unknown", "claims Landlock level 99, above the highest"),
])
def test_gate_refuses_rows_below_floor_or_unknown(lane: Saphan, tmp_path: Path, level: int,
                                                  cls: str, needle: str) -> None:
    _write_row(lane, level=level)
    marker = tmp_path / "ran"
    r = lane(*RUN, "--workdir", str(tmp_path), "--", "touch", str(marker))
    assert r.code == 3, r.err
    assert f"refused [{cls}]" in r.err and needle in r.err
    assert "fix:" in r.err
    assert not marker.exists()


def test_row_measured_with_another_launcher_is_refused(lane: Saphan, tmp_path: Path) -> None:
    _write_row(lane, launcher_sha256="0" * 64)
    r = lane(*RUN, "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3
    assert "refused [digest-mismatch]" in r.err and "0" * 64 in r.err


def test_kernel_without_landlock_is_measured_and_refused(lane: Saphan, tmp_path: Path,
                                                        no_landlock: str) -> None:
    from conftest import saphan_exe

    p = subprocess.run([no_landlock, saphan_exe(), "machine", "probe-confinement", "here",
                        "--json"], capture_output=True, text=True, env=lane.env(), check=True)
    assert json.loads(p.stdout)["level"] == 0
    assert json.loads(p.stdout)["reason"] == "enosys"
    r = lane(*RUN, "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3
    assert "refused [landlock-incapable]" in r.err and "enosys" in r.err


def test_launcher_rechecks_the_live_kernel(lane: Saphan, tmp_path: Path, no_landlock: str) -> None:
    """A stale row cannot make a weaker boundary: the launcher measures again."""
    launcher = lane.ok("launcher", "path").out.strip()
    marker = tmp_path / "ran"
    policy = json.dumps({"version": 1, "workdir": str(tmp_path), "writable": [str(tmp_path)],
                         "readable": "everything"})
    p = subprocess.run([no_landlock, launcher, "exec", "--policy", policy, "--",
                        "/usr/bin/touch", str(marker)], capture_output=True, text=True)
    assert p.returncode == 3
    assert "landlock-incapable" in p.stderr and "0" in p.stderr
    assert not marker.exists()


def test_pinned_digest_mismatch_runs_nothing(lane: Saphan, tmp_path: Path) -> None:
    launcher = lane.ok("launcher", "path").out.strip()
    marker = tmp_path / "ran"
    policy = json.dumps({"version": 1, "workdir": str(tmp_path), "writable": [str(tmp_path)],
                         "readable": "everything", "agent_sha256": "ab" * 32})
    p = subprocess.run([launcher, "exec", "--policy", policy, "--", "/usr/bin/touch",
                        str(marker)], capture_output=True, text=True)
    assert p.returncode == 3
    assert "refused [digest-mismatch]" in p.stderr
    assert not marker.exists()


def test_unknown_policy_key_refused_by_name(lane: Saphan, tmp_path: Path) -> None:
    launcher = lane.ok("launcher", "path").out.strip()
    policy = json.dumps({"version": 1, "workdir": str(tmp_path), "writable": [str(tmp_path)],
                         "readable": "everything", "network": "open"})
    p = subprocess.run([launcher, "exec", "--policy", policy, "--", "/usr/bin/true"],
                       capture_output=True, text=True)
    assert p.returncode == 3
    assert "refused [policy-invalid]" in p.stderr and "network" in p.stderr


def test_escape_battery_under_landlock(lane: Saphan, tmp_path: Path) -> None:
    lane.ok("machine", "probe-confinement", "here")
    repo, outside = escapes.make_repo_and_victim(tmp_path)
    victim = outside / "victim.txt"
    before = escapes.digest(victim)
    git_config = (repo / ".git" / "config").read_bytes()
    r = lane(*RUN, "--workdir", str(repo), "--", "sh", "-c",
             escapes.script({**escapes.CONTENT, **escapes.METADATA}))
    assert r.code == 0, r.err
    lines = set(r.out.splitlines())
    for name in escapes.CONTENT:
        assert f"REFUSED {name}" in lines, f"escape {name!r} succeeded under Landlock:\n{r.out}"
    # The documented residuals still exist (docs/boundaries.md): Landlock does
    # not cover metadata. If this starts failing, the docs must change.
    for name in escapes.METADATA:
        assert f"ESCAPED {name}" in lines, f"residual {name!r} no longer exists:\n{r.out}"
    assert "INSIDE ok" in lines
    assert escapes.digest(victim) == before
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (repo / ".git" / "config").read_bytes() == git_config
    rec = lane.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "landlock" and enforced["abi"] == _native.landlock_abi()[0]
    assert enforced["confirmation"].startswith(f"saphan-launcher: landlock abi={enforced['abi']} "
                                               "enforced writable=[")
    assert json.loads(enforced["policy_json"])["workdir"] == str(repo)
    assert len(enforced["executable_sha256"]) == 64 and enforced["launcher_version"]
    assert rec["agent"]["sha256"] == _native.sha256_file(rec["agent"]["path"])
