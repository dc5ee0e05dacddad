"""Run records are signed with the workspace record key and verified on read.

Every writer of a run's record_json signs it (refused, finished, finalised by
the operator, finalised because its holder died); `runs show`, `runs list` and
the API verify it and hold the row's columns against the signed values. A
record that does not verify is FLAGGED, never hidden: `runs show` still prints
it and exits 3. The store is edited here directly (sqlite3 / psycopg), as
someone with write access to it could.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import saphan as saphan_api
from conftest import Saphan
from saphan.capacity import reserve_seat
from saphan.ids import new_run_id
from saphan.liveness import Holder, current_holder
from saphan.records import _record_mac
from saphan.store import open_store

HEADLINE = ("record-signature-invalid: this record does not verify against the workspace key "
            "(edited, or written under another key)")


# -- the store, edited from outside saphan ----------------------------------------

def _sql(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            rows = conn.execute(sql, params).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
        return list(cur.fetchall()) if cur.description else []


def _record_json(url: str, run_id: str) -> dict[str, Any]:
    got = _sql(url, "SELECT record_json FROM runs WHERE id = ?", (run_id,))
    record: dict[str, Any] = json.loads(got[0][0])
    return record


def _put_record_json(url: str, run_id: str, record: dict[str, Any]) -> None:
    _sql(url, "UPDATE runs SET record_json = ? WHERE id = ?",
         (json.dumps(record, sort_keys=True), run_id))


def _show(s: Saphan, run_id: str) -> tuple[int, dict[str, Any]]:
    r = s("runs", "show", run_id, "--json")
    shown = json.loads(r.out)
    assert isinstance(shown, dict)
    return r.code, shown


def _setup(s: Saphan, max_sessions: str = "2") -> None:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", max_sessions)


def _run(s: Saphan, wd: Path, *argv: str) -> str:
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--json", "--",
          *argv)
    assert r.code in (0, 1), r.err
    record = json.loads(r.out)
    return str(record["id"])


def _assert_flagged(s: Saphan, run_id: str, status: str) -> dict[str, Any]:
    """`runs show` (text and JSON) and `runs list` flag the record; it is still shown."""
    r = s("runs", "show", run_id)
    assert r.code == 3, (r.out, r.err)
    first = r.out.splitlines()[0]
    assert first.startswith("record-signature-invalid: ")
    if status == "invalid":
        assert first == HEADLINE
    else:
        assert "signature missing" in first
    assert f"run:         {run_id}" in r.out  # the record is still printed
    assert f"signature:   {status.upper()}" in r.out
    code, shown = _show(s, run_id)
    assert code == 3
    assert shown["id"] == run_id
    assert shown["signature"]["status"] == status
    assert shown["signature"]["class"] == "record-signature-invalid"
    assert "re-sign" in shown["signature"]["remediation"]
    listed = s.ok("runs", "list")
    row = next(line for line in listed.out.splitlines() if line.startswith(run_id))
    assert row.rstrip().endswith(f"!{status}")
    assert run_id in listed.err and "record-signature-invalid" in listed.err
    as_json = s.ok("runs", "list", "--json").json()
    assert isinstance(as_json, list)
    entry = next(x for x in as_json if x["id"] == run_id)
    assert entry["signature"]["status"] == status
    return shown


# -- signed on every write, verified on every read ---------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_a_finished_run_is_signed_and_verifies(saphan: Saphan, database_url: str,
                                               tmp_path: Path) -> None:
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "sh", "-c", "echo hi > out.txt")
    code, shown = _show(saphan, run_id)
    assert code == 0
    assert shown["signature"] == {"status": "valid"}
    assert len(shown["record_signature"]) == 64
    text = saphan.ok("runs", "show", run_id)
    assert "record-signature-invalid" not in text.out
    assert "signature:   valid" in text.out
    listed = saphan.ok("runs", "list")
    assert listed.out.splitlines()[1].rstrip().endswith("valid")
    assert listed.err == ""
    stored = _record_json(database_url, run_id)
    assert stored["record_signature"] == shown["record_signature"]
    assert (stored["state"], stored["outcome"], stored["exit_code"]) == ("ended", "exited", 0)
    # The record file carries the same signature as the store's copy.
    on_disk = json.loads((saphan.home / "runs" / run_id / "record.json").read_text())
    assert on_disk["record_signature"] == stored["record_signature"]


@pytest.mark.usefixtures("bwrap_available")
def test_an_edited_record_is_flagged_and_still_shown(saphan: Saphan, database_url: str,
                                                     tmp_path: Path) -> None:
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "true")
    record = _record_json(database_url, run_id)
    record["writable"] = ["/"]  # widen what the record claims was writable
    _put_record_json(database_url, run_id, record)
    shown = _assert_flagged(saphan, run_id, "invalid")
    assert shown["writable"] == ["/"]  # shown as found, flagged
    assert "mismatched" not in shown["signature"]


@pytest.mark.usefixtures("bwrap_available")
def test_an_edited_outcome_in_the_record_is_flagged(saphan: Saphan, database_url: str,
                                                    tmp_path: Path) -> None:
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "false")
    record = _record_json(database_url, run_id)
    record["outcome"], record["exit_code"] = "exited", 0
    _sql(database_url, "UPDATE runs SET outcome = 'exited', exit_code = 0 WHERE id = ?",
         (run_id,))
    _put_record_json(database_url, run_id, record)
    _assert_flagged(saphan, run_id, "invalid")


@pytest.mark.usefixtures("bwrap_available")
def test_an_edited_column_is_flagged(saphan: Saphan, database_url: str, tmp_path: Path) -> None:
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "false")
    _sql(database_url, "UPDATE runs SET outcome = 'exited', exit_code = 0 WHERE id = ?",
         (run_id,))
    shown = _assert_flagged(saphan, run_id, "invalid")
    assert shown["outcome"] == "exited"  # the row, as found
    mismatched = {m["column"]: (m["row"], m["signed"]) for m in shown["signature"]["mismatched"]}
    assert mismatched == {"outcome": ("exited", "failed"), "exit_code": (0, 1)}
    assert "mismatch:  outcome: row 'exited', signed 'failed'" in saphan("runs", "show",
                                                                          run_id).out


@pytest.mark.usefixtures("bwrap_available")
def test_a_record_copied_from_another_run_is_flagged(saphan: Saphan, database_url: str,
                                                     tmp_path: Path) -> None:
    _setup(saphan)
    first = _run(saphan, tmp_path, "true")
    second = _run(saphan, tmp_path, "false")
    _sql(database_url,
         "UPDATE runs SET record_json = (SELECT record_json FROM runs WHERE id = ?), "
         "outcome = 'exited', exit_code = 0, finished_at = (SELECT finished_at FROM runs "
         "WHERE id = ?), session_ordinal = (SELECT session_ordinal FROM runs WHERE id = ?) "
         "WHERE id = ?", (first, first, first, second))
    shown = _assert_flagged(saphan, second, "invalid")
    assert [m["column"] for m in shown["signature"]["mismatched"]] == ["id"]


@pytest.mark.usefixtures("bwrap_available")
def test_an_unsigned_record_shows_as_missing(saphan: Saphan, database_url: str,
                                             tmp_path: Path) -> None:
    """What an older build wrote, or a record whose signature was stripped."""
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "true")
    record = _record_json(database_url, run_id)
    del record["record_signature"]
    _put_record_json(database_url, run_id, record)
    _assert_flagged(saphan, run_id, "missing")


def test_a_record_signed_under_another_key_is_flagged(saphan: Saphan, database_url: str,
                                                      tmp_path: Path) -> None:
    from saphan.records import signed_record_json

    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir",
               str(tmp_path / "missing"), "--", "true")
    assert r.code == 3
    run_id = r.err.strip().splitlines()[-1].removeprefix("run: ")
    record = _record_json(database_url, run_id)
    # a record without a key id (as written before key ids) under another key: invalid
    old = json.loads(signed_record_json(b"\x01" * 32, record))
    del old["record_key_id"]
    old["record_signature"] = _record_mac(b"\x01" * 32, old)
    _sql(database_url, "UPDATE runs SET record_json = ? WHERE id = ?",
         (json.dumps(old), run_id))
    _assert_flagged(saphan, run_id, "invalid")


def test_a_record_naming_another_key_is_foreign_not_invalid(saphan: Saphan, database_url: str,
                                                            tmp_path: Path) -> None:
    from saphan.records import key_id, signed_record_json

    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir",
               str(tmp_path / "missing"), "--", "true")
    run_id = r.err.strip().splitlines()[-1].removeprefix("run: ")
    forged = signed_record_json(b"\x01" * 32, _record_json(database_url, run_id))
    _sql(database_url, "UPDATE runs SET record_json = ? WHERE id = ?", (forged, run_id))
    other = key_id(b"\x01" * 32)
    shown = saphan("runs", "show", run_id)
    assert shown.code == 3  # nothing here vouches for it
    assert shown.out.splitlines()[0].startswith(f"signed by key {other}, not held here")
    assert "record-signature-invalid" not in shown.out and "INVALID" not in shown.out
    assert f"signature:   FOREIGN: signed by key {other}, not held here" in shown.out
    code, got = _show(saphan, run_id)
    assert code == 3 and got["signature"]["status"] == "foreign"
    assert got["signature"]["key_id"] == other and "class" not in got["signature"]
    listed = saphan.ok("runs", "list")
    assert f"?foreign:{other}" in listed.out and "!invalid" not in listed.out
    assert f"signed by key {other}, not held here" in listed.err


def test_a_refused_run_is_signed(saphan: Saphan, database_url: str, tmp_path: Path) -> None:
    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir",
               str(tmp_path / "missing"), "--", "true")
    assert r.code == 3 and "refused [workdir-missing]" in r.err
    code, shown = _show(saphan, "last")
    assert code == 0
    assert shown["signature"] == {"status": "valid"}
    assert shown["refusal"]["class"] == "workdir-missing"
    stored = _record_json(database_url, shown["id"])
    assert (stored["state"], stored["outcome"], stored["session_ordinal"]) == (
        "refused", "refused", None)
    assert stored["finished_at"] == shown["finished_at"]  # the row's, as signed


def test_operator_finalize_is_signed(saphan: Saphan, database_url: str, tmp_path: Path) -> None:
    _setup(saphan)
    store = open_store(database_url, tmp_path / "unused.db")
    slot = store.get_slot("here", "s1")
    assert slot is not None
    run_id = new_run_id()
    reserve_seat(store, slot, run_id=run_id, tool="command", workdir=None,
                 holder=Holder("elsewhere", 1, 1, "b"))
    store.close()
    # A live run whose record is not written yet: nothing to verify, not flagged.
    code, live = _show(saphan, run_id)
    assert code == 0 and live["signature"]["status"] == "pending"
    r = saphan.ok("runs", "finalize", run_id, "--reason", "host decommissioned")
    assert "record signature valid" in r.out
    code, shown = _show(saphan, run_id)
    assert code == 0
    assert shown["signature"] == {"status": "valid"}
    assert shown["outcome"] == "finalized-by-operator"
    assert any("host decommissioned" in n for n in shown["notes"])
    stored = _record_json(database_url, run_id)
    assert (stored["state"], stored["outcome"], stored["session_ordinal"]) == (
        "ended", "finalized-by-operator", 0)


def _dead_holder() -> Holder:
    me = current_holder()
    dead = subprocess.Popen(["true"])
    dead.wait()
    return Holder(me.host, dead.pid, 12345, me.boot_id)


@pytest.mark.usefixtures("bwrap_available")
def test_holder_dead_finalisation_is_signed(saphan: Saphan, database_url: str,
                                            tmp_path: Path) -> None:
    _setup(saphan, max_sessions="1")
    store = open_store(database_url, tmp_path / "unused.db")
    slot = store.get_slot("here", "s1")
    assert slot is not None
    dead_id = new_run_id()
    reserve_seat(store, slot, run_id=dead_id, tool="command", workdir=None,
                 holder=_dead_holder())
    store.close()
    # The next run's conflict handling finds the holder dead and finalises it.
    new_id = _run(saphan, tmp_path, "true")
    code, shown = _show(saphan, dead_id)
    assert code == 0, shown["signature"]
    assert shown["signature"] == {"status": "valid"}
    assert shown["outcome"] == "holder-dead"
    assert any("holder dead" in n for n in shown["notes"])
    assert _show(saphan, new_id)[1]["signature"]["status"] == "valid"


@pytest.mark.usefixtures("bwrap_available")
def test_finalising_never_launders_an_unverified_record(saphan: Saphan, database_url: str,
                                                        tmp_path: Path) -> None:
    """A live row whose running-state record does not verify: the finalisation
    is signed, the record it found is kept apart as unverified, not re-signed."""
    _setup(saphan, max_sessions="1")
    store = open_store(database_url, tmp_path / "unused.db")
    slot = store.get_slot("here", "s1")
    assert slot is not None
    dead_id = new_run_id()
    reserve_seat(store, slot, run_id=dead_id, tool="command", workdir=None,
                 holder=_dead_holder())
    store.close()
    planted = {"id": dead_id, "writable": ["/"], "enforced_by": {"mechanism": "made-up"}}
    _put_record_json(database_url, dead_id, planted)
    _run(saphan, tmp_path, "true")
    code, shown = _show(saphan, dead_id)
    assert code == 0
    assert shown["signature"] == {"status": "valid"}
    assert shown["prior_record_signature"] == "missing"
    assert shown["unverified_prior_record"] == planted
    assert "writable" not in shown and "enforced_by" not in shown
    assert any("does not vouch for it" in n for n in shown["notes"])


# -- the Python API ----------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_api_run_record_and_runs_carry_the_signature(saphan: Saphan, database_url: str,
                                                     tmp_path: Path) -> None:
    _setup(saphan)
    run_id = _run(saphan, tmp_path, "true")
    engine = saphan_api.Engine(saphan.home)
    try:
        assert engine.run_record(run_id).signature == "valid"
        assert [r.signature for r in engine.runs()] == ["valid"]
    finally:
        engine.close()
    _sql(database_url, "UPDATE runs SET state = 'refused' WHERE id = ?", (run_id,))
    engine = saphan_api.Engine(saphan.home)
    try:
        record = engine.run_record(run_id)
        assert record.signature == "invalid"
        assert record.signature_flagged
        assert record.data["signature"]["mismatched"] == [
            {"column": "state", "row": "refused", "signed": "ended"}]
        assert [r.signature for r in engine.runs()] == ["invalid"]
    finally:
        engine.close()


def test_runs_show_help_names_the_exit_code(saphan_sqlite: Saphan) -> None:
    out = saphan_sqlite.ok("runs", "show", "--help").out
    assert "3  it does not" in out and "record-signature-invalid: this record" in out


def test_native_hmac_is_rfc2104_hmac_sha256() -> None:
    """Records are signed by rust/core's HMAC: it agrees with Python's own
    HMAC-SHA256 on keys shorter, equal to and longer than the block."""
    import hashlib
    import hmac

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from saphan import _native

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=200), st.binary(max_size=2000))
    def agree(key: bytes, data: bytes) -> None:
        want = hmac.new(key, data, hashlib.sha256).hexdigest()
        assert _native.hmac_sha256(key, data) == want
        assert _native.digests_equal(want, want)
        assert not _native.digests_equal(want, want[:-1] + ("0" if want[-1] != "0" else "1"))

    agree()
