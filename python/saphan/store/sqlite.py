"""The embedded store: SQLite in the workspace, WAL mode, autocommit."""

from __future__ import annotations

import os
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
        #: opened for reading only: the database (or its directory) cannot be
        #: written here (a read-only mount or copy); reading verbs still work
        self.read_only = False
        self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        path = self._path
        if path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
            return self._connect_read_only()
        try:
            # isolation_level=None: autocommit; explicit transactions are ours.
            db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            db.text_factory = _text
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the SQLite store {path}: {e}") from None
        return db

    def _connect_read_only(self) -> sqlite3.Connection:
        """The database for reading: ``mode=ro``, or, when WAL mode cannot be
        read that way (no -shm file may be made beside it), ``immutable=1``:
        nothing can write it through this path either."""
        from urllib.parse import quote

        self.read_only = True
        last: sqlite3.Error | None = None
        for flags in ("mode=ro", "mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(f"file:{quote(str(self._path))}?{flags}", uri=True,
                                     timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
                db.text_factory = _text
                db.execute("SELECT count(*) FROM sqlite_master").fetchall()
                return db
            except sqlite3.Error as e:
                last = e
        raise StoreError(f"cannot open the SQLite store {self._path} (read-only here): {last}")

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
            if self.read_only:
                raise StoreError(f"{self.description} is read-only here (only reading verbs "
                                 f"work: runs list, runs show, ...): {e}") from None
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


def _text(raw: bytes) -> str:
    """A TEXT value as str: SQLite keeps any bytes in a TEXT column (a row
    saphan did not write may hold invalid UTF-8); undecodable bytes are
    replaced, so such a row reads as a row that does not verify, never as a
    failure of every query that meets it."""
    return raw.decode("utf-8", "replace")
