"""The loop's outer half: the adapter the dispatcher drives for a loop slot.

The loop is one more caller of the composer that jails agent tools
(saphan.site.local.LocalSite → confine.compose): it gets the same derived
Policy, the same bubblewrap (or Landlock) rendering, the same argv guard.
What it adds is the blinding (docs/loop.md):

- read denials, applied last by every renderer, for EVERY declared lane's
  credential file and for the lanes file that names them;
- the key crosses on a pipe: :meth:`stdin_bytes` is written into a pipe whose
  read end is the jailed loop's stdin (transport/local.py), never argv or an
  environment;
- the environment given to the jail is the base allow-list only
  (confine/environment.py: :meth:`env_allowed` adds nothing), and on top of
  that every lane's credential variable is removed by name (and any variable
  whose value holds a lane's key), including one the operator's own shell
  exported.

The engine confines the loop whatever ``run.confinement`` says: the loop has
no sandbox of its own to hand confinement to.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.lanes import Lane
from saphan.tools.adapter import Adapter
from saphan.tools.argv_guard import AllowList, Option
from saphan.tools.binaries import AgentBinary

if TYPE_CHECKING:
    from saphan.confine.policy import Policy

DEFAULT_MAX_TURNS = 50
DEFAULT_MAX_SECONDS = 1800
COMMAND_TIMEOUT = 300
RETRIES = 2
#: seconds past --max-seconds after which the engine kills a loop that has
#: not ended by itself (outcome ``time-limit-killed``)
WATCHDOG_GRACE = 30

CHANNEL_NOTE = (
    "the lane's key was read by the engine (custody-checked) and written into a pipe that is "
    "the jailed loop's stdin; the loop read it to EOF, put /dev/null on fd 0 and made itself "
    "non-dumpable before its first tool call; it never rode argv or an environment"
)
VENDOR_NOTE = (
    "run.confinement = vendor does not apply to the built-in loop: it has no sandbox of its "
    "own, so the engine confined it"
)


#: Everything :meth:`LoopAdapter.argv` emits (the argv guard's allow-list):
#: ``-I -m saphan.loop.agent`` and the spec file's absolute path.
ALLOWED_ARGV = AllowList(
    options={"-I": Option(),
             "-m": Option(1, frozenset({"saphan.loop.agent"}), says="saphan.loop.agent")},
    positionals=lambda words: len(words) == 1 and words[0].startswith("/"),
    says="one word, the spec file's absolute path",
    required=frozenset({"-I", "-m"}),
)


#: A far loop (site/far_agent.py): ``-I`` then the delivered zipapp's and the
#: spec file's absolute paths (loop/zipapp.py).
FAR_ALLOWED_ARGV = AllowList(
    options={"-I": Option()},
    positionals=lambda words: len(words) == 2 and all(w.startswith("/") for w in words),
    says="two words: the delivered zipapp's and the spec file's absolute paths",
    required=frozenset({"-I"}),
)

FAR_CHANNEL_NOTE = (
    "the lane's key was read by the engine on the control plane (custody-checked), crossed "
    "the SSH channel's stdin in the launcher's frame, and the launcher wrote it into a pipe "
    "that is the jailed loop's stdin; the loop read it to EOF, put /dev/null on fd 0 and made "
    "itself non-dumpable before its first tool call; it never rode argv, a far file or an "
    "environment"
)
FAR_FILES_NOTE = (
    "the lanes file and every lane's credential file are on the control plane only: nothing "
    "of them is on the runner (Landlock denies no reads there)"
)


def interpreter(path: str | None = None) -> AgentBinary:
    """The Python that runs the loop inside the jail: this one (or the
    slot's ``--agent-path``), digested."""
    from saphan import __version__, _native

    if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        from saphan import refusals

        raise refusals.agent_binary_missing(
            f"the slot's agent path {path} (the loop's Python) is not an executable file on "
            "this machine", "point the slot at a Python that has saphan installed (`saphan "
            "slot set MACHINE SLOT --agent-path PATH`)")
    # a venv's bin/python must stay the venv's: not resolved
    path = os.path.abspath(path if path is not None else sys.executable)
    return AgentBinary("loop", path, _native.sha256_file(os.path.realpath(path)),
                       f"saphan {__version__} loop on Python {platform.python_version()}")


#: every end the loop names (loop/agent.py, loop/client.py; docs/loop.md's table)
ENDS = frozenset({
    "finished", "turn-budget-exhausted", "time-budget-exhausted", "model-malformed",
    "model-auth-rejected", "model-rate-limited", "model-request-rejected", "model-server-error",
    "model-timeout", "model-unreachable", "key-channel-broken",
})


@dataclass(frozen=True)
class LoopAdapter(Adapter):
    lane: Lane
    #: the lane's key; never in repr, argv, environment or record
    secret: bytes = field(repr=False)
    #: every lane credential file and the lanes file (read-denied in the jail)
    hidden: tuple[str, ...] = ()
    #: every lane's credential variable (never in the jail's environment)
    scrub_env: tuple[str, ...] = ()
    #: every lane's key: no variable holding one reaches the jail, whatever its name
    scrub_values: tuple[bytes, ...] = field(default=(), repr=False)
    spec_path: str = ""
    out_dir: str = ""
    max_turns: int = DEFAULT_MAX_TURNS
    max_seconds: int = DEFAULT_MAX_SECONDS
    #: a far run: the runner's name and the delivered zipapp there (its spec
    #: is written into the run's far control directory by the far script,
    #: its result read back from ``out_dir`` there: site/ssh.py)
    far_machine: str | None = None
    far_zipapp: str | None = None
    far_prompt: str = field(default="", repr=False)

    tool = "loop"
    allowed_argv = ALLOWED_ARGV

    @property
    def stdin_path(self) -> str | None:
        return None

    def stdin_bytes(self) -> bytes | None:
        return self.secret

    def read_denials(self) -> tuple[str, ...]:
        return self.hidden

    def exposed_paths(self) -> tuple[str, ...]:
        # The loop's spec (written by argv(), in the hidden run directory).
        return (self.spec_path,)

    def env_allowed(self) -> tuple[str, ...]:
        # Nothing beyond the base: the key crosses on a pipe, and a permission
        # class's credentials are not used by the loop (docs/loop.md).
        return ()

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        # Defence in depth on the built (allow-listed) environment: no lane's
        # variable by name, and no variable whose value holds a lane's key.
        from saphan.loop.agent import scrubbed

        return scrubbed(env, self.scrub_env,
                        [k.decode("ascii") for k in (self.secret, *self.scrub_values)])

    def spec_bytes(self, policy: Policy) -> bytes:
        """The loop's spec (its task and lane; never the key), as written."""
        return (json.dumps(self._spec(policy), indent=2, sort_keys=True) + "\n").encode()

    def _spec(self, policy: Policy) -> dict[str, Any]:
        pc = self.instruction.permission_class
        prompt = (self.far_prompt if self.far_machine is not None
                  else Path(self.instruction.prompt_path).read_text(encoding="utf-8"))
        return {
            "lane": self.lane.name, "base_url": self.lane.base_url, "model": self.lane.model,
            "timeout": self.lane.timeout, "retries": RETRIES,
            "prompt": prompt,
            "workdir": policy.workdir,
            "allowed_commands": list(pc.commands) if pc is not None else None,
            # an allowed command resolving in here is refused (loop/tools.py)
            "writable": list(policy.writable_dirs),
            "max_turns": self.max_turns, "max_seconds": self.max_seconds,
            "command_timeout": COMMAND_TIMEOUT, "scrub_env": list(self.scrub_env),
            "transcript": os.path.join(self.out_dir, "transcript.jsonl"),
            "result": os.path.join(self.out_dir, "loop-result.json"),
        }

    def argv(self, policy: Policy) -> list[str]:
        if self.far_machine is not None:
            assert self.far_zipapp is not None
            return [self.binary.path, "-I", self.far_zipapp, self.spec_path]
        # Written outside the writable set (the run directory): the loop reads it.
        with open(self.spec_path, "wb") as f:
            f.write(self.spec_bytes(policy))
        return [self.binary.path, "-I", "-m", "saphan.loop.agent", self.spec_path]

    def guard(self, final_argv: list[str], agent_at: int = 0) -> None:
        if self.far_machine is None:
            super().guard(final_argv, agent_at)
            return
        from saphan.tools import argv_guard

        argv_guard.check(final_argv, tool=self.tool, model=self.instruction.model,
                         resume_session=None, allowed=FAR_ALLOWED_ARGV,
                         binary=self.binary.path, agent_at=agent_at)

    def record(self, policy: Policy) -> dict[str, Any]:
        out = super().record(policy)
        out["model"] = self.lane.model
        out["lane"] = {"name": self.lane.name, "base_url": self.lane.base_url,
                       "model": self.lane.model, "credential_env": self.lane.credential_env}
        out["blinding"] = {
            # denied by name, or hidden with saphan's workspace (lanes.toml)
            "read_denied": [p for p in self.hidden if p in policy.read_denials
                            or any(p == h or p.startswith(h.rstrip("/") + "/")
                                   for h in policy.hidden_dirs)],
            "env_scrubbed": list(self.scrub_env),
            "credential_channel": CHANNEL_NOTE,
        }
        if self.far_machine is not None:
            out["blinding"].update({"read_denied": [], "lane_files": FAR_FILES_NOTE,
                                    "credential_channel": FAR_CHANNEL_NOTE})
            out["zipapp"] = self.far_zipapp
        out["budgets"] = {"max_turns": self.max_turns, "max_seconds": self.max_seconds,
                          "command_timeout": COMMAND_TIMEOUT, "model_retries": RETRIES,
                          "engine_kills_at_seconds": self.max_seconds + WATCHDOG_GRACE}
        if self.confinement == "vendor":
            out["confinement_note"] = VENDOR_NOTE
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        if self.far_machine is not None:
            return {}  # read back from the runner (site/ssh.py: facts_from)
        from saphan.confine import nofollow
        from saphan.errors import PlantedLink

        # out/ is the run's to write: read without following a link, never
        # blocking on a FIFO, bounded; only a JSON object is taken.
        try:
            raw: bytes | None = nofollow.read_small(
                os.path.join(self.out_dir, "loop-result.json"), 1 << 20)
        except (OSError, PlantedLink):
            raw = None
        return self.facts_from(raw)

    def facts_from(self, raw: bytes | None) -> dict[str, Any]:
        """The record's facts from the loop's result file (its bytes as read,
        here or on the runner; None: none could be read)."""
        transcript = os.path.join(self.out_dir, "transcript.jsonl")
        try:
            if raw is None:
                raise ValueError("no result file")
            result = json.loads(raw)
            if not isinstance(result, dict):
                raise ValueError("not a JSON object")
        except ValueError:
            return {"loop": {"end": None, "transcript": transcript,
                             "detail": "the loop wrote no result (it did not finish its "
                                       "bookkeeping; see stderr.log)"}}
        from saphan.tools import usage

        got_tokens, got_models = result.get("tokens"), result.get("models")
        tokens: dict[str, Any] = got_tokens if isinstance(got_tokens, dict) else {}
        models: list[Any] = got_models if isinstance(got_models, list) else []
        return {"loop": {**result, "transcript": transcript},
                "usage": usage.record(
                    models=models,
                    tokens={"input": tokens.get("prompt"), "output": tokens.get("completion")},
                    cost_usd=None, reported_by="loop's result file (the endpoint's usage "
                                               "and model fields)")}

    def time_limit(self) -> float | None:
        # The loop keeps its own budget; this is the engine's backstop.
        return float(self.max_seconds + WATCHDOG_GRACE)

    def outcome(self, facts: dict[str, Any]) -> str | None:
        """The loop's end as the run's outcome: only a name of :data:`ENDS`.
        The result file is in the run's writable return path (a process the
        run left could rewrite it before the reaper ends it: measured by
        review), so anything else is ``loop-result-unreadable``, never passed
        on as it came."""
        end = (facts.get("loop") or {}).get("end")
        if end is None or end == "finished":
            return None
        return end if end in ENDS else "loop-result-unreadable"
