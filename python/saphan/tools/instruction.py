"""The internal instruction format: the one value a tool adapter receives.

It is deliberately narrow. There is no field that could ask an agent to
disable its own safety mechanisms (no "extra argv", no "sandbox mode", no
"skip permissions"), no field that names a second or fallback model, and no
way to continue a session except :attr:`Instruction.resume`, which is set
only by an explicit ``saphan run --resume RUN`` and is recorded. The argv
guard (argv_guard.py) checks the composed command line again, right before
launch, as defence in depth.

The prompt is never placed on a command line: adapters hand it to the tool
on standard input, from a file, so it cannot be mistaken for a flag and the
guard never needs to scan it.
"""

from __future__ import annotations

from dataclasses import dataclass

from saphan.tools.permission_class import PermissionClass


@dataclass(frozen=True)
class Resume:
    """An explicit, recorded continuation: which run, and its tool session."""

    run_id: str
    session_id: str


@dataclass(frozen=True)
class Instruction:
    #: the task, delivered on stdin from ``prompt_path`` (never in argv)
    prompt_path: str
    #: the canonical working directory (realpath)
    workdir: str
    #: the model the operator named; None means the tool's own default, and
    #: then no model selector may appear on the command line at all
    model: str | None = None
    #: what the agent is permitted to do (SPEC.md §8); None: no class given
    permission_class: PermissionClass | None = None
    #: set only by ``saphan run --resume RUN``
    resume: Resume | None = None


@dataclass(frozen=True)
class Request:
    """What ``saphan run`` was asked for an agent slot (nothing else exists)."""

    prompt: str | None = None
    prompt_file: str | None = None
    model: str | None = None
    permission_class: str | None = None
    resume: str | None = None
    #: loop slots: the lane (default: the only one declared) and the budgets
    lane: str | None = None
    max_turns: int | None = None
    max_seconds: int | None = None
    #: an egress policy file (egress/policy.py): the run is cut, its door the way out
    egress_policy: str | None = None
