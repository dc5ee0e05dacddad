"""The workspace's config.toml: a closed schema, validated on load.

Known keys are listed in :data:`SCHEMA`; any other key is an error naming it.
``run.confinement`` is NOT validated here, not even its type: a bad value
(``"engnie"``, ``1``, ``true``, a table) must surface as the refusal
``confinement-setting-invalid`` on the next run of any shape, before any other
branch of that run, recorded like every refusal (see :func:`confinement_mode`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saphan import refusals
from saphan.errors import UserError

CONFINEMENT_MODES = ("engine", "vendor")

#: section -> {key: python type} (``object``: any TOML value; checked later)
SCHEMA: dict[str, dict[str, type]] = {
    "run": {"confinement": object},
    "database": {"url": str, "write_retry_seconds": int},
    "ssh": {"connect_timeout": int, "command_timeout": int},
    "codex": {"base_url": str, "env_key": str},
    "cast": {"image_fresh_seconds": int},
    "auth": {"claude_token_url": str, "codex_token_url": str},
}

DEFAULT_TEXT = """\
# saphan workspace configuration. Unknown keys are refused.

[run]
# Who confines agent tools: "engine" (saphan composes the OS boundary) or
# "vendor" (the agent tool's own sandbox; the record then says the engine
# makes no claim the agent is confined). Any other value refuses every run.
confinement = "engine"

