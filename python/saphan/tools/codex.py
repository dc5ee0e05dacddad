"""Codex CLI: it confines itself; the engine composes that sandbox tightly.

Codex applies its own sandbox (bubblewrap + seccomp on Linux) to every
command the model runs, so the engine's bubblewrap cannot nest around it and
the engine composes NO boundary of its own here. Instead every setting that
shapes Codex's sandbox is pinned on the command line for each run (the
command line outranks every config file), validated by ``--strict-config``.

Measured against codex-cli 0.169.0 (tests/tools/test_codex.py runs each of
these for real):

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

Nothing from the project's or the user's config widens or reroutes the run
(each measured against codex-cli 0.169.0 and its scripted Responses server;
tests/tools/test_codex.py plants each config and runs it for real):

- ``model``: always pinned — the named model, else :data:`DEFAULT_MODEL`
  (``gpt-6.1-sol``: what 0.169.0 requested with no model named, with the
  built-in ``openai`` provider and with a provider of saphan's alike). With
  none pinned, a ``model = …`` in the user's config chose the run's model
  while the record said "the tool's default". The record's ``model`` names
  the pinned one; the guard checks the line against it.
- ``model_provider``: the slot's endpoint or the workspace's ``[codex]``
  table as a provider named per run (``saphan-<run id>``): a config file's
  ``[model_providers.NAME]`` is MERGED with the command line's table of that
  name (measured: the file's ``query_params``, ``http_headers`` and
  ``env_http_headers`` — an environment value sent as a header — reached the
  requests). Without one, Codex's built-in ``openai`` provider (a file cannot
  redefine it: ``[model_providers.openai]`` is refused by Codex).
- ``openai_base_url = "https://api.openai.com/v1"``, always: the user's
  config's ``openai_base_url`` rerouted the built-in provider, key and all,
  to another server; the command line's value wins (that server then got no
  request). ``OPENAI_BASE_URL`` in the environment is not read by 0.169.0
  (measured: the traffic went to api.openai.com), so saphan refuses a run
  without an endpoint of its own while it is set (the key would go elsewhere
  than the operator meant) and never passes it. A seat logged in with a
  ChatGPT account (no API key) would use ``chatgpt.com/backend-api/codex``;
  pinned, it is sent to the API endpoint too.
- ``projects``: the working directory and every directory above it,
  ``trust_level = "untrusted"``. When the user's config trusted the
  repository, Codex loaded its ``.codex/config.toml``, and an
  ``[mcp_servers]`` command there ran outside Codex's sandbox: from the
  working directory, from a parent of a subdirectory up to the repository's
  root (pinning only the working directory did not stop that one), and for a
  linked worktree from the main repository's root (a file an agent committed
  on the branch with git plumbing). Codex decides each ``.codex`` directory
  from that directory's own entry first, so the whole chain is pinned. The
  paths ride inside one table value: Codex splits a ``-c`` KEY at every dot,
  quotes or not (``projects."/a.b".trust_level`` was refused as an unknown
  field), while a value is parsed as TOML (the table is merged with the
  files'). :func:`toml_str` escapes what TOML requires (quotes, backslash,
  controls, DEL); a working directory that is not valid UTF-8 is refused.
- ``agents.enabled = false``, ``features.multi_agent = false``,
  ``features.multi_agent_v2 = false``: no sub-agents. ``spawn_agent
  {"model": …}`` started an agent whose requests named the other model.
  ``features.multi_agent = false`` alone did not remove the tool from
  ``gpt-6.1-sol`` (its catalog entry turns multi-agent v2 on);
  ``[agents] enabled = false`` did, but a user config's ``multi_agent_v2 =
  true`` outranked it — so all three. Pinned, the tool is not offered and a
  call to it anyway returns "unsupported call".
- ``shell_environment_policy``: what the commands Codex runs see —
  ``inherit = "all"`` then ``include_only`` the base names
  (confine/environment.py), the names saphan sets for the run, a ``--repo``
  run's git object variables and the class's credentials; ``exclude`` every
  provider key (the pinned provider's ``env_key``, ``OPENAI_API_KEY``,
  ``CODEX_API_KEY``), which wins over ``include_only`` even when a class
  names one. By default Codex handed its whole environment on (the provider
  key reached ``env``); a user config's ``include_only = ["*"]``, ``set`` or
  ``filters`` did not widen the pinned lists. Codex adds its own ``CODEX_*``
  names, and its login shell (``bash -lc``) runs the user's profile.

- ``notify = []``: the user's ``notify`` program ran after every turn
  outside Codex's sandbox, with the run's environment (it read saphan's record
  key through ``$SAPHAN_RETURN_PATH/../../../record.key``); pinned empty, it
  does not run.
- ``mcp_servers.<name>.enabled = false`` for every ``[mcp_servers.<name>]``
  of ``$CODEX_HOME/config.toml`` (:func:`configured_mcp_servers`, read with
  tomllib before the seat; the guard reads it again right before launch): the
  user's MCP servers started outside the sandbox; pinned off, they do not. A
  name a ``-c`` key cannot spell (outside ``[A-Za-z0-9_-]``: Codex splits the
  key at every dot) is refused before the seat, naming the entry. Only that
  file is read for them (not ``[profiles.*]``); ``/etc/codex`` is refused
  (next).
- ``/etc/codex`` (the machine's config, read whatever ``CODEX_HOME`` says):
  ``managed_config.toml`` OUTRANKS the command line (measured: its
  ``notify``, ``[mcp_servers.x]`` and ``model_provider = "evilprov"`` all
  took effect — the key went to another server while the record named the
  slot's endpoint), ``config.toml`` adds MCP servers, ``requirements.toml``
  constrains the choices. No pin holds against that, so
  :func:`check_system_config` refuses the run before the seat when any of
  them sets a key of :data:`SYSTEM_REFUSED` (or cannot be read or parsed):
  ask the machine's administrator, or run elsewhere.
- ``features.plugins = false``: a plugin enabled in ``$CODEX_HOME/config.toml``
  (``[plugins."demo@local"] enabled = true``, its ``plugin.json`` under
  ``$CODEX_HOME/plugins/cache/…`` naming an ``.mcp.json``) started that MCP
  server outside the sandbox; with the feature pinned off it did not
  (measured).
- Hooks (``hooks.json``, ``[hooks]``, ``features.codex_hooks``) are not
  pinned: a command hook from either place, feature on, did not run in
  ``codex exec`` (Codex: "hooks need review before they can run" — a review
  in the interactive TUI, whose stored trust was not measured).

The guard holds the line to these: :data:`ALLOWED_SETTINGS` validates each
value's shape, :data:`REQUIRED_SETTINGS` must all be present, and every MCP
server of the user's config must be pinned off.

Before the seat (:meth:`CodexAdapter.checked`, from tools/launch.py): a
``CODEX_HOME`` (resolved) inside the working directory or another directory
the run may write, or around one, is refused — measured: with
``CODEX_HOME=<workdir>/state`` a run planted ``notify`` in its config.toml
and the next run's codex process ran it outside the sandbox; checked again
against the derived policy's writable directories when the boundary is
composed. A permission class's credentials reach the codex process itself,
so :meth:`CodexAdapter.credential_refused` names those Codex or its libraries
read (``CODEX_*`` — ``CODEX_EXEC_SERVER_URL`` sent command execution to an
executor of the class's choosing, measured —, ``OPENAI_*``, proxy and CA
variables, ``RUST_LOG``, loader variables, ``PATH``-likes); tools/launch.py
refuses the run. The provider's ``base_url`` goes through
:func:`saphan.fleet.slots.check_endpoint` when a :class:`Provider` is built
(and when the workspace config is read): no credentials in it (they reached
the record), no query, plain http only to loopback.

The environment (:meth:`CodexAdapter.env_allowed`, on top of
confine/environment.py's base and the permission class's credentials):

- ``CODEX_HOME``: Codex's state, configuration and login (``auth.json``);
  the record names it from saphan's environment, so the tool must see the
  same one;
- with a provider of saphan's: that provider's ``env_key`` and nothing else
  — the pinned provider is the only one the run talks to;
- without one (the built-in ``openai`` provider): ``OPENAI_API_KEY`` (its
  key) and ``CODEX_API_KEY`` (the key Codex documents for ``codex exec``). A
  seat logged in with ``codex login --with-api-key`` needs neither.

The record's ``usage`` (:func:`usage_of`) sums Codex's ``turn.completed``
events: ``input_tokens`` (which include the cached ones, as the Responses API
counts them: two requests of 100 input, 40 cached, gave 200 and 80),
``cached_input_tokens``, ``output_tokens`` (reasoning included). Its
``cache_write_input_tokens`` (0 in every run measured: what it counts is not
measurable against a scripted server) is not recorded. Codex's events name
no model, so ``models`` is empty; it reports no cost.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.tools import argv_guard
from saphan.tools.adapter import (
    DEFAULT_AGENT_MAX_SECONDS,
    Adapter,
    first_json_event,
    json_events,
)
from saphan.tools.argv_guard import AllowList, Option, toml_value

if TYPE_CHECKING:
    from saphan.confine.compose import Boundary
    from saphan.confine.policy import Policy

NOT_RESTRICTED = (
    "Codex's own sandbox confines only the commands the model runs. Outside it: the codex "
    "process itself (it writes its own state under CODEX_HOME), its helper programs (MCP "
    "servers, the notify program, the code-mode host, hooks), which can read what this user "
    "can read (saphan's record key included) and write wherever this user can; saphan pins "
    "notify off and every MCP server of the user's config.toml off, and refuses a CODEX_HOME "
    "the run could write; all reads of the codex process (everything this user can read, "
    "except the read denials listed); and Codex's own traffic to its model provider. On a "
    "kernel without the facilities Codex needs, its behaviour is not documented and not "
    "measured here"
)

#: What codex-cli 0.169.0 requests when no model is named — with the built-in
#: ``openai`` provider (API key) and with a provider of saphan's alike
#: (measured). saphan pins it, so the record names the model that ran.
DEFAULT_MODEL = "gpt-6.1-sol"
#: The built-in ``openai`` provider's endpoint for an API key, pinned as
#: ``openai_base_url`` so no config file can reroute that provider.
OPENAI_BASE_URL = "https://api.openai.com/v1"
#: The keys that reach Codex for the built-in ``openai`` provider.
OPENAI_ENV: tuple[str, ...] = ("OPENAI_API_KEY", "CODEX_API_KEY")
#: The names saphan itself sets for every run (site/local.py), which commands see.
RUN_SET = ("TMPDIR", "SAPHAN_RUN_ID", "SAPHAN_RETURN_PATH")


@dataclass(frozen=True)
class Provider:
    """A model provider pinned on the command line (the slot's endpoint, or
    the workspace config's ``[codex]`` table)."""

    base_url: str
    env_key: str
    wire_api: str = "responses"
    name: str = "saphan"

    def __post_init__(self) -> None:
        # Again wherever it comes from (a slot's row or the workspace's
        # [codex] table): no credentials, no query, plain http only to loopback.
        from saphan.endpoints import check_endpoint_masked

        check_endpoint_masked(self.base_url, "the Codex provider's base_url")


def codex_home() -> str:
    """The CODEX_HOME the run uses (saphan passes its own on)."""
    return os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")


#: An MCP server name saphan can pin off with ``-c mcp_servers.NAME.enabled``
#: (Codex splits a -c key at every dot, quotes or not: measured).
_MCP_NAME = re.compile(r"[A-Za-z0-9_-]+")


def configured_mcp_servers(home: str | None = None) -> tuple[str, ...]:
    """The ``[mcp_servers]`` names of ``$CODEX_HOME/config.toml`` (the
    operator's file), each pinned off on the command line: Codex starts an
    MCP server outside its sandbox (measured with 0.169.0). A name a ``-c`` key
    cannot spell is refused (UserError), as is a file Codex could not parse."""
    path = os.path.join(home or codex_home(), "config.toml")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return ()
    except OSError as e:
        raise UserError(f"{path}: cannot read Codex's config ({e.strerror}); saphan reads it "
                        "to pin its MCP servers off; make it readable or remove it") from None
    return mcp_servers_of(path, raw)


def mcp_servers_of(path: str, raw: bytes | None) -> tuple[str, ...]:
    """:func:`configured_mcp_servers` of a config file's bytes (read on this
    machine or, for a far run, on the runner; None: it could not be read)."""
    if raw is None:
        raise UserError(f"{path}: cannot read Codex's config; saphan reads it to pin its MCP "
                        "servers off; make it readable or remove it")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{path}: Codex's config is not valid TOML ({e}); saphan reads it to "
                        "pin its MCP servers off; fix the file") from None
    servers = data.get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise UserError(f"{path}: mcp_servers is not a table; fix the file")
    for name in servers:
        if not _MCP_NAME.fullmatch(name):
            raise UserError(
                f"{path}: [mcp_servers.{toml_str(name)}]: Codex starts an MCP server outside "
                "its sandbox, so saphan pins every one off on the command line "
                "(-c mcp_servers.NAME.enabled=false), and Codex splits that key at every dot "
                f"(quotes or not), so the name {name!r} cannot be pinned; rename the server "
                "(letters, digits, _ and - only) or remove it from that file")
    return tuple(servers)


