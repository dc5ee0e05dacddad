"""The auth pre-flight: before a run's seat is reserved, the unconfined side
checks the seat's credential against the slot's endpoint.

:func:`target_for` says, per tool, what the run will present and where
(:class:`Target`), read from the adapter's fields and saphan's environment
exactly as the tool will read them:

- ``claude``: the slot's endpoint (else :data:`saphan.tools.claude.DEFAULT_ENDPOINT`),
  ``GET {endpoint}/v1/models`` with ``ANTHROPIC_API_KEY`` (``x-api-key``), else
  ``ANTHROPIC_AUTH_TOKEN`` (``Authorization: Bearer``), else
  ``CLAUDE_CODE_OAUTH_TOKEN`` (Bearer, with the OAuth beta header); else the
  login file ``<config home>/.credentials.json``;
- ``codex``: the pinned provider (its ``base_url`` and ``env_key``; without
  one the built-in ``openai`` provider at ``https://api.openai.com/v1`` with
  ``OPENAI_API_KEY``, else ``CODEX_API_KEY``), ``GET {base_url}/models`` with
  ``Authorization: Bearer``; else the login file ``$CODEX_HOME/auth.json``;
- ``loop``: the lane's ``base_url`` and key as the loop's client sends them
  (loop/client.py: ``Authorization: Bearer``), ``GET`` of ``models`` under the
  base the client posts ``chat/completions`` to;
- ``command``: nothing to check.

:func:`check` makes the request from this host, :func:`far_check` from a far
machine over its SSH connection with that machine's curl (the headers on
curl's stdin: never on a command line, in a file or in an environment).
HTTP 401/403 refuses the run (``agent-auth-rejected``); 2xx, or 404 (the
endpoint lists no models, so the key was not rejected) accepts it; anything
else — no connection, a timeout, a 5xx, a TLS failure, a redirect — is not a
refusal: the record says ``not checked: <why>``. No credential at all refuses
it (``agent-auth-missing``). A login file on this host is read and, when its
token is due, refreshed here, outside the jail (tools/login.py): Claude's
token is then checked against the endpoint as Claude Code presents it; a
Codex login's is refreshed, not sent (it is for Codex's own backend). A
login file on a runner is the same (:func:`far_login_check`): read there
over the SSH connection, refreshed here and written back there, and its
token checked from the runner.

What goes on the run record (``auth``) names the credential — the variable,
or the file — and never holds its value.
"""

from __future__ import annotations

import os
import shlex
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from saphan import refusals

if TYPE_CHECKING:
    from saphan.loop.adapter import LoopAdapter
    from saphan.tools.adapter import Adapter
    from saphan.tools.codex import CodexAdapter
    from saphan.transport.ssh import Completed

#: seconds the pre-flight request may take
TIMEOUT = 10
#: what a login-file seat's record says
LOGIN_FILE_RESULT = "the seat's login file, not checked by saphan"
#: the Anthropic API version the Claude pre-flight names
ANTHROPIC_VERSION = "2023-06-01"
#: the beta header Claude Code sends with an OAuth token
ANTHROPIC_OAUTH_BETA = "oauth-2025-04-20"
#: Claude Code's credential variables, in the order they are looked for
CLAUDE_KEYS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
#: the headers that carry a credential (their values never reach a message)
_SECRET_HEADERS = frozenset({"x-api-key", "authorization"})
#: the far script's line when curl is not on the far PATH
_NO_CURL = "saphan-auth: no curl"


@dataclass(frozen=True)
class Target:
    """What one run presents to its endpoint, and where.

    ``headers`` holds the secret: it is never in this object's repr or str,
    never on a record and never in a message. ``login_file`` set: the seat
    authenticates with that file of the tool's (nothing is sent). Neither
    headers nor a login file: the credential is missing (``looked_for`` and
    ``login_path`` say where saphan looked)."""

    tool: str
    #: the base URL as the tool uses it
    endpoint: str
    #: the exact URL checked
    url: str
    #: the credential's name: a variable, or a description ("lane L's credential file")
    credential: str
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    login_file: str | None = None
    #: every variable looked for, in order (named by a missing-credential refusal)
    looked_for: tuple[str, ...] = ()
    #: the login file looked for (named by a missing-credential refusal)
    login_path: str | None = None

    def __repr__(self) -> str:
        return (f"Target(tool={self.tool!r}, endpoint={self.endpoint!r}, url={self.url!r}, "
                f"credential={self.credential!r}, headers=<{len(self.headers)} withheld>, "
                f"login_file={self.login_file!r})")

    __str__ = __repr__

    @property
    def missing(self) -> bool:
        return not self.headers and self.login_file is None


