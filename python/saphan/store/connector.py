"""The seam between the store and a database driver.

A connector runs one statement (autocommit: each statement is its own
transaction, READ COMMITTED on PostgreSQL) or a short explicit transaction.
Driver exceptions are translated here, once, into :class:`StoreError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

Row = tuple[Any, ...]




class Connector(Protocol):
    dialect: str
    description: str

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def transaction(self) -> AbstractContextManager[None]:
        """A read-then-write transaction (SQLite: BEGIN IMMEDIATE)."""
        ...

    def close(self) -> None: ...

    def reopen(self) -> None:
        """Close the connection and open a new one (StoreError if it cannot)."""
        ...


def rows(it: Iterator[Row] | list[Row]) -> list[Row]:
    return list(it)
