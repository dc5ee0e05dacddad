"""doctor.py: `saphan doctor`, through the real CLI, against this machine's
real parts: bubblewrap, user namespaces, Landlock, the store (SQLite and
PostgreSQL), the agent CLIs. A part taken away is taken away for real: the
system's bwrap hidden in a mount namespace of the test's, a database file
mounted read-only, a PostgreSQL database made read-only."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import PgServer, Result, Saphan, require, saphan_exe
from saphan import _native
from saphan.store.migrations import LATEST

HOST_CHECKS = ["bubblewrap", "bubblewrap-network", "user-namespaces", "landlock",
               "saphan-custody", "launcher-custody"]
WORKSPACE_CHECKS = ["config", "record-key", "store", "store-write", "migrations",
                    "agent-claude", "agent-codex"]
LINE = re.compile(r"^(PASS|WARN|FAIL) (\S+): (.+)$")


def _lines(r: Result) -> list[tuple[str, str, str, str | None]]:
    """(status, check, detail, fix) per check, parsed from the text output:
    every line is a check line or the `  fix: ` line under one."""
    parsed: list[tuple[str, str, str, str | None]] = []
    for line in r.out.splitlines():
        if line.startswith("  fix: "):
            status, check, detail, fix = parsed[-1]
            assert fix is None, r.out
            parsed[-1] = (status, check, detail, line.removeprefix("  fix: "))
            continue
        m = LINE.match(line)
        assert m is not None, f"not a check line: {line!r}\n{r.out}"
        parsed.append((m.group(1), m.group(2), m.group(3), None))
    return parsed


def _by_check(r: Result) -> dict[str, tuple[str, str, str | None]]:
    return {check: (status, detail, fix) for status, check, detail, fix in _lines(r)}


def _in_mount_ns(s: Saphan, setup: list[str], *args: str, path: str | None = None) -> Result:
    """`saphan ARGS` in a private mount namespace after the `mount` commands
    in ``setup`` (root: `unshare -m`), with PATH set to ``path`` if given."""
    require(os.geteuid() == 0 and shutil.which("unshare") is not None,
            "root and unshare(1) to take a part away in a mount namespace")
    run = 'exec "$0" "$@"' if path is None else f"PATH={shlex.quote(path)} exec \"$0\" \"$@\""
    script = " && ".join([*setup, run])
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                        saphan_exe(), *args], capture_output=True, text=True,
                       env=s.env(), timeout=120, stdin=subprocess.DEVNULL)
    return Result(p.returncode, p.stdout, p.stderr)


def _hide_bwrap() -> list[str]:
    """Bind /dev/null over every bwrap of the trusted directories."""
    from saphan.confine.trusted import TRUSTED_DIRS

    return [f"mount --bind /dev/null {d}/bwrap" for d in TRUSTED_DIRS
            if os.path.isfile(f"{d}/bwrap") and not os.path.islink(f"{d}/bwrap")]


# -- this machine ---------------------------------------------------------------------

def test_doctor_on_this_machine_passes_every_check(
        saphan: Saphan, claude_bin: str, codex_bin: str, bwrap_available: None) -> None:
    """On each store: every check PASS, exit 0, each line what was measured,
    and the store's write check left nothing behind."""
    level, _reason = _native.landlock_abi()
    require(level >= _native.landlock_floor(), "a kernel with Landlock ABI >= 3")
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("machine", "probe-confinement", "here")
    r = saphan("doctor")
    assert r.code == 0, r.out + r.err
    lines = _lines(r)
    assert [check for _, check, _, _ in lines] == [
        *HOST_CHECKS, *WORKSPACE_CHECKS, "machine:here", "ssh-machines"]
    assert all(status == "PASS" and fix is None for status, _, _, fix in lines), r.out
    got = _by_check(r)
    from saphan.confine.trusted import find

    assert got["bubblewrap"][1].startswith(f"{find('bwrap')} ")
    assert f"ABI {level} (supported;" in got["landlock"][1]
    assert "unshare(CLONE_NEWUSER) succeeded" in got["user-namespaces"][1]
    assert "--unshare-net" in got["bubblewrap-network"][1]
    assert got["migrations"][1] == f"schema at version {LATEST}: migrations 1..{LATEST} applied"
    store_url = saphan.ok("config", "show", "--json").json()["store"]
    assert got["store"][1].startswith(f"{store_url}: connected and read")
    assert f"level {level}, measured" in got["machine:here"][1]
    assert got["ssh-machines"][1] == "no SSH machines registered; nothing to reach"
    # The write check was rolled back: no migration 0 (or anything else) was kept.
    from saphan.engine import Engine

    engine = Engine(saphan.home)
    try:
        assert engine.store.schema_versions() == list(range(1, LATEST + 1))
        assert engine.runs() == []
    finally:
        engine.close()


