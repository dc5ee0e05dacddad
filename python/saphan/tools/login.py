"""A seat's login file — a tool's own OAuth session — checked, and refreshed
when its access token has expired or is about to, by saphan's unconfined
side before the seat is reserved: never inside the jail (where the file is
not writable, and a refresh would rotate the refresh token and lose it).

    claude   <config home>/.credentials.json
             {"claudeAiOauth": {"accessToken", "refreshToken", "expiresAt" (ms),
                                "scopes", "clientId"?, ...}}
    codex    $CODEX_HOME/auth.json
             {"tokens": {"access_token", "refresh_token", "id_token", ...},
              "last_refresh"}   (the access token's expiry: its JWT ``exp``);
             or {"OPENAI_API_KEY": "..."} (an API key: checked as a key)

The refresh is the tool's own (the request the pinned binaries make, read
from them): ``POST`` of a ``refresh_token`` grant to the tool's token
endpoint (``[auth] claude_token_url`` / ``codex_token_url`` replace it, for
a test or a gateway). A grant the endpoint refuses (HTTP 400/401/403) means
the session is dead: ``agent-auth-rejected`` (log in again). An endpoint
that cannot be reached leaves the token as it is, and the record says so.
The new tokens are written back in place of the file only if it is still
the file that was read (same inode, size and time: the tool itself may have
refreshed it meanwhile), through a new file in the same directory renamed
over it, owner-only. The file is read and replaced never through a link.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import shlex
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from saphan import refusals

#: the tools' own token endpoints and OAuth clients (read from the pinned
#: binaries: claude-code 2.1.197, codex-cli 0.169.0)
CLAUDE_TOKEN_URL = "https://platform.claude.com/v1/oauth/token"
CLAUDE_CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
CLAUDE_SCOPES = ("user:profile", "user:inference", "user:sessions:claude_code",
                 "user:mcp_servers", "user:file_upload")
CODEX_TOKEN_URL = "https://auth.openai.com/oauth/token"
CODEX_CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
CODEX_SCOPE = "openid profile email"
#: a token that expires within this many seconds is refreshed first
MARGIN = 300
#: Codex refreshes a login this old whatever its token says (seconds)
CODEX_REFRESH_AGE = 8 * 86400
#: a login file larger than this is not read
LIMIT = 1 << 20
TIMEOUT = 15
#: how long a refresh waits for another saphan's refresh of the same file
LOCK_WAIT = 30.0


@dataclass(frozen=True)
class Login:
    """A login file as read. The tokens are never in its repr."""

    tool: str
    path: str
    access: str = field(repr=False)
    refresh: str | None = field(repr=False)
    #: when the access token expires (epoch seconds), if it says
    expires_at: float | None
    data: dict[str, Any] = field(repr=False)
    #: (st_ino, st_size, st_mtime_ns) as read: a write-back replaces only this file
    identity: tuple[int, int, int] = field(repr=False)
    #: "oauth" (a session's tokens) or "api-key" (Codex's key in its login file)
    kind: str = "oauth"

    def due(self, now: float | None = None) -> bool:
        """Its access token has expired, or expires within MARGIN."""
        now = time.time() if now is None else now
        if self.kind == "api-key":
            return False
        if self.tool == "codex":
            last = _epoch(self.data.get("last_refresh"))
            if last is not None and now - last > CODEX_REFRESH_AGE:
                return True
        return self.expires_at is not None and self.expires_at - now < MARGIN


def _missing(tool: str, path: str, why: str) -> refusals.Refusal:
    return refusals.agent_auth_missing(
        f"the {tool} seat's login file {path} {why}",
        f"log {tool} in again on the seat ({_login_verb(tool)}), or give the run an API key "
        "in saphan's environment")


def _login_verb(tool: str) -> str:
    return "`claude /login`" if tool == "claude" else "`codex login`"


def read(tool: str, path: str) -> Login:
    """The login file on this host (``agent-auth-missing`` when it holds no session)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise _missing(tool, path, f"cannot be read ({e.strerror or e}; saphan follows no link "
                                   "there)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _missing(tool, path, "is not a regular file")
        if st.st_uid != os.geteuid():
            raise _missing(tool, path, f"is owned by uid {st.st_uid}, not this account "
                                       f"({os.geteuid()})")
        raw = os.read(fd, LIMIT + 1)
    finally:
        os.close(fd)
    return parse(tool, path, raw, (st.st_ino, st.st_size, st.st_mtime_ns))


def parse(tool: str, path: str, raw: bytes, ident: tuple[int, int, int]) -> Login:
    """A login file's bytes as a :class:`Login` (``ident``: what a write-back
    must still find there)."""
    if len(raw) > LIMIT:
        raise _missing(tool, path, f"is over {LIMIT} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise _missing(tool, path, "is not JSON") from None
    if not isinstance(data, dict):
        raise _missing(tool, path, "is not a JSON object")
    if tool == "claude":
        o = data.get("claudeAiOauth")
        access = o.get("accessToken") if isinstance(o, dict) else None
        if not isinstance(access, str) or not access:
            raise _missing(tool, path, "holds no claudeAiOauth.accessToken (the session was "
                                       "ended)")
        assert isinstance(o, dict)
        refresh = o.get("refreshToken") if isinstance(o.get("refreshToken"), str) else None
        exp = _sane(o.get("expiresAt"), 1000)
        return Login(tool, path, access, refresh or None, exp, data, ident)
    tokens = data.get("tokens")
    access = tokens.get("access_token") if isinstance(tokens, dict) else None
    key = data.get("OPENAI_API_KEY")
    if (not isinstance(access, str) or not access) and isinstance(key, str) and key:
        # `codex login --with-api-key`: an API key, presented as one
        return Login(tool, path, key, None, None, data, ident, kind="api-key")
    if not isinstance(access, str) or not access:
        raise _missing(tool, path, "holds neither tokens.access_token nor OPENAI_API_KEY")
    assert isinstance(tokens, dict)
    refresh = tokens.get("refresh_token") if isinstance(tokens.get("refresh_token"), str) else None
    return Login(tool, path, access, refresh or None, _jwt_exp(access), data, ident)


class Place(Protocol):
    """Where a login file is read and written back: this host, or a runner."""

    def read(self, tool: str, path: str) -> Login: ...

    def write(self, login: Login, data: dict[str, Any]) -> str: ...

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]: ...


class Here:
    """This host's file system."""

    def read(self, tool: str, path: str) -> Login:
        return read(tool, path)

    def write(self, login: Login, data: dict[str, Any]) -> str:
        return _write_back(login, data)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        """An exclusive flock on the login file (never through a link) while
        it is read, refreshed and written back: two saphan processes never
        spend one refresh token twice (a rotating endpoint would take the
        second for theft and end the session). Waits up to LOCK_WAIT s."""
        import fcntl

        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            yield  # read() names what is wrong with it
            return
        try:
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise refusals.agent_auth_missing(
                            f"the seat's login file {path} stayed locked by another saphan "
                            f"for {LOCK_WAIT:.0f} s while its token was being refreshed",
                            "run again once the other run has started") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)


