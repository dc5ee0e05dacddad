"""The store: one seam, two databases, the same schema and the same SQL.

:func:`open_store` picks the connector from ``database.url``; everything above
it talks to :class:`saphan.store.base.Store`.
"""

from __future__ import annotations

from pathlib import Path

from saphan.errors import StoreError
from saphan.store.base import Store

__all__ = ["Store", "StoreError", "open_store", "sqlite_file"]


def sqlite_file(url: str, sqlite_default: Path) -> Path | None:
    """The SQLite database file ``url`` names, or None for PostgreSQL:
    "sqlite" is ``sqlite_default`` (the workspace's own), "sqlite:///PATH"
    the absolute PATH."""
    if url == "sqlite":
        return sqlite_default
    if url.startswith("sqlite:///"):
        return Path("/" + url[len("sqlite:///"):].lstrip("/"))
    return None


def open_store(url: str, sqlite_default: Path, *, migrate: bool = True) -> Store:
    """Open (and migrate on first use) the store named by ``url``; with
    ``migrate=False`` it is only opened (``saphan doctor`` measures the
    schema as it finds it)."""
    path = sqlite_file(url, sqlite_default)
    if path is not None:
        from saphan.store.sqlite import SQLiteConnector

        store = Store(SQLiteConnector(path))
    else:
        from saphan.store.postgres import PostgresConnector

        store = Store(PostgresConnector(url))
    if migrate and not getattr(store.db, "read_only", False):
        store.migrate()  # a read-only store is read as it is (reading verbs)
    return store
