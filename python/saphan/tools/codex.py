"""Codex CLI: it confines itself; the engine composes that sandbox tightly.

Codex applies its own sandbox (bubblewrap + seccomp on Linux) to every
command the model runs, so the engine's bubblewrap cannot nest around it and
the engine composes NO boundary of its own here. Instead every setting that
shapes Codex's sandbox is pinned on the command line for each run (the
command line outranks every config file), validated by ``--strict-config``.

Measured against codex-cli 0.169.0 (tests/tools/test_codex_sandbox.py runs
each of these for real):

- The legacy ``sandbox_workspace_write.exclude_slash_tmp`` /
  ``exclude_tmpdir_env_var`` keys do NOT shape the built-in ``:workspace``
  permission profile: ``/tmp`` and ``$TMPDIR`` stayed writable. So the engine
  does not use ``:workspace`` or the legacy keys at all. It defines a
  permission profile of its own, named per run (``saphan-<run id>``), and
  selects it with ``default_permissions``. A per-run name matters: a config
  file that defines ``[permissions.<name>.filesystem]`` under a name the
  command line also uses is MERGED with it (measured: a file's ``"/" =
  "write"`` survived next to the command line's entries), and no file can
  know a name minted for this run.
- The profile: ``":root" = "read"`` (reads everywhere, as every boundary
  here); ``":slash_tmp" = "read"`` (``/tmp`` not writable — measured refused);
  the working directory (``":workspace_roots"."."``) writable; the run's
  return path and the derived git grants (per-worktree git dir, objects,
  the branch namespace's refs and logs — the same grants the engine's
  boundary derives) writable, so a commit on a linked worktree works
  (measured); the read denials (the workspace's record key and config)
  ``"none"``; ``network.enabled = false`` (measured: a socket from inside
  fails with EPERM).
- ``$TMPDIR``: the agent's TMPDIR is the run's scratch directory inside the
  working directory; ``:tmpdir`` is deliberately not granted, so the
  invoking process's own TMPDIR is not writable (measured). (Pinning
  ``":tmpdir" = "read"`` would make the scratch directory read-only: the
  more specific entry wins.)
- ``.git`` of the working directory itself stays read-only (Codex's own
  default, and the engine's): run with ``--repo`` to commit.
- ``approval_policy = "never"``: no escalation to an unsandboxed retry.
- ``model``: the named model, exactly once; ``model_provider`` pinned too.

The environment (:meth:`CodexAdapter.env_allowed`, on top of
confine/environment.py's base and the permission class's credentials):

- ``CODEX_HOME``: Codex's state, configuration and login (``auth.json``);
  the record names it from saphan's environment, so the tool must see the
  same one;
- with a provider pinned from the workspace's ``[codex]`` table: that
  provider's ``env_key`` and nothing else — the pinned provider is the only
  one the run talks to;
- without one (the built-in ``openai`` provider): ``OPENAI_API_KEY`` (its
  key), ``CODEX_API_KEY`` (the key Codex documents for ``codex exec``) and
  ``OPENAI_BASE_URL`` (its endpoint override: dropping it would send the key
  to the default endpoint). A seat logged in with ``codex login`` needs none
  of them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saphan.tools.adapter import DEFAULT_AGENT_MAX_SECONDS, Adapter, first_json_event
from saphan.tools.argv_guard import AllowList, Option, toml_value

if TYPE_CHECKING:
    from saphan.confine.compose import Boundary
    from saphan.confine.policy import Policy

NOT_RESTRICTED = (
    "Codex's own sandbox confines only the commands the model runs. Outside it: the codex "
    "process itself (it writes its own state under CODEX_HOME), its helper services (MCP "
    "servers, the code-mode host) and its hooks, which can write wherever this user can; all "
    "reads (everything this user can read, except the read denials listed); and Codex's own "
    "traffic to its model provider. On a kernel without the facilities Codex needs, its "
    "behaviour is not documented and not measured here"
)


#: Codex's own variables for the built-in ``openai`` provider (see above)
OPENAI_ENV: tuple[str, ...] = ("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL")


@dataclass(frozen=True)
class Provider:
    """A model provider pinned on the command line (workspace config [codex])."""

    base_url: str
    env_key: str
    wire_api: str = "responses"
    name: str = "saphan"


def toml_str(value: str) -> str:
    """A TOML basic string (JSON's escaping is a subset TOML accepts)."""
    return json.dumps(value, ensure_ascii=False)


def profile_name(run_id: str) -> str:
    return f"saphan-{run_id.lower()}"


def filesystem_entries(policy: Policy) -> list[tuple[str, str]]:
    """(path or special, access) for the run's profile, from the derived policy."""
    entries: list[tuple[str, str]] = [(":root", "read"), (":slash_tmp", "read")]
    # saphan's workspaces: unreadable; the run's own paths under them are
    # granted below (the most specific entry wins — measured with 0.169.0).
    for d in policy.hidden_dirs:
        entries.append((d, "none"))
    for d in policy.writable_dirs:
        if d != policy.workdir:
            entries.append((d, "write"))
    for d in policy.readonly_dirs:
        entries.append((d, "read"))
    for p in policy.read_denials:
        entries.append((p, "none"))
    return entries


def settings(
    policy: Policy,
    *,
    run_id: str,
    model: str | None,
    network: str = "off",
    provider: Provider | None = None,
) -> list[tuple[str, str]]:
    """Every pinned setting as (key, TOML value), in command-line order."""
    name = profile_name(run_id)
    fs = ", ".join(f"{toml_str(p)} = {toml_str(a)}" for p, a in filesystem_entries(policy))
    fs += ', ":workspace_roots" = { "." = "write" }'
    enabled = "true" if network == "open" else "false"
    out = [
        ("default_permissions", toml_str(name)),
        (f"permissions.{name}", f"{{ filesystem = {{ {fs} }}, network = {{ enabled = {enabled} }} }}"),
        ("approval_policy", toml_str("never")),
    ]
    if model is not None:
        out.append(("model", toml_str(model)))
    if provider is not None:
        out.append(("model_provider", toml_str(provider.name)))
        out.append((f"model_providers.{provider.name}",
                    f"{{ name = {toml_str(provider.name)}, base_url = {toml_str(provider.base_url)}, "
                    f"env_key = {toml_str(provider.env_key)}, wire_api = {toml_str(provider.wire_api)} }}"))
    else:
        out.append(("model_provider", toml_str("openai")))
    return out


def compose_argv(
    binary: str,
    policy: Policy,
    *,
    run_id: str,
    model: str | None,
    network: str = "off",
    provider: Provider | None = None,
    resume_session: str | None = None,
) -> list[str]:
    """Codex's command line (pure). The prompt goes on stdin (``-``)."""
    argv = [binary, "exec", "--strict-config", "--json", "--skip-git-repo-check",
            "-C", policy.workdir]
    for key, value in settings(policy, run_id=run_id, model=model, network=network,
                               provider=provider):
        argv += ["-c", f"{key}={value}"]
    if resume_session is not None:
        argv += ["resume", resume_session]
    argv.append("-")
    return argv


_PROFILE = re.compile(r"saphan-[a-z0-9-]+")
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ACCESS = frozenset({"read", "write", "none"})


def _profile_table(value: Any) -> bool:
    """A per-run permission profile as :func:`settings` writes it: ``:root``
    and ``:slash_tmp`` read, the working directory's roots writable, every
    other entry an absolute path other than ``/`` with a declared access, and
    the network on or off."""
    if not isinstance(value, dict) or set(value) != {"filesystem", "network"}:
        return False
    fs, net = value["filesystem"], value["network"]
    if not isinstance(fs, dict) or fs.get(":root") != "read" or fs.get(":slash_tmp") != "read":
        return False
    if fs.get(":workspace_roots") != {".": "write"}:
        return False
    for path, access in fs.items():
        if path in (":root", ":slash_tmp", ":workspace_roots"):
            continue
        if (not path.startswith("/") or os.path.normpath(path) == "/"
                or access not in _ACCESS):
            return False
    return (isinstance(net, dict) and set(net) == {"enabled"}
            and isinstance(net["enabled"], bool))


def _provider_table(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"name", "base_url", "env_key", "wire_api"}
            and all(isinstance(v, str) for v in value.values()))