class Far:
    """A runner's file, over its SSH connection: read by a far script (the
    final component no link, a regular file of the far account, its inode,
    size and time in nanoseconds with it) and written back by another,
    which replaces it only while those are unchanged, through a new
    owner-only file ``mktemp`` makes beside it. The tokens cross the
    channel: never a far command line. No lock is held across the
    connection (docs/tools.md)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def read(self, tool: str, path: str) -> Login:
        done = self.conn.run(_FAR_READ.format(path=shlex.quote(path), limit=LIMIT + 1),
                             timeout=TIMEOUT + 20)
        out: bytes = done.stdout
        # the answer starts at saphan's own line: whatever the far login's
        # start-up printed before it is skipped, and no byte after it (the
        # file's, the tokens) ever reaches a message
        at = out.find(b"saphan-login-ident ")
        if done.exit_code != 0 or at < 0:
            said = [line.decode(errors="replace")[len("saphan-login: "):][:160]
                    for line in out.split(b"\n")[:20] if line.startswith(b"saphan-login: ")]
            why = said[0] if said else f"no answer saphan can read (exit {done.exit_code})"
            raise _missing(tool, path, f"on {self.conn.name} cannot be read: {why}")
        head, _, raw = out[at:].partition(b"\n")
        try:
            ino, size = (int(x) for x in head.split()[1:3])
            mtime = int(head.split()[3].replace(b".", b""))
        except (ValueError, IndexError):
            raise _missing(tool, path, f"on {self.conn.name}: an unreadable answer") from None
        return parse(tool, path, raw, (ino, size, mtime))

    def write(self, login: Login, data: dict[str, Any]) -> str:
        ino, size, mtime = login.identity
        stamp = str(mtime)
        shown = f"{ino} {size} {stamp[:-9] or '0'}.{stamp[-9:].rjust(9, '0')}"
        done = self.conn.run(_FAR_WRITE.format(path=shlex.quote(login.path),
                                               ident=shlex.quote(shown)),
                             stdin=json.dumps(data, indent=2).encode(), timeout=TIMEOUT + 20)
        said = done.stdout.decode(errors="replace").strip().splitlines()
        if done.exit_code == 0 and said[-1:] == ["written"]:
            return "written"
        if done.exit_code == 0 and said[-1:] == ["changed"]:
            return "changed"
        return f"the far write-back failed (exit {done.exit_code})"

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        yield  # not held across the connection: see docs/tools.md


# the identity's time in nanoseconds (stat's %.9Y)
_FAR_READ = """\
f={path}
if [ -L "$f" ] || [ ! -f "$f" ]; then
  echo "saphan-login: not a regular file (saphan follows no link there)"; exit 3
