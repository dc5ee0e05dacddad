"""run/end.py: how a run's body ended, as the record and the row show it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from saphan.errors import Interrupted
from saphan.refusals import seat_full
from saphan.run.end import (
    CANCEL_REQUEST,
    RunEnd,
    cancel_request,
    requested_signal,
    signal_text,
    write_cancel_request,
)


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


# -- the cancel request and how a cancelled run ends ------------------------------------

def test_a_cancel_request_round_trips_and_names_the_signal(tmp_path: Path) -> None:
    assert cancel_request(tmp_path) is None
    assert requested_signal(tmp_path) == signal.SIGTERM  # no request: SIGTERM
    write_cancel_request(tmp_path / "run", {"signal": "SIGHUP", "grace": 3})
    assert cancel_request(tmp_path / "run") == {"signal": "SIGHUP", "grace": 3}
    assert requested_signal(tmp_path / "run") == signal.SIGHUP
    write_cancel_request(tmp_path / "run", {"signal": "SIGKILL", "grace": 0})  # replaced
    assert requested_signal(tmp_path / "run") == signal.SIGKILL
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [CANCEL_REQUEST]


@pytest.mark.parametrize("content", [
    b'{"signal": "SIGSTOP"}', b'{"signal": 9}', b'["SIGTERM"]', b"not json", b"",
])
def test_a_request_not_in_saphans_shape_is_no_request(tmp_path: Path, content: bytes) -> None:
    (tmp_path / CANCEL_REQUEST).write_bytes(content)
    assert cancel_request(tmp_path) is None
    assert requested_signal(tmp_path) == signal.SIGTERM


def test_a_request_is_never_read_through_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"signal": "SIGKILL"}))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(elsewhere, run_dir / CANCEL_REQUEST)
    assert cancel_request(run_dir) is None
    # Written, a request replaces the link itself: nothing is written through it.
    write_cancel_request(run_dir, {"signal": "SIGTERM"})
    assert not (run_dir / CANCEL_REQUEST).is_symlink()
    assert requested_signal(run_dir) == signal.SIGTERM
    assert json.loads(elsewhere.read_text()) == {"signal": "SIGKILL"}


def test_a_cancelled_run_keeps_its_status_and_says_who_recorded_it() -> None:
    end, record = RunEnd(), _record()
    end.absorb(Interrupted(signal.SIGTERM, -signal.SIGTERM), record)
    end.cancelled({"signal": "SIGTERM", "grace": 10, "requested_at": "T"}, record)
    assert (end.outcome, end.state, end.exit_code) == ("cancelled", "ended", -15)
    assert record["cancel"]["signal"] == "SIGTERM"
    assert record["notes"][-1].startswith("cancelled by `saphan runs cancel` (requested at T, "
                                          "signal SIGTERM, grace 10 s)")
    assert "the command ended interrupted with status SIGTERM" in record["notes"][-1]


def test_a_refusal_stays_a_refusal_when_a_cancel_was_asked() -> None:
    end, record = RunEnd(), _record()
    end.absorb(seat_full("full", "wait"), record)
    end.cancelled({"signal": "SIGTERM"}, record)
    assert (end.outcome, end.state) == ("refused", "refused") and "cancel" not in record


@pytest.mark.parametrize(("code", "text"), [
    (None, "-"), (0, "0"), (7, "7"), (143, "143"), (-15, "SIGTERM"), (-9, "SIGKILL"),
    (-1, "SIGHUP"), (-99, "signal 99"),
])
def test_an_exit_status_is_printed_with_signals_by_name(code: int | None, text: str) -> None:
    assert signal_text(code) == text
