"""Claude Code: confined by the engine; only what saphan pins reaches it.

Measured with Claude Code 2.1.197 (the native executable of npm
``@anthropic-ai/claude-code``), run directly and through ``saphan run``
against a scripted Messages server on loopback (tests/tools/model_servers.py):

- ``-p --output-format stream-json --verbose`` runs non-interactively and
  prints one JSON event per line; the first is ``system/init`` with the
  ``session_id`` and the ``cwd`` (``-p`` with stream-json refuses to start
  without ``--verbose``); the last is ``result``, with ``modelUsage`` (per
  model: ``inputTokens``, ``outputTokens``, ``cacheReadInputTokens``,
  ``cacheCreationInputTokens``, ``costUSD``), ``usage`` and
  ``total_cost_usd``. The prompt is read from standard input.
- Under bubblewrap with only the working directory and the seat's session
  leaf ``<config home>/projects/<key>`` writable, it starts, calls the API at
  ``ANTHROPIC_BASE_URL`` and writes its transcript into that leaf.
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

What saphan pins, and what each pin was measured to do:

- **No settings from the user, the project or the machine's user:**
  ``--setting-sources ""`` (the empty list; ``none`` is refused by the CLI,
  "Valid options are: user, project, local"). ``-p`` skips the trust dialog,
  so without it a ``<workdir>/.claude/settings.json`` (and
  ``settings.local.json``, and ``~/.claude/settings.json``) holding
  ``{"env":{"ANTHROPIC_BASE_URL":…}}`` sent every request to that server and
  ``{"model":…}`` changed the model. With it, none of the three is read, and
  neither is any ``CLAUDE.md`` (workdir, its parents, ``CLAUDE.local.md``,
  ``.claude/rules``, ``~/.claude/CLAUDE.md``), nor the project's
  ``.claude/agents``, ``.claude/skills``, ``.claude/commands``,
  ``.claude/workflows`` or ``.mcp.json`` (the init event lists none of them).
- **saphan's own settings file:** ``--settings <run dir>/claude-settings.json``
  (:data:`SETTINGS`), written outside the writable set and bound read-only
  into the jail. It turns auto memory off: with ``--setting-sources ""``
  Claude Code still loaded ``<session leaf>/memory/MEMORY.md`` into the
  context — a file inside the granted leaf, so one run could leave
  instructions for the next outside the working directory. A settings file
  that fails validation is silently ignored under ``-p`` (its help says so),
  so the end-to-end test checks the memory marker stays out.
- **Machine-managed settings still apply:** ``/etc/claude-code/
  managed-settings.json`` and ``managed-settings.d/*.json`` are read whatever
  ``--setting-sources`` says, and their ``env`` beats both the process
  environment and ``--settings`` (a managed ``ANTHROPIC_BASE_URL`` won over
  both; measured in a mount namespace with an overlay on /etc). So
  :func:`preflight` refuses a run whose managed settings set
  an endpoint or sub-agent model other than the one saphan pins, or any
  other variable :func:`refused_variable` names (a managed
  ``CLAUDE_CODE_USE_BEDROCK`` with ``ANTHROPIC_BEDROCK_BASE_URL`` sent the
  traffic elsewhere; review), and the record lists the managed files. The managed ``CLAUDE.md`` and
  ``.claude/rules/*.md`` under /etc/claude-code are loaded too: they are the
  run's :func:`instruction_files`. A managed ``"model"`` lost to ``--model``.
- **The model, always:** ``--model`` is the operator's (or the slot's), else
  :data:`DEFAULT_MODEL` — ``claude-opus-4-8[1m]``, what 2.1.197 chose with no
  ``--model`` and nothing configured: requests for ``claude-opus-4-8`` with
  the ``context-1m-2025-08-07`` beta, init and ``modelUsage`` naming
  ``claude-opus-4-8[1m]``; ``--model claude-opus-4-8[1m]`` gave exactly the
  same requests. (With ``ANTHROPIC_AUTH_TOKEN`` instead of a key: the same
  ``claude-opus-4-8`` requests.)
- **Sub-agents run on the pinned model:** the ``Agent`` tool (``Task`` in
  the init event's tool list; ``--disallowedTools Task`` and ``Agent`` both
  remove it) takes a ``model`` and spawned ``claude-opus-4-8`` for
  ``"model":"opus"``; its built-in ``Explore`` agent asked for
  ``claude-haiku-4-5-20251001`` with no model named. With
  ``CLAUDE_CODE_SUBAGENT_MODEL`` set to the pinned model (set by saphan:
  :meth:`ClaudeAdapter.env_set`) every sub-agent request — ``opus``,
  ``Explore``, ``Explore`` with ``haiku`` — named the pinned model, and
  ``modelUsage`` listed only it. The ``Workflow`` tool, whose scripts give
  each agent they spawn its own ``opts.model``, is disallowed
  (``--disallowedTools Workflow``). WebFetch's side request used the main
  model (no ``ANTHROPIC_SMALL_FAST_MODEL`` passes), and the record's usage
  lists every model ``modelUsage`` names, whatever route chose it.
- **The endpoint comes from the slot:** ``ANTHROPIC_BASE_URL`` is set by
  saphan from the slot's ``--endpoint`` (:meth:`ClaudeAdapter.env_set`) and
  is never taken from saphan's environment; a different value there is
  refused before the seat (:func:`preflight`), since an
  operator who exported it meant something the slot does not say.
- **Turns:** ``--max-turns N`` (hidden from ``--help`` but honoured: with 2,
  two requests, exit 1, a ``result`` of subtype ``error_max_turns``; ``0``
  and non-numbers are silently ignored, so only 1.. is composed). That end
  is recorded as ``turn-budget-exhausted``, as the loop's — only when a
  budget was composed and Claude Code exited 1 itself.
- **The result event is the tool's word:** a command of the run wrote a
  ``result`` event (``error_max_turns``, a haiku model) to Claude Code's
  stdout through ``/proc/<pid>/fd/1`` and SIGKILLed it (review): when Claude
  Code was ended by a signal (128 + N from the launcher, negative from
  Python), or its output holds more than one result event (it prints one),
  or any non-empty line that is not a whole JSON object (it prints nothing
  else; a command writing ``X`` to that descriptor every 2 ms ran into its
  own result line, so only a forged one parsed — review),
  :meth:`ClaudeAdapter.after_exit` takes neither the outcome nor the usage
  from it (usage null, ``claude_result.ignored``, a note).
- **Class credentials that steer Claude Code are refused**
  (:meth:`ClaudeAdapter.credential_refused`, :func:`refused_variable`): a
  class — which a repository can supply — naming ``CLAUDE_CODE_USE_BEDROCK``,
  ``ANTHROPIC_BEDROCK_BASE_URL``, ``CLAUDE_CODE_SKIP_BEDROCK_AUTH`` and
  ``AWS_REGION`` sent the run's traffic to another server while the record
  named the slot's endpoint (review). Refused: the prefixes and names
  2.1.197 reads itself (``process.env.NAME`` in its executable, measured with
  grep: ``ANTHROPIC_*``, ``CLAUDE_*``, ``AWS_*``, ``AZURE_*``, ``GOOGLE_*``,
  ``CLOUD_ML_*``, ``DISABLE_*``, ``MAX_*``, ``MCP_*``, ``ENABLE_*``, …),
  anything naming Bedrock, Vertex, Foundry or a proxy, certificate
  authorities, telemetry exporters and the runtime's (``NODE_*``, ``LD_*``).
  :data:`ENV_ALLOWED` passes anyway, so a class may name it.
- **The transcript is digested:** every run in a working directory shares
  the session leaf, so one rewrote another's transcript and ``--resume``
  sent the forged history (review). The record's ``claude_transcript`` holds
  the SHA-256 of ``<leaf>/<session id>.jsonl`` at the run's end (read with
  ``O_NOFOLLOW``, a regular file, bounded); tools/launch.py refuses a resume
  whose transcript differs, whose record has no digest, or whose session id
  is not a UUID (it names ``session-env/<id>``, created and granted).
- **The configuration home is outside the working directory**
  (:func:`refuse_config_home_in`): otherwise a run could leave settings,
  hooks or MCP servers in it for the next run.

With ``run.confinement = vendor`` the engine composes no boundary and the
record says, in as many words, that it makes no claim the agent is confined.

The environment (:data:`ENV_ALLOWED`, on top of confine/environment.py's
base and the permission class's credentials): what authenticates the seat's
account and where its configuration lives —

- ``ANTHROPIC_API_KEY`` (``X-Api-Key``) / ``ANTHROPIC_AUTH_TOKEN``
  (``Authorization: Bearer``, for a gateway) / ``CLAUDE_CODE_OAUTH_TOKEN``
  (a subscription's long-lived token from ``claude setup-token``). Claude
  Code passes them on to its Bash tool's commands (measured: ``env`` there
  showed ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_AUTH_TOKEN``), so the agent
  can read the key it runs on; its ``CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1``
  hides them but forces the permission mode to ``default`` (measured: a
  Write was then refused for want of a grant), so saphan does not set it —
  give a seat a key of its own;
- ``CLAUDE_CONFIG_DIR``: the configuration directory. The engine grants the
  session leaf under :func:`config_home`, read from its own environment, so
  the tool must see the same value or its transcript would land elsewhere
  (read-only, EROFS).

Nothing else passes: no ``ANTHROPIC_BASE_URL`` (saphan sets it from the
slot), no ``ANTHROPIC_MODEL`` / ``ANTHROPIC_SMALL_FAST_MODEL`` /
``ANTHROPIC_DEFAULT_*_MODEL`` / ``CLAUDE_CODE_SUBAGENT_MODEL`` (each selects
a model). Anything else a seat needs (a proxy, custom headers) is named in
its permission class's ``credentials``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.tools import argv_guard
from saphan.tools.adapter import (
    DEFAULT_AGENT_MAX_SECONDS,
    Adapter,
    first_json_event,
)
from saphan.tools.argv_guard import AllowList, Option
from saphan.tools.permission_class import PERMISSION_MODES
from saphan.tools.session_key import session_key

if TYPE_CHECKING:
    from saphan.confine.compose import Boundary
    from saphan.confine.policy import Policy

DEFAULT_PERMISSION_MODE = "acceptEdits"

#: The model a run pins when neither ``--model`` nor the slot names one: what
#: Claude Code 2.1.197 chose by itself with nothing configured (see above).
DEFAULT_MODEL = "claude-opus-4-8[1m]"

#: Where requests go when the slot names no endpoint (the tool's own default).
DEFAULT_ENDPOINT = "https://api.anthropic.com"

#: ``--setting-sources``: none of user, project, local.
SETTING_SOURCES = ""

#: saphan's per-run settings file (in the run's directory), and what it holds.
SETTINGS_FILE = "claude-settings.json"
SETTINGS: Mapping[str, Any] = {"autoMemoryEnabled": False}

#: Tools the run may not use (``--disallowedTools``), see above.
DISALLOWED_TOOLS: tuple[str, ...] = ("Workflow",)

#: The machine's managed configuration, which Claude Code reads whatever
#: ``--setting-sources`` says (see above).
MANAGED_DIR = "/etc/claude-code"

#: Claude Code's own variables a run may take from saphan's environment (see above)
ENV_ALLOWED: tuple[str, ...] = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CONFIG_DIR",
)

#: A managed settings file larger than this is not read (and the run refused).
_MANAGED_LIMIT = 1 << 20

#: A transcript larger than this is not digested (the record says why; a
#: run with no digest cannot be resumed).
_TRANSCRIPT_LIMIT = 1 << 30

_ENDPOINT_WHY = ("it selects the endpoint, provider, account or model Claude Code talks to, or how "
                 "it behaves")
_TRANSPORT_WHY = ("it decides where Claude Code's connections go or whom they trust (a proxy or a "
                  "certificate authority)")
_RUNTIME_WHY = "it changes what Claude Code's runtime loads or runs (the dynamic loader, Node or Bun)"

#: What a permission class may not name as a credential for a Claude run, and
#: why (:func:`refused_variable`). Every prefix and name below is one Claude
#: Code 2.1.197 reads (``process.env.NAME`` in its executable, measured with
#: grep), or a family the operating system's loader or its TLS stack reads.
REFUSED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("ANTHROPIC_", _ENDPOINT_WHY), ("CLAUDE_", _ENDPOINT_WHY),
    # Bedrock (AWS_*), Vertex (GOOGLE_*, GCLOUD_*, CLOUDSDK_*, CLOUD_ML_*,
    # GCE_METADATA_*), Foundry (AZURE_*): another provider, another endpoint
    ("AWS_", _ENDPOINT_WHY), ("AZURE_", _ENDPOINT_WHY), ("GOOGLE_", _ENDPOINT_WHY),
    ("GCLOUD_", _ENDPOINT_WHY), ("CLOUDSDK_", _ENDPOINT_WHY), ("CLOUD_ML_", _ENDPOINT_WHY),
    ("GCE_METADATA_", _ENDPOINT_WHY),
    # its knobs: DISABLE_PROMPT_CACHING, MAX_THINKING_TOKENS, MCP_TOOL_TIMEOUT,
    # ENABLE_TOOL_SEARCH, FORCE_PROMPT_CACHING_5M, USE_LOCAL_OAUTH, CCR_*, …
    ("DISABLE_", _ENDPOINT_WHY), ("MAX_", _ENDPOINT_WHY), ("MCP_", _ENDPOINT_WHY),
    ("ENABLE_", _ENDPOINT_WHY), ("FORCE_", _ENDPOINT_WHY), ("USE_", _ENDPOINT_WHY),
    ("CCR_", _ENDPOINT_WHY),
    # telemetry exporters: where its traces, logs and metrics go
    ("OTEL_", _TRANSPORT_WHY), ("GRPC_", _TRANSPORT_WHY),
    ("NODE_", _RUNTIME_WHY), ("BUN_", _RUNTIME_WHY), ("LD_", _RUNTIME_WHY),
    ("DYLD_", _RUNTIME_WHY),
)
#: Anywhere in the name: another provider, or a proxy (``HTTPS_PROXY``,
#: ``ALL_PROXY``, ``NO_PROXY``, ``AGENT_PROXY_URL``, any case).
REFUSED_PARTS: tuple[tuple[str, str], ...] = (
    ("BEDROCK", _ENDPOINT_WHY), ("VERTEX", _ENDPOINT_WHY), ("FOUNDRY", _ENDPOINT_WHY),
    ("PROXY", _TRANSPORT_WHY),
)
#: Single names of the same kinds.
REFUSED_NAMES: Mapping[str, str] = {
    **dict.fromkeys(("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                     "TRACEPARENT", "TRACESTATE", "BETA_TRACING_ENDPOINT",
                     "SESSION_INGRESS_URL", "VOICE_STREAM_BASE_URL", "LOCAL_BRIDGE",
                     "METADATA_SERVER_DETECTION", "DETECT_GCP_RETRIES"), _TRANSPORT_WHY),
    **dict.fromkeys(("API_TIMEOUT_MS", "API_FORCE_IDLE_TIMEOUT", "BASH_MAX_OUTPUT_LENGTH",
                     "TASK_MAX_OUTPUT_LENGTH", "SLASH_COMMAND_TOOL_CHAR_BUDGET",
                     "FALLBACK_FOR_ALL_PRIMARY_MODELS", "IS_SANDBOX", "SDK_NATIVE_BIN",
                     "DEBUG", "DEBUG_AUTH", "DEBUG_SDK", "DEBUG_CLAUDE_AGENT_SDK",
                     "XDG_CONFIG_HOME"), _ENDPOINT_WHY),
}


def refused_variable(name: str) -> str | None:
    """Why ``name`` controls Claude Code itself (see :data:`REFUSED_PREFIXES`),
    else None. Compared in upper case: a proxy is read in either."""
    upper = name.upper()
    if upper in REFUSED_NAMES:
        return REFUSED_NAMES[upper]
    for prefix, why in REFUSED_PREFIXES:
        if upper.startswith(prefix):
            return why
    for part, why in REFUSED_PARTS:
        if part in upper:
            return why
    return None

VENDOR_NOTE = (
    "run.confinement = vendor: the engine makes no claim that this agent is confined. "
    "saphan composed no boundary around Claude Code; whatever Claude Code does to itself "
    "is its own, unmeasured here, and its permission mode is policy, not a boundary"
)


def is_uuid(value: str) -> bool:
    """``value`` is a UUID in its canonical form (as Claude Code names a session)."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _allowed_tool(value: str) -> bool:
    """``Bash(<command>:*)``, as :func:`compose_argv` writes a class's command."""
    return value.startswith("Bash(") and value.endswith(":*)") and len(value) > len("Bash(:*)")


