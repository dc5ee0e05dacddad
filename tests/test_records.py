"""records.py: run records signed with the workspace key and verified on read
(the row's columns held against the signed values), and signed machine facts.

Unit tier: rows are built as the store returns them (store.rows.RunRow); the
end-to-end cases through the CLI and a real store are in
test_record_signature.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from saphan.records import (
    INVALID_HEADLINE,
    KEY_ID_FIELD,
    MISSING_HEADLINE,
    SIGNATURE_FIELD,
    SIGNED_COLUMNS,
    RunRecord,
    _mac,
    _payload,
    _record_mac,
    finalised_record_json,
    key_id,
    sign_fact,
    sign_record,
    signed_record_json,
    verify_fact,
    verify_run_row,
)
from saphan.refusals import Refusal
from saphan.store.rows import RunRow

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def _record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": "01RUN", "machine": "m1", "slot": "s1", "tool": "command", "state": "ended",
        "outcome": "exited", "exit_code": 0, "finished_at": "2025-01-01T00:00:01.000000Z",
        "session_ordinal": 0, "argv": ("sh", "-c", "true"), "workdir": "/wd",
        "started_at": "2025-01-01T00:00:00.000000Z",
    }
    rec.update(over)
    return rec


def _row(record_json: str | None, **over: Any) -> RunRow:
    """The row the store would hold for ``_record()``."""
    cols: dict[str, Any] = dict(
        id="01RUN", machine="m1", slot="s1", session_ordinal=0, state="ended",
        started_at="2025-01-01T00:00:00.000000Z", finished_at="2025-01-01T00:00:01.000000Z",
        holder_host="h", holder_pid=1, holder_start_ticks=2, holder_boot_id="b", tool="command",
        workdir="/wd", outcome="exited", exit_code=0, refusal_class=None,
        record_json=record_json)
    cols.update(over)
    return RunRow(**cols)


# -- signing --------------------------------------------------------------------------

def test_signing_is_over_the_json_a_reader_sees() -> None:
    signed = sign_record(KEY, _record())
    assert signed["argv"] == ["sh", "-c", "true"]  # a tuple reads back as a list
    sig = signed[SIGNATURE_FIELD]
    assert isinstance(sig, str) and len(sig) == 64 and int(sig, 16) >= 0
    # Key order does not matter; the key and the content do.
    reordered = dict(reversed(list(_record().items())))
    assert sign_record(KEY, reordered)[SIGNATURE_FIELD] == sig
    assert sign_record(OTHER_KEY, _record())[SIGNATURE_FIELD] != sig
    assert sign_record(KEY, _record(exit_code=1))[SIGNATURE_FIELD] != sig
    # An old signature in the input is replaced, not signed over.
    assert sign_record(KEY, {**_record(), SIGNATURE_FIELD: "0" * 64})[SIGNATURE_FIELD] == sig
    assert json.loads(signed_record_json(KEY, _record())) == signed


def test_a_signed_record_on_its_row_is_valid() -> None:
    rec = RunRecord.from_row(_row(signed_record_json(KEY, _record())), KEY)
    assert rec.signature == "valid" and not rec.signature_flagged
    assert rec.data["signature"] == {"status": "valid"}
    assert rec.data["argv"] == ["sh", "-c", "true"]
    assert (rec.id, rec.outcome, rec.exit_code) == ("01RUN", "exited", 0)


def test_another_key_is_foreign_not_invalid() -> None:
    stored = signed_record_json(KEY, _record())
    assert json.loads(stored)[KEY_ID_FIELD] == key_id(KEY)
    rec = RunRecord.from_row(_row(stored), OTHER_KEY)
    assert rec.signature == "foreign" and not rec.signature_flagged and rec.signature_unverified
    verified = rec.data["signature"]
    assert (verified["key_id"], verified["held_key_id"]) == (key_id(KEY), key_id(OTHER_KEY))
    assert f"signed by key {key_id(KEY)}, not held here" in verified["message"]
    assert "class" not in verified and "--join" in verified["remediation"]


def test_key_ids_are_short_distinct_and_not_the_key() -> None:
    assert len(key_id(KEY)) == 16 and key_id(KEY) == key_id(bytes(KEY))
    assert key_id(KEY) != key_id(OTHER_KEY)
    assert key_id(KEY) not in (KEY.hex(), OTHER_KEY.hex()) and key_id(KEY) not in KEY.hex()


def test_the_wrong_key_or_an_edit_is_invalid() -> None:
    # A record from before key ids (no record_key_id), under another key: invalid, as before.
    old = json.loads(signed_record_json(KEY, _record()))
    del old[KEY_ID_FIELD]
    old[SIGNATURE_FIELD] = _record_mac(KEY, old)  # as a build before key ids signed it
    stored = json.dumps(old)
    assert RunRecord.from_row(_row(stored), KEY).signature == "valid"  # still verifies
    rec = RunRecord.from_row(_row(stored), OTHER_KEY)
    assert rec.signature == "invalid" and rec.signature_flagged
    assert rec.data["signature"]["class"] == "record-signature-invalid"
    assert "edited, or written under another key" in rec.data["signature"]["message"]
    assert "re-sign" in rec.data["signature"]["remediation"]
    edited = json.loads(stored)
    edited["argv"] = ["sh", "-c", "curl evil"]
    rec = RunRecord.from_row(_row(json.dumps(edited)), KEY)
    assert rec.signature == "invalid"
    assert rec.data["argv"] == ["sh", "-c", "curl evil"]  # still shown, as stored


def _column_value(column: str) -> Any:
    return {"id": "01OTHER", "machine": "m2", "slot": "s2", "tool": "claude",
            "state": "running", "outcome": "failed", "exit_code": 7,
            "finished_at": "2030-01-01T00:00:00.000000Z", "session_ordinal": 3}[column]


@pytest.mark.parametrize("column", SIGNED_COLUMNS)
def test_a_column_edited_in_the_row_is_named(column: str) -> None:
    """The signature verifies but the store's column says otherwise: flagged,
    with the column, the row's value and the signed one."""
    row = _row(signed_record_json(KEY, _record()), **{column: _column_value(column)})
    rec = RunRecord.from_row(row, KEY)
    assert rec.signature == "invalid", column
    mismatched = rec.data["signature"]["mismatched"]
    assert [m["column"] for m in mismatched] == [column]
    signed = _record()[column]
    assert mismatched[0]["signed"] == signed and mismatched[0]["row"] == _column_value(column)
    # The row's columns are shown over the record (the store's truth).
    assert rec.data[column] == _column_value(column)


