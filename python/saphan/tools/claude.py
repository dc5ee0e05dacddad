"""Claude Code: confined by the engine; its permission mode is policy.

Measured with Claude Code 2.1.197 (the native executable of npm
``@anthropic-ai/claude-code``):

- ``-p --output-format stream-json --verbose`` runs non-interactively and
  prints one JSON event per line; the first is ``system/init`` with the
  ``session_id`` and the ``cwd`` (``-p`` with stream-json refuses to start
  without ``--verbose``). The prompt is read from standard input.
- Under bubblewrap with only the working directory and the seat's session
  leaf ``<config home>/projects/<key>`` writable, it starts, calls the API at
  ``ANTHROPIC_BASE_URL`` and writes its transcript into that leaf
  (tests/tools/test_claude_e2e.py).
- ``--permission-mode`` (``plan`` / ``acceptEdits``) is a policy the tool
  applies to itself: composed here and recorded under ``policy``, never as
  what enforced. The engine's boundary is what enforces.
- ``--allowedTools Bash(<cmd>:*)`` is composed from the permission class's
  commands (Claude Code's own rule syntax; still policy).
- ``--resume <session id>`` appears only for ``saphan run --resume RUN``.
  A new run instead gets ``--session-id <uuid>`` minted from the run id, so
  the engine knows the id before launch: Claude Code's Bash tool creates
  ``<config home>/session-env/<session id>`` and fails with EROFS without it
  (measured), so that one directory is created outside and granted too.

With ``run.confinement = vendor`` the engine composes no boundary and the
record says, in as many words, that it makes no claim the agent is confined.

The environment (:data:`ENV_ALLOWED`, on top of confine/environment.py's
base and the permission class's credentials): Claude Code's own documented
variables that the runs saphan makes use —

- ``ANTHROPIC_API_KEY`` (``X-Api-Key``) / ``ANTHROPIC_AUTH_TOKEN``
  (``Authorization: Bearer``, for a gateway) / ``CLAUDE_CODE_OAUTH_TOKEN``
  (a subscription's long-lived token from ``claude setup-token``): how the
  seat's account authenticates; a seat logged in interactively needs none of
  them (its credentials live in the configuration directory);
- ``ANTHROPIC_BASE_URL``: the API endpoint (a gateway, or the tests'
  scripted server). Dropping it would send the key to the default endpoint;
- ``CLAUDE_CONFIG_DIR``: the configuration directory. The engine grants the
  session leaf under :func:`config_home`, read from its own environment, so
  the tool must see the same value or its transcript would land elsewhere
  (read-only, EROFS).

Model selection travels on the command line (``--model``), so no
``ANTHROPIC_MODEL``-style variable passes; anything else a seat needs (a
proxy, custom headers) is named in its permission class's ``credentials``.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan.tools.adapter import DEFAULT_AGENT_MAX_SECONDS, Adapter, first_json_event
from saphan.tools.argv_guard import AllowList, Option
from saphan.tools.permission_class import PERMISSION_MODES
from saphan.tools.session_key import session_key

if TYPE_CHECKING:
    from saphan.confine.compose import Boundary
    from saphan.confine.policy import Policy

DEFAULT_PERMISSION_MODE = "acceptEdits"

#: Claude Code's own variables a run may take from saphan's environment (see above)
ENV_ALLOWED: tuple[str, ...] = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_BASE_URL", "CLAUDE_CONFIG_DIR",
)

VENDOR_NOTE = (
    "run.confinement = vendor: the engine makes no claim that this agent is confined. "
    "saphan composed no boundary around Claude Code; whatever Claude Code does to itself "
    "is its own, unmeasured here, and its permission mode is policy, not a boundary"
)


def _uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _allowed_tool(value: str) -> bool:
    """``Bash(<command>:*)``, as :func:`compose_argv` writes a class's command."""
    return value.startswith("Bash(") and value.endswith(":*)") and len(value) > len("Bash(:*)")


#: Everything :func:`compose_argv` may emit (the argv guard's allow-list):
#: no positional word (the prompt is on stdin), and only these options.
ALLOWED_ARGV = AllowList(options={
    "-p": Option(),
    "--output-format": Option(1, frozenset({"stream-json"}), says="stream-json"),
    "--verbose": Option(),
    "--permission-mode": Option(1, frozenset({DEFAULT_PERMISSION_MODE, *PERMISSION_MODES}),
                                says=" or ".join(sorted({DEFAULT_PERMISSION_MODE,
                                                         *PERMISSION_MODES}))),
    # the value is the named model (the guard's model check compares it)
    "--model": Option(1, says="the named model"),
    "--allowedTools": Option(-1, check=_allowed_tool, says="Bash(<command>:*) rules"),
    # the value is the recorded session (the guard's resumption check compares it)
    "--resume": Option(1, says="the explicitly resumed session"),
    "--session-id": Option(1, check=_uuid, says="a UUID"),
}, required=frozenset({"-p", "--permission-mode"}))