#: The machine's Codex configuration directory (codex-cli 0.169.0 reads it
#: whatever CODEX_HOME says). A parameter of :func:`check_system_config`, so
#: a test points it elsewhere; never taken from the environment.
SYSTEM_DIR = "/etc/codex"
#: Its files: ``managed_config.toml`` outranks the command line's ``-c``
#: (measured: a managed ``notify``, ``[mcp_servers.x]`` and ``model_provider``
#: all took effect over saphan's pins), ``config.toml`` adds MCP servers, and
#: ``requirements.toml`` constrains what the command line may choose.
SYSTEM_FILES = ("managed_config.toml", "config.toml", "requirements.toml")
#: Top-level keys saphan refuses in any of those files: each chooses the
#: model, the provider or its endpoint, starts a program outside Codex's
#: sandbox, or shapes the sandbox, the trust or the commands' environment.
SYSTEM_REFUSED = frozenset({
    "model_provider", "model_providers", "openai_base_url", "chatgpt_base_url", "model",
    "notify", "mcp_servers", "plugins", "hooks", "features", "agents",
    "shell_environment_policy", "sandbox_mode", "approval_policy", "default_permissions",
    "permissions", "profile", "profiles", "projects",
})


_SYSTEM_FIX = ("ask the machine's administrator to remove it, or run Codex on another machine "
               "(saphan's pins on the command line do not hold against it)")


