"""workspace.py: $SAPHAN_HOME and what lives in it, and the account's registry
of workspaces (each one hidden inside every run's jail)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from saphan.refusals import Refusal
from saphan.workspace import (
    KEY_LENGTH,
    Workspace,
    default_home,
    register_workspace,
    registered_workspaces,
    registry_path,
)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own registry (never the account's)."""
    d = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(d))
    return d


# -- the registry -------------------------------------------------------------------

def test_registry_lives_under_xdg_state_home(state: Path) -> None:
    assert registry_path() == state / "saphan" / "workspaces"


def test_a_relative_xdg_state_home_is_ignored(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert registry_path() == tmp_path / "me" / ".local" / "state" / "saphan" / "workspaces"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert registry_path() == tmp_path / "me" / ".local" / "state" / "saphan" / "workspaces"


def test_register_adds_the_real_path_once(state: Path, tmp_path: Path) -> None:
    home = tmp_path / "ws"
    home.mkdir()
    link = tmp_path / "ws-link"
    link.symlink_to(home)
    assert registered_workspaces() == []
    register_workspace(link)
    register_workspace(home)
    register_workspace(link)
    assert registered_workspaces() == [str(home)]
    assert registry_path().read_text() == f"{home}\n"
    assert stat.S_IMODE(registry_path().parent.stat().st_mode) == 0o700


def test_registered_lists_only_absolute_existing_directories_once(state: Path,
                                                                  tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (tmp_path / "file").write_text("x")
    registry_path().parent.mkdir(parents=True)
    registry_path().write_text("\n".join([
        str(a), "relative/dir", str(tmp_path / "gone"), f"  {b}  ", str(a),
        str(tmp_path / "file"), ""]) + "\n")
    assert registered_workspaces() == [str(a), str(b)]


def test_a_registry_that_is_a_link_is_not_read(state: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(f"{ws}\n")
    registry_path().parent.mkdir(parents=True)
    registry_path().symlink_to(elsewhere)
    assert registered_workspaces() == []


def test_register_never_writes_through_a_planted_link(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    registry_path().parent.mkdir(parents=True)
    registry_path().symlink_to(victim)
    ws = tmp_path / "ws"
    ws.mkdir()
    register_workspace(ws)
    assert victim.read_text() == "victim\n"


# -- the workspace ----------------------------------------------------------------------

def test_default_home_is_saphan_home_else_dot_saphan(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPHAN_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"
    assert Workspace.resolve().home == tmp_path / "h"
    monkeypatch.delenv("SAPHAN_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert default_home() == tmp_path / "me" / ".saphan"


def test_resolve_makes_the_home_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert Workspace.resolve("rel/ws").home == tmp_path / "rel" / "ws"
    assert Workspace.resolve("~/ws").home == tmp_path / "me" / "ws"
    assert Workspace.resolve(tmp_path / "a" / ".." / "b").home == tmp_path / "b"


def test_layout(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "h")
    assert ws.config_path == tmp_path / "h" / "config.toml"
    assert ws.key_path == tmp_path / "h" / "record.key"
    assert ws.sqlite_path == tmp_path / "h" / "saphan.db"
    assert ws.runs_dir == tmp_path / "h" / "runs"
    assert ws.run_dir("01ABC") == tmp_path / "h" / "runs" / "01ABC"


def test_init_creates_owner_only_files_and_registers(state: Path, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "h")
    assert not ws.exists()
    created = ws.init()
    assert created == [str(ws.config_path), str(ws.key_path)]
    assert ws.exists()
    for path, mode in ((ws.home, 0o700), (ws.runs_dir, 0o700), (ws.config_path, 0o600),
                       (ws.key_path, 0o600)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    assert ws.key_path.stat().st_size == KEY_LENGTH == 32
    assert ws.record_key() == ws.key_path.read_bytes()
    assert registered_workspaces() == [str(ws.home)]
    assert not [p for p in ws.home.iterdir() if p.name.endswith(".tmp")]


def test_init_never_overwrites(state: Path, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "h")
    ws.init()
    ws.config_path.write_text("# mine\n")
    key = ws.key_path.read_bytes()
    assert ws.init() == []
    assert ws.config_path.read_text() == "# mine\n"
    assert ws.key_path.read_bytes() == key
    # Only what is missing is made again.
    ws.config_path.unlink()
    assert ws.init() == [str(ws.config_path)]
    assert ws.key_path.read_bytes() == key


def test_init_does_not_write_through_a_link_at_the_key(state: Path, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "h")
    ws.home.mkdir()
    target = tmp_path / "target"
    ws.key_path.symlink_to(target)  # dangling: following it would create target
    created = ws.init()
    assert str(ws.key_path) not in created
    assert not target.exists()
    assert ws.key_path.is_symlink()


def test_two_workspaces_get_different_keys(state: Path, tmp_path: Path) -> None:
    a, b = Workspace(tmp_path / "a"), Workspace(tmp_path / "b")
    a.init()
    b.init()
    assert a.record_key() != b.record_key()
    assert registered_workspaces() == [str(a.home), str(b.home)]


@pytest.mark.parametrize(("damage", "needle"), [
    ("missing", "does not exist"),
    ("group-readable", "record.key"),
    ("short", "record.key"),
])
def test_record_key_refused_unless_in_custody(state: Path, tmp_path: Path, damage: str,
                                              needle: str) -> None:
    ws = Workspace(tmp_path / "h")
    ws.init()
    if damage == "missing":
        ws.key_path.unlink()
    elif damage == "group-readable":
        os.chmod(ws.key_path, 0o640)
    else:
        ws.key_path.write_bytes(b"short")
    with pytest.raises(Refusal) as info:
        ws.record_key()
    assert info.value.cls == "custody-key-unsafe"
    assert needle in info.value.message
    fix = info.value.remediation
    assert ("saphan init" in fix) if damage == "missing" else ("chmod 0600" in fix)
