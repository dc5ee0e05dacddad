"""`saphan init` is all or nothing, and several workspaces share one
PostgreSQL store by holding one fleet key (issue 17 items 3 and 4), through
the real CLI against a PostgreSQL server the fixture starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PgServer, Saphan, require, saphan_exe
from saphan.records import key_id


def _new_db(pg: PgServer, tag: str) -> str:
    name = f"join_{tag}_{os.getpid()}_{int(time.time() * 1000) % 10**7}"
    pg.psql(f"CREATE DATABASE {name}")
    return pg.url(name)


def _ws(tmp_path: Path, name: str) -> Saphan:
    return Saphan(tmp_path / name / "saphan")


def _key(s: Saphan) -> bytes:
    return (s.home / "record.key").read_bytes()


def _url_in_config(s: Saphan) -> str:
    import tomllib

    return str(tomllib.loads((s.home / "config.toml").read_text())["database"]["url"])


def _refused_run(s: Saphan, tmp_path: Path) -> str:
    """A refused run: a signed run record, cheaply."""
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path / "nowhere"),
          "--", "true")
    assert r.code == 3 and "workdir-missing" in r.err, r.err
    return r.err.strip().splitlines()[-1].removeprefix("run: ")


# -- init is all or nothing -------------------------------------------------------------

@pytest.mark.parametrize("url", ["postgresql://postgres@127.0.0.1:1/nowhere",
                                 "mysql://somewhere/db"])
def test_init_with_a_bad_url_leaves_no_files(tmp_path: Path, url: str) -> None:
    s = _ws(tmp_path, "a")
    r = s("init", "--database-url", url)
    assert r.code in (1, 2), r.out + r.err
    assert not s.home.exists() and not s.home.parent.exists()
    # an existing empty directory stays empty
    s.home.mkdir(parents=True)
    r = s("init", "--database-url", url)
    assert r.code in (1, 2)
    assert list(s.home.iterdir()) == []


def test_a_corrected_url_is_taken_only_after_it_connects(tmp_path: Path,
                                                         pg_server: PgServer) -> None:
    s = _ws(tmp_path, "a")
    s.ok("init")
    before = (s.home / "config.toml").read_text()
    r = s("init", "--database-url", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert r.code == 1, r.out + r.err
    assert (s.home / "config.toml").read_text() == before  # unchanged: it did not connect
    url = _new_db(pg_server, "fix")
    r = s.ok("init", "--database-url", url)
    assert "database.url changed from sqlite to" in r.out and "connected and migrated" in r.out
    assert _url_in_config(s) == url
    # the rest of the file is kept as written
    assert (s.home / "config.toml").read_text() == before.replace(
        'url = "sqlite"', f"url = {json.dumps(url)}")
    r = s.ok("init", "--database-url", url)
    assert "nothing changed" in r.out


def test_a_missing_key_is_refused_naming_what_a_new_one_invalidates(tmp_path: Path) -> None:
    s = _ws(tmp_path, "a")
    s.ok("init")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    run_id = _refused_run(s, tmp_path)
    old = key_id(_key(s))
    (s.home / "record.key").unlink()
    r = s("init")
    assert r.code == 3, r.out + r.err
    assert "refused [custody-key-unsafe]" in r.err
    assert "does not exist" in r.err
    assert f"1 signed run record(s) and 0 machine fact row(s) (by key: {old}: 1 + 0)" in r.err
    assert "--join --key-file" in r.err and "--new-key" in r.err
    assert not (s.home / "record.key").exists()  # nothing quietly minted
    r = s("init", "--new-key")
    assert r.code == 0, r.out + r.err
    new = key_id(_key(s))
    assert new != old
    assert f"note: new record key {new}: 1 signed run record(s) and 0 machine fact row(s)" \
        in r.out
    assert "do not verify here any more" in r.out
    r = s("runs", "show", run_id)
    assert r.code == 3 and r.out.startswith(f"signed by key {old}, not held here")
    again = s("init", "--new-key")  # a key in place is never replaced
    assert again.code == 2 and "never replaces a record key" in again.err


# -- several workspaces, one store ---------------------------------------------------------

def _join(s: Saphan, url: str, key: bytes, via_pipe: bool, tmp_path: Path) -> str:
    if not via_pipe:
        kf = tmp_path / "fleet.key"
        kf.write_bytes(key)
        os.chmod(kf, 0o600)
        return s.ok("init", "--database-url", url, "--join", "--key-file", str(kf)).out
    p = subprocess.run([saphan_exe(), "init", "--database-url", url, "--join", "--key-file",
                        "-"], input=key, capture_output=True, env=s.env(), timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode()


def _records(s: Saphan) -> dict[str, Any]:
    listed = s.ok("runs", "list", "--json").json()
    assert isinstance(listed, list)
    return {r["id"]: r for r in listed}


def _wait_running(s: Saphan, timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        live = [r for r in _records(s).values() if r.get("state") == "running"]
        if live:
            return str(live[0]["id"])
        time.sleep(0.2)
    raise AssertionError("the run did not start")


@pytest.mark.usefixtures("bwrap_available")
def test_joined_workspaces_share_signed_rows_and_capacity(tmp_path: Path,
                                                          pg_server: PgServer) -> None:
    from saphan import _native

    url = _new_db(pg_server, "fleet")
    a, b, c = _ws(tmp_path, "a"), _ws(tmp_path, "b"), _ws(tmp_path, "c")
    a.ok("init", "--database-url", url)
    a.ok("machine", "add", "here", "--local")
    a.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "1")
    probed = a.ok("machine", "probe-confinement", "here", "--json").json()
    assert isinstance(probed, dict)
    a_run = _refused_run(a, tmp_path)

    out = _join(b, url, _key(a), via_pipe=True, tmp_path=tmp_path)
    assert f"record key id {key_id(_key(a))}" in out
    assert _key(b) == _key(a) and (b.home / "record.key").stat().st_mode & 0o777 == 0o600

    # B verifies A's run and A's probe row; A verifies B's.
    assert _records(b)[a_run]["signature"] == {"status": "valid"}
    shown = b.ok("machine", "show", "here", "--json").json()
    assert isinstance(shown, dict)
    assert shown["facts"]["landlock"]["value"]["level"] == probed["level"]
    b_run = _refused_run(b, tmp_path)
    assert _records(a)[b_run]["signature"] == {"status": "valid"}
    assert b.ok("runs", "show", a_run).code == 0

    # Capacity is shared: A's live run holds the only seat, so B's run is seat-full.
    wd = tmp_path / "wd"
    wd.mkdir()
    holder = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                               "--workdir", str(wd), "--", "sleep", "60"], env=a.env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        live = _wait_running(b)
        r = b("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert r.code == 3 and "refused [seat-full]" in r.err, r.err
        assert live in r.err
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
    assert b.ok("runs", "show", live).code == 0  # A's finalised record verifies in B

    # A third workspace with a key of its own: the fleet's rows are foreign, not invalid.
    out = c.ok("init", "--database-url", url).out
    fleet, own = key_id(_key(a)), key_id(_key(c))
    assert f"signed with other keys than this workspace's ({own})" in out and fleet in out
    listed = c.ok("runs", "list")
    assert f"?foreign:{fleet}" in listed.out and "!invalid" not in listed.out
    assert f"signed by key {fleet}, not held here" in listed.err
    shown_c = c("runs", "show", a_run, "--json")
    assert shown_c.code == 3
    got = json.loads(shown_c.out)["signature"]
    assert got["status"] == "foreign" and got["key_id"] == fleet
    text = c.ok("machine", "show", "here").out
    assert f"landlock: signed by key {fleet}, not held here" in text
    facts_c = c.ok("machine", "show", "here", "--json").json()
    assert isinstance(facts_c, dict)
    assert facts_c["facts"]["landlock"]["signature"]["status"] == "foreign"
    # ... and nothing is gated on a foreign fact.
    require(_native.landlock_abi()[0] >= _native.landlock_floor(),
            "a kernel with Landlock ABI >= 3")
    r = c("run", "--machine", "here", "--slot", "s1", "--boundary", "landlock",
          "--workdir", str(wd), "--", "true")
    assert r.code == 3, r.out + r.err
    assert "refused [record-signature-invalid]" in r.err
    assert f"signed by key {fleet}, not held here" in r.err
    assert "not an invalid signature" in r.err and "--join" in r.err


def test_join_reads_the_fleet_key_under_custody(tmp_path: Path, pg_server: PgServer) -> None:
    url = _new_db(pg_server, "custody")
    a, b = _ws(tmp_path, "a"), _ws(tmp_path, "b")
    a.ok("init", "--database-url", url)
    kf = tmp_path / "fleet.key"
    kf.write_bytes(_key(a))
    os.chmod(kf, 0o644)
    r = b("init", "--database-url", url, "--join", "--key-file", str(kf))
    assert r.code == 3 and "refused [custody-key-unsafe]" in r.err and "fleet key" in r.err
    assert not b.home.exists()
    link = tmp_path / "link.key"
    os.chmod(kf, 0o600)
    link.symlink_to(kf)
    r = b("init", "--database-url", url, "--join", "--key-file", str(link))
    assert r.code == 3 and "refused [custody-key-unsafe]" in r.err
    assert not b.home.exists()
    r = b("init", "--database-url", url, "--join")
    assert r.code == 2 and "--key-file" in r.err
    r = b("init", "--database-url", url, "--join", "--key-file", "-")  # stdin: /dev/null
    assert r.code == 2 and "from a pipe" in r.err
    p = subprocess.run([saphan_exe(), "init", "--database-url", url, "--join", "--key-file",
                        "-"], input=_key(a)[:31], capture_output=True, env=b.env(), timeout=120)
    assert p.returncode == 2 and b"read 31 bytes" in p.stderr
    assert not b.home.exists()
    # a workspace that holds another key never has it replaced by a join
    b.ok("init", "--database-url", url)
    r = b("init", "--database-url", url, "--join", "--key-file", str(kf))
    assert r.code == 2 and "never replaces a record key" in r.err
    # a missing key is put back from the fleet
    c = _ws(tmp_path, "c")
    c.ok("init", "--database-url", url, "--join", "--key-file", str(kf))
    (c.home / "record.key").unlink()
    assert c("init").code == 3
    c.ok("init", "--join", "--key-file", str(kf))
    assert _key(c) == _key(a)


def test_a_unix_socket_url_works_as_documented(tmp_path: Path, pg_server: PgServer) -> None:
    tcp = _new_db(pg_server, "sock")
    db = tcp.rsplit("/", 1)[1]
    url = f"postgresql://{pg_server.user}@/{db}?host={pg_server.host}&port={pg_server.port}"
    a = _ws(tmp_path, "a")
    r = a.ok("init", "--database-url", url)
    assert _url_in_config(a) == url and "workspace ready" in r.out
    a.ok("machine", "add", "here", "--local")
    b = _ws(tmp_path, "b")
    b.ok("init", "--database-url", tcp)  # the same database over TCP
    assert "here" in b.ok("machine", "list").out