def target_for(adapter: Adapter) -> Target | None:
    """The run's :class:`Target` (None: a tool saphan does not check)."""
    if adapter.tool == "claude":
        from saphan.tools.claude import ClaudeAdapter

        assert isinstance(adapter, ClaudeAdapter)
        return _claude(adapter.endpoint)
    if adapter.tool == "codex":
        from saphan.tools.codex import CodexAdapter

        assert isinstance(adapter, CodexAdapter)
        return _codex(adapter)
    if adapter.tool == "loop":
        from saphan.loop.adapter import LoopAdapter

        assert isinstance(adapter, LoopAdapter)
        return _loop(adapter)
    return None


def _claude(endpoint: str | None) -> Target:
    from saphan.tools import claude

    base = endpoint or claude.DEFAULT_ENDPOINT
    url = _under(base, "v1/models")
    common = {"anthropic-version": ANTHROPIC_VERSION}
    for name in CLAUDE_KEYS:
        value = os.environ.get(name)
        if not value:
            continue
        if name == "ANTHROPIC_API_KEY":
            headers = {"x-api-key": value}
        elif name == "ANTHROPIC_AUTH_TOKEN":
            headers = {"Authorization": f"Bearer {value}"}
        else:
            headers = {"Authorization": f"Bearer {value}", "anthropic-beta": ANTHROPIC_OAUTH_BETA}
        return Target("claude", base, url, name, {**headers, **common},
                      looked_for=CLAUDE_KEYS)
    login = os.path.join(claude.config_home(), ".credentials.json")
    return _login_or_missing("claude", base, url, CLAUDE_KEYS, login)


def _codex(adapter: CodexAdapter) -> Target:
    from saphan.tools import codex

    provider = adapter.provider
    keys: tuple[str, ...]
    if provider is not None:
        base, keys = provider.base_url, (provider.env_key,)
    else:
        base, keys = codex.OPENAI_BASE_URL, codex.OPENAI_ENV
    url = _under(base, "models")
    for name in keys:
        value = os.environ.get(name)
        if value:
            return Target("codex", base, url, name, {"Authorization": f"Bearer {value}"},
                          looked_for=keys)
    login = os.path.join(codex.codex_home(), "auth.json")
    return _login_or_missing("codex", base, url, keys, login)


def _loop(adapter: LoopAdapter) -> Target:
    lane = adapter.lane
    secret = adapter.secret.decode("ascii", errors="replace")
    name = f"lane {lane.name}'s credential file ({lane.credential_file})"
    # As loop/client.py posts: the route on the base's path, a query kept.
    return Target("loop", lane.base_url, _under(lane.base_url, "models"), name,
                  {"Authorization": f"Bearer {secret}"} if secret else {},
                  looked_for=(name,))


def _under(base: str, route: str) -> str:
    """``route`` under ``base``'s path (a query stays a query), as the tools
    join their own routes to a base URL."""
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + route))


def _login_or_missing(tool: str, base: str, url: str, keys: tuple[str, ...],
                      login: str) -> Target:
    if os.path.isfile(login):
        return Target(tool, base, url, f"the seat's login file {login}", login_file=login,
                      looked_for=keys, login_path=login)
    return Target(tool, base, url, " or ".join(keys), looked_for=keys, login_path=login)


# -- the check ---------------------------------------------------------------------