def test_json_is_a_list_of_check_status_detail_fix(saphan_sqlite: Saphan) -> None:
    text = saphan_sqlite("doctor")
    r = saphan_sqlite("doctor", "--json")
    assert r.code == text.code
    value = json.loads(r.out)
    assert r.out == json.dumps(value, indent=2, sort_keys=True) + "\n"
    assert isinstance(value, list) and value
    for item in value:
        assert set(item) == {"check", "status", "detail", "fix"}, item
        assert item["status"] in ("PASS", "WARN", "FAIL")
        assert isinstance(item["detail"], str) and item["detail"] and "\n" not in item["detail"]
        assert (item["fix"] is None) == (item["status"] == "PASS"), item
    # The same checks, in the same order, with the same verdicts as the text.
    assert [(i["status"], i["check"], i["fix"]) for i in value] == \
        [(status, check, fix) for status, check, _, fix in _lines(text)]
    assert len({i["check"] for i in value}) == len(value)
    assert r.code == (1 if any(i["status"] == "FAIL" for i in value) else 0)


# -- parts taken away -----------------------------------------------------------------

def test_without_bubblewrap_doctor_fails_with_the_fix(saphan_sqlite: Saphan,
                                                      tmp_path: Path) -> None:
    """bwrap gone from PATH and from the system directories: FAIL, the fix, exit
    1. A bwrap planted on PATH is not taken either (runs never take it from
    PATH), and PATH alone does not decide: the system's bwrap is what runs use."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    planted = tmp_path / "planted-bin"
    planted.mkdir()
    (planted / "bwrap").write_text("#!/bin/sh\nexit 0\n")
    (planted / "bwrap").chmod(0o755)
    hide = _hide_bwrap()
    assert hide, "no bwrap in the trusted directories to hide"
    for path in (str(bare), f"{planted}:/usr/bin:/bin"):
        r = _in_mount_ns(saphan_sqlite, hide, "doctor", path=path)
        assert r.code == 1, r.out + r.err
        status, detail, fix = _by_check(r)["bubblewrap"]
        assert status == "FAIL", r.out
        assert detail.startswith("[confinement-unavailable] bubblewrap (bwrap) is not "
                                 "installed on this control plane"), detail
        assert str(planted) not in detail
        assert fix is not None and fix.startswith("install it: `apt-get install bubblewrap`")
        assert "FAIL bubblewrap: " in r.out and "\n  fix: install it: " in r.out
        # Measured apart: the kernel still makes user namespaces.
        assert _by_check(r)["user-namespaces"][0] == "PASS"
    # bwrap in its system directory, none on PATH: what runs use is there.
    r = saphan_sqlite("doctor", env=saphan_sqlite.env(PATH=str(bare)))
    from saphan.confine.trusted import find

    assert _by_check(r)["bubblewrap"][0] == "PASS", r.out
    assert _by_check(r)["bubblewrap"][1].startswith(f"{find('bwrap')} ")


def test_a_read_only_sqlite_store_fails_the_write_check(saphan_sqlite: Saphan) -> None:
    db = saphan_sqlite.home / "saphan.db"
    r = _in_mount_ns(saphan_sqlite, [f"mount --bind {db} {db}",
                                     f"mount -o remount,ro,bind {db}"], "doctor")
    assert r.code == 1, r.out + r.err
    got = _by_check(r)
    assert got["store"][0] == "PASS"  # reached and read ...
    status, detail, fix = got["store-write"]  # ... but not written
    assert status == "FAIL"
    assert detail.startswith(f"a write was refused: sqlite:///{db}")
    assert detail.endswith(": attempt to write a readonly database")
    assert fix == (f"make {db} and its directory writable by uid {os.geteuid()}, on a "
                   "filesystem mounted read-write")
    # The same store, mounted read-write: the write goes through (and is rolled back).
    assert _by_check(saphan_sqlite("doctor"))["store-write"][0] == "PASS"


def test_a_read_only_postgresql_database_fails_the_write_check(home: Path,
                                                               pg_server: PgServer) -> None:
    name = f"doctor_ro_{os.getpid()}"
    pg_server.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_server.url(name))
    assert _by_check(s("doctor"))["store-write"][0] == "PASS"
    pg_server.psql(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    r = s("doctor")
    assert r.code == 1, r.out
    got = _by_check(r)
    assert got["store"][0] == "PASS"
    status, detail, fix = got["store-write"]
    assert status == "FAIL" and "read-only transaction" in detail, detail
    assert fix is not None and "read-only standby" in fix


def test_pending_and_unknown_migrations(saphan_sqlite: Saphan) -> None:
    """Measured as found: doctor applies nothing."""
    from saphan.store.base import Store
    from saphan.store.sqlite import SQLiteConnector

    db = saphan_sqlite.home / "saphan.db"
    db.unlink()
    older = Store(SQLiteConnector(db))
    older.migrate(upto=LATEST - 1)
    older.close()
    for _ in range(2):  # the first doctor did not migrate it
        r = saphan_sqlite("doctor")
        status, detail, fix = _by_check(r)["migrations"]
        assert status == "WARN", r.out
        assert detail == f"schema at version {LATEST - 1}; pending: [{LATEST}]"
        assert fix is not None and fix.startswith("`saphan db migrate`")
    saphan_sqlite.ok("db", "migrate")
    with sqlite3.connect(db) as conn:  # a newer saphan's migration
        conn.execute("INSERT INTO schema_migrations VALUES (?, 'from a newer saphan', 'now')",
                     (LATEST + 1,))
    r = saphan_sqlite("doctor")
    assert r.code == 1
    status, detail, fix = _by_check(r)["migrations"]
    assert status == "FAIL"
    assert detail.startswith(f"the store has migration(s) [{LATEST + 1}] this saphan does not "
                             f"know (it knows 1..{LATEST})")
    assert fix == "upgrade saphan here to the version that migrated the store"


def test_an_unsafe_record_key_fails_by_name(saphan_sqlite: Saphan) -> None:
    key = saphan_sqlite.home / "record.key"
    key.chmod(0o640)
    r = saphan_sqlite("doctor")
    assert r.code == 1
    status, detail, fix = _by_check(r)["record-key"]
    assert status == "FAIL" and detail.startswith("[custody-key-unsafe] "), detail
    assert fix is not None and f"chmod 0600 {key}" in fix
    key.chmod(0o600)
    assert _by_check(saphan_sqlite("doctor"))["record-key"][0] == "PASS"


def test_agent_clis_missing_or_not_the_pinned_version(saphan_sqlite: Saphan,
                                                      tmp_path: Path) -> None:
    from saphan.tools.binaries import PINNED

    s = saphan_sqlite
    other = tmp_path / "codex"
    other.write_text("#!/bin/sh\necho 'codex-cli 0.1.0'\n")
    other.chmod(0o755)
    env = s.env(SAPHAN_CLAUDE_BIN=str(tmp_path / "absent"), SAPHAN_CODEX_BIN=str(other))
    got = _by_check(s("doctor", env=env))
    # No local slot runs claude: a warning, with the install command.
    status, detail, fix = got["agent-claude"]
    assert status == "WARN" and "no local slot runs it" in detail, detail
    assert fix is not None and f"@anthropic-ai/claude-code@{PINNED['claude']}" in fix
    status, detail, fix = got["agent-codex"]
    assert status == "WARN", detail
    assert f"reports 'codex-cli 0.1.0' (pinned {PINNED['codex']};" in detail
    assert fix is not None and f"@openai/codex@{PINNED['codex']}" in fix
    # A local claude slot would fail its runs: FAIL, exit 1.
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "c1", "--tool", "claude")
    r = s("doctor", env=env)
    assert r.code == 1
    status, detail, _ = _by_check(r)["agent-claude"]
    assert status == "FAIL" and "local slot(s) here/c1 run it" in detail, detail


def test_no_workspace_is_a_failure_naming_init_and_nothing_is_made(home: Path) -> None:
    r = Saphan(home)("doctor")
    assert r.code == 1
    got = _by_check(r)
    assert got["config"] == (
        "FAIL", f"no saphan workspace at {home} (no {home / 'config.toml'})",
        "`saphan init` (or point SAPHAN_HOME / --home at your workspace)")
    assert "store" not in got and "record-key" not in got
    assert not home.exists()


def test_a_bad_config_fails_naming_the_key(saphan_sqlite: Saphan) -> None:
    cfg = saphan_sqlite.home / "config.toml"
    cfg.write_text('[run]\nconfinement = "engnie"\n')
    r = saphan_sqlite("doctor")
    assert r.code == 1
    status, detail, fix = _by_check(r)["config"]
    assert status == "FAIL" and f"run.confinement is 'engnie' in {cfg}" in detail
    assert fix is not None and 'set confinement = "engine" under [run]' in fix


@pytest.mark.parametrize("args", [["--help"], ["doctor", "--help"]])
def test_help_needs_no_workspace(home: Path, args: list[str]) -> None:
    r = Saphan(home).ok(*args)
    assert "doctor" in r.out
    assert not home.exists()



# -- no password shown, on any line ------------------------------------------------------

SECRETS = ("s3cretA", "s3cretD", "s3cretE")


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert not any(x in text for x in SECRETS), text


def test_no_password_is_printed_by_init_config_show_or_doctor(
        tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> None:
    """A password with no user name before it, one under a percent-encoded
    key, an sslpassword: none is printed by init, config show (text and
    JSON), doctor's PASS lines, its FAIL lines, or init's "cannot connect"."""
    name = f"doctor_secret_{os.getpid()}"
    pg_server.psql(f"CREATE DATABASE {name}")
    where = f"127.0.0.1:{pg_server.port}/{name}"
    urls = [f"postgresql://:s3cretA@{where}?user={pg_server.user}",  # the server trusts any
            f"postgresql://{pg_server.user}@{where}?%70assword=s3cretD&sslpassword=s3cretE"]
    for url in urls:
        s = Saphan(tmp_path_factory.mktemp("home") / "saphan")
        r = s.ok("init", "--database-url", url)
        _no_secret(r.out, r.err)
        shown = s.ok("config", "show", "--json").json()
        assert isinstance(shown, dict) and "***" in shown["store"]
        _no_secret(json.dumps(shown), s.ok("config", "show").out)
        r = s("doctor")
        assert _by_check(r)["store"][0] == "PASS", r.out
        _no_secret(r.out, r.err, s("doctor", "--json").out)
        # the server gone: the FAIL lines
        down = url.replace(f":{pg_server.port}/", ":1/")
        cfg = s.home / "config.toml"
        cfg.write_text(cfg.read_text().replace(url, down))
        r = s("doctor")
        status, detail, _ = _by_check(r)["store"]
        assert status == "FAIL" and detail.startswith("cannot connect to "), r.out
        _no_secret(r.out, r.err, s("doctor", "--json").out)
        r = Saphan(tmp_path_factory.mktemp("home") / "saphan")("init", "--database-url", down)
        assert r.code != 0 and "cannot connect to " in r.err, r.err
        _no_secret(r.out, r.err)


# -- what a run needs of the store ------------------------------------------------------------

_roles = [0]


def _limited_role(pg_server: PgServer, db: str, grants: list[str]) -> str:
    """A login role of its own with only ``grants`` (each `PRIVS ON WHAT`) in ``db``."""
    _roles[0] += 1
    role = f"doctor_role_{os.getpid()}_{_roles[0]}"
    pg_server.psql(f"CREATE ROLE {role} LOGIN")
    for grant in grants:
        pg_server.psql(f"GRANT {grant} TO {role}", db=db)
    return role


def _as_role(s: Saphan, pg_server: PgServer, db: str, role: str) -> None:
    cfg = s.home / "config.toml"
    cfg.write_text(cfg.read_text().replace(pg_server.url(db),
                                           f"postgresql://{role}@127.0.0.1:{pg_server.port}/{db}"))


def _command_run(s: Saphan, tmp_path: Path) -> Result:
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    return s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "true")


@pytest.mark.usefixtures("bwrap_available")
def test_a_role_that_cannot_write_runs_fails_the_write_check(
        home: Path, pg_server: PgServer, tmp_path: Path) -> None:
    """The role writes schema_migrations and may create in the schema, and
    nothing else: doctor FAILs (it said PASS, and every run failed with
    `permission denied for table runs`), naming the grants; once they are
    given, doctor PASSes and a run goes through."""
    name = f"doctor_role_{os.getpid()}"
    pg_server.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_server.url(name))
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    role = _limited_role(pg_server, name, ["USAGE, CREATE ON SCHEMA public",
                                           "SELECT, INSERT ON schema_migrations"])
    _as_role(s, pg_server, name, role)
    r = s("doctor")
    assert r.code == 1, r.out
    got = _by_check(r)
    assert got["store"][0] == "PASS"
    status, detail, fix = got["store-write"]
    assert status == "FAIL" and "permission denied for table" in detail, detail
    assert fix is not None
    for grant in (f"GRANT SELECT, INSERT, UPDATE ON public.runs TO {role}",
                  f"GRANT SELECT ON public.machines TO {role}",
                  f"GRANT SELECT ON public.slots TO {role}",
                  f"GRANT SELECT ON public.machine_facts TO {role}"):
        assert grant in fix, fix
    assert "schema_migrations" not in fix and "SCHEMA" not in fix, fix
    ran = _command_run(s, tmp_path)
    assert ran.code != 0 and "permission denied" in ran.err, ran.err  # as doctor says
    for grant in re.findall(rf"GRANT [^;`]+ TO {role}", fix):
        pg_server.psql(grant, db=name)
    r = s("doctor")
    assert _by_check(r)["store-write"][0] == "PASS", r.out
    ran = _command_run(s, tmp_path)
    assert ran.code == 0, ran.err  # as doctor says


def test_a_role_that_cannot_create_in_the_schema_fails_the_write_check(
        home: Path, pg_server: PgServer) -> None:
    """Every table privilege, no CREATE on the schema: every command fails on
    open_store's CREATE TABLE IF NOT EXISTS schema_migrations, so doctor FAILs."""
    name = f"doctor_nocreate_{os.getpid()}"
    pg_server.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_server.url(name))
    role = _limited_role(pg_server, name, [
        "USAGE ON SCHEMA public", "ALL ON ALL TABLES IN SCHEMA public"])
    _as_role(s, pg_server, name, role)
    listed = s("machine", "list")
    assert listed.code != 0 and "permission denied for schema public" in listed.err, listed.err
    r = s("doctor")
    assert r.code == 1, r.out
    status, detail, fix = _by_check(r)["store-write"]
    assert status == "FAIL" and "permission denied for schema public" in detail, detail
    assert fix is not None and f"GRANT CREATE ON SCHEMA public TO {role}" in fix, fix
    pg_server.psql(f"GRANT CREATE ON SCHEMA public TO {role}", db=name)
    assert _by_check(s("doctor"))["store-write"][0] == "PASS"
    s.ok("machine", "list")


