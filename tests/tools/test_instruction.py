"""tools/instruction.py: the one value an adapter receives. It is deliberately
narrow: no field could ask an agent to disable its safety mechanisms, name a
fallback model or continue a session other than by an explicit --resume."""

from __future__ import annotations

import dataclasses

import pytest

from saphan.tools.instruction import Instruction, Resume
from saphan.tools.permission_class import parse


def test_the_fields_are_exactly_these() -> None:
    """A new field (an "extra argv", a "sandbox mode", a second model) must be
    argued for here: this is the whole surface an adapter can be asked through."""
    assert [f.name for f in dataclasses.fields(Instruction)] == [
        "prompt_path", "workdir", "model", "permission_class", "resume"]
    assert [f.name for f in dataclasses.fields(Resume)] == ["run_id", "session_id"]


def test_defaults_name_nothing_beyond_the_task() -> None:
    i = Instruction(prompt_path="/run/prompt.txt", workdir="/wd")
    assert i.model is None  # the tool's own default: no model selector at all
    assert i.permission_class is None
    assert i.resume is None  # a session continues only when asked, on the record


def test_it_cannot_be_changed_after_it_is_made() -> None:
    pc = parse({"schema": 1, "commands": ["git"]})
    i = Instruction("/p", "/wd", model="m1", permission_class=pc,
                    resume=Resume(run_id="01RUN", session_id="sess-1"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        i.model = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        i.resume.session_id = "another"  # type: ignore[union-attr,misc]
    assert dataclasses.replace(i, model="m2").model == "m2" and i.model == "m1"