def check_system_config(system_dir: str = SYSTEM_DIR) -> None:
    """Before the seat: refuse (UserError) a machine whose Codex
    configuration (``system_dir``'s :data:`SYSTEM_FILES`) sets any key of
    :data:`SYSTEM_REFUSED` — saphan's pins on the command line do not hold
    against ``managed_config.toml`` (measured with 0.169.0: its ``notify``,
    MCP server and ``model_provider`` took effect, the key went to another
    server while the record named the slot's endpoint). A file present but
    not readable or not valid TOML is refused too."""
    fix = _SYSTEM_FIX
    for name in SYSTEM_FILES:
        path = os.path.join(system_dir, name)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UserError(f"{path}: cannot read the machine's Codex config ({e.strerror}); "
                            f"Codex reads it, so saphan must check it; {fix}") from None
        check_system_file(path, raw)


def check_system_file(path: str, raw: bytes | None, where: str = "") -> None:
    """One file of :func:`check_system_config`, as read on this machine or,
    for a far run, on the runner ``where`` (None: it could not be read)."""
    fix = _SYSTEM_FIX
    if where:
        path = f"{path} on {where}"
    if raw is None:
        raise UserError(f"{path}: cannot read the machine's Codex config; Codex reads it, so "
                        f"saphan must check it; {fix}")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{path}: the machine's Codex config is not valid TOML ({e}); "
                        f"saphan cannot check it; {fix}") from None
    bad = sorted(SYSTEM_REFUSED & set(data))
    if bad:
        raise UserError(
            f"{path}: the machine's Codex config sets {', '.join(bad)}, which would choose "
            "the run's model or endpoint, start a program outside Codex's sandbox or shape "
            f"that sandbox; {fix}")


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def check_home_apart(home: str, writable: Sequence[str]) -> None:
    """Refuse (UserError) a CODEX_HOME (resolved) inside a directory the run
    may write, or holding one: a run could plant its ``config.toml``
    (``notify``, ``[mcp_servers]``, ``rules``) for the next run, whose codex
    process obeys it outside the sandbox (measured with 0.169.0)."""
    for d in writable:
        real = os.path.realpath(d)
        if _within(home, real) or _within(real, home):
            raise UserError(
                f"CODEX_HOME resolves to {home}, {'inside' if _within(home, real) else 'around'} "
                f"{real}, which this run may write: the run could change Codex's config for the "
                "next run (a notify program or an MCP server runs outside Codex's sandbox); set "
                "CODEX_HOME to a directory outside the working directory (e.g. ~/.codex)")


