"""Permission classes: what an agent is permitted to do (SPEC.md §8).

A permission class is a JSON file with a deliberately narrow surface —
allowed commands, write scope, network posture, named credentials, the
protected entries a run may change — and an explicit schema version from
:data:`ACCEPTED`. Loading is strict:

- a version outside the accepted set fails to load (``policy-schema-unknown``),
  never "interpreted charitably";
- a file that claims one version but uses a field of another
  (``policy-schema-mixed``) is rejected, because accepting it would change
  what that version means between releases;
- anything else malformed — a key that appears twice in one object (anywhere
  in the document: JSON would silently keep the last), an unknown field, a wrong type, a relative path,
  a command that is not a bare name, a credential value, a credential that
  never reaches a run (``TMPDIR``, ``SSH_AUTH_SOCK``, ``SAPHAN_HOME``,
  ``SAPHAN_RUN_ID``, ``SAPHAN_RETURN_PATH``), a writable protected name that
  is not one — is ``policy-invalid``.

The versions:

    1  commands, write_scope, network, credentials
    2  allowed_commands (v1's `commands`, renamed), write_scope, network,
       credentials, permission_mode (Claude Code's mode, composed as policy)
    3  version 2's fields and writable_protected: names from
       saphan.confine.protected.NAMES (``.vscode``, ``.envrc``, ...) a run
       may change — not bound read-only in the jail, and imported from the
       run's commits. Versions 1 and 2 allow none.
    4  version 3's fields and egress_policy: the absolute path of an egress
       policy file (egress/policy.py) every run under the class carries, as
       if `saphan run --egress-policy` named it.

A class never widens a boundary: ``write_scope`` only narrows where a run
may work (the working directory must lie inside it), the writable set stays
derived from the working directory. Commands are matched exact-token on the
base name (:meth:`PermissionClass.allows`) — never by prefix or substring.
Credentials are variable NAMES; the engine mints each value at launch from
its own environment, and a file that carries a value is refused. They are
also the only way a variable outside the base and the tool's own list
reaches a run (confine/environment.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saphan import refusals
from saphan.confine import environment, protected
from saphan.refusals import Refusal

#: schema version -> the fields that version defines
FIELDS: dict[int, frozenset[str]] = {
    1: frozenset({"schema", "name", "commands", "write_scope", "network", "credentials"}),
    2: frozenset({"schema", "name", "allowed_commands", "write_scope", "network", "credentials",
                  "permission_mode"}),
    3: frozenset({"schema", "name", "allowed_commands", "write_scope", "network", "credentials",
                  "permission_mode", "writable_protected"}),
    4: frozenset({"schema", "name", "allowed_commands", "write_scope", "network", "credentials",
                  "permission_mode", "writable_protected", "egress_policy"}),
}
ACCEPTED: tuple[int, ...] = tuple(sorted(FIELDS))
NETWORK_POSTURES = ("off", "open")
PERMISSION_MODES = ("plan", "acceptEdits")

_COMMAND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class PermissionClass:
    schema: int
    name: str
    commands: tuple[str, ...]
    write_scope: tuple[str, ...]
    network: str
    credentials: tuple[str, ...]
    permission_mode: str | None = None
    source: str = ""
    #: protected entries (confine/protected.py) a run may change; schema 3 only
    writable_protected: tuple[str, ...] = ()
    #: an egress policy file every run under the class carries; schema 4 only
    egress_policy: str | None = None

    def allows(self, command: str) -> bool:
        """Exact token on the base name: ``/usr/bin/git`` is ``git``; ``gitk``,
        ``git-lfs`` and ``gi`` are not ``git``."""
        return os.path.basename(command) in self.commands

    def scope_covers(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == s or real.startswith(s.rstrip("/") + "/") for s in self.write_scope)

    def as_record(self) -> dict[str, Any]:
        return {
            "source": self.source, "schema": self.schema, "name": self.name,
            "commands": list(self.commands), "write_scope": list(self.write_scope),
            "network": self.network, "credentials": list(self.credentials),
            "permission_mode": self.permission_mode,
            "writable_protected": list(self.writable_protected),
            "egress_policy": self.egress_policy,
        }


def _invalid(where: str, message: str) -> Refusal:
    return refusals.policy_invalid(f"permission class {where}: {message}",
                   f"fix {where}; `saphan policy check {where}` prints what it allows")


def load(path: str) -> PermissionClass:
    """Read and validate one permission class file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise _invalid(path, f"cannot be read ({e.strerror})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        raise _invalid(path, f"has the key {e.key!r} twice in one object (a JSON reader would "
                             "keep only one of them, and which is not a policy's choice); "
                             "give each key once") from None
    except (ValueError, RecursionError) as e:
        raise _invalid(path, f"is not JSON ({e})") from None
    return parse(data, source=os.path.abspath(path))


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: every object of the document, keys checked."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse(data: object, *, source: str = "<memory>") -> PermissionClass:
    """Validate a decoded JSON value; raises :class:`Refusal` on any defect."""
    if not isinstance(data, Mapping):
        raise _invalid(source, "the top level must be a JSON object")
    if "schema" not in data:
        raise refusals.policy_schema_unknown(
            f"permission class {source} names no schema version; accepted: "
            f"{', '.join(map(str, ACCEPTED))}",
            f'add "schema": {ACCEPTED[-1]} (and only that version\'s fields)',
        )
    schema = data["schema"]
    if type(schema) is not int or schema not in FIELDS:
        raise refusals.policy_schema_unknown(
            f"permission class {source} claims schema {json.dumps(schema)}, which this "
            f"engine does not accept (accepted: {', '.join(map(str, ACCEPTED))})",
            f"rewrite it for schema {ACCEPTED[-1]}, or upgrade saphan if it comes from a newer "
            "release",
        )
    keys = {str(k) for k in data}
    known_here = FIELDS[schema]
    foreign = sorted(k for k in keys - known_here
                     if any(k in fields for v, fields in FIELDS.items() if v != schema))
    if foreign:
        owners = {k: [v for v, f in FIELDS.items() if k in f] for k in foreign}
        described = ", ".join(f"{k!r} (schema {'/'.join(map(str, owners[k]))})" for k in foreign)
        raise refusals.policy_schema_mixed(
            f"permission class {source} claims schema {schema} but uses {described}",
            f"use only schema {schema}'s fields ({', '.join(sorted(known_here))}), or change "
            "\"schema\" to the version those fields belong to and rewrite the rest",
        )
    unknown = sorted(keys - known_here)
    if unknown:
        raise _invalid(source, f"unknown field(s) {', '.join(map(repr, unknown))} for schema "
                               f"{schema}; its fields: {', '.join(sorted(known_here))}")
    name = data.get("name", "")
    if not isinstance(name, str) or (name and not _NAME.match(name)):
        raise _invalid(source, "`name` must be 1-63 letters, digits, '.', '_' or '-'")
    commands = _str_list(source, data, "commands" if schema == 1 else "allowed_commands")
    for c in commands:
        if not _COMMAND.match(c):
            raise _invalid(source, f"command {c!r} is not a bare base name (no paths, no "
                                   "arguments, no wildcards): commands match exact-token")
    scope = _str_list(source, data, "write_scope")
    for p in scope:
        if not os.path.isabs(p) or "\x00" in p:
            raise _invalid(source, f"write_scope entry {p!r} is not an absolute path")
    network = data.get("network", "off")
    if network not in NETWORK_POSTURES:
        raise _invalid(source, f"`network` must be one of {', '.join(NETWORK_POSTURES)}, got "
                               f"{json.dumps(network)}")
    credentials = _credentials(source, data.get("credentials", []))
    mode = data.get("permission_mode")
    if mode is not None and mode not in PERMISSION_MODES:
        raise _invalid(source, f"`permission_mode` must be one of {', '.join(PERMISSION_MODES)} "
                               f"(bypass modes are not representable), got {json.dumps(mode)}")
    writable = _str_list(source, data, "writable_protected")
    for w in writable:
        if w not in protected.NAMES:
            raise _invalid(source, f"writable_protected entry {w!r} is not a protected name; "
                                   f"protected: {', '.join(protected.NAMES)}")
    egress = data.get("egress_policy")
    if egress is not None and (not isinstance(egress, str) or not os.path.isabs(egress)
                               or "\x00" in egress):
        raise _invalid(source, "`egress_policy` must be the absolute path of an egress policy "
                               "file (`saphan egress check FILE`)")
    return PermissionClass(
        egress_policy=egress,
        schema=schema, name=name, commands=tuple(dict.fromkeys(commands)),
        write_scope=tuple(dict.fromkeys(os.path.normpath(p) for p in scope)),
        network=str(network), credentials=credentials,
        permission_mode=mode if isinstance(mode, str) else None, source=source,
        writable_protected=tuple(dict.fromkeys(writable)),
    )


def _str_list(source: str, data: Mapping[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _invalid(source, f"`{key}` must be a list of strings")
    return list(value)


def _credentials(source: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _invalid(source, "`credentials` must be a list of variable names")
    names: list[str] = []
    for item in value:
        if isinstance(item, Mapping):
            raise _invalid(source, "a credential is named by its variable only "
                                   "(e.g. \"ANTHROPIC_API_KEY\"); values never live in a "
                                   "policy file — the engine mints them at launch")
        if not isinstance(item, str) or not _VARIABLE.match(item):
            raise _invalid(source, f"credential {item!r} is not an environment variable name "
                                   "(A-Z, 0-9, _)")
        if environment.never_passed(item):
            raise _invalid(source, f"credential {item} never reaches a run (never passed: "
                                   f"{', '.join(sorted(environment.NEVER))}): saphan sets "
                                   "TMPDIR and its run variables itself, and SSH_AUTH_SOCK "
                                   "(a socket that signs as you) and SAPHAN_HOME stay out")
        names.append(item)
    return tuple(dict.fromkeys(names))


def describe(pc: PermissionClass) -> list[str]:
    """What the class allows, one line each (``saphan policy check``)."""
    return [
        f"permission class {pc.name or '(unnamed)'}: schema {pc.schema} ({pc.source})",
        "commands (exact base name): " + (", ".join(pc.commands) or "none"),
        "write scope (runs must work inside): " + (", ".join(pc.write_scope) or "any directory"),
        f"network: {pc.network}",
        "credentials (minted at launch, by name): " + (", ".join(pc.credentials) or "none"),
        f"permission mode (Claude Code, policy not boundary): {pc.permission_mode or 'default'}",
        "protected entries a run may change: " + (", ".join(pc.writable_protected) or "none"),
        "egress policy (every run carries it): " + (pc.egress_policy or "none"),
    ]
