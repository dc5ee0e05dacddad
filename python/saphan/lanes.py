"""Lanes: the model endpoints saphan's own agent loop drives.

A lane is an OpenAI-compatible chat-completions endpoint (a local llama.cpp,
vLLM or Ollama server, or any other), the model to ask it for, and the file
that holds its API key. Lanes live in ``$SAPHAN_HOME/lanes.toml``, written
only by ``saphan lane add`` / ``saphan lane remove``, closed schema::

    [lane.NAME]
    base_url = "http://127.0.0.1:8080/v1"
    model = "qwen2.5-coder"
    credential_file = "/home/me/.config/saphan/lanes/local.key"
    credential_env = "OPENAI_API_KEY"
    timeout = 120

The credential VALUE never appears in this file, in a record, in argv or in
any environment saphan composes. It is read here, in the outer (unconfined)
process, through the same custody discipline as the workspace key (rust/core:
regular file, owned by the caller, mode 0600, not a symbolic link, exactly one
hard link, at most :data:`MAX_CREDENTIAL_BYTES`; one token of at least
:data:`MIN_CREDENTIAL_CHARS` characters), and handed to the jailed loop over a
pipe (saphan.loop.adapter). Every lane's credential file and this file
are read-denied inside the loop's jail — all lanes, not just the active one.
This file itself is read with a credential's custody: it says where keys go.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from saphan import refusals
from saphan.errors import UserError

MAX_CREDENTIAL_BYTES = 4096
MAX_LANES_FILE_BYTES = 1 << 20
DEFAULT_ENV = "OPENAI_API_KEY"
DEFAULT_TIMEOUT = 120

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_KEYS = {"base_url": str, "model": str, "credential_file": str, "credential_env": str,
         "timeout": int}
#: A key is one token of these characters (it travels as an HTTP header value
#: and is matched by value, so it must survive JSON unescaped), at least
#: :data:`MIN_CREDENTIAL_CHARS` long: a shorter one could not be told apart
#: from ordinary text when it is scrubbed from environments and output.
_TOKEN = re.compile(rb"^[A-Za-z0-9._~+/=:-]+$")
MIN_CREDENTIAL_CHARS = 16


@dataclass(frozen=True)
class Lane:
    name: str
    base_url: str
    model: str
    credential_file: str
    credential_env: str = DEFAULT_ENV
    #: seconds one request to the endpoint may take
    timeout: int = DEFAULT_TIMEOUT

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def path(home: Path) -> Path:
    return home / "lanes.toml"


def load(file: Path) -> dict[str, Lane]:
    """Every declared lane, by name (empty when the file does not exist).

    The file is read with a credential file's custody (rust/core): it is not
    a secret, but it says where each key is sent, so whoever could rewrite it
    could point a lane at their own endpoint.
    """
    import tomllib

    from saphan import _native

    try:
        raw = _native.read_lanes_file(str(file), MAX_LANES_FILE_BYTES)
    except FileNotFoundError:
        return {}
    except _native.KeyCustodyError as e:
        message, fix = e.args
        raise refusals.custody_key_unsafe(f"{message} (it names where lane keys are sent)",
                      fix) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{file} is not UTF-8 ({e}); fix it or move it aside") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{file} is not valid TOML ({e}); fix it or remove the broken lane "
                        "with `saphan lane remove`") from None
    unknown = [k for k in data if k != "lane"]
    if unknown or not isinstance(data.get("lane", {}), dict):
        raise UserError(f"{file}: only [lane.NAME] tables belong here (found: "
                        f"{', '.join(unknown) or 'lane'}); it is written by `saphan lane add`")
    lanes: dict[str, Lane] = {}
    for name, body in data.get("lane", {}).items():
        if not isinstance(body, dict):
            raise UserError(f"{file}: lane.{name} must be a table")
        for key, value in body.items():
            if key not in _KEYS:
                raise UserError(f"{file}: unknown key lane.{name}.{key}; known keys: "
                                f"{', '.join(_KEYS)}")
            if not isinstance(value, _KEYS[key]):
                raise UserError(f"{file}: lane.{name}.{key} must be a "
                                f"{_KEYS[key].__name__}")
        missing = [k for k in ("base_url", "model", "credential_file") if k not in body]
        if missing:
            raise UserError(f"{file}: lane.{name} lacks {', '.join(missing)}; re-add it with "
                            "`saphan lane add`")
        lanes[name] = validate(Lane(name=name, **body))
    return lanes


def validate(lane: Lane) -> Lane:
    """Check every field (the same checks for `lane add` and for a loaded file)."""
    if not _NAME.match(lane.name):
        raise UserError(f"lane name {lane.name!r} is not allowed; use 1-63 letters, digits, "
                        "'.', '_' or '-', starting with a letter or digit")
    if not re.match(r"^https?://[^\s/]+(/\S*)?$", lane.base_url):
        raise UserError(f"--base-url {lane.base_url!r} is not an http(s) URL; give the "
                        "endpoint's OpenAI-compatible base, e.g. http://127.0.0.1:8080/v1")
    if not lane.model or lane.model.startswith("-") or any(c.isspace() for c in lane.model):
        raise UserError(f"--model {lane.model!r} is not a model name")
    if not os.path.isabs(lane.credential_file):
        raise UserError(f"credential file {lane.credential_file!r} is not an absolute path")
    if not _VARIABLE.match(lane.credential_env):
        raise UserError(f"--credential-env {lane.credential_env!r} is not a variable name "
                        "(A-Z, 0-9, _; e.g. OPENAI_API_KEY)")
    if not 1 <= lane.timeout <= 3600:
        raise UserError(f"--timeout {lane.timeout} is out of range; give 1-3600 seconds")
    return lane


def read_credential(lane: Lane) -> bytes:
    """The lane's API key, read after its custody is proved (rust/core).

    Surrounding whitespace (a trailing newline) is stripped; what remains must
    be one printable token, because it travels as an HTTP header value.
    """
    from saphan import _native

    where = f"lane {lane.name}'s credential file {lane.credential_file}"
    try:
        raw = _native.read_secret_file(lane.credential_file, MAX_CREDENTIAL_BYTES)
    except _native.KeyCustodyError as e:
        message, fix = e.args
        raise refusals.custody_key_unsafe(
            f"lane {lane.name}: {message}",
            f"{fix}; then `saphan lane check {lane.name}`",
        ) from None
    except FileNotFoundError:
        raise UserError(f"{where} does not exist; write the key there (mode 0600) or "
                        f"re-add the lane with `saphan lane add {lane.name} --credential-file "
                        "PATH`") from None
    except PermissionError as e:
        raise refusals.custody_key_unsafe(
            f"{where} cannot be opened by uid {os.geteuid()} ({e.strerror})",
            "the credential file must belong to the account that runs saphan",
        ) from None
    secret = raw.strip()
    if not _TOKEN.match(secret):
        raise UserError(f"{where} does not hold one token of letters, digits and ._~+/=:- "
                        "(no spaces, quotes or control characters); put only the API key in it")
    if len(secret) < MIN_CREDENTIAL_CHARS:
        raise UserError(
            f"{where} holds a {len(secret)}-character key; saphan needs at least "
            f"{MIN_CREDENTIAL_CHARS} (a shorter one cannot be told apart from ordinary text "
            "when it is scrubbed from environments and output). If the server ignores keys, "
            "write a random one: `openssl rand -hex 24 > FILE`"
        )
    return secret


def read_all(declared: dict[str, Lane], active: Lane) -> dict[str, bytes]:
    """Every declared lane's key whose file exists, each read under custody.

    A loop run hides ALL lanes' files, so all of them must be files a path
    denial covers: a credential file that gained a second hard link since
    `lane add` refuses the run, whichever lane is active. The values serve
    only to scrub environments by value (another name for the same key).
    """
    out = {active.name: read_credential(active)}
    for lane in declared.values():
        if lane.name not in out and os.path.lexists(lane.credential_file):
            out[lane.name] = read_credential(lane)
    return out


def add(file: Path, lane: Lane) -> Lane:
    """Declare a lane. The credential file's custody is checked now, not at run time."""
    lanes = load(file)
    if lane.name in lanes:
        raise UserError(f"lane {lane.name!r} already exists; `saphan lane remove {lane.name}` "
                        "first, or pick another name")
    lane = validate(Lane(**{**lane.as_dict(),
                            "credential_file": os.path.abspath(lane.credential_file)}))
    # The realpath is what the jail must deny; a link in the final component
    # is refused by the custody check itself.
    parent = os.path.realpath(os.path.dirname(lane.credential_file))
    lane = Lane(**{**lane.as_dict(), "credential_file": os.path.join(
        parent, os.path.basename(lane.credential_file))})
    read_credential(lane)
    _write(file, {**lanes, lane.name: lane})
    return lane