#: Environment names a permission class may not hand a Codex run as
#: credentials (each reaches the codex process itself), with why.
_REFUSED_CREDENTIALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CODEX_.*"), "Codex reads CODEX_* variables itself (CODEX_HOME chooses its "
                              "config; CODEX_EXEC_SERVER_URL sent every command to another "
                              "executor, measured)"),
    (re.compile(r"OPENAI_.*"), "Codex's provider reads OPENAI_* variables (key, endpoint, "
                               "organisation)"),
    (re.compile(r"(?i)(http|https|all|no|ftp)_proxy"),
     "a proxy variable reroutes Codex's own traffic (key and prompts)"),
    (re.compile(r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|"
                r"NODE_EXTRA_CA_CERTS"),
     "a CA variable makes Codex trust another certificate authority (a man in the middle "
     "reads its traffic)"),
    (re.compile(r"RUST_LOG"), "RUST_LOG turns on Codex's tracing, which writes its requests "
                              "to its logs"),
    (re.compile(r"LD_.*|DYLD_.*"), "a dynamic loader variable loads code into the programs "
                                   "Codex starts"),
    (re.compile(r"PATH|HOME|SHELL|TMPDIR|BASH_ENV|ENV|ZDOTDIR|[A-Z0-9_]*PATH"),
     "it chooses which programs, files or state Codex and its sandbox helper use"),
)


