"""run/ask.py: the checks before a seat that do not depend on where a run
goes — the tool this build dispatches, measure-base on command slots only,
the operator's command line free of bypass tokens (a refusal, recorded)."""

from __future__ import annotations

import json

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.liveness import current_holder
from saphan.measure.order import make
from saphan.refusals import Refusal
from saphan.run.ask import Ask, check_command, check_tool
from saphan.store.rows import Slot


def _ask(**kw: object) -> Ask:
    fields: dict[str, object] = dict(command=["true"], run_id="r1", mode="engine", workdir=None,
                                     stream=False, boundary=None, repo=None, base_ref=None,
                                     keep_worktree=True, request=None, view=False,
                                     measure=None)
    fields.update(kw)
    return Ask(**fields)  # type: ignore[arg-type]


def test_measure_base_goes_to_command_slots_only() -> None:
    check_tool(Slot("m", "s", "command", None), _ask(measure=make("main", ["pytest"])))
    with pytest.raises(UserError, match="measure-base runs a test command"):
        check_tool(Slot("m", "s", "loop", None), _ask(measure=make("main", ["pytest"])))
    check_tool(Slot("m", "s", "loop", None), _ask())


def test_a_bypass_token_on_the_command_line_is_refused_and_recorded(ctx: Context) -> None:
    base = {"id": "01TESTBYPASS0000000000000", "machine": "(fleet)", "slot": "(cast)",
            "argv": ["codex", "--dangerously-bypass-approvals-and-sandbox"], "workdir": None,
            "saphan_version": "t", "requested_at": "t"}
    with pytest.raises(Refusal) as e:
        check_command(ctx, base, list(base["argv"]), current_holder())  # type: ignore[arg-type]
    assert e.value.cls == "bypass-token" and e.value.run_id == base["id"]
    row = ctx.store.get_run(str(base["id"]))
    assert row is not None and row.refusal_class == "bypass-token"
    assert json.loads(row.record_json or "{}")["machine"] == "(fleet)"