[database]
# "sqlite" keeps the store in this workspace (saphan.db); several operators
# share a PostgreSQL store: "postgresql://user@host:port/dbname".
url = "sqlite"
"""


@dataclass(frozen=True)
class Config:
    path: Path
    #: as written, any TOML value: :func:`confinement_mode` is the check
    confinement: object
    database_url: str
    #: how long a run's outcome is retried on the store once its record file
    #: holds it (run/record.py); 0 tries once
    write_retry_seconds: int = 30
    #: seconds to reach an SSH machine and finish the handshake
    ssh_connect_timeout: int = 10
    #: seconds one non-streaming SSH command may take (a run has no limit)
    ssh_command_timeout: int = 120
    #: Codex's model provider, pinned on its command line when set ([codex])
    codex_base_url: str | None = None
    #: the variable holding that provider's API key
    codex_env_key: str | None = None
    #: how old a machine's docker-oci row may be when a cast reads it ([cast])
    image_fresh_seconds: int = 86400
    #: where a seat's login token is refreshed, per tool ([auth]; tools/login.py)
    claude_token_url: str | None = None
    codex_token_url: str | None = None
    #: the ``section.key`` names the file sets (every other one is a default)
    given: frozenset[str] = field(default=frozenset(), compare=False)


def load(path: Path) -> Config:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no config at {path}; run `saphan init` first") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML ({e}); fix the file at that line") from None
    for section, body in data.items():
        if section not in SCHEMA:
            raise UserError(
                f"{path}: unknown section [{section}]; known sections: {', '.join(SCHEMA)}; "
                f"fix: rename or remove [{section}]"
            )
        if not isinstance(body, dict):
            raise UserError(f"{path}: `{section}` must be a table; fix: write it as "
                            f"[{section}] followed by its keys")
        for key, value in body.items():
            known = SCHEMA[section]
            if key not in known:
                raise UserError(
                    f"{path}: unknown key {section}.{key}; known keys in [{section}]: "
                    f"{', '.join(known)}; fix: rename or remove {key} under [{section}]"
                )
            want = known[key]
            # TOML's true/false are Python ints too: not a number of seconds.
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                name = _TOML_NAMES.get(want, want.__name__)
                raise UserError(
                    f"{path}: {section}.{key} must be a TOML {name}, got {_shown(value)} "
                    f"(a TOML {_toml_type(value)}); fix: write {key} = <{name}> under "
                    f"[{section}]"
                )
    run = data.get("run", {})
    db = data.get("database", {})
    url = db.get("url", "sqlite")
    if not (url == "sqlite" or url.startswith(("sqlite:///", "postgresql://", "postgres://"))):
        from saphan.store.postgres import redact_url

        raise UserError(
            f"{path}: database.url {redact_url(url)!r} is neither \"sqlite\", \"sqlite:///PATH\" "
            "nor a postgresql:// URL; fix: set url = \"sqlite\" (or a postgresql://USER@HOST/DB "
            "URL) under [database]"
        )
    retry = db.get("write_retry_seconds", 30)
    if not 0 <= retry <= 3600:
        raise UserError(f"{path}: database.write_retry_seconds is {retry}; give 0..3600 "
                        "seconds; fix: write_retry_seconds = 30 under [database], or remove "
                        "it for the default")
    fresh = data.get("cast", {}).get("image_fresh_seconds", 86400)
    if not 60 <= fresh <= 30 * 86400:
        raise UserError(f"{path}: cast.image_fresh_seconds is {fresh}; give 60..2592000 "
                        "seconds; fix: image_fresh_seconds = 86400 under [cast], or remove it "
                        "for the default")
    codex_url = data.get("codex", {}).get("base_url")
    if codex_url is not None:
        from saphan.endpoints import check_endpoint_masked

        check_endpoint_masked(codex_url, f"{path}: codex.base_url")
    auth = data.get("auth", {})
    for key in ("claude_token_url", "codex_token_url"):
        if key in auth:
            from saphan.endpoints import check_endpoint_masked

            check_endpoint_masked(auth[key], f"{path}: auth.{key}")
    ssh = data.get("ssh", {})
    for key in ("connect_timeout", "command_timeout"):
        if key in ssh and ssh[key] < 1:
            raise UserError(f"{path}: ssh.{key} is {ssh[key]}; give a number of seconds >= 1; "
                            f"fix: {key} = 10 under [ssh], or remove it for the default")
    return Config(
        path=path, confinement=run.get("confinement", "engine"), database_url=url,
        write_retry_seconds=retry, image_fresh_seconds=fresh,
        ssh_connect_timeout=ssh.get("connect_timeout", 10),
        ssh_command_timeout=ssh.get("command_timeout", 120),
        codex_base_url=data.get("codex", {}).get("base_url"),
        codex_env_key=data.get("codex", {}).get("env_key"),
        claude_token_url=auth.get("claude_token_url"),
        codex_token_url=auth.get("codex_token_url"),
        given=frozenset(f"{s}.{k}" for s, body in data.items() for k in body),
    )


def check(config: Config) -> str:
    """``saphan config check``, after :func:`load` validated the rest: what
    load leaves to each run's refusal (run.confinement), as a UserError
    naming the key and the fix. Returns the confinement mode."""
    try:
        return confinement_mode(config)
    except refusals.Refusal as r:
        raise UserError(f"{r.message}; fix: {r.remediation}") from None


def effective(config: Config, *, workspace: Path, key_path: Path,
              sqlite_path: Path) -> dict[str, Any]:
    """``saphan config show``: where the workspace and its files are, the
    store it opens, and every setting as it takes effect (``source``:
    "file" or "default"). Passwords in URLs are masked (a store URL by
    postgres.redact_url, the one function every printed store URL goes
    through)."""
    from saphan.endpoints import redact_endpoint
    from saphan.store import sqlite_file
    from saphan.store.postgres import redact_url

    url = config.database_url
    file = sqlite_file(url, sqlite_path)
    store = redact_url(url) if file is None else f"sqlite:///{file}"
    values: dict[str, object] = {
        "run.confinement": config.confinement,
        "database.url": redact_url(url),
        "database.write_retry_seconds": config.write_retry_seconds,
        "ssh.connect_timeout": config.ssh_connect_timeout,
        "ssh.command_timeout": config.ssh_command_timeout,
        "codex.base_url": (redact_endpoint(config.codex_base_url)
                           if config.codex_base_url is not None else None),
        "codex.env_key": config.codex_env_key,
        "cast.image_fresh_seconds": config.image_fresh_seconds,
        "auth.claude_token_url": config.claude_token_url,
        "auth.codex_token_url": config.codex_token_url,
    }
    return {
        "workspace": str(workspace),
        "config_file": str(config.path),
        "record_key": str(key_path),
        "store": store,
        "settings": [
            {"key": k, "value": v if v is None or isinstance(v, (str, int, float)) else _shown(v),
             "source": "file" if k in config.given else "default"}
            for k, v in values.items()
        ],
    }


def confinement_mode(config: Config) -> str:
    """run.confinement, or the refusal. Every run calls this first."""
    value = config.confinement
    if not isinstance(value, str) or value not in CONFINEMENT_MODES:
        shown = repr(value) if isinstance(value, str) else (
            f"{_shown(value)} (a TOML {_toml_type(value)}, not a string)")
        raise refusals.confinement_setting_invalid(
            f"run.confinement is {shown} in {config.path}; "
            "it accepts exactly \"engine\" or \"vendor\"",
            f'edit {config.path}: set confinement = "engine" under [run] '
            '(or "vendor" to hand confinement to the agent tool, on the record)',
        )
    return value


_TOML_NAMES: dict[type, str] = {str: "string", int: "integer"}


def _shown(value: object) -> str:
    """A value other than a string, one line, as TOML would write it (near enough)."""
    import datetime

    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return json.dumps(value, default=str)


def _toml_type(value: object) -> str:
    import datetime

    for kind, name in ((str, "string"), (bool, "boolean"), (int, "integer"), (float, "float"),
                       (list, "array"),
                       (dict, "table"), (datetime.datetime, "date-time"),
                       (datetime.date, "date"), (datetime.time, "time")):
        if isinstance(value, kind):
            return name
    return type(value).__name__