# -- network namespaces ---------------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_without_network_namespaces_doctor_fails_the_network_trial(
        saphan_sqlite: Saphan) -> None:
    """user.max_net_namespaces=0 (in a user namespace of the test's own):
    bubblewrap still makes a sandbox, but not one with --unshare-net, so
    every `network: off` run would fail: FAIL with the sysctl named."""
    require(shutil.which("unshare") is not None, "unshare(1)")
    script = ("echo 0 > /proc/sys/user/max_net_namespaces && "
              'exec "$0" "$@"')
    p = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script,
                        saphan_exe(), "doctor"], capture_output=True, text=True,
                       env=saphan_sqlite.env(), timeout=120, stdin=subprocess.DEVNULL)
    require(p.returncode != 255 and "unshare failed" not in p.stderr,
            f"a user namespace whose sysctls can be set ({p.stderr.strip()})")
    r = Result(p.returncode, p.stdout, p.stderr)
    got = _by_check(r)
    assert got["bubblewrap"][0] == "PASS", r.out
    status, detail, fix = got["bubblewrap-network"]
    assert status == "FAIL", r.out
    assert "--unshare-net" in detail and "ENOSPC" in detail, detail
    assert fix is not None and "user.max_net_namespaces" in fix, fix
    assert "network: off" in fix
    assert r.code == 1
    # Outside it, the same trial passes.
    assert _by_check(saphan_sqlite("doctor"))["bubblewrap-network"][0] == "PASS"


