"""Egress policy files: where a run's door may lead, and the credentials it adds.

An egress policy is a versioned JSON file with the discipline of a permission
class (tools/permission_class.py): an explicit set of accepted schema
versions (``policy-schema-unknown`` otherwise), a key given twice anywhere
in the document or a key the version does not define is ``policy-invalid``,
by name. Schema 1::

    {
      "schema": 1,
      "name": "claude-and-github",
      "allow": [
        {"host": "api.github.com", "ports": [443]},
        {"host": "*.githubusercontent.com", "ports": [443]}
      ],
      "routes": [
        {"name": "anthropic", "tool": "claude",
         "upstream": "https://api.anthropic.com",
         "header": "x-api-key", "prefix": "",
         "secret_env": "ANTHROPIC_API_KEY"}
      ]
    }

- ``allow``: destinations the door's CONNECT answers: an exact host name or
  IP literal, or ``*.suffix`` (any name ending in ``.suffix``, not the
  suffix itself), each with its ports. Loopback, link-local (cloud
  metadata) and unspecified addresses are denied by the door whatever this
  list says (egress/door.py).
- ``routes``: credential routes. The door serves ``/<name>/…`` on the jail's
  loopback and forwards it to ``upstream`` with the real secret in
  ``header`` (after ``prefix``, e.g. ``"Bearer "``); inside the jail the tool
  holds only a per-run placeholder, which the door checks and replaces. The
  secret comes from ``secret_env`` (saphan's own environment) or
  ``secret_file`` (an absolute path, read under a lane key's custody: yours,
  0600, one link, no link) at launch — never from this file. A route naming
  a ``tool`` (claude, codex or loop) is that tool's model endpoint: the
  agent's base URL points at the door, and its upstream must be the slot's
  endpoint (or the lane's base URL). Upstreams are https: the secret never
  crosses a network in the clear, and the door never connects to loopback.

Loading reads nothing but the file; the secrets are read by :func:`secrets`
when a run starts.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from saphan import refusals
from saphan.errors import UserError
from saphan.refusals import Refusal

#: schema version -> the fields of its top level, of an allow entry, of a route
FIELDS: dict[int, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {
    1: (frozenset({"schema", "name", "allow", "routes"}),
        frozenset({"host", "ports"}),
        frozenset({"name", "tool", "upstream", "header", "prefix", "secret_env",
                   "secret_file"})),
}
ACCEPTED: tuple[int, ...] = tuple(sorted(FIELDS))
#: the agent tools a route can serve as their model endpoint
ROUTE_TOOLS = ("claude", "codex", "loop")
MAX_POLICY_BYTES = 1 << 20
MAX_ENTRIES = 256

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ROUTE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_PREFIX = re.compile(r"^[\x21-\x7e]{0,31}[ ]?$")
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
#: headers a route may not carry its secret in: hop-by-hop, framing, routing
_RESERVED_HEADERS = frozenset({
    "host", "connection", "content-length", "transfer-encoding", "te", "trailer", "upgrade",
    "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection", "expect",
})


@dataclass(frozen=True)
class Allowed:
    host: str
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        name = host.lower().rstrip(".")
        if port not in self.ports:
            return False
        if self.host.startswith("*."):
            return name.endswith(self.host[1:])
        return name == self.host


@dataclass(frozen=True)
class RouteSpec:
    name: str
    upstream: str
    header: str
    prefix: str
    secret_env: str | None
    secret_file: str | None
    tool: str | None = None

    def secret_source(self) -> str:
        return (f"variable {self.secret_env}" if self.secret_env is not None
                else f"file {self.secret_file}")


@dataclass(frozen=True)
class EgressPolicy:
    schema: int
    name: str
    allow: tuple[Allowed, ...]
    routes: tuple[RouteSpec, ...]
    source: str = "<memory>"
    #: SHA-256 of the file's bytes as loaded (the record names what was enforced)
    sha256: str = ""

    def route_for(self, tool: str) -> RouteSpec | None:
        return next((r for r in self.routes if r.tool == tool), None)

    def as_record(self) -> dict[str, Any]:
        return {
            "source": self.source, "sha256": self.sha256, "schema": self.schema,
            "name": self.name,
            "allow": [{"host": a.host, "ports": list(a.ports)} for a in self.allow],
            "routes": [{"name": r.name, "tool": r.tool, "upstream": r.upstream,
                        "header": r.header, "secret_from": r.secret_source()}
                       for r in self.routes],
        }


def _invalid(where: str, message: str) -> Refusal:
    return refusals.policy_invalid(f"egress policy {where}: {message}",
                                   f"fix {where}; `saphan egress check {where}` prints what "
                                   "it allows")


def load(path: str) -> EgressPolicy:
    """Read and validate one egress policy file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except OSError as e:
        raise _invalid(path, f"cannot be read ({e.strerror})") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise _invalid(path, f"is larger than {MAX_POLICY_BYTES} bytes")
    from saphan.tools.permission_class import _DuplicateKey, _no_duplicate_keys

    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        raise _invalid(path, f"has the key {e.key!r} twice in one object (a JSON reader would "
                             "keep only one of them); give each key once") from None
    except (ValueError, RecursionError) as e:
        raise _invalid(path, f"is not JSON ({e})") from None
    pol = parse(data, source=os.path.abspath(path))
    return EgressPolicy(pol.schema, pol.name, pol.allow, pol.routes, pol.source,
                        hashlib.sha256(raw).hexdigest())