def credential_refused(name: str) -> str | None:
    """Why ``name`` may not be a permission class's credential for a Codex
    run, or None."""
    return next((why for p, why in _REFUSED_CREDENTIALS if p.fullmatch(name)), None)


def toml_str(value: str) -> str:
    """A TOML basic string: JSON's escaping (a subset TOML accepts) plus DEL,
    which TOML does not allow raw in a basic string."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def profile_name(run_id: str) -> str:
    return f"saphan-{run_id.lower()}"


def provider_id(run_id: str) -> str:
    """The pinned provider's table name, per run: a config file's
    ``[model_providers.NAME]`` is merged with the command line's table of that
    name (measured: its ``query_params``, ``http_headers`` and
    ``env_http_headers`` reached the requests), and no file can know a name
    minted for this run."""
    return f"saphan-{run_id.lower()}"


def ancestors(path: str) -> list[str]:
    """``path`` and every directory above it, up to ``/``."""
    out = [path]
    while True:
        parent = os.path.dirname(out[-1])
        if parent == out[-1]:
            return out
        out.append(parent)


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


def provider_keys(provider: Provider | None) -> tuple[str, ...]:
    """Every provider key a Codex run's commands must not see: the pinned
    provider's, and the built-in ``openai`` provider's."""
    return tuple(dict.fromkeys((*((provider.env_key,) if provider else ()), *OPENAI_ENV)))


def command_env(policy: Policy, credentials: tuple[str, ...] = (),
                provider: Provider | None = None) -> list[str]:
    """The names the commands Codex runs may see (its
    ``shell_environment_policy.include_only``): the base names every run gets
    (confine/environment.py), the names saphan sets for the run, the
    permission class's credentials — never a provider key."""
    from saphan.confine.environment import BASE, LOCALE

    keys = set(provider_keys(provider))
    names = (*BASE, *LOCALE, *RUN_SET, *(k for k, _ in policy.setenv), *credentials)
    return [n for n in dict.fromkeys(names) if n not in keys]


def settings(
    policy: Policy,
    *,
    run_id: str,
    model: str | None,
    network: str = "off",
    provider: Provider | None = None,
    credentials: tuple[str, ...] = (),
    mcp_servers: Sequence[str] = (),
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
        ("model", toml_str(model or DEFAULT_MODEL)),
    ]
    if provider is not None:
        pid = provider_id(run_id)
        out.append(("model_provider", toml_str(pid)))
        out.append((f"model_providers.{pid}",
                    f"{{ name = {toml_str(provider.name)}, base_url = {toml_str(provider.base_url)}, "
                    f"env_key = {toml_str(provider.env_key)}, wire_api = {toml_str(provider.wire_api)} }}"))
    else:
        out.append(("model_provider", toml_str("openai")))
    out.append(("openai_base_url", toml_str(OPENAI_BASE_URL)))
    # A dotted key on -c is split at every dot, quotes or not (measured), so
    # the paths go inside a table value; the table is merged with the files'.
    trust = ", ".join(f'{toml_str(d)} = {{ trust_level = "untrusted" }}'
                      for d in ancestors(policy.workdir))
    out.append(("projects", f"{{ {trust} }}"))
    out.append(("agents.enabled", "false"))
    out.append(("features.multi_agent", "false"))
    out.append(("features.multi_agent_v2", "false"))
    # Plugins: a plugin's MCP servers start outside Codex's sandbox (measured).
    out.append(("features.plugins", "false"))
    # Programs Codex starts outside its sandbox (measured): the notify program
    # after every turn, the user's MCP servers at start.
    out.append(("notify", "[]"))
    out.extend((f"mcp_servers.{n}.enabled", "false") for n in mcp_servers)
    exclude = ", ".join(toml_str(k) for k in provider_keys(provider))
    include = ", ".join(toml_str(n) for n in command_env(policy, credentials, provider))
    out.append(("shell_environment_policy",
                f'{{ inherit = "all", ignore_default_excludes = true, exclude = [{exclude}], '
                f"include_only = [{include}], experimental_use_profile = false }}"))
    return out


