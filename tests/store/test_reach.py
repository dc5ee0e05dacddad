"""No run reaches the store: its unix socket and the client credential files
are denied in every jail (store/reach.py). Review measured a `network: off`
command run connecting to PostgreSQL's socket and rewriting a slot's
endpoint; here the same run's connect is refused."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from conftest import PgServer, Saphan
from saphan.store.reach import client_paths


def _listening(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(1)
    return s


def test_the_sockets_and_credential_files_a_client_would_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".postgresql").mkdir(parents=True)
    (home / ".pgpass").write_text("*:*:*:*:pw\n")
    (home / ".postgresql" / "postgresql.key").write_text("key")
    sock_dir = tmp_path / "sock"
    sock_dir.mkdir()
    held = [_listening(sock_dir / ".s.PGSQL.6000"), _listening(sock_dir / ".s.PGSQL.6001")]
    (sock_dir / ".s.PGSQL.6000.lock").write_text("")
    try:
        env = {"HOME": str(home)}
        url = f"postgresql://u@/db?host={sock_dir}&port=6000"
        assert client_paths(url, tmp_path / "x.db", env) == (
            str(sock_dir / ".s.PGSQL.6000"), str(sock_dir / ".s.PGSQL.6000.lock"),
            str(home / ".pgpass"), str(home / ".postgresql" / "postgresql.key"))
        # several hosts and ports; a passfile named in the URL; PGHOST from the environment
        passfile = tmp_path / "pf"
        passfile.write_text("x")
        got = client_paths(f"postgresql://u@/db?host={sock_dir},db.example&port=6000,6001"
                           f"&passfile={passfile}", tmp_path / "x.db", env)
        assert str(sock_dir / ".s.PGSQL.6001") in got and str(passfile) in got
        assert str(home / ".pgpass") not in got
        got = client_paths("postgresql://u@/db?port=6001", tmp_path / "x.db",
                           {**env, "PGHOST": str(sock_dir)})
        assert got[0] == str(sock_dir / ".s.PGSQL.6001")
    finally:
        for s in held:
            s.close()
    # A directory only another account may enter: out of every jail's reach.
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / ".pgpass").write_text("x")
    os.chown(closed, 65534, 65534) if os.geteuid() == 0 else closed.chmod(0o000)
    try:
        assert client_paths("postgresql://u@h/db", tmp_path / "x.db",
                            {"HOME": str(closed)}) == ()
    finally:
        closed.chmod(0o700)
    # A SQLite store outside the workspace: the file and its journals.
    db = tmp_path / "elsewhere.db"
    db.write_text("")
    (tmp_path / "elsewhere.db-wal").write_text("")
    assert client_paths(f"sqlite:///{db}", tmp_path / "x.db", {}) == (
        str(db), f"{db}-wal")


PROBE = ("import socket,sys\n"
         "s = socket.socket(socket.AF_UNIX)\n"
         "try:\n"
         "    s.connect(sys.argv[1]); print('CONNECTED')\n"
         "except OSError as e:\n"
         "    print('REFUSED', e.errno)\n")


@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize("net", ["off", "open"])
def test_a_run_cannot_connect_to_the_stores_socket(pg_own: PgServer, home: Path,
                                                   tmp_path: Path, net: str) -> None:
    pg_server = pg_own
    db = f"reach{os.getpid()}{net}"
    pg_server.psql(f"CREATE DATABASE {db}")
    # The socket's directory open to every account, as /var/run/postgresql is.
    os.chmod(pg_server.host, 0o755)
    sock = Path(pg_server.host) / f".s.PGSQL.{pg_server.port}"
    assert sock.exists()
    s = Saphan(home)
    s.ok("init", "--database-url",
         f"postgresql://{pg_server.user}@/{db}?host={pg_server.host}&port={pg_server.port}")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": [Path(sys.executable).name],
                              "network": net}))
    wd = tmp_path / "wd"
    wd.mkdir()
    # The probe works: outside a jail it connects.
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(str(sock))
    probe.close()
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
          "--permission-class", str(pc), "--json", "--", sys.executable, "-c", PROBE, str(sock))
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert Path(rec["output"]["stdout"]).read_text().startswith("REFUSED")
    assert str(sock) in rec["policy"]["read_denials"]
