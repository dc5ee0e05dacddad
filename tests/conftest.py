"""Shared fixtures: real parts only (see ../../shared/design/TESTING.md).

A test that needs a part that is missing FAILS under CI=true and skips loudly
on a developer machine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: the agent-tool fixtures (real CLIs at pinned versions): tests/tools/agents.py
pytest_plugins = ["tools.agents"]


def require(ok: bool, what: str) -> None:
    """Fail in CI, skip loudly elsewhere, when a real part is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"required test part missing in CI: {what}")
    pytest.skip(f"MISSING PART (would fail in CI): {what}")


# -- the real `saphan` entry point --------------------------------------------

@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


def saphan_exe() -> str:
    # The interpreter's own scripts dir first: a version-manager shim (pyenv)
    # in front of it would add its own start-up cost to every call.
    scripts = Path(sysconfig.get_path("scripts")) / "saphan"
    exe = str(scripts) if scripts.exists() else shutil.which("saphan")
    require(exe is not None, "the `saphan` console script (run ci/setup)")
    assert exe is not None
    return exe


class Saphan:
    """Runs the installed `saphan` console script against one workspace."""

    def __init__(self, home: Path):
        self.home = home

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["SAPHAN_HOME"] = str(self.home)
        # The registry of workspaces (hidden in every jail) is per test, not
        # the account's: a session makes hundreds of workspaces.
        env["XDG_STATE_HOME"] = str(self.home.parent / "xdg-state")
        env.update(extra)
        return env

    def __call__(self, *args: str, cwd: str | None = None, timeout: float = 120,
                 env: dict[str, str] | None = None) -> Result:
        p = subprocess.run(
            [saphan_exe(), *args], capture_output=True, text=True, timeout=timeout,
            env=env or self.env(), cwd=cwd, stdin=subprocess.DEVNULL,
        )
        return Result(p.returncode, p.stdout, p.stderr)

    def ok(self, *args: str, **kw: object) -> Result:
        r = self(*args, **kw)  # type: ignore[arg-type]
        assert r.code == 0, f"saphan {' '.join(args)} -> {r.code}\n{r.out}\n{r.err}"
        return r


# -- PostgreSQL, started by the fixture ------------------------------------------

def _pg_bin() -> Path | None:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "initdb").exists():
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    host: str
    port: int
    user: str
    #: ``pg_ctl`` as the server's account, and the arguments that start it
    #: (``stop()``/``start()``: a test that takes the server away mid-run)
    ctl: tuple[str, ...] = ()
    start_args: tuple[str, ...] = ()

    def url(self, db: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def psql(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(db), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the server (`pg_ctl stop -m fast`: every connection is cut)."""
        subprocess.run([*self.ctl, "-m", "fast", "-w", "stop"], check=True,
                       capture_output=True)

    def start(self) -> None:
        subprocess.run([*self.ctl, *self.start_args, "-w", "start"], check=True,
                       capture_output=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    yield from _pg_up()


@pytest.fixture
def pg_own() -> Iterator[PgServer]:
    """A PostgreSQL server of this test's own, which it may stop and start."""
    yield from _pg_up()


def _pg_up() -> Iterator[PgServer]:
    bindir = _pg_bin()
    require(bindir is not None, "PostgreSQL server binaries (apt-get install postgresql)")
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="saphan-pg-"))
    data = root / "data"
    user = "postgres"
    as_user: list[str] = []
    if os.geteuid() == 0:
        # initdb refuses to run as root: run the server as the package's account.
        require(subprocess.run(["id", user], capture_output=True).returncode == 0,
                "the `postgres` system account")
        shutil.chown(root, user=user)
        os.chmod(root, 0o700)
        as_user = ["runuser", "-u", user, "--"]
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", user,
                    "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True)
    port = _free_port()
    log = root / "server.log"
    server = PgServer(
        str(root), port, user, ctl=(*as_user, str(bindir / "pg_ctl"), "-D", str(data)),
        start_args=("-l", str(log), "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
                    "-c fsync=off -c max_connections=200"))
    server.start()
    try:
        yield server
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


_db_counter = [0]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on SQLite AND on PostgreSQL (a fresh database each)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    server: PgServer = request.getfixturevalue("pg_server")
    _db_counter[0] += 1
    name = f"t{os.getpid()}_{_db_counter[0]}_{int(time.time() * 1000) % 100000}"
    server.psql(f"CREATE DATABASE {name}")
    return server.url(name)


@pytest.fixture
def engine_ctx(database_url: str, tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real workspace made by the Engine (the public API `saphan init`
    uses), on SQLite AND on PostgreSQL, handed down as its Context."""
    from saphan.engine import Engine

    # The registry of workspaces is per test, not the account's.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    engine = Engine(tmp_path_factory.mktemp("home") / "saphan")
    engine.init(database_url)
    try:
        yield engine.ctx
    finally:
        engine.close()


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace directory apart from tmp_path (tests use tmp_path as workdir)."""
    return tmp_path_factory.mktemp("home") / "saphan"


@pytest.fixture
def saphan(home: Path, database_url: str) -> Saphan:
    """An initialised workspace on each store, driven through the real CLI."""
    s = Saphan(home)
    s.ok("init", "--database-url", database_url)
    return s


@pytest.fixture
def saphan_sqlite(home: Path) -> Saphan:
    s = Saphan(home)
    s.ok("init")
    return s


@pytest.fixture(scope="session")
def bwrap_available() -> None:
    require(shutil.which("bwrap") is not None, "bubblewrap (apt-get install bubblewrap)")


PYTHON = sys.executable


@pytest.fixture(scope="session")
def no_landlock(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A seccomp wrapper answering landlock_create_ruleset with ENOSYS (the
    allowed stand-in for a kernel without Landlock, TESTING.md)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    require(gcc is not None, "a C compiler (gcc) to build tests/helpers/no_landlock.c")
    assert gcc is not None
    out = tmp_path_factory.mktemp("helpers") / "no_landlock"
    src = Path(__file__).resolve().parent / "helpers" / "no_landlock.c"
    subprocess.run([gcc, "-O2", "-Wall", "-o", str(out), str(src)], check=True)
    return str(out)


@pytest.fixture(scope="session")
def zombie_leader(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/helpers/zombie_leader.c built: a process that looks dead ('Z',
    its main thread exited) while a thread of it runs on, appending ticks."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    require(gcc is not None, "a C compiler (gcc) to build tests/helpers/zombie_leader.c")
    assert gcc is not None
    out = tmp_path_factory.mktemp("helpers") / "zombie_leader"
    src = Path(__file__).resolve().parent / "helpers" / "zombie_leader.c"
    subprocess.run([gcc, "-O2", "-Wall", "-pthread", "-o", str(out), str(src)], check=True)
    return str(out)