def remove(file: Path, name: str) -> Lane:
    lanes = load(file)
    if name not in lanes:
        raise UserError(f"no lane named {name!r}; see `saphan lane list`")
    gone = lanes.pop(name)
    _write(file, lanes)
    return gone


def get(file: Path, name: str | None) -> Lane:
    """The named lane, or the only one when none is named."""
    return choose(load(file), name)


def choose(lanes: dict[str, Lane], name: str | None) -> Lane:
    """The named lane among ``lanes``, or the only one when none is named."""
    if name is None:
        if len(lanes) == 1:
            return next(iter(lanes.values()))
        if not lanes:
            raise UserError("a loop slot needs a lane and none is declared; add one: "
                            "`saphan lane add NAME --base-url URL --model M "
                            "--credential-file PATH`")
        raise UserError(f"{len(lanes)} lanes are declared ({', '.join(sorted(lanes))}); "
                        "name one with --lane NAME")
    if name not in lanes:
        raise UserError(f"no lane named {name!r}; see `saphan lane list`")
    return lanes[name]


def _write(file: Path, lanes: dict[str, Lane]) -> None:
    """Replace the lanes file atomically (mode 0600); never half-written."""
    lines = ["# saphan lanes: written by `saphan lane add/remove`. Unknown keys are refused.",
             "# Credential VALUES never live here; each lane names a custody-checked file.", ""]
    for lane in lanes.values():
        lines.append(f"[lane.{json.dumps(lane.name)}]")
        for key in _KEYS:
            value = getattr(lane, key)
            lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def check(path: Path, name: str | None = None) -> list[Lane]:
    """Re-check every lane's credential custody (or the named one's); nothing is sent."""
    chosen = [get(path, name)] if name else list(load(path).values())
    for lane in chosen:
        read_credential(lane)
    return chosen
