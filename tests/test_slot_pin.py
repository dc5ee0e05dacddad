"""A slot may pin the SHA-256 of its agent binary; a mismatch is refused
(``digest-mismatch``) before launch. Through the real CLI, on both stores."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from conftest import Saphan
from saphan.store import open_store
from saphan.store.base import Store
from saphan.store.migrations import LATEST
from saphan.store.rows import Machine, Slot

OTHER = "0" * 64


def _sh_digest() -> tuple[str, str]:
    sh = shutil.which("sh")
    assert sh is not None
    return sh, hashlib.sha256(Path(sh).read_bytes()).hexdigest()


def _slot(s: Saphan, name: str = "s1") -> dict[str, object]:
    got = s.ok("slot", "show", "here", name, "--json").json()
    assert isinstance(got, dict)
    return got


def _run(s: Saphan, wd: Path, marker: Path, slot: str = "s1") -> object:
    return s("run", "--machine", "here", "--slot", slot, "--workdir", str(wd), "--",
             "sh", "-c", f"touch {marker}")


@pytest.mark.usefixtures("bwrap_available")
def test_matching_pin_runs_mismatch_refused_unpin_runs(
    saphan: Saphan, database_url: str, tmp_path: Path
) -> None:
    sh, digest = _sh_digest()
    saphan.ok("machine", "add", "here", "--local")
    r = saphan.ok("slot", "add", "here", "s1", "--tool", "command", "--pin-sha256", digest)
    assert digest in r.out
    assert _slot(saphan)["agent_sha256"] == digest
    listed = saphan.ok("slot", "list", "--json").json()
    assert isinstance(listed, list) and listed[0]["agent_sha256"] == digest
    marker = tmp_path / "ran"

    # Pin matches: the command runs, and the record carries the pin.
    r = _run(saphan, tmp_path, marker)
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    assert marker.exists()
    rec = saphan.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["agent"]["sha256"] == digest and rec["agent"]["pinned_sha256"] == digest
    marker.unlink()

    # Pin differs: refused before launch, recorded, the seat released.
    saphan.ok("slot", "set", "here", "s1", "--pin-sha256", OTHER)
    assert _slot(saphan)["agent_sha256"] == OTHER
    r = _run(saphan, tmp_path, marker)
    assert r.code == 3, r.err  # type: ignore[attr-defined]
    err = r.err  # type: ignore[attr-defined]
    assert "refused [digest-mismatch]" in err
    assert "slot s1" in err and sh in err and digest in err and OTHER in err
    assert f"saphan slot set here s1 --pin-sha256 {digest}" in err
    assert not marker.exists()
    rec = saphan.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["refusal"]["class"] == "digest-mismatch"
    assert rec["outcome"] == "refused" and rec["finished_at"] is not None
    store = open_store(database_url, saphan.home / "store.db")
    try:
        row = store.get_run(rec["id"])
        assert row is not None
        assert row.refusal_class == "digest-mismatch" and row.state == "refused"
        assert store.live_runs("here", "s1") == []
    finally:
        store.close()
    assert _slot(saphan)["holders"] == []

    # Unpinned: runs again (and the seat is free to take).
    r = saphan.ok("slot", "set", "here", "s1", "--unpin")
    assert "pins no agent binary" in r.out
    assert _slot(saphan)["agent_sha256"] is None
    r = _run(saphan, tmp_path, marker)
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    assert marker.exists()
    rec = saphan.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and "pinned_sha256" not in rec["agent"]


@pytest.mark.parametrize("bad", [
    "abc",
    "A" * 64,  # uppercase
    "0" * 63,
    "0" * 65,
    "g" * 64,
    " " + "0" * 64,
])
def test_bad_pin_exit_2_nothing_written(saphan_sqlite: Saphan, bad: str) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    r = s("slot", "add", "here", "s1", "--tool", "command", "--pin-sha256", bad)
    assert r.code == 2, r.err
    assert r.err.startswith("error: --pin-sha256") and r.err.count("\n") == 1
    assert s.ok("slot", "list", "--json").json() == []
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    r = s("slot", "set", "here", "s1", "--pin-sha256", bad, "--max-sessions", "3")
    assert r.code == 2, r.err
    assert r.err.count("\n") == 1
    got = _slot(s)
    assert got["agent_sha256"] is None and got["max_sessions"] is None  # nothing written


def test_slot_set_options(saphan: Saphan) -> None:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command")
    r = saphan("slot", "set", "here", "s1")
    assert r.code == 2 and "nothing to change" in r.err and r.err.count("\n") == 1
    r = saphan("slot", "set", "here", "s1", "--pin-sha256", OTHER, "--unpin")
    assert r.code == 2 and r.err.count("\n") == 1
    assert _slot(saphan)["agent_sha256"] is None
    saphan.ok("slot", "set", "here", "s1", "--max-sessions", "2", "--pin-sha256", OTHER)
    got = _slot(saphan)
    assert got["max_sessions"] == 2 and got["agent_sha256"] == OTHER
    saphan.ok("slot", "set", "here", "s1", "--max-sessions", "3")
    got = _slot(saphan)
    assert got["max_sessions"] == 3 and got["agent_sha256"] == OTHER  # the pin stays
    assert "agent pin: sha256 " + OTHER in saphan.ok("slot", "show", "here", "s1").out
    r = saphan("slot", "set", "here", "nope", "--unpin")
    assert r.code == 2 and "no slot 'nope'" in r.err


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_agent_lane_mismatch_refused_before_launch(saphan_sqlite: Saphan, claude_bin: str,
                                                   tmp_path: Path) -> None:
    """The Claude lane checks the pin too: the binary is digested, never started.
    (The slot's endpoint is a scripted server: the auth pre-flight before the
    seat accepts the key there, and no request leaves this host.)"""
    from tools.model_servers import MessagesServer

    s = saphan_sqlite
    home = tmp_path / "home"
    home.mkdir()
    env = s.env(HOME=str(home), SAPHAN_CLAUDE_BIN=claude_bin, ANTHROPIC_API_KEY="sk-ant-test")
    wd = tmp_path / "wd"
    wd.mkdir()
    with MessagesServer([("text", "never")]) as srv:
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "cl", "--tool", "claude", "--pin-sha256", OTHER,
             "--endpoint", srv.base_url)
        r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd), "--prompt",
              "hi", env=env, timeout=120)
    assert srv.requests == []  # the pre-flight's GET only: nothing was posted
    assert r.code == 3, r.err
    real = os.path.realpath(claude_bin)
    assert "refused [digest-mismatch]" in r.err and real in r.err
    rec = s.ok("runs", "show", "last", "--json", env=env).json()
    assert isinstance(rec, dict)
    assert rec["refusal"]["class"] == "digest-mismatch"
    assert "stdout" not in (rec.get("output") or {})  # nothing was launched
    assert not (s.home / "runs" / rec["id"] / "stdout.log").exists()
    assert _slot(s, "cl")["holders"] == []


def test_migration_2_applies_on_a_v1_database(database_url: str, tmp_path: Path) -> None:
    if database_url.startswith("sqlite"):
        from saphan.store.sqlite import SQLiteConnector

        db_path = Path(database_url[len("sqlite:///") - 1:])
        old = Store(SQLiteConnector(db_path))
    else:
        from saphan.store.postgres import PostgresConnector

        old = Store(PostgresConnector(database_url))
    assert old.migrate(upto=1) == [1]
    assert old.applied_versions() == [1]
    old.db.execute("INSERT INTO machines (name, transport, created_at) VALUES (?, ?, ?)",
                   ("m", "local", "2026-01-01T00:00:00Z"))
    old.db.execute("INSERT INTO slots (machine, name, tool, max_sessions, created_at) "
                   "VALUES (?, ?, ?, ?, ?)", ("m", "s", "command", 2, "2026-01-01T00:00:00Z"))
    old.close()

    store = open_store(database_url, tmp_path / "unused.db")
    try:
        assert store.applied_versions() == list(range(1, LATEST + 1))
        assert store.get_slot("m", "s") == Slot("m", "s", "command", 2, "2026-01-01T00:00:00Z",
                                                None)
        assert store.get_machine("m") == Machine("m", "local", created_at="2026-01-01T00:00:00Z")
        assert store.set_agent_pin("m", "s", OTHER)
        got = store.get_slot("m", "s")
        assert got is not None and got.agent_sha256 == OTHER
    finally:
        store.close()