# -- a store that does not answer -------------------------------------------------------------

def test_a_locked_store_does_not_hang_doctor(home: Path, pg_server: PgServer) -> None:
    """Another session holds ACCESS EXCLUSIVE on schema_migrations: doctor
    printed nothing for as long as it was held. Now each line is printed as
    it is measured, and the store check gives up at its lock timeout."""
    import time

    import psycopg

    name = f"doctor_lock_{os.getpid()}"
    pg_server.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_server.url(name))
    with psycopg.connect(pg_server.url(name)) as holder:
        holder.execute("LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        p = subprocess.Popen([saphan_exe(), "doctor"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=s.env(), stdin=subprocess.DEVNULL)
        try:
            assert p.stdout is not None
            early = b""
            # the host's checks and config's line, read before doctor ends
            while not re.search(rb"^(PASS|FAIL) config: ", early, re.MULTILINE):
                ready, _, _ = select.select([p.stdout], [], [], started + 60 - time.monotonic())
                chunk = os.read(p.stdout.fileno(), 65536) if ready else b""
                assert chunk, f"nothing more printed after {time.monotonic() - started:.0f} s:" \
                    f" {early.decode()!r}"
                early += chunk
            # ... while the store check still waits on the lock
            assert p.poll() is None, early.decode()
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        took = time.monotonic() - started
    r = Result(p.returncode, (early + out).decode(), err.decode())
    from saphan.doctor import STORE_LOCK_TIMEOUT, STORE_STATEMENT_TIMEOUT

    assert took < STORE_LOCK_TIMEOUT + 30, took
    status, detail, fix = _by_check(r)["store"]
    assert status == "FAIL" and "lock timeout" in detail, r.out
    assert fix is not None
    assert f"{STORE_LOCK_TIMEOUT:g} s" in fix and f"{STORE_STATEMENT_TIMEOUT:g} s" in fix, fix
    assert r.code == 1
