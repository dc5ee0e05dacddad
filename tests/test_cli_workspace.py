"""`saphan init`, the config schema, and run.confinement, through the real CLI."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from conftest import Saphan


def test_init_creates_workspace_with_owner_only_key(home: Path) -> None:
    s = Saphan(home)
    r = s.ok("init")
    assert "created" in r.out
    key = home / "record.key"
    assert key.stat().st_size == 32
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (home / "config.toml").exists()
    assert (home / "saphan.db").exists()


def test_second_init_is_a_noop_that_says_so(home: Path) -> None:
    s = Saphan(home)
    s.ok("init")
    key_before = (home / "record.key").read_bytes()
    r = s.ok("init")
    assert "already exists; nothing changed" in r.out
    assert (home / "record.key").read_bytes() == key_before


def test_unknown_config_key_is_refused_by_name(saphan_sqlite: Saphan) -> None:
    cfg = saphan_sqlite.home / "config.toml"
    cfg.write_text(cfg.read_text() + "\n[run2]\nx = 1\n")
    r = saphan_sqlite("machine", "list")
    assert r.code == 2
    assert "unknown section [run2]" in r.err
    cfg.write_text('[run]\nconfinment = "engine"\n')
    r = saphan_sqlite("machine", "list")
    assert r.code == 2
    assert "unknown key run.confinment" in r.err


@pytest.mark.parametrize(("value", "shown"), [
    ('"engnie"', "'engnie'"),
    # not a string: the same recorded refusal (it was a plain error, no run row)
    ("1", "1 (a TOML integer, not a string)"),
    ("true", "true (a TOML boolean, not a string)"),
])
def test_bad_confinement_setting_refuses_every_run_first(saphan_sqlite: Saphan,
                                                          tmp_path: Path, value: str,
                                                          shown: str) -> None:
    cfg = saphan_sqlite.home / "config.toml"
    cfg.write_text(cfg.read_text().replace('confinement = "engine"', f"confinement = {value}"))
    # Refused before any other branch: the machine and slot do not even exist.
    r = saphan_sqlite("run", "--machine", "nope", "--slot", "nope", "--workdir",
                      str(tmp_path), "--", "true")
    assert r.code == 3, r.err
    assert "refused [confinement-setting-invalid]" in r.err
    assert f"run.confinement is {shown} in {cfg}" in r.err
    assert "fix:" in r.err
    runs = saphan_sqlite.ok("runs", "list", "--json").json()
    assert isinstance(runs, list) and len(runs) == 1
    assert runs[0]["refusal"]["class"] == "confinement-setting-invalid"
    assert runs[0]["outcome"] == "refused"


def test_missing_workspace_names_the_fix(home: Path) -> None:
    r = Saphan(home)("machine", "list")
    assert r.code == 2
    assert "saphan init" in r.err


def test_key_custody_refused_when_group_readable(saphan_sqlite: Saphan) -> None:
    key = saphan_sqlite.home / "record.key"
    key.chmod(0o640)
    r = saphan_sqlite("init")
    assert r.code == 3
    assert "refused [custody-key-unsafe]" in r.err
    key.chmod(0o600)
    key.write_bytes(b"short")
    r = saphan_sqlite("init")
    assert r.code == 3
    assert "custody-key-unsafe" in r.err


def test_version_names_launcher_and_digest(home: Path) -> None:
    r = Saphan(home).ok("--version")
    lines = r.out.splitlines()
    assert lines[0].startswith("saphan 0.")
    assert lines[1].startswith("saphan-launcher ")
    assert "sha256:" in lines[1]
    digest = lines[1].split("sha256:")[1].split()[0]
    assert len(digest) == 64
