"""The store: one seam, two databases, the same schema and the same SQL.

:func:`open_store` picks the connector from ``database.url``; everything above
it talks to :class:`saphan.store.base.Store`.
"""

from __future__ import annotations

from pathlib import Path

from saphan.errors import StoreError
from saphan.store.base import Store

__all__ = ["Store", "StoreError", "open_store"]


def open_store(url: str, sqlite_default: Path, *, migrate: bool = True) -> Store:
    """Open (and migrate on first use) the store named by ``url``; with
    ``migrate=False`` it is only opened (``saphan doctor`` measures the
    schema as it finds it)."""
    if url == "sqlite" or url.startswith("sqlite:///"):
        from saphan.store.sqlite import SQLiteConnector

        path = sqlite_default if url == "sqlite" else Path(url[len("sqlite:///") - 1 :])
        store = Store(SQLiteConnector(path))
    else:
        from saphan.store.postgres import PostgresConnector

        store = Store(PostgresConnector(url))
    if migrate:
        store.migrate()
    return store
