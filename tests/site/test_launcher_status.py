"""site/launcher_status.py: the launcher's status lines held against what was
sent. The record claims the Landlock domain only on a confirmation that
matches; a refusal line is that Refusal; an unknown class is only noted."""

from __future__ import annotations

from typing import Any

import pytest

from saphan.refusal_table import CLASSES
from saphan.refusals import Refusal
from saphan.run.end import RunEnd
from saphan.site.launcher_status import LIMIT, Expected, apply, exit_code, lines_of

SHA = "a" * 64
OTHER_SHA = "b" * 64
EXPECTED = Expected(landlock=True, writable=("/work", "/tmp/x"), abi=7, self_sha256=SHA)
CONFIRM = "saphan-launcher: landlock abi=7 enforced writable=[/work,/tmp/x] scopes=[signal,abstract]"
EXITED = "saphan-launcher: exited code=0 reaped=2"


def _record() -> dict[str, Any]:
    return {"id": "R1", "enforced_by": {"mechanism": "landlock"}, "notes": []}


def _ended(code: int = 0) -> RunEnd:
    end = RunEnd()
    end.exited(code)
    return end


def test_a_matching_confirmation_is_recorded() -> None:
    record, end = _record(), _ended()
    lines = [f"saphan-launcher: self sha256={SHA}", CONFIRM, EXITED]
    apply(lines, EXPECTED, record, end)
    assert record["enforced_by"]["confirmation"] == CONFIRM
    assert record["enforced_by"]["scopes"] == ["signal", "abstract"]
    assert record["enforced_by"]["status_lines"] == lines
    assert record["processes_killed_at_end"] == 2
    assert "not_enforced" not in record
    assert end.outcome == "exited"


@pytest.mark.parametrize(("lines", "why"), [
    ([f"saphan-launcher: self sha256={SHA}", EXITED], "no confirmation line"),
    ([f"saphan-launcher: self sha256={SHA}",
      "saphan-launcher: landlock abi=7 enforced writable=[/work] scopes=[]", EXITED],
     "not the policy's [/work,/tmp/x]"),
    ([f"saphan-launcher: self sha256={SHA}",
      "saphan-launcher: landlock abi=5 enforced writable=[/work,/tmp/x] scopes=[]", EXITED],
     "Landlock ABI 5, not the measured 7"),
    ([f"saphan-launcher: self sha256={OTHER_SHA}", CONFIRM, EXITED],
     f"sha256 {OTHER_SHA}, not the {SHA} sent"),
    ([CONFIRM, EXITED], "did not confirm its own digest"),
    ([f"saphan-launcher: self sha256={SHA}", CONFIRM, CONFIRM, EXITED], "more than one confirmation"),
], ids=["missing", "other-writable", "other-abi", "other-digest", "no-digest", "two-confirmations"])
def test_a_confirmation_that_does_not_match_is_not_enforced(lines: list[str], why: str) -> None:
    record, end = _record(), _ended()
    claimed = dict(record["enforced_by"])
    apply(lines, EXPECTED, record, end, where="runner1")
    assert record["enforced_by"] is None
    assert why in record["not_enforced"]["why"]
    assert record["not_enforced"]["claimed_by_composition"]["mechanism"] == claimed["mechanism"]
    assert any("NOT ENFORCED" in n and "on runner1" in n for n in record["notes"])
    assert end.outcome == "failed"


def test_a_failed_run_stays_failed_and_keeps_its_code_when_not_enforced() -> None:
    record, end = _record(), _ended(5)
    apply(["saphan-launcher: exited code=5 reaped=0"], EXPECTED, record, end)
    assert record["enforced_by"] is None and end.outcome == "failed" and end.exit_code == 5


def test_without_landlock_no_confirmation_is_needed() -> None:
    record, end = {"id": "R1", "enforced_by": {"mechanism": "bubblewrap"}}, _ended()
    apply([EXITED], Expected(landlock=False), record, end)
    assert record["enforced_by"]["mechanism"] == "bubblewrap"
    assert "not_enforced" not in record and end.outcome == "exited"


def test_a_boundary_whose_reaper_never_spoke_never_started() -> None:
    """Review: bubblewrap failed to build the jail (no network namespace left)
    and the record still said enforced by bubblewrap, network off."""
    reaper = "c" * 64
    record, end = {"id": "R1", "enforced_by": {"mechanism": "bubblewrap"},
                   "network": "off: a network namespace of its own"}, _ended()
    apply([], Expected(landlock=False, self_sha256=reaper), record, end)
    assert record["enforced_by"] is None
    assert record["not_enforced"]["claimed_by_composition"]["mechanism"] == "bubblewrap"
    assert "the boundary never started" in record["not_enforced"]["why"]
    assert record["network"] == "not applied: the boundary never started"
    assert end.outcome == "failed"
    # another reaper's digest is no confirmation either; its own is
    for lines, started in (([f"saphan-launcher: self sha256={'d' * 64}"], False),
                           ([f"saphan-launcher: self sha256={reaper}", EXITED], True)):
        record, end = {"id": "R1", "enforced_by": {"mechanism": "bubblewrap"}}, _ended()
        apply(lines, Expected(landlock=False, self_sha256=reaper), record, end)
        assert (record["enforced_by"] is not None) == started


