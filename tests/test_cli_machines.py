"""Machines and slots through the real CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from conftest import Saphan


def test_machine_lifecycle(saphan: Saphan, tmp_path: Path) -> None:
    saphan.ok("machine", "add", "m1", "--local")
    saphan.ok("machine", "add", "m2", "--local")
    key = tmp_path / "id_ed25519"
    key.write_text("not read: the host key is fetched first\n")
    # An --ssh machine is added only once its host key could be fetched and
    # pinned (tests/integration/sshd covers real hosts); a closed port adds nothing.
    r = saphan("machine", "add", "far", "--ssh", "agent@127.0.0.1:1", "--identity", str(key))
    assert r.code == 1 and "machine far (127.0.0.1:1) is unreachable" in r.err
    listed = saphan.ok("machine", "list", "--json").json()
    assert [m["name"] for m in listed] == ["m1", "m2"]
    assert listed[0]["address"] == "local"
    table = saphan.ok("machine", "list").out
    assert "m1" in table and "local" in table
    shown = saphan.ok("machine", "show", "m1", "--json").json()
    assert shown["transport"] == "local" and shown["slots"] == [] and shown["facts"] == {}
    saphan.ok("machine", "remove", "m2")
    assert [m["name"] for m in saphan.ok("machine", "list", "--json").json()] == ["m1"]


def test_machine_bad_input_exit_2_nothing_written(saphan: Saphan) -> None:
    saphan.ok("machine", "add", "m1", "--local")
    cases = [
        (["machine", "add", "m1", "--local"], "already exists"),
        (["machine", "add", "m2"], "exactly one of --local or --ssh"),
        (["machine", "add", "m2", "--ssh", "nohost"], "USER@HOST[:PORT]"),
        (["machine", "add", "m2", "--ssh", "a@b"], "--identity"),
        (["machine", "add", "bad name", "--local"], "not allowed"),
        (["machine", "show", "ghost"], "no machine named 'ghost'"),
        (["machine", "remove", "ghost"], "no machine named 'ghost'"),
    ]
    for args, needle in cases:
        r = saphan(*args)
        assert r.code == 2, (args, r.err)
        assert needle in r.err, (args, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert [m["name"] for m in saphan.ok("machine", "list", "--json").json()] == ["m1"]


def test_slots(saphan: Saphan) -> None:
    saphan.ok("machine", "add", "m1", "--local")
    saphan.ok("slot", "add", "m1", "s1", "--tool", "command")
    saphan.ok("slot", "add", "m1", "s2", "--tool", "codex", "--max-sessions", "3")
    slots = saphan.ok("slot", "list", "--json").json()
    assert [(s["slot"], s["tool"], s["max_sessions"]) for s in slots] == [
        ("s1", "command", None), ("s2", "codex", 3)]
    assert saphan.ok("slot", "list").out.splitlines()[1].split()[3] == "1"
    for args, needle in [
        (["slot", "add", "ghost", "s1", "--tool", "command"], "no machine named 'ghost'"),
        (["slot", "add", "m1", "s1", "--tool", "command"], "already exists"),
        (["slot", "add", "m1", "s3", "--tool", "command", "--max-sessions", "0"], "below 1"),
    ]:
        r = saphan(*args)
        assert r.code == 2, (args, r.err)
        assert needle in r.err
    r = saphan("slot", "add", "m1", "s4", "--tool", "bogus")
    assert r.code == 2
    assert len(saphan.ok("slot", "list", "--json").json()) == 2
    saphan.ok("slot", "set", "m1", "s1", "--max-sessions", "4")
    shown = saphan.ok("slot", "show", "m1", "s1", "--json").json()
    assert shown["capacity"] == 4 and shown["holders"] == []


def test_db_migrate_is_idempotent(saphan: Saphan) -> None:
    r = saphan.ok("db", "migrate")
    assert "nothing to apply" in r.out
