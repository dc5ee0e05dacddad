"""What the dispatcher asks of an agent tool adapter.

An adapter turns an :class:`~saphan.tools.instruction.Instruction` and the
run's derived write policy into the tool's command line, says whether the
engine or the tool itself confines it, and reads the tool's session id back
from its output afterwards (so a later ``saphan run --resume RUN`` can name
it). The local site (saphan.site.local) calls, in order:

    session_dirs()          -> extra grants for the derived policy
    read_denials()          -> extra read denials for it (the loop's blinding)
    vendor_boundary(policy) -> a Boundary when the tool confines itself, else None
    argv(policy)            -> the tool's command line (the prompt is on stdin)
    guard(final_argv, agent_at) -> the argv guard, on boundary prefix + argv (the
                               agent's argv from index agent_at on is held to the
                               adapter's allow-list, :attr:`Adapter.allowed_argv`)
    record(policy)          -> what the record says about the tool and its policy
    credential_refused(name) -> why a permission class may not name ``name`` as a
                               credential for this tool (it controls the tool: its
                               endpoint, proxy, trust store, …), else None; checked
                               by tools/launch.py before the seat
    env_allowed()           -> the variable names the run may take from saphan's
                               environment, on top of the base (confine/environment.py)
    env_set()               -> variables the adapter sets for the run (the slot's
                               endpoint for Claude Code): never taken from saphan's
                               environment, recorded under ``set``
    environment(env)        -> a last adjustment of the built environment (the loop
                               scrubs its keys by value here); the boundary starts with it
    stdin_path / stdin_bytes() -> the tool's stdin: a file (the prompt), or
                               bytes written into a pipe (the loop's key)
    after_run(stdout_path)  -> facts read back from the tool's output
    after_exit(stdout_path, exit_code) -> the same, knowing how the tool ended (the
                               engine calls this one; by default it is after_run);
                               a ``notes`` list in it is added to the record's notes
    outcome(facts)          -> the run's outcome, when the tool names a finer one
    time_limit()            -> the engine's watchdog for the whole run, if any
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from saphan.tools import argv_guard
from saphan.tools.binaries import AgentBinary
from saphan.tools.instruction import Instruction

if TYPE_CHECKING:
    from saphan.confine.compose import Boundary
    from saphan.confine.policy import Policy


#: An agent run's time limit when the operator gives no --max-seconds: a run
#: against an endpoint that never answers (a tool retrying for ever) ends.
DEFAULT_AGENT_MAX_SECONDS = 3600


@dataclass(frozen=True)
class Adapter(ABC):
    binary: AgentBinary
    instruction: Instruction
    #: run.confinement: "engine" or "vendor"
    confinement: str
    run_id: str

    tool = ""
    #: Everything :meth:`argv` may emit — the exact options, their values or a
    #: validator, the positional words (argv_guard.AllowList). The guard
    #: refuses any other element of the agent's argv; an agent adapter that
    #: declares none cannot launch.
    allowed_argv: ClassVar[argv_guard.AllowList | None] = None

    @property
    def stdin_path(self) -> str | None:
        return self.instruction.prompt_path

    def stdin_bytes(self) -> bytes | None:
        return None

    def session_dirs(self) -> tuple[str, ...]:
        return ()

    def read_denials(self) -> tuple[str, ...]:
        return ()

    def exposed_paths(self) -> tuple[str, ...]:
        """saphan's own files the tool reads inside the jail from under the
        hidden workspace (bound back read-only)."""
        return ()

    def credential_refused(self, name: str) -> str | None:
        """Why a permission class may not name the variable ``name`` among
        its credentials for this tool (it would control the tool itself
        rather than authenticate a command the agent runs), else None.
        tools/launch.py refuses the run before the seat."""
        return None

    def env_allowed(self) -> tuple[str, ...]:
        """Names this run may take from saphan's environment beyond
        :data:`saphan.confine.environment.BASE`: by default the permission
        class's credentials. A tool adds its own documented variables."""
        pc = self.instruction.permission_class
        return pc.credentials if pc is not None else ()

    def env_set(self) -> dict[str, str]:
        """Variables this run gets from saphan itself (by name and value),
        whatever saphan's environment holds."""
        return {}

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The built environment (``environment.build(...).env``), adjusted.
        Only ever removes: a name absent from the built one never appears."""
        return env

    def vendor_boundary(self, policy: Policy) -> Boundary | None:
        return None

    @abstractmethod
    def argv(self, policy: Policy) -> list[str]:
        """The tool's command line, without any boundary prefix."""

    def guard(self, final_argv: list[str], agent_at: int = 0) -> None:
        """The argv guard on the final command line (boundary prefix + the
        agent's argv, which starts at ``agent_at``)."""
        if self.allowed_argv is None:
            raise ValueError(f"the {self.tool or type(self).__name__} adapter declares no "
                             "allow-list (allowed_argv), so nothing it composes may launch")
        resume = self.instruction.resume
        argv_guard.check(final_argv, tool=self.tool, model=self.instruction.model,
                         resume_session=resume.session_id if resume else None,
                         allowed=self.allowed_argv, binary=self.binary.path, agent_at=agent_at)

    def record(self, policy: Policy) -> dict[str, Any]:
        i = self.instruction
        out: dict[str, Any] = {"model": i.model or "(the tool's default)"}
        if i.permission_class is not None:
            out["permission_class"] = i.permission_class.as_record()
        if i.resume is not None:
            out["resumes"] = {"run": i.resume.run_id, "session": i.resume.session_id}
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        return {}

    def after_exit(self, stdout_path: str, exit_code: int | None) -> dict[str, Any]:
        """:meth:`after_run`, knowing the tool's exit status (negative, or
        128 + N from the engine's launcher, when a signal ended it; None
        when the launcher did not report it)."""
        return self.after_run(stdout_path)

    def outcome(self, facts: dict[str, Any]) -> str | None:
        return None

    def time_limit(self) -> float | None:
        """Seconds after which the engine kills the run (None: no limit)."""
        return None


def json_events(path: str, contains: bytes = b"") -> Iterator[dict[str, Any]]:
    """Every JSON object standing on a line of its own in a tool's stdout log,
    in order (``contains``: only lines holding those bytes, a cheap filter
    before parsing); other lines are skipped, and a log that cannot be read
    yields nothing."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                line = raw.strip()
                if not line.startswith(b"{") or contains not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
    except OSError:
        return


def first_json_event(path: str, predicate: Any) -> dict[str, Any] | None:
    """The first JSON line of a tool's stdout log that satisfies ``predicate``."""
    return next((e for e in json_events(path) if predicate(e)), None)


@dataclass(frozen=True)
class CommandAdapter(Adapter):
    """A ``command`` slot: the operator's own command line, confined by the
    engine. Nothing is composed for it — the argv is the operator's (resolved
    and digested before the seat), stdin is /dev/null, the environment is the
    base allow-list plus its permission class's credentials. Of the argv
    guard only the bypass check applies (docs/tools.md): the bypass tokens
    are refused on the final command line whichever tool they belong to; the
    model, resumption and allow-list checks are for what saphan composes."""

    command: tuple[str, ...] = ()

    tool = "command"

    @property
    def stdin_path(self) -> str | None:
        return None

    def argv(self, policy: Policy) -> list[str]:
        return list(self.command)

    def guard(self, final_argv: list[str], agent_at: int = 0) -> None:
        argv_guard.check_bypass(final_argv)

    def record(self, policy: Policy) -> dict[str, Any]:
        return {}