def parse(data: object, *, source: str = "<memory>") -> EgressPolicy:
    """Validate a decoded JSON value; raises :class:`Refusal` on any defect."""
    if not isinstance(data, Mapping):
        raise _invalid(source, "the top level must be a JSON object")
    schema = data.get("schema")
    if type(schema) is not int or schema not in FIELDS:
        raise refusals.policy_schema_unknown(
            f"egress policy {source} claims schema {json.dumps(schema)}, which this engine "
            f"does not accept (accepted: {', '.join(map(str, ACCEPTED))})",
            f'write "schema": {ACCEPTED[-1]} and only that version\'s fields, or upgrade '
            "saphan if the file comes from a newer release",
        )
    top, allow_keys, route_keys = FIELDS[schema]
    _known(source, "the top level", data, top)
    name = data.get("name", "")
    if not isinstance(name, str) or (name and not _NAME.fullmatch(name)):
        raise _invalid(source, "`name` must be 1-63 letters, digits, '.', '_' or '-'")
    allow = tuple(_allowed(source, i, e, allow_keys)
                  for i, e in enumerate(_list(source, data, "allow")))
    routes = tuple(_route(source, i, e, route_keys)
                   for i, e in enumerate(_list(source, data, "routes")))
    _unique(source, "route name", [r.name for r in routes])
    _unique(source, "route tool", [r.tool for r in routes if r.tool is not None])
    return EgressPolicy(schema, name, allow, routes, source)


def _known(source: str, where: str, obj: Mapping[str, Any], keys: frozenset[str]) -> None:
    unknown = sorted(str(k) for k in obj if k not in keys)
    if unknown:
        raise _invalid(source, f"unknown field(s) {', '.join(map(repr, unknown))} in {where}; "
                               f"its fields: {', '.join(sorted(keys))}")


