"""run/end.py: how a run's body ended, as the record and the row show it."""

from __future__ import annotations

import signal
from typing import Any

from saphan.errors import Interrupted
from saphan.refusals import seat_full
from saphan.run.end import RunEnd


def _record() -> dict[str, Any]:
    return {"id": "01RUN", "notes": ["earlier"]}


def test_a_body_that_never_ended_is_an_error() -> None:
    end = RunEnd()
    assert (end.outcome, end.state, end.exit_code, end.refusal_class) == ("error", "ended", None, None)


def test_exited_zero_and_nonzero() -> None:
    end = RunEnd()
    end.exited(0)
    assert (end.outcome, end.exit_code) == ("exited", 0)
    end.exited(7)
    assert (end.outcome, end.exit_code) == ("failed", 7)
    end.exited(-9)
    assert (end.outcome, end.exit_code) == ("failed", -9)


def test_a_refusal_is_recorded_with_its_class_and_names_the_run() -> None:
    end, record = RunEnd(), _record()
    r = seat_full("slot s on m carries 1 run and may carry 1", "wait")
    end.absorb(r, record)
    assert (end.outcome, end.state, end.refusal_class) == ("refused", "refused", "seat-full")
    assert record["refusal"] == {"class": "seat-full",
                                 "message": "slot s on m carries 1 run and may carry 1",
                                 "remediation": "wait"}
    assert r.run_id == "01RUN"


def test_an_interrupt_keeps_the_child_code_and_notes_why() -> None:
    end, record = RunEnd(), _record()
    end.absorb(Interrupted(signal.SIGTERM, 143), record)
    assert (end.outcome, end.state, end.exit_code) == ("interrupted", "ended", 143)
    assert record["notes"] == ["earlier", "interrupted by SIGTERM"]
    end2, record2 = RunEnd(), _record()
    end2.absorb(Interrupted(signal.SIGINT, None), record2, lambda e: f"stopped ({e.signum})")
    assert record2["notes"] == ["earlier", f"stopped ({int(signal.SIGINT)})"]
    assert end2.exit_code is None


def test_keyboard_interrupt_is_interrupted_without_a_note() -> None:
    end, record = RunEnd(), _record()
    end.absorb(KeyboardInterrupt(), record)
    assert end.outcome == "interrupted" and end.exit_code is None
    assert record == _record()


def test_anything_else_is_an_error_naming_its_type() -> None:
    end, record = RunEnd(), _record()
    end.exited(0)
    end.absorb(OSError("disk full"), record)
    assert end.outcome == "error" and end.state == "ended"
    assert record["error"] == "OSError: disk full"
    assert "refusal" not in record


def test_a_refusal_after_composition_claims_no_enforcement() -> None:
    """A refusal raised after the boundary was composed (the argv guard's,
    the launcher's) leaves the record claiming none; what was composed is
    kept apart."""
    from saphan import refusals

    record = {"id": "R1", "enforced_by": {"mechanism": "bubblewrap"}}
    end = RunEnd()
    end.absorb(refusals.bypass_token("m", "r"), record)
    assert record["enforced_by"] is None
    assert record["composed_boundary"] == {"mechanism": "bubblewrap"}
    assert (end.outcome, end.state, end.refusal_class) == ("refused", "refused", "bypass-token")