def check(target: Target, *, where: str, token_url: str | None = None) -> dict[str, Any]:
    """The pre-flight from this host: the record's ``auth`` entry, or a
    refusal (``agent-auth-missing``, ``agent-auth-rejected``). A login-file
    seat's session is read, refreshed here when due (``token_url``: the
    configured token endpoint; tools/login.py), and then checked."""
    if target.login_file is not None and not target.headers:
        return _login_seat(target, where, token_url)
    early = _before_http(target, where)
    if early is not None:
        return early
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        # A redirect would carry the key to wherever it points: not followed.
        def redirect_request(self, *_a: Any, **_k: Any) -> None:
            return None

    # Direct (no proxy from the environment): the key goes to the endpoint only.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirect(),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()))
    request = urllib.request.Request(target.url, headers=target.headers, method="GET")
    status: int | None = None
    why: str | None = None
    try:
        with opener.open(request, timeout=TIMEOUT) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as e:
        status = int(e.code)
        e.close()
    except urllib.error.URLError as e:
        why = f"{target.endpoint} could not be reached from {where}: {e.reason}"
    except TimeoutError:
        why = f"{target.endpoint} did not answer within {TIMEOUT} s"
    except (OSError, ValueError, http.client.HTTPException) as e:
        why = f"{target.endpoint}: {type(e).__name__}: {e}"
    if status is None:
        return _record(target, where, None, "not checked: " + _withheld(target, why or "?"))
    return _judge(target, where, status)


def _login_seat(target: Target, where: str, token_url: str | None,
                conn: Runner | None = None) -> dict[str, Any]:
    """A login-file seat: read (here, or on the runner ``conn`` reaches),
    refreshed here when due (tools/login.py), then checked as the tool
    presents it — from here, or from the runner."""
    from dataclasses import replace

    from saphan.tools import login as logins

    assert target.login_file is not None
    place: logins.Place = logins.Here() if conn is None else logins.Far(conn)
    with place.lock(target.login_file):  # read, refresh and write back: one at a time
        seat = place.read(target.tool, target.login_file)
        refresh = "not due"
        if seat.due():
            seat, refresh = logins.refreshed(seat, token_url, place)
    until = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seat.expires_at))
             if seat.expires_at is not None else None)
    login = {"file": target.login_file, "kind": seat.kind, "expires_at": until,
             "refresh": refresh}
    if seat.kind == "api-key" and target.endpoint != _codex_default():
        # Codex presents its login file's key to its built-in provider only
        return {**_record(target, where, None,
                          f"not checked: the login file's key is for {_codex_default()}, not "
                          f"this provider; nothing was sent"), "login": login}
    if target.tool == "claude" or seat.kind == "api-key":
        # presented as the tool presents it: the token (or key), to the endpoint
        presented = replace(target, headers=_presented(seat), login_file=None)
        checked = (check(presented, where=where) if conn is None
                   else far_check(conn, presented, where=where))
        return {**checked, "login": login}
    if seat.due():
        result = f"not checked: the login token is due and {refresh}"
    else:
        result = ("accepted: the login token is current (not sent: a ChatGPT login's token "
                  "is for the tool's own backend, not this endpoint)")
    return {**_record(target, where, None, result), "login": login}


def _codex_default() -> str:
    from saphan.tools import codex

    return codex.OPENAI_BASE_URL


def _presented(seat: Any) -> dict[str, str]:
    """What the tool presents with a login file's token (Claude: with its
    OAuth beta header); ``seat``: a tools.login.Login."""
    if seat.tool == "claude":
        return {"Authorization": f"Bearer {seat.access}", "anthropic-beta": ANTHROPIC_OAUTH_BETA,
                "anthropic-version": ANTHROPIC_VERSION}
    return {"Authorization": f"Bearer {seat.access}"}


def far_login_check(conn: Runner, target: Target, *, where: str,
                    token_url: str | None = None) -> dict[str, Any]:
    """:func:`far_check` for a seat whose credential is its login file on the
    runner: read there over the connection, refreshed here when due and
    written back there, then checked from the runner."""
    if target.login_file is not None and not target.headers:
        return _login_seat(target, where, token_url, conn)
    return far_check(conn, target, where=where)


class Runner(Protocol):
    """What :func:`far_check` needs of a far machine's connection
    (transport/ssh.py's SSHConnection)."""

    @property
    def name(self) -> str: ...

    def run(self, script: str, *, stdin: bytes | None = None,
            timeout: float | None = None) -> Completed: ...