def _is_str(pattern: re.Pattern[str] | None = None, *, only: str | None = None) -> Any:
    def ok(value: Any) -> bool:
        return (isinstance(value, str) and (only is None or value == only)
                and (pattern is None or pattern.fullmatch(value) is not None))
    return ok


#: The config keys :func:`settings` pins, as (key pattern, value validator).
ALLOWED_SETTINGS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"default_permissions"), _is_str(_PROFILE)),
    (re.compile(r"permissions\.saphan-[a-z0-9-]+"), _profile_table),
    (re.compile(r"approval_policy"), _is_str(only="never")),
    (re.compile(r"model"), _is_str()),  # the named model: the guard's model check compares it
    (re.compile(r"model_provider"), _is_str(_NAME)),
    (re.compile(r"model_providers\.[A-Za-z0-9_-]+"), _provider_table),
)


def _setting_key(operand: str) -> str:
    return operand.partition("=")[0]


def allowed_setting(operand: str) -> bool:
    """A ``-c`` operand :func:`settings` could have written: a pinned key with
    a value of the shape it writes (parsed as TOML, as Codex parses it)."""
    key, sep, value = operand.partition("=")
    if not sep:
        return False
    check = next((c for p, c in ALLOWED_SETTINGS if p.fullmatch(key)), None)
    return check is not None and bool(check(toml_value(value)))


