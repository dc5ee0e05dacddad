"""The shared store: PostgreSQL through psycopg 3 (imported only here, lazily)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from saphan.errors import StoreError
from saphan.store.connector import Row

_PLACEHOLDER = re.compile(r"\?")


#: what a secret is shown as
MASK = "***"
#: the settings libpq reads as secrets, whatever PQconndefaults says (below)
_SECRET_KEYS = frozenset({"password", "sslpassword", "oauth_client_secret",
                          "scram_client_key", "scram_server_key"})
_SCHEME = re.compile(r"^(postgres(?:ql)?)://", re.IGNORECASE)


def redact_url(url: str) -> str:
    """A store URL as it may be printed: parsed as libpq parses it (psycopg's
    ``conninfo_to_dict``), every setting libpq reads as a secret (password,
    sslpassword, any option it marks hidden) shown as ``***``, and rebuilt
    in the form it was given (URL or ``key=value``). A SQLite URL ("sqlite",
    "sqlite:///PATH") carries none and is returned as is. What libpq cannot
    parse is never shown: only its scheme, if it has one, then ``***``."""
    if url == "sqlite" or url.startswith("sqlite:///"):
        return url
    parsed = _parse(url)
    if parsed is None:
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
        return f"{scheme.group(1)}://{MASK}" if scheme else MASK
    secret = _secret_keys()
    masked = {k: (MASK if k in secret else v) for k, v in parsed.items()}
    scheme = _SCHEME.match(url)
    if scheme is None:
        from psycopg.conninfo import make_conninfo

        return make_conninfo("", **masked)
    return _as_url(scheme.group(1), masked)


def _parse(url: str) -> dict[str, str] | None:
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except Error:
        return None


def _secret_keys() -> frozenset[str]:
    """libpq's hidden options (PQconndefaults' dispchar "*"), and ours."""
    from psycopg import Error, pq

    try:
        hidden = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    except Error:
        hidden = set()
    return _SECRET_KEYS | hidden


def _as_url(scheme: str, settings: dict[str, str]) -> str:
    """``scheme://[user[:password]@]host[:port][,...][/dbname][?key=value&...]``,
    which libpq reads back as ``settings``."""
    from urllib.parse import quote

    rest = dict(settings)
    user, password = rest.pop("user", None), rest.pop("password", None)
    hosts = rest.pop("host").split(",") if "host" in rest else []
    ports = rest["port"].split(",") if "port" in rest else []
    if hosts and len(ports) == len(hosts):
        del rest["port"]
    else:  # one port for every host, or ports without hosts: a parameter
        ports = []
    userinfo = quote(user or "", safe="")
    if password is not None:
        userinfo += ":" + MASK  # (the caller masked it)
    netloc = ",".join(
        (f"[{h}]" if ":" in h else quote(h, safe="")) + (f":{ports[i]}" if ports else "")
        for i, h in enumerate(hosts))
    out = f"{scheme}://" + (f"{userinfo}@" if userinfo else "") + netloc
    if "dbname" in rest:
        out += "/" + quote(rest.pop("dbname"), safe="")
    if rest:
        out += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='*')}"
                              for k, v in rest.items())
    return out


def _scrubbed(text: str, url: str) -> str:
    """A driver's message about ``url`` without any secret of it: libpq's
    parse errors quote the token they stopped at, so for a URL it cannot
    parse nothing of the message is kept."""
    parsed = _parse(url)
    if parsed is None:
        return "not a connection string libpq can parse (not shown: it may hold a password)"
    for key in _secret_keys():
        if parsed.get(key):
            text = text.replace(parsed[key], MASK)
    return text


class PostgresConnector:
    dialect = "postgresql"

    def __init__(self, url: str):
        import psycopg

        self._psycopg = psycopg
        self._url = url
        self.description = redact_url(url)
        self._db = self._connect()
        self._cache: dict[str, str] = {}

    def _connect(self) -> Any:
        try:
            # autocommit: every reservation attempt is its own READ COMMITTED
            # statement, so a losing insert affects zero rows instead of raising
            # a serialization failure.
            return self._psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        except self._psycopg.Error as e:
            raise StoreError(f"cannot connect to {self.description}: "
                             f"{_scrubbed(str(e), self._url)}") from None

    def reopen(self) -> None:
        self._db.close()
        self._db = self._connect()

    def _sql(self, sql: str) -> str:
        out = self._cache.get(sql)
        if out is None:
            out = _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))
            self._cache[sql] = out
        return out

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        try:
            cur = self._db.execute(self._sql(sql), tuple(params))
            if cur.description is None:
                return []
            return list(cur.fetchall())
        except self._psycopg.Error as e:
            raise StoreError(f"{self.description}: {e}") from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self._db.transaction():
                yield
        except self._psycopg.Error as e:
            raise StoreError(f"{self.description}: {e}") from None

    def close(self) -> None:
        self._db.close()
