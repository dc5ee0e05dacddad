"""serve/reader.py: what the pages show, read through the Engine (on SQLite
and PostgreSQL), without writing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from saphan.engine import Engine
from saphan.fleet import facts
from saphan.ids import new_run_id
from saphan.liveness import current_holder
from saphan.records import sign_fact, signed_record_json
from saphan.serve import reader
from saphan.serve.params import RunFilters, cursor
from saphan.store.rows import Fact
from saphan.timefmt import now_iso


@pytest.fixture
def engine(engine_ctx: Any) -> Iterator[Engine]:
    e = Engine(engine_ctx.workspace.home, reconcile=False)
    e.add_machine("here", local=True)
    e.add_slot("here", "s1", tool="command", max_sessions=2)
    try:
        yield e
    finally:
        e.close()


def _refused(e: Engine, tool: str = "command") -> str:
    rid = new_run_id()
    record = {"id": rid, "machine": "here", "slot": "s1", "tool": tool, "session_ordinal": None,
              "state": "refused", "outcome": "refused", "exit_code": None,
              "refusal": {"class": "seat-full", "message": "m", "remediation": "r"}}
    at = now_iso()
    record.update(started_at=at, finished_at=at)
    e.store.insert_refused_run(run_id=rid, machine="here", slot="s1", tool=tool, workdir="/w",
                               holder=current_holder().as_tuple(), refusal_class="seat-full",
                               record_json=signed_record_json(e.ctx.record_key(), record), at=at)
    return rid


def test_fleet_shows_every_ordinal_and_its_holder(engine: Engine) -> None:
    rid = new_run_id()
    held = engine.store.reserve(run_id=rid, machine="here", slot="s1", capacity=2,
                                tool="command", workdir="/w", holder=current_holder().as_tuple())
    assert held == 0
    got = reader.fleet(engine)
    (m,) = got["machines"]
    assert m["name"] == "here" and m["address"] == "local" and got["live"] == 1
    (s,) = m["slots"]
    first, second = s["ordinals"]
    assert first["held"] and first["run"] == rid and first["pid"] == os.getpid()
    assert first["liveness"] == "alive"
    assert not second["held"]
    assert engine.store.get_run(rid).live  # type: ignore[union-attr]  # read, not reconciled


def test_fact_statuses_are_shown_never_hidden(engine: Engine) -> None:
    store, key, home = engine.store, engine.ctx.record_key(), engine.workspace.home
    m = engine.machine("here")
    facts.write(store, key, home, m, "landlock", {"level": 7, "floor": 3,
                                                  "launcher_sha256": "ab" * 32}, now_iso())
    good = facts.write(store, key, home, m, "runtime", {"name": "podman"}, now_iso())
    store.put_fact(Fact(good.machine, good.kind, good.value_json.replace("podman", "evil"),
                        good.measured_at, good.signature))  # edited in the store
    other = sign_fact(b"k" * 32, "here", "vm_cpus", {"value": 64}, now_iso())
    store.put_fact(other)
    shown = {f["kind"]: f for f in reader.fleet(engine)["machines"][0]["facts"]}
    assert shown["landlock"]["status"] == "valid"
    assert "level=7" in shown["landlock"]["summary"] and shown["landlock"]["age"].endswith("ago")
    assert shown["runtime"]["status"] == "invalid" and "evil" in shown["runtime"]["summary"]
    assert "does not verify" in shown["runtime"]["message"] and shown["runtime"]["remediation"]
    assert shown["vm_cpus"]["status"] == "foreign" and "not held here" in shown["vm_cpus"]["message"]


def test_runs_are_paged_by_cursor(engine: Engine) -> None:
    made = [_refused(engine, tool="claude" if i % 2 else "command") for i in range(5)]
    first = reader.runs(engine, RunFilters(limit=2))
    assert [r["id"] for r in first["rows"]] == made[::-1][:2]
    assert first["rows"][0]["refusal_class"] == "seat-full"
    assert first["rows"][0]["signature"] == "valid" and not first["rows"][0]["flagged"]
    seen = [r["id"] for r in first["rows"]]
    nxt = first["next"]
    while nxt:
        page = reader.runs(engine, RunFilters(limit=2, before=cursor(nxt)))
        seen += [r["id"] for r in page["rows"]]
        nxt = page["next"]
    assert seen == made[::-1]
    claude = reader.runs(engine, RunFilters(tool="claude"))
    assert [r["id"] for r in claude["rows"]] == [made[3], made[1]] and claude["next"] is None


def test_one_run_and_a_missing_one(engine: Engine) -> None:
    rid = _refused(engine)
    got = reader.run(engine, rid)
    assert got["refusal"]["class"] == "seat-full" and got["diff"] is None
    assert any(line.startswith("fix:") for line in got["lines"])
    with pytest.raises(reader.NotFound):
        reader.run(engine, new_run_id())
    with pytest.raises(reader.NotFound):
        reader.output(engine, new_run_id(), "stdout", None)
    with pytest.raises(reader.NotFound):
        reader.batch(engine, new_run_id())


def test_output_window_is_whole_characters_escaped(engine: Engine) -> None:
    rid = _refused(engine)
    run_dir = engine.workspace.run_dir(rid)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "é" * 40_000 + "\x1b[31m end\n"  # 80,000+ bytes: more than one window
    (run_dir / "stdout.log").write_bytes(text.encode())
    tail = reader.output(engine, rid, "stdout", None)
    assert tail["end"] == tail["size"] and tail["text"].endswith("\\x1b[31m end\n")
    assert not tail["text"].startswith("\ufffd")  # began at a character
    parts, at = [], 0
    while True:
        w = reader.output(engine, rid, "stdout", at)
        if not w["text"]:
            break
        parts.append(w["text"])
        at = w["end"]
    assert "".join(parts) == "é" * 40_000 + "\\x1b[31m end\n"  # no character cut in two
    assert json.dumps(parts)  # JSON-safe text


def test_a_planted_link_is_not_followed(engine: Engine, tmp_path: Any) -> None:
    rid = _refused(engine)
    run_dir = engine.workspace.run_dir(rid)
    run_dir.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret"
    secret.write_text("SECRET")
    os.symlink(secret, run_dir / "stderr.log")
    got = reader.output(engine, rid, "stderr", None)
    assert got["text"] == "" and got["size"] == 0


def test_the_fleet_page_follows_the_live_runs_not_the_capacity(engine: Engine) -> None:
    engine.add_slot("here", "wide", tool="command", max_sessions=1_000_000)
    rid = new_run_id()
    assert engine.store.reserve(run_id=rid, machine="here", slot="wide", capacity=1_000_000,
                                tool="command", workdir="/w",
                                holder=current_holder().as_tuple()) == 0
    wide = next(s for s in reader.fleet(engine)["machines"][0]["slots"] if s["name"] == "wide")
    held, free = wide["ordinals"]
    assert (held["ordinal"], held["held"], free["ordinal"], free["last"], free["held"]) == (
        0, True, 1, 999_999, False)
    # a row only: no live record signed here backs the seat (a forged row looks the same)
    assert held["backed"] is False


def test_ordinals_a_row_claims_past_the_capacity_are_one_row_each() -> None:
    from saphan.records import RunRecord

    far = RunRecord({"id": "X", "session_ordinal": 4_000_000, "live": {}})
    got = reader._ordinals(2, [far])
    assert [(o["ordinal"], o["last"], o["held"], o["over_capacity"]) for o in got] == [
        (0, 1, False, False), (4_000_000, 4_000_000, True, True)]


def _forge(e: Engine, record_json: str) -> str:
    rid = _refused(e)
    e.store.db.execute("UPDATE runs SET record_json = ? WHERE id = ?", (record_json, rid))
    return rid


def test_a_forged_row_is_flagged_never_fails_the_page(engine: Engine) -> None:
    honest = _refused(engine)
    nested = _forge(engine, "[" * 200_000)
    shaped = json.dumps({"id": "x", "usage": {"cost_usd": "lots", "tokens": {"input": "many"}},
                         "record_signature": "00"})
    costly = _forge(engine, shaped)
    rows = {r["id"]: r for r in reader.runs(engine, RunFilters())["rows"]}
    assert rows[honest]["signature"] == "valid"
    assert rows[nested]["flagged"] and rows[nested]["signature"] == "invalid"
    assert rows[costly]["flagged"] and rows[costly]["cost"] == "0 tok -"
    for rid in (nested, costly):
        page = reader.run(engine, rid)
        assert page["row"]["flagged"] and page["lines"]
    assert reader.run(engine, nested)["cut"] is False


def test_a_fact_that_cannot_be_read_is_one_flagged_row(engine: Engine) -> None:
    engine.store.put_fact(Fact("here", "deep", "[" * 100_000, now_iso(),
                               "ffffffffffffffff:00"))
    (fact,) = reader.fleet(engine)["machines"][0]["facts"]
    assert fact["kind"] == "deep" and fact["status"] in ("foreign", "invalid")


def test_a_finished_log_ending_inside_a_character_is_read_to_its_end(engine: Engine) -> None:
    rid = _refused(engine)
    run_dir = engine.workspace.run_dir(rid)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.log").write_bytes(b"ok \xe2\x82")  # the run ended mid-character
    got = reader.output(engine, rid, "stdout", 0)
    assert got["end"] == got["size"] == 5 and got["text"].startswith("ok ")


def test_live_rows_on_no_listed_seat_are_listed_apart(engine: Engine) -> None:
    rid = new_run_id()
    engine.store.reserve(run_id=rid, machine="ghost", slot="x", capacity=1, tool="command",
                         workdir="/w", holder=current_holder().as_tuple())
    got = reader.fleet(engine)
    assert got["live"] == 1 and [r["run"] for r in got["stray"]] == [rid]
    assert all(not o["held"] for s in got["machines"][0]["slots"] for o in s["ordinals"])


def test_text_in_number_columns_is_flagged_not_a_failure(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite keeps whatever a column is given (PostgreSQL keeps its type)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg")))
    engine = Engine(tmp_path_factory.mktemp("lite") / "saphan", reconcile=False)
    engine.init()
    engine.add_machine("here", local=True)
    engine.add_slot("here", "s1", tool="command", max_sessions=2)
    rid = new_run_id()
    engine.store.reserve(run_id=rid, machine="here", slot="s1", capacity=2, tool="command",
                         workdir="/w", holder=current_holder().as_tuple())
    engine.store.db.execute("UPDATE runs SET session_ordinal = 'x', holder_pid = 'y', "
                            "holder_host = CAST('h' AS BLOB) WHERE id = ?", (rid,))
    assert [r["run"] for r in reader.fleet(engine)["stray"]] == [rid]
    (shown,) = reader.runs(engine, RunFilters())["rows"]
    assert shown["id"] == rid and shown["live"] and not shown["backed"]
    # BLOB start times (SQLite sorts them after all text) and invalid UTF-8 in a TEXT
    # column: listed, and the paging stops at them with a note, never a wrong page
    honest = [_refused(engine) for _ in range(3)]
    blobs = [_refused(engine) for _ in range(3)]
    for b in blobs:
        engine.store.db.execute("UPDATE runs SET started_at = x'30' WHERE id = ?", (b,))
    engine.store.db.execute("UPDATE runs SET workdir = CAST(x'2f77ff' AS TEXT) WHERE id = ?",
                            (honest[0],))
    page = reader.runs(engine, RunFilters(limit=2))
    assert {r["id"] for r in page["rows"]} <= set(blobs)
    assert page["next"] is None and "paging stops" in page["blocked"]
    every = reader.runs(engine, RunFilters(limit=25))["rows"]
    assert {*honest, *blobs, rid} == {r["id"] for r in every}
    engine.close()


def test_a_batch_task_the_key_did_not_sign_is_flagged(engine: Engine, tmp_path: Any) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"id": "a", "command": ["true"]}\n{"id": "b", "command": ["true"]}\n')
    b = engine.batches.create(str(path))
    engine.store.db.execute("UPDATE batch_tasks SET signature = '00' WHERE batch = ? AND seq = 1",
                            (b.id,))
    got = reader.batch(engine, b.id)
    assert [t["task_signature"] for t in got["tasks"]] == ["valid", "invalid"]
    assert got["done_verified"] == 0
    (listed,) = reader.batches(engine)
    assert listed["id"] == b.id and listed["unverified"] == 1


def test_paging_stops_with_a_note_at_a_row_no_cursor_can_carry(engine: Engine) -> None:
    made = [_refused(engine) for _ in range(3)]
    engine.store.db.execute("UPDATE runs SET id = 'forged/../x' WHERE id = ?", (made[1],))
    page = reader.runs(engine, RunFilters(limit=2))
    assert [r["id"] for r in page["rows"]] == [made[2], "forged/../x"]
    assert page["next"] is None and "paging stops at run" in page["blocked"]