def far_script(url: str) -> str:
    """The far side's script: curl with the header lines read from its stdin
    (``-H @-``), ``-q`` first so no ``.curlrc`` adds a proxy, a trace or an
    output file; direct, no redirect followed. The URL is the only argument
    that is not a constant, and it holds no secret."""
    return (f"command -v curl >/dev/null 2>&1 || {{ echo {shlex.quote(_NO_CURL)}; exit 0; }}\n"
            "exec curl -q -sS -o /dev/null -w '%{http_code}' --max-time "
            f"{TIMEOUT} --noproxy '*' --proto '=http,https' -H @- {shlex.quote(url)}\n")


def far_check(conn: Runner, target: Target, *, where: str) -> dict[str, Any]:
    """The same pre-flight made from the far machine ``conn`` reaches, with
    its curl. The secret crosses on the script's stdin only. A connection
    that fails raises what ``conn.run`` raises (TransportError); a login-file
    seat is the caller's to look for on the far machine (this checks the
    ``target`` it is given)."""
    early = _before_http(target, where)
    if early is not None:
        return early
    lines = "".join(f"{k}: {v}\n" for k, v in target.headers.items()).encode()
    done = conn.run(far_script(target.url), stdin=lines, timeout=TIMEOUT + 20)
    out = done.stdout.decode(errors="replace").strip()
    if out == _NO_CURL:
        return _record(target, where, None, f"not checked: curl is not on {conn.name}'s PATH")
    code = int(out) if out.isdigit() and len(out) == 3 else 0
    if code == 0:
        err = done.stderr.decode(errors="replace").strip() or f"curl exited {done.exit_code}"
        why = f"{target.endpoint} could not be reached from {where}: {err}"
        return _record(target, where, None, "not checked: " + _withheld(target, why))
    return _judge(target, where, code)


def _before_http(target: Target, where: str) -> dict[str, Any] | None:
    """The outcomes decided before any request: a missing credential
    (refused), a login file (not checked), a header no request can carry."""
    if target.missing:
        looked = ", ".join(target.looked_for) or target.credential
        file = (f" and there is no login file {target.login_path}"
                if target.login_path is not None else "")
        raise refusals.agent_auth_missing(
            f"the {target.tool} run has no credential to present to {target.endpoint}: none of "
            f"{looked} is set in saphan's environment{file}",
            f"export {target.looked_for[0] if target.looked_for else 'the key'} in saphan's "
            f"environment, or log {target.tool} in on the seat",
        )
    if target.login_file is not None:
        return _record(target, where, None, LOGIN_FILE_RESULT)
    for name, value in target.headers.items():
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            return _record(target, where, None,
                           f"not checked: the credential in {target.credential} holds a control "
                           f"character, which no {name} header can carry")
    return None


def _judge(target: Target, where: str, status: int) -> dict[str, Any]:
    if status in (401, 403):
        raise refusals.agent_auth_rejected(
            f"the {target.tool} run's endpoint {target.endpoint} answered HTTP {status} to the "
            f"auth pre-flight (GET {target.url} from {where}) for the credential in "
            f"{target.credential}: the key was rejected",
            f"fix the key in {target.credential} (revoked, expired, mistyped, or for another "
            f"endpoint), or log {target.tool} in again on the seat; then run again",
        )
    if 200 <= status < 300:
        return _record(target, where, status, "accepted")
    if status == 404:
        return _record(target, where, status,
                       "accepted: the endpoint lists no models (HTTP 404); the key was not "
                       "rejected")
    return _record(target, where, status,
                   f"not checked: {target.endpoint} answered HTTP {status}")


def _withheld(target: Target, text: str) -> str:
    """``text`` with every header value replaced (last line of defence: an
    error message never carries the key)."""
    for name, value in target.headers.items():
        if name.lower() not in _SECRET_HEADERS:
            continue
        for part in (value, value.removeprefix("Bearer ")):
            if len(part) >= 4:
                text = text.replace(part, "[credential withheld]")
    return text


def _record(target: Target, where: str, status: int | None, result: str) -> dict[str, Any]:
    return {"endpoint": target.endpoint, "url": target.url, "credential": target.credential,
            "status": status, "result": result, "checked_from": where}