def _settings_file(value: str) -> bool:
    """An absolute path to a file named :data:`SETTINGS_FILE` (never inline JSON)."""
    return os.path.isabs(value) and os.path.basename(value) == SETTINGS_FILE


def _turns(value: str) -> bool:
    return value.isascii() and value.isdigit() and not value.startswith("0")


#: Everything :func:`compose_argv` may emit (the argv guard's allow-list):
#: no positional word (the prompt is on stdin), and only these options.
ALLOWED_ARGV = AllowList(options={
    "-p": Option(),
    "--output-format": Option(1, frozenset({"stream-json"}), says="stream-json"),
    "--verbose": Option(),
    "--permission-mode": Option(1, frozenset({DEFAULT_PERMISSION_MODE, *PERMISSION_MODES}),
                                says=" or ".join(sorted({DEFAULT_PERMISSION_MODE,
                                                         *PERMISSION_MODES}))),
    "--setting-sources": Option(1, frozenset({SETTING_SOURCES}),
                                says='"" (no user, project or local settings)'),
    # the value is this run's file (ClaudeAdapter.guard compares it)
    "--settings": Option(1, check=_settings_file, says=f"saphan's per-run {SETTINGS_FILE}"),
    # the value is the pinned model (the guard's model check compares it)
    "--model": Option(1, says="the pinned model"),
    "--disallowedTools": Option(-1, frozenset(DISALLOWED_TOOLS),
                                says=", ".join(DISALLOWED_TOOLS)),
    "--max-turns": Option(1, check=_turns, says="a number of turns from 1"),
    "--allowedTools": Option(-1, check=_allowed_tool, says="Bash(<command>:*) rules"),
    # the value is the recorded session (the guard's resumption check compares it)
    "--resume": Option(1, says="the explicitly resumed session"),
    "--session-id": Option(1, check=is_uuid, says="a UUID"),
}, required=frozenset({"-p", "--permission-mode"}))