def compose_argv(
    binary: str,
    policy: Policy,
    *,
    run_id: str,
    model: str | None,
    network: str = "off",
    provider: Provider | None = None,
    credentials: tuple[str, ...] = (),
    resume_session: str | None = None,
    mcp_servers: Sequence[str] = (),
) -> list[str]:
    """Codex's command line (pure). The prompt goes on stdin (``-``)."""
    argv = [binary, "exec", "--strict-config", "--json", "--skip-git-repo-check",
            "-C", policy.workdir]
    for key, value in settings(policy, run_id=run_id, model=model, network=network,
                               provider=provider, credentials=credentials,
                               mcp_servers=mcp_servers):
        argv += ["-c", f"{key}={value}"]
    if resume_session is not None:
        argv += ["resume", resume_session]
    argv.append("-")
    return argv


_PROFILE = re.compile(r"saphan-[a-z0-9-]+")
_PROVIDER = re.compile(r"openai|saphan-[a-z0-9-]+")
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ACCESS = frozenset({"read", "write", "none"})


def _absolute(path: Any) -> bool:
    return isinstance(path, str) and path.startswith("/") and os.path.normpath(path) == path


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
            and all(isinstance(v, str) for v in value.values())
            and value["wire_api"] == "responses" and bool(_VAR.fullmatch(value["env_key"])))


def _untrusted_chain(value: Any) -> bool:
    """A directory and every directory above it, each marked untrusted —
    nothing else (no entry that trusts, no unrelated path)."""
    if not isinstance(value, dict) or not value or not all(_absolute(k) for k in value):
        return False
    deepest = max(value, key=len)
    return (set(value) == set(ancestors(deepest))
            and all(v == {"trust_level": "untrusted"} for v in value.values()))


def _names(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(n, str) and _VAR.fullmatch(n) for n in value))


def _shell_policy(value: Any) -> bool:
    """Commands get exactly the names listed (no pattern), never a provider
    key: inherit all, then keep only ``include_only``, minus ``exclude``."""
    if not isinstance(value, dict) or set(value) != {
            "inherit", "ignore_default_excludes", "exclude", "include_only",
            "experimental_use_profile"}:
        return False
    return (value["inherit"] == "all" and value["ignore_default_excludes"] is True
            and value["experimental_use_profile"] is False
            and _names(value["exclude"]) and _names(value["include_only"])
            and set(OPENAI_ENV) <= set(value["exclude"])
            and not set(value["exclude"]) & set(value["include_only"]))


def _is_str(pattern: re.Pattern[str] | None = None, *, only: str | None = None) -> Any:
    def ok(value: Any) -> bool:
        return (isinstance(value, str) and (only is None or value == only)
                and (pattern is None or pattern.fullmatch(value) is not None))
    return ok


def _is_false(value: Any) -> bool:
    return value is False


def _is_empty_list(value: Any) -> bool:
    return value == [] and isinstance(value, list)


#: The config keys :func:`settings` pins, as (key pattern, value validator).
ALLOWED_SETTINGS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"default_permissions"), _is_str(_PROFILE)),
    (re.compile(r"permissions\.saphan-[a-z0-9-]+"), _profile_table),
    (re.compile(r"approval_policy"), _is_str(only="never")),
    (re.compile(r"model"), _is_str()),  # the named model: the guard's model check compares it
    (re.compile(r"model_provider"), _is_str(_PROVIDER)),
    (re.compile(r"model_providers\.saphan-[a-z0-9-]+"), _provider_table),
    (re.compile(r"openai_base_url"), _is_str(only=OPENAI_BASE_URL)),
    (re.compile(r"projects"), _untrusted_chain),
    (re.compile(r"agents\.enabled"), _is_false),
    (re.compile(r"features\.multi_agent"), _is_false),
    (re.compile(r"features\.multi_agent_v2"), _is_false),
    (re.compile(r"features\.plugins"), _is_false),
    (re.compile(r"shell_environment_policy"), _shell_policy),
    (re.compile(r"notify"), _is_empty_list),
    (re.compile(r"mcp_servers\.[A-Za-z0-9_-]+\.enabled"), _is_false),
)