def config_home() -> str:
    """Claude Code's configuration home: $CLAUDE_CONFIG_DIR, else ~/.claude."""
    return os.path.realpath(os.environ.get("CLAUDE_CONFIG_DIR")
                            or os.path.join(os.path.expanduser("~"), ".claude"))


def session_leaf(workdir: str) -> str:
    """This seat's session directory: ``<config home>/projects/<key>``."""
    return os.path.join(config_home(), "projects", session_key(workdir))


def compose_argv(
    binary: str,
    *,
    permission_mode: str,
    model: str | None,
    allowed_commands: tuple[str, ...] = (),
    resume_session: str | None = None,
    session_id: str | None = None,
) -> list[str]:
    """Claude Code's command line (pure). The prompt goes on stdin."""
    argv = [binary, "-p", "--output-format", "stream-json", "--verbose",
            "--permission-mode", permission_mode]
    if model is not None:
        argv += ["--model", model]
    if allowed_commands:
        argv += ["--allowedTools", *(f"Bash({c}:*)" for c in allowed_commands)]
    if resume_session is not None:
        argv += ["--resume", resume_session]
    elif session_id is not None:
        argv += ["--session-id", session_id]
    return argv


@dataclass(frozen=True)
class ClaudeAdapter(Adapter):
    tool = "claude"
    allowed_argv = ALLOWED_ARGV
    #: the engine's watchdog (seconds): at the limit the run's whole tree is
    #: ended (SIGTERM through the reaper, then SIGKILL): time-limit-killed
    max_seconds: int = DEFAULT_AGENT_MAX_SECONDS

    def time_limit(self) -> float | None:
        return float(self.max_seconds)

    @property
    def permission_mode(self) -> str:
        pc = self.instruction.permission_class
        return (pc.permission_mode if pc is not None and pc.permission_mode
                else DEFAULT_PERMISSION_MODE)

    @property
    def session_id(self) -> str:
        """This run's Claude Code session: the resumed one, or one minted
        from the run id (a fresh UUID no other run can have)."""
        resume = self.instruction.resume
        if resume is not None:
            return resume.session_id
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"saphan:run:{self.run_id}"))

    def env_allowed(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*ENV_ALLOWED, *super().env_allowed())))

    def session_dirs(self) -> tuple[str, ...]:
        if self.confinement == "vendor":
            return ()
        leaf = session_leaf(self.instruction.workdir)
        env_dir = os.path.join(config_home(), "session-env", self.session_id)
        # Created here, outside the jail: bubblewrap binds only what exists.
        for d in (leaf, env_dir):
            os.makedirs(d, exist_ok=True)
        return (leaf, env_dir)

    def vendor_boundary(self, policy: Policy) -> Boundary | None:
        if self.confinement != "vendor":
            return None
        from saphan.confine.compose import Boundary

        return Boundary(
            mechanism="vendor:claude", version=self.binary.version,
            executable=self.binary.path, executable_sha256=self.binary.sha256,
            prefix=[], policy=policy,
            extra={"engine_claim": "none", "not_restricted": VENDOR_NOTE},
        )

    def argv(self, policy: Policy) -> list[str]:
        pc = self.instruction.permission_class
        resume = self.instruction.resume
        return compose_argv(
            self.binary.path, permission_mode=self.permission_mode,
            model=self.instruction.model,
            allowed_commands=pc.commands if pc is not None else (),
            resume_session=resume.session_id if resume else None,
            session_id=self.session_id,
        )

    def record(self, policy: Policy) -> dict[str, Any]:
        out = super().record(policy)
        out["tool_policy"] = {
            "permission_mode": self.permission_mode,
            "is_boundary": False,
            "note": "Claude Code's permission mode is a policy the tool applies to itself; "
                    "it is not an operating-system boundary and is not what enforced",
        }
        if self.confinement == "vendor":
            # Nothing of the derived set is enforced: say so rather than list it.
            out["writable"] = []
            out["engine_claim"] = VENDOR_NOTE
        else:
            out["session_dir"] = session_leaf(self.instruction.workdir)
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        init = first_json_event(
            stdout_path, lambda e: e.get("type") == "system" and e.get("subtype") == "init")
        if init is None:
            return {}
        return {"agent_session": {"id": init.get("session_id"), "cwd": init.get("cwd"),
                                  "model": init.get("model"),
                                  "permission_mode": init.get("permissionMode")}}