#: The pins :meth:`ClaudeAdapter.guard` requires on every composed line, each
#: with exactly its value (the settings file and the model are the run's own).
PINNED_FLAGS = ("--setting-sources", "--settings", "--model", "--disallowedTools")


def config_home() -> str:
    """Claude Code's configuration home: $CLAUDE_CONFIG_DIR, else ~/.claude."""
    return os.path.realpath(os.environ.get("CLAUDE_CONFIG_DIR")
                            or os.path.join(os.path.expanduser("~"), ".claude"))


def session_leaf(workdir: str) -> str:
    """This seat's session directory: ``<config home>/projects/<key>``."""
    return os.path.join(config_home(), "projects", session_key(workdir))


def refuse_config_home_in(workdir: str) -> None:
    """Refuse a run whose configuration home is its working directory or
    inside it: the run could leave settings, hooks, MCP servers or
    ``.claude.json`` there for the next Claude Code to read."""
    home = config_home()
    wd = os.path.realpath(workdir)
    if home == wd or home.startswith(wd.rstrip("/") + "/"):
        raise UserError(
            f"Claude Code's configuration directory {home} (CLAUDE_CONFIG_DIR, else "
            f"~/.claude) is inside the working directory {wd}, which the run may write: it "
            "could leave settings, hooks or MCP servers there for the next run. Run in another "
            "working directory, or set CLAUDE_CONFIG_DIR to a directory outside it"
        )


