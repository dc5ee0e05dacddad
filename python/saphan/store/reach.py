"""What reaches the store from this machine, so no run can.

A run's jail reads everything the user can read and connects to any unix
socket it can name (a read-only bind does not stop ``connect(2)`` on a
socket; ``network: off`` cuts abstract sockets but not these). The store
holds the slots — which endpoint an agent's key is sent to — and every run
row, so a run that reached it could reroute the next run's key (measured by
review: a ``network: off`` command run connected to PostgreSQL's socket
under ``/tmp`` and rewrote a slot's endpoint).

:func:`client_paths` lists what a PostgreSQL client of this URL would use:
the server's unix socket files (and their lock files) in every directory
libpq would try, and the client credential files libpq reads — the password
file, the service file, the client key — each one a jail could reach (a
socket in a directory only the server's account may enter is out of every
jail's reach already). Every jail read-denies them
(site/local.py): a socket denied by a bind of ``/dev/null`` refuses
``connect``. A SQLite store lives in the workspace, hidden whole from every
jail; one configured elsewhere is denied by path with its journal files.

Not covered (docs/boundaries.md): a PostgreSQL server on TCP that trusts
loopback connections without a password is reachable from any run whose
network is open — the store must ask for a password the jail cannot read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

#: where libpq looks for a server socket when the URL names no directory
DEFAULT_SOCKET_DIRS = ("/var/run/postgresql", "/run/postgresql", "/tmp")


def _conninfo(url: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    try:
        got = conninfo_to_dict(url)
    except Exception:  # a URL libpq cannot parse reaches nothing
        return {}
    return {str(k): str(v) for k, v in got.items() if v is not None}


def _searchable(path: str) -> bool:
    """Whether a process with this uid and groups but no capabilities (a
    jail's: every boundary drops them) can reach ``path``: every directory
    above it searchable by its permission bits. What a jail cannot reach it
    cannot use, and bubblewrap could not bind over it either."""
    uid, groups = os.getuid(), {os.getgid(), *os.getgroups()}
    d = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            st = os.stat(d)
        except OSError:
            return False
        if st.st_uid == uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


def client_paths(url: str, sqlite_default: Path,
                 env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Existing paths a run must not read or connect to (see the module text)."""
    from saphan.store import sqlite_file

    env = os.environ if env is None else env
    out: list[str] = []
    file = sqlite_file(url, sqlite_default)
    if file is not None:
        out += [str(file), f"{file}-wal", f"{file}-shm", f"{file}-journal"]
        return tuple(p for p in out if os.path.lexists(p) and _searchable(p))
    info = _conninfo(url)
    home = env.get("HOME") or os.path.expanduser("~")
    hosts = (info.get("host") or env.get("PGHOST") or "").split(",")
    ports = (info.get("port") or env.get("PGPORT") or "5432").split(",")
    dirs: list[str] = []
    for h in hosts:
        h = h.strip()
        if h.startswith("/"):
            dirs.append(h)
        elif not h:
            dirs += DEFAULT_SOCKET_DIRS
    for d in dict.fromkeys(dirs):
        for p in dict.fromkeys(x.strip() or "5432" for x in ports):
            sock = os.path.join(d, f".s.PGSQL.{p}")
            out += [sock, f"{sock}.lock"]
    for key, var, default in (
        ("passfile", "PGPASSFILE", os.path.join(home, ".pgpass")),
        ("service", "PGSERVICEFILE", os.path.join(home, ".pg_service.conf")),
        ("sslkey", "PGSSLKEY", os.path.join(home, ".postgresql", "postgresql.key")),
    ):
        value = info.get(key) if key != "service" else None
        out.append(value or env.get(var) or default)
    return tuple(p for p in dict.fromkeys(out) if os.path.lexists(p) and _searchable(p))