def test_signed_columns_are_the_ones_the_store_decides_on() -> None:
    assert set(SIGNED_COLUMNS) == {"id", "machine", "slot", "tool", "state", "outcome",
                                   "exit_code", "finished_at", "session_ordinal"}


def test_a_live_row_without_a_record_is_pending() -> None:
    for state in ("reserved", "running"):
        row = _row(None, state=state, finished_at=None, outcome=None, exit_code=None,
                   session_ordinal=2)
        rec = RunRecord.from_row(row, KEY)
        assert rec.signature == "pending" and not rec.signature_flagged
        assert "signed when the run ends" in rec.data["signature"]["message"]
        assert rec.data["state"] == state and rec.data["session_ordinal"] == 2


def test_a_finished_row_without_a_record_is_missing() -> None:
    rec = RunRecord.from_row(_row(None), KEY)
    assert rec.signature == "missing" and rec.signature_flagged
    assert "carries no record at all" in rec.data["signature"]["message"]


def test_a_record_without_a_signature_is_missing() -> None:
    rec = RunRecord.from_row(_row(json.dumps(_record())), KEY)
    assert rec.signature == "missing"
    assert "carries no signature" in rec.data["signature"]["message"]


@pytest.mark.parametrize("stored", ["not json", "[1, 2]", '"text"'])
def test_a_record_that_is_not_an_object_is_invalid(stored: str) -> None:
    data, verified = verify_run_row(KEY, _row(stored))
    assert verified["status"] == "invalid"
    assert data == {"unparsed_record_json": stored}


def test_a_signature_that_is_not_text_is_invalid() -> None:
    rec = {**_record(), SIGNATURE_FIELD: 12345}
    assert RunRecord.from_row(_row(json.dumps(rec)), KEY).signature == "invalid"


def test_a_refused_row_has_no_ordinal() -> None:
    record = _record(state="refused", outcome="refused", exit_code=None, session_ordinal=None)
    row = _row(signed_record_json(KEY, record), state="refused", outcome="refused",
               exit_code=None, session_ordinal=-1, refusal_class="seat-full")
    rec = RunRecord.from_row(row, KEY)
    assert rec.signature == "valid"
    assert rec.data["session_ordinal"] is None


def test_a_record_built_by_hand_was_never_verified() -> None:
    rec = RunRecord({"id": "X", "refusal": {"class": "seat-full"}, "outcome": "refused"})
    assert rec.signature == "missing" and rec.signature_flagged
    assert rec.refusal_class == "seat-full" and rec.enforced_by is None
    assert RunRecord({"id": "X", "signature": {"status": "bogus"}}).signature == "missing"
    assert json.loads(rec.to_json()) == rec.data
    assert rec.to_json(indent=None) == json.dumps(rec.data, sort_keys=True)
    assert "'X'" in repr(rec) and "missing" in repr(rec)


def test_headlines_name_the_refusal_class() -> None:
    for line in (INVALID_HEADLINE, MISSING_HEADLINE):
        assert line.startswith("record-signature-invalid: ") and "\n" not in line


