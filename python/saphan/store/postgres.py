"""The shared store: PostgreSQL through psycopg 3 (imported only here, lazily)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from saphan.errors import StoreError
from saphan.store.connector import Row

_PLACEHOLDER = re.compile(r"\?")


def redact_url(url: str) -> str:
    """The URL with every password hidden: in the userinfo and in the query."""
    url = re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


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
            raise StoreError(f"cannot connect to {self.description}: {e}") from None

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