def _positionals(words: tuple[str, ...]) -> bool:
    if words == ("exec", "-"):
        return True
    return (len(words) == 4 and words[:2] == ("exec", "resume") and words[3] == "-"
            and bool(words[2]))


#: Everything :func:`compose_argv` may emit (the argv guard's allow-list):
#: ``exec`` … ``[resume <session>] -`` and only these options. No
#: ``--add-dir``, ``-s``/``--sandbox``, ``-p``/``--profile``, ``--enable``: the
#: sandbox is the per-run profile pinned with ``-c``, and nothing else.
ALLOWED_ARGV = AllowList(
    options={
        "--strict-config": Option(),
        "--json": Option(),
        "--skip-git-repo-check": Option(),
        "-C": Option(1, check=lambda d: d.startswith("/") and os.path.normpath(d) != "/",
                     says="the working directory (an absolute path, not /)"),
        "-c": Option(1, check=allowed_setting, once=False, unique=_setting_key,
                     says="one of the pinned settings (" + ", ".join(
                         p.pattern.replace("\\", "") for p, _ in ALLOWED_SETTINGS)
                     + "), each once, with the value shape the adapter writes"),
    },
    positionals=_positionals,
    says="exec [resume <session>] -",
    required=frozenset({"--strict-config", "-C", "-c"}),
)


@dataclass(frozen=True)
class CodexAdapter(Adapter):
    tool = "codex"
    allowed_argv = ALLOWED_ARGV
    provider: Provider | None = field(default=None)
    #: the engine's watchdog (seconds): at the limit the run's whole tree is
    #: ended (SIGTERM through the reaper, then SIGKILL): time-limit-killed
    max_seconds: int = DEFAULT_AGENT_MAX_SECONDS

    def time_limit(self) -> float | None:
        return float(self.max_seconds)

    @property
    def network(self) -> str:
        pc = self.instruction.permission_class
        return pc.network if pc is not None else "off"

    def env_allowed(self) -> tuple[str, ...]:
        keys = (self.provider.env_key,) if self.provider is not None else OPENAI_ENV
        return tuple(dict.fromkeys(("CODEX_HOME", *keys, *super().env_allowed())))

    def vendor_boundary(self, policy: Policy) -> Boundary | None:
        from saphan.confine.compose import STATUS_FD, Boundary, reaper_prefix

        pinned = settings(policy, run_id=self.run_id, model=self.instruction.model,
                          network=self.network, provider=self.provider)
        # Not a boundary around Codex (its own sandbox is the boundary): a
        # subreaper, so no helper Codex starts (its fs-helper daemon was seen
        # alive an hour after its run) outlives the run.
        prefix, reaper = reaper_prefix()
        return Boundary(
            mechanism="vendor:codex", version=self.binary.version,
            executable=self.binary.path, executable_sha256=self.binary.sha256,
            prefix=prefix, policy=policy, status_fd=STATUS_FD,
            extra={
                **reaper,
                "enforced": "the vendor's sandbox (Codex CLI's own bubblewrap + seccomp), "
                            "not the engine's",
                "pinned_settings": [f"{k}={v}" for k, v in pinned],
                "validated_by": "--strict-config",
                "tmp": "/tmp is not writable (\":slash_tmp\" = \"read\"); the agent's TMPDIR is "
                       f"the scratch dir {policy.scratch_dir} inside the working directory; "
                       "the invoking TMPDIR is not granted",
                "network": "commands' network access "
                           + ("enabled (permission class: open)" if self.network == "open"
                              else "disabled"),
                "not_restricted": NOT_RESTRICTED,
            },
        )

    def argv(self, policy: Policy) -> list[str]:
        resume = self.instruction.resume
        return compose_argv(
            self.binary.path, policy, run_id=self.run_id, model=self.instruction.model,
            network=self.network, provider=self.provider,
            resume_session=resume.session_id if resume else None,
        )

    def record(self, policy: Policy) -> dict[str, Any]:
        out = super().record(policy)
        out["codex_home"] = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        started = first_json_event(stdout_path, lambda e: e.get("type") == "thread.started")
        if started is None:
            return {}
        return {"agent_session": {"id": started.get("thread_id")}}
