"""The workspace's config.toml: a closed schema, validated on load.

Known keys are listed in :data:`SCHEMA`; any other key is an error naming it.
``run.confinement`` is NOT validated here, not even its type: a bad value
(``"engnie"``, ``1``, ``true``, a table) must surface as the refusal
``confinement-setting-invalid`` on the next run of any shape, before any other
branch of that run, recorded like every refusal (see :func:`confinement_mode`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from saphan import refusals
from saphan.errors import UserError

CONFINEMENT_MODES = ("engine", "vendor")

#: section -> {key: python type} (``object``: any TOML value; checked later)
SCHEMA: dict[str, dict[str, type]] = {
    "run": {"confinement": object},
    "database": {"url": str},
    "ssh": {"connect_timeout": int, "command_timeout": int},
    "codex": {"base_url": str, "env_key": str},
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
    #: seconds to reach an SSH machine and finish the handshake
    ssh_connect_timeout: int = 10
    #: seconds one non-streaming SSH command may take (a run has no limit)
    ssh_command_timeout: int = 120
    #: Codex's model provider, pinned on its command line when set ([codex])
    codex_base_url: str | None = None
    #: the variable holding that provider's API key
    codex_env_key: str | None = None


def load(path: Path) -> Config:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no config at {path}; run `saphan init` first") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML ({e}); fix the file") from None
    for section, body in data.items():
        if section not in SCHEMA:
            raise UserError(
                f"{path}: unknown section [{section}]; known sections: {', '.join(SCHEMA)}"
            )
        if not isinstance(body, dict):
            raise UserError(f"{path}: `{section}` must be a table")
        for key, value in body.items():
            known = SCHEMA[section]
            if key not in known:
                raise UserError(
                    f"{path}: unknown key {section}.{key}; known keys in [{section}]: "
                    f"{', '.join(known)}"
                )
            if not isinstance(value, known[key]):
                raise UserError(
                    f"{path}: {section}.{key} must be a {known[key].__name__}, "
                    f"got {type(value).__name__}"
                )
    run = data.get("run", {})
    db = data.get("database", {})
    url = db.get("url", "sqlite")
    if not (url == "sqlite" or url.startswith(("sqlite:///", "postgresql://", "postgres://"))):
        raise UserError(
            f"{path}: database.url {url!r} is neither \"sqlite\", \"sqlite:///PATH\" "
            "nor a postgresql:// URL"
        )
    ssh = data.get("ssh", {})
    for key in ("connect_timeout", "command_timeout"):
        if key in ssh and ssh[key] < 1:
            raise UserError(f"{path}: ssh.{key} is {ssh[key]}; give a number of seconds >= 1")
    return Config(
        path=path, confinement=run.get("confinement", "engine"), database_url=url,
        ssh_connect_timeout=ssh.get("connect_timeout", 10),
        ssh_command_timeout=ssh.get("command_timeout", 120),
        codex_base_url=data.get("codex", {}).get("base_url"),
        codex_env_key=data.get("codex", {}).get("env_key"),
    )


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


def _shown(value: object) -> str:
    """A value other than a string, one line, as TOML would write it (near enough)."""
    import datetime

    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return json.dumps(value, default=str)


def _toml_type(value: object) -> str:
    import datetime

    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "float"), (list, "array"),
                       (dict, "table"), (datetime.datetime, "date-time"),
                       (datetime.date, "date"), (datetime.time, "time")):
        if isinstance(value, kind):
            return name
    return type(value).__name__
