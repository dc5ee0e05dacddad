"""The embedded store: SQLite in the workspace, WAL mode, autocommit."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from saphan.errors import StoreError
from saphan.store.connector import Row

BUSY_TIMEOUT_MS = 10_000


class SQLiteConnector:
    dialect = "sqlite"

    def __init__(self, path: Path):
        self.description = f"sqlite:///{path}"
        self._path = path
        self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        path = self._path
        try:
            # isolation_level=None: autocommit; explicit transactions are ours.
            db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the SQLite store {path}: {e}") from None
        return db

    def reopen(self) -> None:
        self._db.close()
        self._db = self._connect()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        try:
            cur = self._db.execute(sql, tuple(params))
            return cur.fetchall()
        except sqlite3.IntegrityError as e:
            raise StoreError(f"{self.description}: integrity: {e}") from None
        except sqlite3.Error as e:
            raise StoreError(f"{self.description}: {e}") from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the write lock up front: a deferred transaction
        # that later upgrades fails at once with "database is locked".
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