def transcript_path(workdir: str, session_id: str) -> str:
    """The session's transcript: ``<session leaf>/<session id>.jsonl``."""
    return os.path.join(session_leaf(workdir), f"{session_id}.jsonl")


def transcript_sha256(path: str, limit: int = _TRANSCRIPT_LIMIT) -> str:
    """The SHA-256 of the regular file ``path``, read without following a
    link at any component, never blocking on a FIFO, at most ``limit``
    bytes. Raises OSError, or PlantedLink for a link, a special file or a
    file too large."""
    import hashlib

    from saphan.confine import nofollow
    from saphan.errors import PlantedLink

    parent, name = os.path.split(path)
    with nofollow.open_dir(parent) as d:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=d)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PlantedLink(path, "not a regular file")
            if st.st_size > limit:
                raise PlantedLink(path, f"larger than {limit} bytes")
            digest, read = hashlib.sha256(), 0
            while chunk := os.read(fd, 1 << 20):
                read += len(chunk)
                if read > limit:
                    raise PlantedLink(path, f"larger than {limit} bytes")
                digest.update(chunk)
        finally:
            os.close(fd)
    return digest.hexdigest()


def run_session_id(run_id: str) -> str:
    """The Claude Code session a new run gets: a UUID minted from its run id."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"saphan:run:{run_id}"))


def settings_bytes() -> bytes:
    """saphan's per-run settings file for Claude Code, as written."""
    return (json.dumps(dict(SETTINGS), indent=2, sort_keys=True) + "\n").encode()