#: The keys every composed line pins (the guard refuses a line without one):
#: without them a config file chooses the model, reroutes the provider, trusts
#: the project, turns sub-agents on or hands the commands the provider's key.
REQUIRED_SETTINGS: frozenset[str] = frozenset({
    "default_permissions", "approval_policy", "model", "model_provider", "openai_base_url",
    "projects", "agents.enabled", "features.multi_agent", "features.multi_agent_v2",
    "features.plugins", "shell_environment_policy", "notify",
})


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


def usage_of(stdout_path: str) -> dict[str, Any] | None:
    """The record's ``usage`` from Codex's ``turn.completed`` events (summed),
    or None when there is none. Codex's events name no model (measured), so
    ``models`` stays empty: the model is the one pinned (``pinned_settings``)."""
    from saphan.tools import usage

    total: dict[str, int | None] = {k: None for k in usage.TOKEN_KINDS}
    seen = False
    for event in json_events(stdout_path, b'"turn.completed"'):
        got = event.get("usage")
        if event.get("type") != "turn.completed" or not isinstance(got, dict):
            continue
        seen = True
        usage.add(total, {"input": got.get("input_tokens"),
                          "output": got.get("output_tokens"),
                          "cache_read": got.get("cached_input_tokens")})
    if not seen:
        return None
    return usage.record(models=(), tokens=total, cost_usd=None,
                        reported_by="codex turn.completed events (they name no model)")