def test_a_missing_exited_line_is_noted_and_not_counted() -> None:
    record, end = {"id": "R1", "enforced_by": None}, _ended()
    apply([], Expected(landlock=False), record, end)
    assert record["processes_killed_at_end"] is None
    assert any("did not report how the run ended" in n for n in record["notes"])
    # no word from the launcher: no status, never a clean end
    assert (end.outcome, end.exit_code) == ("failed", None)
    assert any("the boundary process ended with status 0" in n for n in record["notes"])


def test_the_launchers_status_is_the_commands_not_the_boundary_process() -> None:
    """Review: from inside a bubblewrap jail the command wrote bubblewrap's
    process-1 status channel, and the run was recorded `exited 0` while the
    launcher had killed it (137)."""
    record, end = {"id": "R1", "enforced_by": None, "notes": []}, _ended(0)
    apply(["saphan-launcher: exited code=137 reaped=0"], Expected(landlock=False), record, end)
    assert (end.outcome, end.exit_code) == ("failed", 137)
    assert any("ended with status 0, but the launcher reported the command's status 137" in n
               for n in record["notes"])
    # agreeing: nothing to say
    record, end = {"id": "R1", "enforced_by": None, "notes": []}, _ended(7)
    apply(["saphan-launcher: exited code=7 reaped=0"], Expected(landlock=False), record, end)
    assert (end.outcome, end.exit_code, record["notes"]) == ("failed", 7, [])


def test_a_launcher_that_started_nothing_gives_no_status() -> None:
    end = RunEnd()
    end.exit_code = 129
    record: dict[str, Any] = {"id": "R1", "enforced_by": None, "notes": []}
    apply(["saphan-launcher: not started: the lifeline ended or said stop first"],
          Expected(landlock=False), record, end)
    assert end.exit_code is None and record["processes_killed_at_end"] == 0
    assert any("started nothing" in n for n in record["notes"])
    assert not any("did not report" in n for n in record["notes"])


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_a_refused_line_is_that_refusal(cls: str) -> None:
    record, end = _record(), _ended()
    with pytest.raises(Refusal) as got:
        apply([f"saphan-launcher: refused [{cls}] the measured thing is 3"], EXPECTED, record, end,
              where="runner1")
    assert got.value.cls == cls
    assert got.value.message == "saphan-launcher on runner1 refused: the measured thing is 3"
    assert cls in got.value.remediation
    assert record["enforced_by"] is None


def test_a_refused_line_with_an_unknown_class_is_only_noted() -> None:
    record, end = _record(), _ended()
    line = "saphan-launcher: refused [made-up-class] something"
    apply([line, CONFIRM], EXPECTED, record, end)
    assert record["enforced_by"] is None
    assert record["notes"] == [f"the launcher refused: {line}"]
    assert end.outcome == "failed"


def test_lines_the_run_could_print_are_not_control() -> None:
    """A line that merely contains the control text (indented, prefixed) is no confirmation."""
    record, end = _record(), _ended()
    apply([f"saphan-launcher: self sha256={SHA}", " " + CONFIRM, "x" + CONFIRM, EXITED],
          EXPECTED, record, end)
    assert record["enforced_by"] is None and end.outcome == "failed"


def test_exit_code() -> None:
    assert exit_code(["noise", "saphan-launcher: exited code=42 reaped=0"]) == 42
    assert exit_code(["saphan-launcher: exited code=-9 reaped=1"]) == -9
    assert exit_code(["saphan-launcher: exited code=x reaped=1"]) is None
    assert exit_code([]) is None


def test_lines_of_reads_at_most_the_limit_and_strips_carriage_returns() -> None:
    assert lines_of(b"a\r\nb\n\xffc") == ["a", "b", "\ufffdc"]
    raw = b"x" * (LIMIT - 1) + b"\n" + b"saphan-launcher: exited code=0 reaped=0\n"
    got = lines_of(raw)
    assert got == ["x" * (LIMIT - 1)]
    assert exit_code(got) is None
    assert lines_of(b"x" * (LIMIT + 10)) == ["x" * LIMIT]


def test_processes_the_launcher_could_not_end_make_the_run_fail() -> None:
    record, end = _record(), _ended()
    lines = [f"saphan-launcher: self sha256={SHA}", CONFIRM,
             "saphan-launcher: abandoned pids=[41,42]", EXITED]
    apply(lines, EXPECTED, record, end)
    assert record["processes_left_running"] == [41, 42]
    assert end.outcome == "failed"
    assert any("could not end every process" in n and "[41, 42]" in n for n in record["notes"])
    # the boundary itself was confirmed: only the end was not clean
    assert record["enforced_by"]["confirmation"] == CONFIRM


def test_two_self_digest_lines_are_not_believed() -> None:
    record, end = _record(), _ended()
    lines = [f"saphan-launcher: self sha256={SHA}", f"saphan-launcher: self sha256={OTHER_SHA}",
             CONFIRM, EXITED]
    apply(lines, EXPECTED, record, end)
    assert record["enforced_by"] is None and "more than one self-digest" in record["not_enforced"]["why"]


def test_processes_that_could_not_be_listed_make_the_run_fail() -> None:
    """The launcher could not read /proc (review: the command lowered its
    open-file limit with prlimit) and so could not end what was left."""
    record, end = {"id": "R1", "enforced_by": None, "notes": []}, _ended(0)
    apply(["saphan-launcher: abandoned pids=[unknown]", "saphan-launcher: exited code=0 reaped=0"],
          Expected(landlock=False), record, end)
    assert (end.outcome, end.exit_code) == ("failed", 0)
    assert record["processes_left_running"] == "unknown"
    assert any("could not list the processes the run left" in n for n in record["notes"])