def compose_argv(
    binary: str,
    *,
    permission_mode: str,
    model: str,
    settings_path: str,
    max_turns: int | None = None,
    allowed_commands: tuple[str, ...] = (),
    resume_session: str | None = None,
    session_id: str | None = None,
) -> list[str]:
    """Claude Code's command line (pure). The prompt goes on stdin."""
    argv = [binary, "-p", "--output-format", "stream-json", "--verbose",
            "--permission-mode", permission_mode,
            "--setting-sources", SETTING_SOURCES, "--settings", settings_path,
            "--model", model, "--disallowedTools", *DISALLOWED_TOOLS]
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    if allowed_commands:
        argv += ["--allowedTools", *(f"Bash({c}:*)" for c in allowed_commands)]
    if resume_session is not None:
        argv += ["--resume", resume_session]
    elif session_id is not None:
        argv += ["--session-id", session_id]
    return argv


# -- what the machine's managed configuration adds ----------------------------------

def _kind(path: str) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def _listed(path: str, kind: str | None) -> str | None:
    """How a file Claude Code would read is named in the record: a regular
    file by its path; a link by its path and what saphan did not do."""
    if kind == "file":
        return path
    if kind == "link":
        return (f"{path} (a symbolic link: saphan did not follow it; Claude Code may read "
                "what it points to)")
    return None


def _rules(directory: str) -> list[str]:
    """``*.md`` under ``directory`` at any depth, through real directories
    only; a link anywhere is listed as one (whatever its name)."""
    out: list[str] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        kind = _kind(entry.path)
        if kind == "dir":
            out += _rules(entry.path)
        elif kind == "link" or entry.name.endswith(".md"):
            listed = _listed(entry.path, kind)
            if listed is not None:
                out.append(listed)
    return out


def instruction_files(managed_dir: str = MANAGED_DIR) -> list[str]:
    """The instruction files Claude Code 2.1.197 loads into a run's context
    under saphan's pins, found the way it finds them (measured): with
    ``--setting-sources ""`` and auto memory off, no ``CLAUDE.md`` of the
    workdir, its parents or the user, and no memory file — only the
    machine's managed ``CLAUDE.md`` and ``.claude/rules/**/*.md``. Nothing is
    resolved through a link (``os.lstat``): a link on the way is listed as
    one, and not entered."""
    found: list[str] = []
    path = managed_dir
    for step in ("", ".claude", "rules"):
        path = os.path.join(path, step) if step else path
        kind = _kind(path)
        if kind == "link":
            found.append(str(_listed(path, kind)))
            return found
        if kind != "dir":
            return found
        if not step:
            top = os.path.join(path, "CLAUDE.md")
            found += [x for x in (_listed(top, _kind(top)),) if x is not None]
    return found + _rules(path)


def managed_settings_files(managed_dir: str = MANAGED_DIR) -> list[str]:
    """The machine's managed settings files that exist (not followed through links)."""
    files = [os.path.join(managed_dir, "managed-settings.json")]
    dropins = os.path.join(managed_dir, "managed-settings.d")
    if _kind(dropins) == "dir":
        with contextlib.suppress(OSError):
            files += sorted(e.path for e in os.scandir(dropins) if e.name.endswith(".json"))
    return [f for f in files if _kind(f) is not None]


def _managed_env(path: str, raw: bytes | None = None, *, far: bool = False) -> dict[str, Any]:
    """The ``env`` table of a managed settings file: read here, or (``far``)
    as the runner read it (``raw``; None: it could not be read there)."""
    from saphan.confine import nofollow
    from saphan.errors import PlantedLink

    try:
        if far and raw is None:
            raise OSError("it could not be read there")
        data = json.loads(raw if far and raw is not None
                          else nofollow.read_small(path, _MANAGED_LIMIT))
    except (OSError, ValueError, PlantedLink) as e:
        raise UserError(
            f"Claude Code reads the machine's managed settings {path} whatever saphan pins, "
            f"and saphan cannot read it ({e}), so it cannot tell where that file sends the "
            "run; fix or remove the file (it belongs to the machine's administrator)"
        ) from None
    env = data.get("env") if isinstance(data, dict) else None
    return env if isinstance(env, dict) else {}


