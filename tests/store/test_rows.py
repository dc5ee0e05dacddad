"""Typed rows the store returns (store/rows.py): built from a row's tuple in
column order, and what the CLI shows of them."""

from __future__ import annotations

from saphan.store.rows import Fact, Machine, RunRow, Slot

RUN = ("01RUN", "m", "s", 2, "running", "2030-01-01T00:00:00Z", None, "host", 42, 99, "boot",
       "codex", "/w", None, None, None, None)


def test_a_local_machine_is_addressed_as_local() -> None:
    m = Machine.from_row(("m", "local", None, None, None, None, None, "t", 0, None))
    assert m == Machine("m", "local", created_at="t")
    assert m.address() == "local"
    assert m.as_dict() == {"name": "m", "transport": "local", "address": "local",
                           "identity_file": None, "host_key": None, "created_at": "t",
                           "ssh_agent": False, "proxy_jump": None}


def test_an_ssh_machine_is_addressed_user_at_host_port() -> None:
    m = Machine.from_row(("far", "ssh", "agent", "10.0.0.5", 2222, "/k", "ssh-ed25519 AAAA", "t", 1,
                          None))
    assert m.ssh_agent is True
    assert m.address() == "agent@10.0.0.5:2222"
    assert m.as_dict()["address"] == "agent@10.0.0.5:2222"
    assert (m.as_dict()["identity_file"], m.as_dict()["host_key"]) == ("/k", "ssh-ed25519 AAAA")


def test_a_slots_capacity_is_its_max_sessions_or_one() -> None:
    assert Slot("m", "s", "command", None).capacity == 1
    assert Slot("m", "s", "command", 4).capacity == 4


def test_a_slot_shows_under_the_cli_names() -> None:
    s = Slot.from_row(("m", "s", "claude", 3, "t", "ab" * 32, "http://e", "mo", 60, 5,
                       "/opt/claude"))
    assert s.as_dict() == {"machine": "m", "slot": "s", "tool": "claude", "max_sessions": 3,
                           "agent_sha256": "ab" * 32, "endpoint": "http://e", "model": "mo",
                           "max_seconds": 60, "max_turns": 5, "agent_path": "/opt/claude",
                           "created_at": "t"}
    assert Slot("m", "s", "claude", None).agent_sha256 is None


def test_a_run_row_is_live_until_finished_and_reads_its_record() -> None:
    r = RunRow.from_row(RUN)
    assert (r.id, r.session_ordinal, r.holder_pid, r.workdir) == ("01RUN", 2, 42, "/w")
    assert r.live and r.record() == {}
    done = r._replace(finished_at="2030-01-01T00:01:00Z", record_json='{"outcome": "exited"}')
    assert not done.live
    assert done.record() == {"outcome": "exited"}
    assert r._replace(record_json="").record() == {}


def test_a_fact_is_its_five_columns() -> None:
    f = Fact.from_row(("m", "landlock", '{"level":7}', "t", "sig"))
    assert (f.machine, f.kind, f.value_json, f.measured_at, f.signature) == (
        "m", "landlock", '{"level":7}', "t", "sig")