def _list(source: str, data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise _invalid(source, f"`{key}` must be a list")
    if len(value) > MAX_ENTRIES:
        raise _invalid(source, f"`{key}` has more than {MAX_ENTRIES} entries")
    return value


def _unique(source: str, what: str, values: list[str]) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise _invalid(source, f"the {what} {v!r} is given twice")
        seen.add(v)


def _allowed(source: str, i: int, entry: object, keys: frozenset[str]) -> Allowed:
    where = f"allow[{i}]"
    if not isinstance(entry, Mapping):
        raise _invalid(source, f"{where} must be an object {{\"host\": ..., \"ports\": [...]}}")
    _known(source, where, entry, keys)
    host = entry.get("host")
    if not isinstance(host, str) or not host:
        raise _invalid(source, f"{where}.host must be a host name, an IP literal or *.suffix")
    ports = entry.get("ports")
    if (not isinstance(ports, list) or not ports
            or not all(type(p) is int and 1 <= p <= 65535 for p in ports)):
        raise _invalid(source, f"{where}.ports must be a non-empty list of ports 1-65535")
    return Allowed(_host(source, where, host), tuple(dict.fromkeys(ports)))


def _host(source: str, where: str, host: str) -> str:
    """An exact name (lower case, no trailing dot), an IP literal, or
    ``*.suffix`` with at least one dot-separated label after the star."""
    name = host.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        pass
    labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
    if not name or not all(_LABEL.fullmatch(label) for label in labels) or len(name) > 253:
        raise _invalid(source, f"{where}.host {host!r} is not a host name, an IP literal or "
                               "*.suffix (a star only as the whole first label)")
    return name


def _route(source: str, i: int, entry: object, keys: frozenset[str]) -> RouteSpec:
    where = f"routes[{i}]"
    if not isinstance(entry, Mapping):
        raise _invalid(source, f"{where} must be an object")
    _known(source, where, entry, keys)
    name = entry.get("name")
    if not isinstance(name, str) or not _ROUTE.fullmatch(name):
        raise _invalid(source, f"{where}.name must be 1-32 lower-case letters, digits or '-' "
                               "(the door serves it at /<name>/)")
    where = f"route {name}"
    tool = entry.get("tool")
    if tool is not None and tool not in ROUTE_TOOLS:
        raise _invalid(source, f"{where}: `tool` must be one of {', '.join(ROUTE_TOOLS)}")
    upstream = entry.get("upstream")
    if not isinstance(upstream, str):
        raise _invalid(source, f"{where}: `upstream` must be an https URL")
    upstream = _upstream(source, where, upstream)
    header = entry.get("header")
    if not isinstance(header, str) or not _HEADER.fullmatch(header) \
            or header.lower() in _RESERVED_HEADERS:
        raise _invalid(source, f"{where}: `header` must be an HTTP header name that carries a "
                               "credential (e.g. x-api-key, authorization), not a hop-by-hop "
                               "or framing header")
    prefix = entry.get("prefix", "")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise _invalid(source, f"{where}: `prefix` must be printable ASCII of at most 32 "
                               "characters (e.g. \"Bearer \")")
    env, file = entry.get("secret_env"), entry.get("secret_file")
    if (env is None) == (file is None):
        raise _invalid(source, f"{where}: give exactly one of `secret_env` (a variable of "
                               "saphan's environment) or `secret_file` (an absolute path); the "
                               "secret itself never lives in a policy file")
    if env is not None and (not isinstance(env, str) or not _VARIABLE.fullmatch(env)):
        raise _invalid(source, f"{where}: `secret_env` {env!r} is not a variable name")
    if file is not None and (not isinstance(file, str) or not os.path.isabs(file)
                             or "\x00" in file):
        raise _invalid(source, f"{where}: `secret_file` must be an absolute path")
    return RouteSpec(name, upstream, header.lower(), prefix, env, file, tool)


def _upstream(source: str, where: str, url: str) -> str:
    from saphan.endpoints import check_endpoint

    try:
        check_endpoint(url)
    except UserError as e:
        raise _invalid(source, f"{where}: {str(e).replace('--endpoint', '`upstream`')}") from None
    if urlsplit(url).scheme != "https":
        raise _invalid(source, f"{where}: `upstream` {url!r} is not https: the door adds the "
                               "real secret on that leg, and it never connects to loopback")
    return url.rstrip("/")


#: A secret is one token of these characters (it travels as a header value), at
#: least 16 long (shorter cannot be scrubbed by value from what a run shows)
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=:-]{16,4096}$")


def read_secret(route: RouteSpec, env: Mapping[str, str]) -> str:
    """One route's secret, from saphan's environment or from its file under
    a key's custody (rust/core); never logged, never in a message."""
    where = f"egress route {route.name}'s secret ({route.secret_source()})"
    if route.secret_env is not None:
        value = env.get(route.secret_env, "").strip()
        if not value:
            raise refusals.agent_auth_missing(
                f"{where} is not set in saphan's environment",
                f"export {route.secret_env} for saphan (the run itself never sees it)",
            )
    else:
        assert route.secret_file is not None
        value = _read_file(route, where)
    if not _TOKEN.fullmatch(value):
        raise UserError(f"{where} is not one token of 16 or more letters, digits and ._~+/=:- "
                        "(no spaces, quotes or control characters)")
    return value


def _read_file(route: RouteSpec, where: str) -> str:
    from saphan import _native

    assert route.secret_file is not None
    try:
        raw = _native.read_secret_file(route.secret_file, 4096)
    except _native.KeyCustodyError as e:
        message, fix = e.args
        raise refusals.custody_key_unsafe(f"{where}: {message}", fix) from None
    except FileNotFoundError:
        raise UserError(f"{where} does not exist; write the secret there (mode 0600)") from None
    except PermissionError as e:
        raise refusals.custody_key_unsafe(
            f"{where} cannot be opened by uid {os.geteuid()} ({e.strerror})",
            "the secret file must belong to the account that runs saphan",
        ) from None
    return raw.strip().decode("ascii", "replace")


def describe(pol: EgressPolicy) -> list[str]:
    """What the policy allows, one line each (``saphan egress check``)."""
    lines = [f"egress policy {pol.name or '(unnamed)'}: schema {pol.schema} ({pol.source})",
             "the run gets a network namespace of its own; its one way out is the door"]
    if pol.allow:
        lines.append("CONNECT allowed to (TLS end to end; loopback, link-local and metadata "
                     "addresses always denied):")
        lines += [f"  {a.host} ports {', '.join(map(str, a.ports))}" for a in pol.allow]
    else:
        lines.append("CONNECT allowed to: nothing")
    for r in pol.routes:
        serves = f" (the {r.tool} agent's model endpoint)" if r.tool else ""
        lines.append(f"route /{r.name}/ -> {r.upstream}{serves}: the door adds {r.header}: "
                     f"{r.prefix}<secret from {r.secret_source()}>")
    if not pol.routes:
        lines.append("credential routes: none")
    return lines