#: What :func:`preflight` compares with the run's own value.
_MANAGED_PINNED = frozenset({"ANTHROPIC_BASE_URL", "CLAUDE_CODE_SUBAGENT_MODEL"})


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def preflight(endpoint: str | None, model: str | None, *,
              environ: Mapping[str, str] | None = None,
              managed_dir: str = MANAGED_DIR,
              far_managed: Sequence[tuple[str, bytes | None]] | None = None) -> None:
    """Before the seat (tools/launch.py): refuse what would send a run
    elsewhere than its slot says — ``ANTHROPIC_BASE_URL`` in saphan's
    environment that is not the slot's ``endpoint`` (the operator who
    exported it meant something the slot does not say; it is not passed),
    and managed settings that set the endpoint, or the sub-agent model,
    to something else (their ``env`` outranks every pin, measured)."""
    env = os.environ if environ is None else environ
    exported = env.get("ANTHROPIC_BASE_URL")
    if exported and (endpoint is None or not _same_url(exported, endpoint)):
        has = (f"names {endpoint}" if endpoint is not None
               else f"names no endpoint (so Claude Code's default, {DEFAULT_ENDPOINT})")
        raise UserError(
            f"ANTHROPIC_BASE_URL is set in saphan's environment, and the slot {has}: a "
            "Claude run's endpoint comes only from its slot. Set it there (`saphan slot set "
            "MACHINE SLOT --endpoint URL`) or unset ANTHROPIC_BASE_URL"
        )
    url_pinned = endpoint or DEFAULT_ENDPOINT
    model_pinned = model or DEFAULT_MODEL
    files: list[tuple[str, bytes | None]] = (
        list(far_managed) if far_managed is not None
        else [(p, None) for p in managed_settings_files(managed_dir)])
    for path, raw in files:
        menv = _managed_env(path, raw, far=far_managed is not None)
        url = menv.get("ANTHROPIC_BASE_URL")
        if url is not None and not (isinstance(url, str) and _same_url(url, url_pinned)):
            raise UserError(
                f"the machine's managed Claude Code settings {path} set ANTHROPIC_BASE_URL, "
                "which outranks everything saphan pins, to another endpoint than the slot's "
                f"({url_pinned}); name that endpoint on the slot (`saphan slot set MACHINE "
                "SLOT --endpoint URL`) or have the file changed"
            )
        sub = menv.get("CLAUDE_CODE_SUBAGENT_MODEL")
        if sub is not None and sub != model_pinned:
            raise UserError(
                f"the machine's managed Claude Code settings {path} set "
                "CLAUDE_CODE_SUBAGENT_MODEL, which outranks saphan's pin, to another model "
                f"than this run's ({model_pinned}); run with --model set to it or have the "
                "file changed"
            )
        for name in sorted(str(n) for n in menv):
            why = refused_variable(name)
            if why is None or name in _MANAGED_PINNED or name in ENV_ALLOWED[:3]:
                continue  # checked above; or it authenticates the slot's endpoint
            raise UserError(
                f"the machine's managed Claude Code settings {path} set {name}, which "
                f"outranks everything saphan pins and {why}: the record could not say where "
                "the run's traffic went or what ran it. Have the file changed (it belongs to "
                "the machine's administrator), or run Claude Code on another machine"
            )


# -- the adapter -------------------------------------------------------------------