fi
if [ "$(stat -c %u -- "$f")" != "$(id -u)" ]; then echo "saphan-login: not this account's"; exit 3; fi
printf 'saphan-login-ident %s\\n' "$(stat -c '%i %s %.9Y' -- "$f")"
head -c {limit} -- "$f"
"""
_FAR_WRITE = """\
f={path}
same() {{ [ ! -L "$f" ] && [ -f "$f" ] && [ "$(stat -c '%i %s %.9Y' -- "$f")" = {ident} ]; }}
same || {{ echo changed; exit 0; }}
t=$(mktemp "$f.saphan.XXXXXXXX") || exit 4
if ! cat > "$t"; then rm -f -- "$t"; exit 4; fi
if ! same; then rm -f -- "$t"; echo changed; exit 0; fi
mv -f -- "$t" "$f" && echo written
"""

def refreshed(login: Login, url: str | None = None, place: Place | None = None
              ) -> tuple[Login, str]:
    """The login after a refresh at the tool's token endpoint (``url``: the
    configured one), written back; and what happened, for the record. A
    refused grant raises ``agent-auth-rejected``; an endpoint that cannot be
    reached returns the login unchanged with why."""
    if login.refresh is None:
        return login, "its token is due, and the login file holds no refresh token"
    if login.tool == "claude":
        o = login.data["claudeAiOauth"]
        scopes = o.get("scopes") if isinstance(o.get("scopes"), list) else None
        client = o.get("clientId") if isinstance(o.get("clientId"), str) else CLAUDE_CLIENT_ID
        body = {"grant_type": "refresh_token", "refresh_token": login.refresh,
                "client_id": client,
                "scope": " ".join(str(s) for s in (scopes or CLAUDE_SCOPES))}
        target = url or CLAUDE_TOKEN_URL
    else:
        body = {"client_id": CODEX_CLIENT_ID, "grant_type": "refresh_token",
                "refresh_token": login.refresh, "scope": CODEX_SCOPE}
        target = url or CODEX_TOKEN_URL
    status, answer, why = _post(target, body)
    secrets = (login.refresh, login.access)
    if status in (400, 401, 403):
        raise refusals.agent_auth_rejected(
            f"the {login.tool} seat's login session is dead: its token endpoint {target} "
            f"refused the refresh (HTTP {status}{_reason(answer, secrets)})",
            f"log {login.tool} in again on the seat ({_login_verb(login.tool)}), then run again")
    if status is None or not 200 <= status < 300 or not isinstance(answer, dict):
        return login, _hide(f"not refreshed: {why or f'{target} answered HTTP {status}'}",
                            secrets)
    access = answer.get("access_token")
    if not isinstance(access, str) or not access:
        return login, f"not refreshed: {target} answered without an access_token"
    data = json.loads(json.dumps(login.data))  # a copy
    now = time.time()
    if login.tool == "claude":
        o = data["claudeAiOauth"]
        o["accessToken"] = access
        if isinstance(answer.get("refresh_token"), str) and answer["refresh_token"]:
            o["refreshToken"] = answer["refresh_token"]
        life = _sane(answer.get("expires_in"), 1)
        if life is not None and life <= 10 * 365 * 86400:
            o["expiresAt"] = int((now + life) * 1000)
        if isinstance(answer.get("scope"), str) and answer["scope"]:
            o["scopes"] = answer["scope"].split()
    else:
        t = data["tokens"]
        for k in ("access_token", "refresh_token", "id_token"):
            if isinstance(answer.get(k), str) and answer[k]:
                t[k] = answer[k]
        data["last_refresh"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))
    where = place or Here()
    wrote = where.write(login, data)
    if wrote == "changed":
        # the file changed meanwhile (the tool refreshed it itself): read what it holds now
        return where.read(login.tool, login.path), "refreshed elsewhere meanwhile; read again"
    if wrote != "written":
        # the endpoint may have rotated the refresh token: say so, by name
        raise refusals.agent_auth_rejected(
            f"the {login.tool} seat's login was refreshed at {target}, but the new tokens "
            f"could not be written back to {login.path}: {wrote}; the old refresh token may "
            "no longer be valid",
            f"free the seat's configuration home (space, permissions), then log {login.tool} "
            f"in again on the seat ({_login_verb(login.tool)})")
    return where.read(login.tool, login.path), f"refreshed at {target}"


def _write_back(login: Login, data: dict[str, Any]) -> str:
    """Replace the login file with ``data`` if it is still the file read:
    "written", "changed", or why it failed. The new file is made beside it
    under an unpredictable name (O_EXCL: never through a link), owner-only,
    and removed on every path that does not rename it."""
    import tempfile

    path = login.path
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".saphan-login-")
    except OSError as e:
        return f"cannot make a new file beside it ({e.strerror or e})"
    renamed = False
    try:
        try:
            os.write(fd, json.dumps(data, indent=2).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        st = os.lstat(path)
        if (not stat.S_ISREG(st.st_mode)
                or (st.st_ino, st.st_size, st.st_mtime_ns) != login.identity):
            return "changed"
        os.replace(tmp, path)
        renamed = True
        return "written"
    except OSError as e:
        return f"{e.strerror or e}"
    finally:
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _post(url: str, body: dict[str, Any]) -> tuple[int | None, Any, str | None]:
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_a: Any, **_k: Any) -> None:
            return None  # a redirect would carry the refresh token elsewhere

    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirect(),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()))
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    try:
        with opener.open(req, timeout=TIMEOUT) as resp:
            return int(resp.status), _json(resp.read(LIMIT)), None
    except urllib.error.HTTPError as e:
        try:
            return int(e.code), _json(e.read(LIMIT)), None
        finally:
            e.close()
    except urllib.error.URLError as e:
        return None, None, f"{url} could not be reached: {e.reason}"
    except TimeoutError:
        return None, None, f"{url} did not answer within {TIMEOUT} s"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return None, None, f"{url}: {type(e).__name__}: {e}"


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _reason(answer: Any, secrets: tuple[str | None, ...]) -> str:
    """The endpoint's ``error`` for a message: the tokens hidden first, then
    cut; withheld whole if a piece of a token (12 characters) is left."""
    if not (isinstance(answer, dict) and isinstance(answer.get("error"), str)):
        return ""
    text = _hide(answer["error"], secrets)[:80]
    if any(s[i:i + 12] in text for s in secrets if s for i in range(max(0, len(s) - 11))):
        return ": (its answer withheld: it held a piece of a token)"
    return f": {text}"


def _hide(text: str, secrets: tuple[str | None, ...]) -> str:
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "[credential withheld]")
    return text


def _jwt_exp(token: str) -> float | None:
    """The ``exp`` claim of a JWT (not verified: only when to refresh)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        pad = "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + pad))
    except (ValueError, RecursionError):
        return None
    return _sane(claims.get("exp") if isinstance(claims, dict) else None, 1)


#: no expiry is believed beyond this (epoch seconds: the year 2286)
_LATEST = 1e10


def _sane(value: object, per_second: int) -> float | None:
    """An epoch time as a login file or an answer gives it (``per_second``:
    1000 for milliseconds), or None unless it is a finite number in range
    (a hostile file or answer must not crash the pre-flight)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value) / per_second
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and 0 < seconds < _LATEST else None


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