@dataclass(frozen=True)
class CodexAdapter(Adapter):
    tool = "codex"
    allowed_argv = ALLOWED_ARGV
    #: the slot's endpoint or the workspace's [codex] table; None: the
    #: built-in ``openai`` provider at :data:`OPENAI_BASE_URL`, pinned
    provider: Provider | None = field(default=None)
    #: the engine's watchdog (seconds): at the limit the run's whole tree is
    #: ended (SIGTERM through the reaper, then SIGKILL): time-limit-killed
    max_seconds: int = DEFAULT_AGENT_MAX_SECONDS
    #: the user's config's MCP servers, each pinned off (:meth:`checked`;
    #: for a far run, read there by the preflight)
    mcp_servers: tuple[str, ...] = ()
    #: a far run: the runner's name and the CODEX_HOME resolved there (its
    #: config was read there; nothing of this host's CODEX_HOME applies)
    far_machine: str | None = None
    far_home: str | None = None

    def __post_init__(self) -> None:
        try:
            self.instruction.workdir.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(
                f"the working directory {self.instruction.workdir!r} is not valid UTF-8: Codex "
                "reads its pinned settings (the working directory among them) as TOML, which "
                "is UTF-8; run in a directory whose path is valid UTF-8") from None
        if self.provider is None and os.environ.get("OPENAI_BASE_URL"):
            raise UserError(
                "OPENAI_BASE_URL is set in saphan's environment, but codex-cli 0.169.0 does not "
                "read it (measured) and saphan pins Codex's built-in openai provider to "
                f"{OPENAI_BASE_URL}: the run's key would go there, not to that endpoint. Give "
                "the slot its endpoint (`saphan slot set MACHINE SLOT --endpoint URL`, or "
                "`[codex] base_url` in the workspace config), or unset OPENAI_BASE_URL")

    def time_limit(self) -> float | None:
        return float(self.max_seconds)

    def checked(self, writable: Sequence[str] = ()) -> CodexAdapter:
        """Before the seat (tools/launch.py): the adapter with the user's MCP
        servers to pin off — refused (UserError) when CODEX_HOME lies in what
        the run may write (the working directory, ``writable``, its session
        directories) or holds one of them: the run could plant the config
        (``notify``, ``[mcp_servers]``, rules) that the next run's codex
        process obeys outside its sandbox; and when the machine's
        ``/etc/codex`` sets what saphan pins (:func:`check_system_config`)."""
        check_system_config()
        home = os.path.realpath(codex_home())
        check_home_apart(home, (self.instruction.workdir, *writable, *self.session_dirs()))
        return replace(self, mcp_servers=configured_mcp_servers(home))

    def credential_refused(self, name: str) -> str | None:
        """Why a permission class may not name ``name`` as a credential for a
        Codex run (its value would reach the codex process, outside its
        sandbox), or None."""
        return credential_refused(name)

    @property
    def model(self) -> str:
        """The model pinned: the one named, else :data:`DEFAULT_MODEL`."""
        return self.instruction.model or DEFAULT_MODEL

    @property
    def network(self) -> str:
        pc = self.instruction.permission_class
        return pc.network if pc is not None else "off"

    @property
    def credentials(self) -> tuple[str, ...]:
        pc = self.instruction.permission_class
        return pc.credentials if pc is not None else ()

    def env_allowed(self) -> tuple[str, ...]:
        keys = (self.provider.env_key,) if self.provider is not None else OPENAI_ENV
        return tuple(dict.fromkeys(("CODEX_HOME", *keys, *super().env_allowed())))

    def _settings(self, policy: Policy) -> list[tuple[str, str]]:
        return settings(policy, run_id=self.run_id, model=self.model, network=self.network,
                        provider=self.provider, credentials=self.credentials,
                        mcp_servers=self.mcp_servers)

    def vendor_boundary(self, policy: Policy) -> Boundary | None:
        from saphan.confine.compose import LIFELINE_FD, STATUS_FD, Boundary, reaper_prefix

        # Again with the derived policy (a --repo run's git grants are known
        # only now): a CODEX_HOME the run could write is never used.
        try:
            check_home_apart(os.path.realpath(codex_home()), policy.writable_dirs)
        except UserError as e:
            from saphan import refusals

            raise refusals.workdir_unsafe(str(e), "set CODEX_HOME outside what the run may "
                                                  "write (e.g. ~/.codex)") from None
        pinned = self._settings(policy)
        # Not a boundary around Codex (its own sandbox is the boundary): a
        # subreaper, so no helper Codex starts (its fs-helper daemon was seen
        # alive an hour after its run) outlives the run.
        prefix, reaper = reaper_prefix()
        return Boundary(
            mechanism="vendor:codex", version=self.binary.version,
            executable=self.binary.path, executable_sha256=self.binary.sha256,
            prefix=prefix, policy=policy, status_fd=STATUS_FD, lifeline_fd=LIFELINE_FD,
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
            self.binary.path, policy, run_id=self.run_id, model=self.model,
            network=self.network, provider=self.provider, credentials=self.credentials,
            resume_session=resume.session_id if resume else None,
            mcp_servers=self.mcp_servers,
        )

    def guard(self, final_argv: list[str], agent_at: int = 0) -> None:
        """The argv guard with the model pinned (named or :data:`DEFAULT_MODEL`),
        and every setting of :data:`REQUIRED_SETTINGS` present."""
        from saphan import refusals

        resume = self.instruction.resume
        argv_guard.check(final_argv, tool=self.tool, model=self.model,
                         resume_session=resume.session_id if resume else None,
                         allowed=self.allowed_argv, binary=self.binary.path, agent_at=agent_at)
        agent = final_argv[agent_at:]
        pinned = dict(agent[i + 1].partition("=")[::2] for i in range(len(agent) - 1)
                      if agent[i] == "-c")
        try:
            # read again now (a far run's was read on the runner by its preflight)
            servers = self.mcp_servers if self.far_machine else configured_mcp_servers()
        except UserError as e:
            raise refusals.bypass_token(str(e), "fix Codex's config.toml") from None
        # every MCP server of the user's config, pinned off (read again now)
        missing = sorted((REQUIRED_SETTINGS | {f"mcp_servers.{n}.enabled" for n in servers})
                         - set(pinned))
        shell = toml_value(pinned.get("shell_environment_policy", "{}"))
        excluded = shell.get("exclude") if isinstance(shell, dict) else None
        keys = set(provider_keys(self.provider))
        if not missing and not keys <= set(excluded if isinstance(excluded, list) else ()):
            missing = [f"shell_environment_policy excluding {', '.join(sorted(keys))}"]
        if missing:
            raise refusals.bypass_token(
                f"codex's command line must pin {', '.join(missing)}; without it a config file "
                f"decides: {' '.join(final_argv)}",
                "report this as an adapter bug: the codex adapter pins every one of these")

    def record(self, policy: Policy) -> dict[str, Any]:
        out = super().record(policy)
        out["model"] = self.model
        out["endpoint"] = self.provider.base_url if self.provider is not None else OPENAI_BASE_URL
        out["codex_home"] = self.far_home if self.far_machine else codex_home()
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        started = first_json_event(stdout_path, lambda e: e.get("type") == "thread.started")
        out: dict[str, Any] = {}
        if started is not None:
            out["agent_session"] = {"id": started.get("thread_id")}
        used = usage_of(stdout_path)
        if used is not None:
            out["usage"] = used
        return out