@dataclass(frozen=True)
class ClaudeAdapter(Adapter):
    tool = "claude"
    allowed_argv = ALLOWED_ARGV
    #: the engine's watchdog (seconds): at the limit the run's whole tree is
    #: ended (SIGTERM through the reaper, then SIGKILL): time-limit-killed
    max_seconds: int = DEFAULT_AGENT_MAX_SECONDS
    #: ``--max-turns`` (None: no turn budget but the time limit)
    max_turns: int | None = None
    #: the slot's endpoint: ``ANTHROPIC_BASE_URL`` (None: the tool's default)
    endpoint: str | None = None
    #: the machine's managed configuration (a test points it elsewhere)
    managed_dir: str = MANAGED_DIR
    #: a far run: the runner's name, its managed settings files as its
    #: preflight found them, and this run's session leaf there (None: not
    #: resolved, so not granted). The settings file is written there by the
    #: far script, the transcript digested there (site/ssh.py).
    far_machine: str | None = None
    far_managed: tuple[str, ...] = ()
    far_leaf: str | None = None
    far_session_env: str | None = None

    def time_limit(self) -> float | None:
        return float(self.max_seconds)

    @property
    def model(self) -> str:
        """The model this run pins: the operator's or the slot's, else
        :data:`DEFAULT_MODEL`."""
        return self.instruction.model or DEFAULT_MODEL

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
        return run_session_id(self.run_id)

    @property
    def settings_path(self) -> str:
        """saphan's settings file for this run, in the run's directory (where
        the prompt is): outside the writable set, hidden with the workspace
        and bound back read-only."""
        return os.path.join(os.path.dirname(os.path.abspath(self.instruction.prompt_path)),
                            SETTINGS_FILE)

    def credential_refused(self, name: str) -> str | None:
        """A class credential Claude Code reads itself (:func:`refused_variable`):
        saphan pins where a run goes and what loads, and a class (which a
        repository can supply) may not move it. :data:`ENV_ALLOWED` passes
        anyway: a class naming it adds nothing."""
        return None if name in ENV_ALLOWED else refused_variable(name)

    def env_allowed(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*ENV_ALLOWED, *super().env_allowed())))

    def env_set(self) -> dict[str, str]:
        out = {"CLAUDE_CODE_SUBAGENT_MODEL": self.model}
        if self.endpoint is not None:
            out["ANTHROPIC_BASE_URL"] = self.endpoint
        return out

    def session_dirs(self) -> tuple[str, ...]:
        if self.confinement == "vendor":
            return ()
        leaf = session_leaf(self.instruction.workdir)
        env_dir = os.path.join(config_home(), "session-env", self.session_id)
        # Created here, outside the jail: bubblewrap binds only what exists.
        for d in (leaf, env_dir):
            os.makedirs(d, exist_ok=True)
        return (leaf, env_dir)

    def exposed_paths(self) -> tuple[str, ...]:
        # saphan's settings file (written by argv(), in the hidden run directory)
        return (self.settings_path,)

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
        from saphan.confine import nofollow

        if self.far_machine is None:
            # Written outside the writable set (the run directory): Claude Code reads it.
            nofollow.write_replace(self.settings_path, settings_bytes())
        pc = self.instruction.permission_class
        resume = self.instruction.resume
        return compose_argv(
            self.binary.path, permission_mode=self.permission_mode, model=self.model,
            settings_path=self.settings_path, max_turns=self.max_turns,
            allowed_commands=pc.commands if pc is not None else (),
            resume_session=resume.session_id if resume else None,
            session_id=self.session_id,
        )

    def guard(self, final_argv: list[str], agent_at: int = 0) -> None:
        """The argv guard with the pinned model, then each pin of
        :data:`PINNED_FLAGS` present with exactly its value."""
        resume = self.instruction.resume
        argv_guard.check(final_argv, tool=self.tool, model=self.model,
                         resume_session=resume.session_id if resume else None,
                         allowed=ALLOWED_ARGV, binary=self.binary.path, agent_at=agent_at)
        agent = final_argv[agent_at:]
        want = {"--setting-sources": [SETTING_SOURCES], "--settings": [self.settings_path],
                "--model": [self.model], "--disallowedTools": list(DISALLOWED_TOOLS)}
        for flag in PINNED_FLAGS:
            at = agent.index(flag) if flag in agent else -1
            given = agent[at + 1:at + 1 + len(want[flag])] if at >= 0 else None
            if given != want[flag]:
                from saphan import refusals

                raise refusals.bypass_token(
                    f"the claude command line must pin {flag} {' '.join(want[flag])!r}; "
                    f"it was refused before launch: {' '.join(final_argv)}",
                    "nothing to change in your request: saphan launches Claude Code only with "
                    "its pins (docs/tools.md); report this as an adapter bug")

    def record(self, policy: Policy) -> dict[str, Any]:
        out = super().record(policy)
        out["model"] = self.model
        out["model_chosen_by"] = (
            "the run or its slot" if self.instruction.model
            else f"saphan's default for Claude Code ({DEFAULT_MODEL}: what 2.1.197 "
                 "requests when nothing names a model, measured)")
        out["endpoint"] = self.endpoint or f"{DEFAULT_ENDPOINT} (the tool's default)"
        out["instruction_files"] = (
            instruction_files(self.managed_dir) if self.far_machine is None
            else [f"(not listed for a run on {self.far_machine}: Claude Code loads that "
                  f"machine's managed {MANAGED_DIR}/CLAUDE.md and .claude/rules if present)"])
        out["claude_pins"] = {
            "setting_sources": [],
            "settings_file": self.settings_path,
            "settings": dict(SETTINGS),
            "disallowed_tools": list(DISALLOWED_TOOLS),
            "subagent_model": self.model,
            "max_turns": self.max_turns,
            "managed_settings": (managed_settings_files(self.managed_dir)
                                 if self.far_machine is None else list(self.far_managed)),
        }
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
        elif self.far_machine is None:
            out["session_dir"] = session_leaf(self.instruction.workdir)
        else:
            out["session_dir"] = self.far_leaf
        return out

    def after_run(self, stdout_path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        init = first_json_event(
            stdout_path, lambda e: e.get("type") == "system" and e.get("subtype") == "init")
        if init is not None:
            out["agent_session"] = {"id": init.get("session_id"), "cwd": init.get("cwd"),
                                    "model": init.get("model"),
                                    "permission_mode": init.get("permissionMode")}
        result, count, strays = _results(stdout_path)
        if result is not None:
            out["usage"] = usage_of(result)
            out["claude_result"] = {"subtype": result.get("subtype"),
                                    "num_turns": result.get("num_turns"),
                                    "is_error": result.get("is_error"),
                                    "result_events": count}
            if strays:
                out["claude_result"]["not_json_lines"] = strays
        return out

    def after_exit(self, stdout_path: str, exit_code: int | None) -> dict[str, Any]:
        """:meth:`after_run`, held against how Claude Code ended, and the
        digest of the session's transcript (``--resume`` compares it)."""
        out = self.after_run(stdout_path)
        result = out.get("claude_result")
        if result is not None:
            result["exit_code"] = exit_code
            why = None
            if exit_code is None:
                why = ("how Claude Code ended is unknown (its launcher did not report it), so "
                       "the `result` event in its output is not taken as its own account")
            elif _by_signal(exit_code):
                # Claude Code prints its result event as it ends; a command of
                # the run can write one to its output and kill it (measured).
                why = (f"Claude Code was ended by a signal ({_status_text(exit_code)}), so the "
                       "`result` event in its output is not its own account")
            elif result.get("not_json_lines"):
                # In stream-json mode it prints whole JSON objects, one a line; a
                # command of the run can write bytes to its output that run into
                # its own lines (its result event among them, measured).
                n = result["not_json_lines"]
                why = (f"Claude Code's output holds {n} line(s) that are not JSON events "
                       "where it prints only whole JSON objects, so the tool's own report "
                       "cannot be told from what the run wrote into it")
            elif result.get("result_events", 1) != 1:
                # It prints one; a command of the run can write more to its output.
                why = (f"Claude Code's output holds {result.get('result_events')} `result` "
                       "events where it prints one, so which is its own cannot be told")
            if why is not None:
                result["ignored"] = True
                out["usage"] = None
                out["notes"] = [
                    f"{why}: a command of the run could have written it. Neither the outcome "
                    "nor the usage is taken from it (usage: none recorded)"]
        if self.far_machine is not None:
            return out  # digested on the runner (site/ssh.py)
        from saphan.errors import PlantedLink

        path = transcript_path(self.instruction.workdir, self.session_id)
        try:
            out["claude_transcript"] = {"path": path, "sha256": transcript_sha256(path)}
        except (OSError, ValueError, PlantedLink) as e:  # a link, a FIFO, too large, none
            out["claude_transcript"] = {"path": path, "sha256": None,
                                        "unreadable": str(e) or type(e).__name__}
        return out

    def outcome(self, facts: dict[str, Any]) -> str | None:
        """``turn-budget-exhausted`` when a turn budget was composed and
        Claude Code itself exited 1 with an ``error_max_turns`` result."""
        result = facts.get("claude_result") or {}
        if (self.max_turns is not None and result.get("subtype") == "error_max_turns"
                and result.get("exit_code") == 1 and not result.get("ignored")):
            return "turn-budget-exhausted"
        return None


def _by_signal(exit_code: int) -> bool:
    """A status a signal gives: negative (Python's) or 128 + N (the engine's
    launcher and reaper, as a shell says it)."""
    return exit_code < 0 or 128 < exit_code <= 128 + 64


def _status_text(exit_code: int) -> str:
    import signal

    number = -exit_code if exit_code < 0 else exit_code - 128
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return name if exit_code < 0 else f"status {exit_code}: 128 + {number}, {name}"


def _results(path: str) -> tuple[dict[str, Any] | None, int, int]:
    """The last ``result`` event of a stream-json log, how many it holds, and
    how many of its non-empty lines are not a whole JSON object (Claude Code
    prints nothing else there: any such line is what something else wrote
    into its output, and may have swallowed one of its own events). A log that
    cannot be read holds nothing."""
    import json

    last: dict[str, Any] | None = None
    count = strays = 0
    try:
        with open(path, "rb") as f:
            for raw in f:
                line = raw[:-1] if raw.endswith(b"\n") else raw
                if not line:
                    continue
                event: object = None
                if line.startswith(b"{") and line.endswith(b"}"):
                    try:
                        event = json.loads(line)
                    except (ValueError, RecursionError):
                        event = None
                if not isinstance(event, dict):
                    strays += 1
                elif event.get("type") == "result":
                    last = event
                    count += 1
    except OSError:
        return None, 0, 0
    return last, count, strays


def usage_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``usage`` from a ``result`` event: the models
    ``modelUsage`` names and its token counts summed over them (sub-agents
    included), else the event's own ``usage``; ``total_cost_usd``."""
    from saphan.tools import usage

    per_model = result.get("modelUsage")
    tokens: dict[str, int | None] = {k: None for k in usage.TOKEN_KINDS}
    if isinstance(per_model, dict) and per_model:
        keys = {"input": "inputTokens", "output": "outputTokens",
                "cache_read": "cacheReadInputTokens",
                "cache_creation": "cacheCreationInputTokens"}
        for counts in per_model.values():
            if isinstance(counts, dict):
                usage.add(tokens, {k: counts.get(v) for k, v in keys.items()})
        models: list[Any] = list(per_model)
    else:
        u = result.get("usage")
        u = u if isinstance(u, dict) else {}
        tokens = {"input": u.get("input_tokens"), "output": u.get("output_tokens"),
                  "cache_read": u.get("cache_read_input_tokens"),
                  "cache_creation": u.get("cache_creation_input_tokens")}
        models = []
    return usage.record(models=models, tokens=tokens, cost_usd=result.get("total_cost_usd"),
                        reported_by="claude result event")