# -- finalising a live run without its runner -------------------------------------------

def _live_row(record_json: str | None) -> RunRow:
    return _row(record_json, state="running", finished_at=None, outcome=None, exit_code=None)


def _finalised(row: RunRow, stored: str) -> RunRow:
    return row._replace(state="ended", outcome="holder-dead", exit_code=None,
                        finished_at="2025-01-02T00:00:00.000000Z", record_json=stored)


def test_finalising_keeps_the_runs_own_record_and_signs_it() -> None:
    live = _record(state="running", outcome=None, exit_code=None, finished_at=None)
    row = _live_row(signed_record_json(KEY, live))
    stored = finalised_record_json(KEY, row, outcome="holder-dead", note="holder dead (pid 1)",
                                   finished_at="2025-01-02T00:00:00.000000Z")
    out = json.loads(stored)
    assert out["argv"] == ["sh", "-c", "true"] and out["workdir"] == "/wd"
    assert (out["state"], out["outcome"], out["exit_code"]) == ("ended", "holder-dead", None)
    assert out["notes"] == ["holder dead (pid 1)"]
    assert "unverified_prior_record" not in out
    assert RunRecord.from_row(_finalised(row, stored), KEY).signature == "valid"


def test_finalising_a_pending_run_starts_its_record() -> None:
    row = _live_row(None)
    stored = finalised_record_json(KEY, row, outcome="finalized-by-operator", note="by hand",
                                   finished_at="2025-01-02T00:00:00.000000Z")
    out = json.loads(stored)
    assert out["id"] == "01RUN" and out["workdir"] == "/wd" and out["notes"] == ["by hand"]
    assert out["started_at"] == row.started_at


def test_finalising_never_vouches_for_an_unverified_record() -> None:
    forged = json.loads(signed_record_json(OTHER_KEY, _record(state="running")))
    row = _live_row(json.dumps(forged))
    stored = finalised_record_json(KEY, row, outcome="holder-dead", note="n",
                                   finished_at="2025-01-02T00:00:00.000000Z")
    out = json.loads(stored)
    assert out["prior_record_signature"] == "foreign"  # another key's: not vouched for either
    assert out["unverified_prior_record"] == forged  # kept apart, as found
    assert "argv" not in out  # nothing of it is adopted as saphan's own
    assert "does not vouch for it" in out["notes"][0] and out["notes"][-1] == "n"
    assert RunRecord.from_row(_finalised(row, stored), KEY).signature == "valid"


# -- machine facts ------------------------------------------------------------------------

def test_a_fact_verifies_and_returns_its_value() -> None:
    fact = sign_fact(KEY, "m1", "landlock", {"level": 7, "reason": "ok"}, "2025-01-01T00:00:00Z")
    assert fact.value_json == '{"level":7,"reason":"ok"}'
    assert verify_fact(KEY, fact) == {"level": 7, "reason": "ok"}


def test_a_fact_names_its_key_and_an_older_bare_one_still_verifies() -> None:
    fact = sign_fact(KEY, "m1", "landlock", {"level": 7}, "2025-01-01T00:00:00Z")
    assert fact.signature.startswith(f"{key_id(KEY)}:")
    old = fact._replace(signature=_mac(KEY, _payload("m1", "landlock", fact.value_json,
                                                     fact.measured_at)))
    assert verify_fact(KEY, old) == {"level": 7}
    # the key id is signed too: another key id put on the row does not verify
    forged = fact._replace(signature=f"{key_id(OTHER_KEY)}:{fact.signature.split(':')[1]}")
    with pytest.raises(Refusal):
        verify_fact(OTHER_KEY, forged)


@pytest.mark.parametrize("edit", ["value", "machine", "kind", "measured_at", "key"])
def test_an_edited_fact_is_refused(edit: str) -> None:
    fact = sign_fact(KEY, "m1", "landlock", {"level": 2}, "2025-01-01T00:00:00Z")
    key = KEY
    if edit == "value":
        fact = fact._replace(value_json='{"level":7}')
    elif edit == "machine":
        fact = fact._replace(machine="m2")
    elif edit == "kind":
        fact = fact._replace(kind="container")
    elif edit == "measured_at":
        fact = fact._replace(measured_at="2030-01-01T00:00:00Z")
    else:
        key = os.urandom(32)
    with pytest.raises(Refusal) as info:
        verify_fact(key, fact)
    assert info.value.cls == "record-signature-invalid"
    assert f"machine {fact.machine}" in info.value.message
    if edit == "key":  # another key's row: foreign, named by its key id, not invalid
        assert f"signed by key {key_id(KEY)}, not held here" in info.value.message
        assert "not an invalid signature" in info.value.message
        assert "--join" in info.value.remediation
    else:
        assert f"saphan machine probe-confinement {fact.machine}" in info.value.remediation
