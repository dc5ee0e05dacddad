"""run/shown.py: a record as `saphan runs show` prints it."""

from __future__ import annotations

from saphan.records import RunRecord
from saphan.run.shown import record_lines


def _record(**extra: object) -> RunRecord:
    data = {"id": "01ABC", "machine": "here", "slot": "s1", "session_ordinal": None,
            "tool": "command", "argv": ["sh", "-c", "x"], "workdir": "/w", "state": "refused",
            "started_at": "2026-12-01T00:00:00.000000Z",
            "finished_at": "2026-12-01T00:00:01.000000Z", "outcome": "refused",
            "exit_code": None, "signature": {"status": "valid"}, **extra}
    return RunRecord(data)


def test_refusal_is_shown_with_its_fix() -> None:
    lines = record_lines(_record(refusal={"class": "seat-full", "message": "both held",
                                          "remediation": "wait for a seat"}))
    assert "refusal:     [seat-full] both held" in lines
    assert "fix:         wait for a seat" in lines
    assert lines[-1].startswith("signature:   valid")


def test_every_line_is_one_printable_line() -> None:
    lines = record_lines(_record(workdir="/w\nsignature:   valid\x1b]52;c;aGk=\x07",
                                 notes=["a\u202eb"]))
    assert not any(line.startswith("signature:   valid") for line in lines[:-1])
    joined = "\n".join(lines)
    assert "\x1b" not in joined and "\u202e" not in joined
    assert "\\x1b]52" in joined and "\\u202e" in joined


def test_flagged_record_says_so_first() -> None:
    rec = _record(signature={"status": "invalid", "class": "record-signature-invalid",
                             "message": "edited", "remediation": "investigate"})
    lines = record_lines(rec)
    assert lines[0].startswith("record-signature-invalid")
    assert lines[-1].startswith("signature:   INVALID")
