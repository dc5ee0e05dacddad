"""serve/app.py over HTTP, against the real `saphan serve`: the token gate,
the Host check, parameters refused by shape, hostile output inert, forged
records flagged, nothing written to the store."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from conftest import Saphan, saphan_exe
from serve.served import Served, serving, stop

HOSTILE = ("printf '<script>document.title=\"pwned\"</script><img src=x onerror=alert(1)>"
           "\\033]52;c;aGk=\\007 \\033[31mred\\342\\200\\256evil\\n'")
ROUTES = ["/", "/fleet/body", "/runs", "/runs/rows", "/batches", "/static/saphan.js",
          "/static/saphan.css"]


def _run(s: Saphan, wd: Path, script: str) -> str:
    wd.mkdir(exist_ok=True)
    s.ok("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
         script)
    got = s.ok("runs", "list", "--json", "--limit", "1").json()
    assert isinstance(got, list)
    return str(got[0]["id"])


def _db(s: Saphan) -> str:
    return str(s.home / "saphan.db")


# -- the gate -------------------------------------------------------------------------------

def test_every_route_needs_the_token(served: Served) -> None:
    rid = "01" + "A" * 24
    for path in [*ROUTES, f"/run/{rid}", f"/run/{rid}/output?stream=stdout", f"/batch/{rid}",
                 "/no/such/page"]:
        missing = served.get(path, token=False)
        assert missing.status == 403, path
        assert b"token" in missing.body
        wrong = served.get(path, token=False, headers={"Authorization": "Bearer " + "x" * 43})
        assert wrong.status == 403, path
        # wrong in its last character, whatever that character is
        last = "B" if served.token.endswith("A") else "A"
        cookie = served.get(path, token=False, headers={
            "Cookie": f"saphan-token-{served.port}={served.token[:-1]}{last}"})
        assert cookie.status == 403, path
        # the right token under another port's cookie name is not this dashboard's
        other = served.get(path, token=False, headers={
            "Cookie": f"saphan-token-{served.port + 1}={served.token}"})
        assert other.status == 403, path
        query = served.get(path + ("&" if "?" in path else "?") + "token=nope", token=False)
        assert query.status == 403, path
    for path in ROUTES:
        assert served.get(path).status == 200, path


def test_the_token_in_the_url_becomes_a_cookie_of_the_pages_own_name(served: Served) -> None:
    assert re.fullmatch(r"s-[0-9a-f]{16}\.localhost", served.name), served.url
    first = served.get(f"/runs?state=ended&token={served.token}", token=False)
    assert first.status == 303
    assert first.headers["location"] == "/runs?state=ended"  # the token leaves the address bar
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"saphan-token-{served.port}={served.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": cookie.split(";", 1)[0]}
    again = served.get("/runs?state=ended", token=False, headers=jar)
    assert again.status == 200
    assert "set-cookie" not in again.headers  # no cookie beyond the token
    twice = served.get(f"/?token={served.token}&token={served.token}", token=False)
    assert twice.status == 403
    # The same cookie under 127.0.0.1 or localhost (a name every local server
    # shares: a cookie set there is sent to all of them) is not honoured...
    for host in ("127.0.0.1", "localhost", "[::1]"):
        other = {**jar, "Host": f"{host}:{served.port}"}
        assert served.get("/runs", token=False, headers=other).status == 403, host
        # ...and the token given there is sent on to the page's own name, no cookie set
        moved = served.get(f"/runs?state=live&token={served.token}", token=False,
                           headers={"Host": f"{host}:{served.port}"})
        assert moved.status == 303 and "set-cookie" not in moved.headers
        assert moved.headers["location"] == (
            f"http://{served.name}:{served.port}/runs?state=live&token={served.token}")
        # a program's bearer token is good on any loopback name
        assert served.get("/runs", headers={"Host": f"{host}:{served.port}"}).status == 200


def test_an_ssh_tunnel_port_keeps_the_name(served: Served) -> None:
    tunnel = {"Host": f"{served.name}:9000"}
    first = served.get(f"/?token={served.token}", token=False, headers=tunnel)
    assert first.status == 303 and first.headers["location"] == "/"
    moved = served.get(f"/?token={served.token}", token=False,
                       headers={"Host": "127.0.0.1:9000"})
    assert moved.headers["location"].startswith(f"http://{served.name}:9000/?token=")


def test_the_token_exchange_redirects_only_to_this_dashboard(served: Served) -> None:
    for path in ("//evil.example/x", "/\\evil.example", "/%2F%2Fevil.example",
                 "http://evil.example/", "/runs/../..//evil.example"):
        got = served.get(f"{path}?token={served.token}", token=False)
        if got.status == 303:
            where = got.headers["location"]
            assert where.startswith("/") and not where.startswith("//"), (path, where)
            assert "evil" not in where, (path, where)
        else:
            assert got.status in (400, 403, 404), (path, got.status)


def test_foreign_host_and_writes_are_refused(served: Served) -> None:
    for host in (f"attacker.example:{served.port}", f"s-0000000000000000.localhost:{served.port}",
                 f"[127.0.0.1]x:{served.port}", "127.0.0.1:80@evil.example", "",
                 f"{served.name}.evil.example:{served.port}"):
        rebound = served.get("/", headers={"Host": host})
        assert rebound.status in (400, 403), host
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert served.get("/runs", method=method).status == 405
    ok = served.get("/", headers={"Host": f"localhost:{served.port}"})
    assert ok.status == 200


def test_security_headers_on_every_answer(served: Served) -> None:
    for path in [*ROUTES, "/run/x"]:
        got = served.get(path)
        csp = got.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp
        assert got.headers["x-content-type-options"] == "nosniff"
        assert got.headers["referrer-policy"] == "no-referrer"
        assert got.headers["cache-control"] == "no-store"
        assert "set-cookie" not in got.headers
    assert served.get("/", token=False).headers["x-content-type-options"] == "nosniff"


# -- parameters ------------------------------------------------------------------------------

TRAVERSALS = ["../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "%2e%2e%2f%2e%2e%2fetc",
              "..", "/etc/passwd", "....//....//etc/passwd", "%00", "..\\..\\etc\\passwd",
              "%252e%252e%252f"]


def test_path_traversal_in_every_parameter_is_refused(served: Served, saphan_sqlite: Saphan,
                                                      bwrap_available: None,
                                                      tmp_path: Path) -> None:
    rid = _run(saphan_sqlite, tmp_path / "wd", "echo hello")
    attempts: list[str] = []
    for bad in TRAVERSALS:
        attempts += [f"/run/{bad}", f"/run/{bad}/record", f"/run/{bad}/output?stream=stdout",
                     f"/batch/{bad}", f"/batch/{bad}/body", f"/static/{bad}",
                     f"/run/{rid}/{bad}", f"/{bad}"]
        for name in ("state", "machine", "slot", "tool", "outcome", "before", "limit"):
            attempts += [f"/runs?{name}={quote(bad, safe='%')}",
                         f"/runs/rows?{name}={quote(bad, safe='%')}"]
        attempts += [f"/run/{rid}/output?stream={quote(bad, safe='%')}",
                     f"/run/{rid}/output?stream=stdout&offset={quote(bad, safe='%')}",
                     f"/run/{rid}?file={quote(bad, safe='%')}", f"/?path={quote(bad, safe='%')}"]
    for path in attempts:
        got = served.get(path)
        assert got.status in (400, 404), (path, got.status)
        assert b"root:" not in got.body, path
        assert b"hello" not in got.body, path
    named = served.get("/runs?machine=..%2F..%2Fetc%2Fpasswd")
    assert named.status == 400 and b"parameter &#x27;machine&#x27;" in named.body
    # the same run, asked properly, is served
    assert served.get(f"/run/{rid}").status == 200
    out = json.loads(served.get(f"/run/{rid}/output?stream=stdout").body)
    assert out["text"] == "hello\n"


# -- what a run wrote is text ------------------------------------------------------------------

def test_hostile_output_and_record_are_inert(served: Served, saphan_sqlite: Saphan,
                                             bwrap_available: None, tmp_path: Path) -> None:
    wd = tmp_path / "<b onclick=x>wd"
    rid = _run(saphan_sqlite, wd, HOSTILE)
    page = served.get(f"/run/{rid}")
    assert page.status == 200
    body = page.text
    # the argv in the record is escaped, never markup
    assert "&lt;script&gt;" in body and "<script>document" not in body
    assert "<img" not in body and "<b " not in body and "&lt;b onclick=x&gt;wd" in body
    assert "\x1b" not in body and "\u202e" not in body and "\x07" not in body
    out = served.get(f"/run/{rid}/output?stream=stdout")
    assert out.headers["content-type"].startswith("application/json")
    text = json.loads(out.body)["text"]
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b]52;c;aGk=\\x07" in text and "\\x1b[31mred" in text and "\\u202eevil" in text
    rows = served.get("/runs/rows").text
    assert "<script" not in rows and "<img" not in rows


# -- what does not verify is flagged ---------------------------------------------------------------

def test_a_forged_record_is_shown_flagged(served: Served, saphan_sqlite: Saphan,
                                          bwrap_available: None, tmp_path: Path) -> None:
    rid = _run(saphan_sqlite, tmp_path / "wd", "echo honest")
    conn = sqlite3.connect(_db(saphan_sqlite))
    try:
        (raw,) = conn.execute("SELECT record_json FROM runs WHERE id = ?", (rid,)).fetchone()
        record = json.loads(raw)
        record["writable"] = ["/tmp/only-this"]  # a claim the kernel never made
        conn.execute("UPDATE runs SET record_json = ? WHERE id = ?", (json.dumps(record), rid))
        conn.commit()
    finally:
        conn.close()
    rows = served.get("/runs/rows").text
    assert f'data-run="{rid}"' in rows
    row = rows.split(f'data-run="{rid}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-signature="invalid"' in row
    assert rows.split(f'data-run="{rid}"', 1)[0].rsplit("<tr", 1)[1].count("flagged") == 1
    page = served.get(f"/run/{rid}").text
    assert 'class="flag"' in page and "record-signature-invalid" in page
    assert "/tmp/only-this" in page  # shown, not hidden
    assert "signature:   INVALID" in page


# -- binding ------------------------------------------------------------------------------------

def test_non_loopback_bind_is_refused_without_allow_remote(saphan_sqlite: Saphan) -> None:
    from serve.served import require_serve

    require_serve()
    for bind in ("0.0.0.0:0", "[::]:0"):
        got = saphan_sqlite("serve", "--bind", bind, timeout=30)
        assert got.code == 2, got
        assert "--allow-remote" in got.err and "not a loopback address" in got.err
        assert got.out == ""  # no URL, no token printed


def test_allow_remote_says_who_can_reach_it(saphan_sqlite: Saphan) -> None:
    from serve.served import require_serve

    require_serve()
    proc = subprocess.Popen([saphan_exe(), "serve", "--bind", "0.0.0.0:0", "--allow-remote"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=saphan_sqlite.env(), stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "open:" in lines[1] and "?token=" in lines[1]
        assert "over the network" in lines[2] and "unencrypted" in lines[2]
    finally:
        assert stop(proc) in (0, 130, -signal.SIGINT)


def test_without_the_extra_it_says_how_to_install_it(saphan_sqlite: Saphan) -> None:
    # the interpreter is told starlette is absent (sys.modules[name] = None:
    # find_spec then answers None, as for a package not installed)
    code = ("import sys; sys.modules['starlette'] = None; sys.argv = ['saphan', 'serve']; "
            "from saphan.entry import main; main()")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=saphan_sqlite.env(), timeout=60)
    assert got.returncode == 2
    assert "pip install 'saphan[serve]'" in got.stderr and "starlette" in got.stderr


def test_a_port_in_use_is_named(saphan_sqlite: Saphan) -> None:
    with serving(saphan_sqlite) as first:
        got = saphan_sqlite("serve", "--bind", f"127.0.0.1:{first.port}", timeout=30)
        assert got.code == 2 and f"127.0.0.1:{first.port} is in use" in got.err
        assert "port 0 for a free one" in got.err


# -- read-only, on both stores -----------------------------------------------------------------

def test_serving_writes_nothing(saphan_sqlite: Saphan, bwrap_available: None,
                                tmp_path: Path) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    wd = tmp_path / "wd"
    wd.mkdir()
    # a run whose saphan is killed outright: its row stays live, its holder dead
    proc = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                             "--workdir", str(wd), "--", "sh", "-c", "echo up; sleep 120"],
                            env=s.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"up"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # saphan and the jail it leads (--die-with-parent)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def rows() -> list[tuple[object, ...]]:
        conn = sqlite3.connect(_db(s))
        try:
            return conn.execute("SELECT * FROM runs ORDER BY id").fetchall()
        finally:
            conn.close()

    before = rows()
    assert len(before) == 1 and before[0][5] is not None  # started, not finished
    with serving(s) as served:
        fleet = served.get("/").text
        assert 'class="seat held"' in fleet and 'class="life dead"' in fleet
        rid = str(before[0][0])
        for path in ("/runs", "/runs/rows", f"/run/{rid}", f"/run/{rid}/record",
                     f"/run/{rid}/output?stream=stdout", "/fleet/body"):
            assert served.get(path).status == 200, path
        time.sleep(0.5)
        assert rows() == before  # not reconciled, not finalised: shown as it is
    listed = s.ok("runs", "list", "--json").json()  # an operator verb reconciles it
    assert isinstance(listed, list) and listed[0]["outcome"] == "holder-dead"


@pytest.mark.postgres
def test_served_over_either_store(saphan: Saphan, bwrap_available: None, tmp_path: Path) -> None:
    saphan.ok("machine", "add", "here", "--local")
    saphan.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    rid = _run(saphan, tmp_path / "wd", "echo on-either-store")
    with serving(saphan) as served:
        assert served.startup[0].startswith("saphan serve: a read-only view of ")
        page = served.get("/runs").text
        assert f'data-run="{rid}"' in page and 'data-signature="valid"' in page
        assert "on-either-store" in json.loads(
            served.get(f"/run/{rid}/output?stream=stdout").body)["text"]
        assert served.get("/runs?tool=command&outcome=exited&machine=here&slot=s1").status == 200
        assert f'data-run="{rid}"' not in served.get("/runs/rows?tool=claude").text


@pytest.mark.postgres
def test_a_store_that_comes_back_is_read_again(pg_own: Any, home: Path) -> None:
    """PostgreSQL restarted under the dashboard: the requests while it is down
    say so (503), and the next after it is back are served on new connections."""
    pg_own.psql("CREATE DATABASE back")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_own.url("back"))
    s.ok("machine", "add", "here", "--local")
    with serving(s) as served:
        for _ in range(8):  # every worker thread has its connection open
            assert served.get("/runs/rows").status == 200
        pg_own.stop()
        down = served.get("/runs/rows")
        assert down.status == 503 and b"secret" not in down.body
        pg_own.start()
        answers = [served.get("/runs/rows").status for _ in range(12)]
        # at most one request per worker thread finds its old connection gone
        assert answers[-4:] == [200] * 4, answers
        assert served.get("/").status == 200


@pytest.mark.postgres
def test_on_postgresql_every_operators_runs_are_shown(pg_server: Any, tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory,
                                                      bwrap_available: None) -> None:
    """Two control planes on one store with the fleet key: each one's dashboard
    shows the other's runs, verified; a third with a key of its own is shown
    foreign (flagged, not hidden)."""
    name = f"fleet_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    pg_server.psql(f"CREATE DATABASE {name}")
    url = pg_server.url(name)
    a = Saphan(tmp_path_factory.mktemp("a") / "saphan")
    a.ok("init", "--database-url", url)
    a.ok("machine", "add", "here", "--local")
    a.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    key = tmp_path / "fleet.key"
    key.write_bytes((a.home / "record.key").read_bytes())
    key.chmod(0o600)
    b = Saphan(tmp_path_factory.mktemp("b") / "saphan")
    b.ok("init", "--database-url", url, "--join", "--key-file", str(key))
    c = Saphan(tmp_path_factory.mktemp("c") / "saphan")
    c.ok("init", "--database-url", url)  # a key of its own
    mine = _run(a, tmp_path / "wa", "echo from-a")
    theirs = _run(b, tmp_path / "wb", "echo from-b")
    other = _run(c, tmp_path / "wc", "echo from-c")
    with serving(a) as served:
        rows = served.get("/runs/rows").text
        for rid, status in ((mine, "valid"), (theirs, "valid"), (other, "foreign")):
            row = rows.split(f'data-run="{rid}"', 1)[1].split("</tr>", 1)[0]
            assert f'data-signature="{status}"' in row, (rid, status)
        # b's run: its record here, its output kept where it ran (not here)
        assert "from-b" not in served.get(f"/run/{theirs}/output?stream=stdout").text
        assert "signed by key" in served.get(f"/run/{other}").text


def test_json_start_line_for_programs(saphan_sqlite: Saphan) -> None:
    from serve.served import require_serve

    require_serve()
    proc = subprocess.Popen([saphan_exe(), "serve", "--bind", "127.0.0.1:0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=saphan_sqlite.env(), stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        said = json.loads(proc.stdout.readline())
        assert set(said) == {"url", "name", "port", "token", "store", "reachable"}
        assert said["url"] == f"http://{said['name']}:{said['port']}/?token={said['token']}"
        served = Served(said["name"], said["port"], said["token"], said["url"], proc)
        assert served.get("/runs").status == 200
    finally:
        stop(proc)
