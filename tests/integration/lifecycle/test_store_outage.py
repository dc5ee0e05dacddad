"""PostgreSQL goes away while a run is live (a server of the test's own,
stopped with `pg_ctl stop -m fast`, which cuts saphan's connection). The run
`sh -c 'sleep 3; exit 7'` ends while the server is down:

- back within the retry budget (30 s by default): the driver's own retries
  reconnect and record exit 7 in the row;
- kept down past the budget: `saphan run` exits non-zero saying what is
  pending and where; runs/<id>/record.json holds exit 7, signed; the next
  command that reaches the store records it there, with a note.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PgServer, Saphan, saphan_exe
from run.test_cancel import wait_running
from saphan.records import SIGNATURE_FIELD, sign_record

pytestmark = pytest.mark.usefixtures("bwrap_available")


@pytest.fixture
def on_pg(home: Path, pg_own: PgServer) -> Saphan:
    name = f"outage_{os.getpid()}"
    pg_own.psql(f"CREATE DATABASE {name}")
    s = Saphan(home)
    s.ok("init", "--database-url", pg_own.url(name))
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    return s


def _start(s: Saphan, workdir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(workdir),
         "--", "sh", "-c", "sleep 3; exit 7"], env=s.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _file(s: Saphan, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((s.home / "runs" / run_id / "record.json").read_text())
    return data


def test_a_restart_within_the_retry_budget_records_the_exit_code(
        on_pg: Saphan, pg_own: PgServer, tmp_path: Path) -> None:
    proc = _start(on_pg, tmp_path)
    try:
        run = wait_running(on_pg)
        t0 = time.monotonic()
        pg_own.stop()
        time.sleep(max(0.0, 5.5 - (time.monotonic() - t0)))  # the run ended ~2.5 s ago
        assert proc.poll() is None  # saphan is still retrying the store
        pg_own.start()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err  # the command failed (exit 7): saphan's exit 1
    assert f"run {run['id']} failed (exit 7)" in err and "pending" not in err
    rec = on_pg.ok("runs", "show", run["id"], "--json").json()
    assert isinstance(rec, dict)
    assert (rec["state"], rec["outcome"], rec["exit_code"]) == ("ended", "failed", 7)
    assert rec["signature"]["status"] == "valid"
    assert not any("reconciled" in n for n in rec["notes"])  # its own driver wrote it
    assert _file(on_pg, run["id"])["exit_code"] == 7


def test_a_store_down_past_the_budget_leaves_the_outcome_in_the_record_file(
        on_pg: Saphan, pg_own: PgServer, tmp_path: Path) -> None:
    cfg = on_pg.home / "config.toml"
    assert cfg.read_text().rstrip().splitlines()[-1].startswith("url = ")  # [database] last
    cfg.write_text(cfg.read_text() + "write_retry_seconds = 3\n")
    proc = _start(on_pg, tmp_path)
    try:
        run = wait_running(on_pg)
        pg_own.stop()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    path = on_pg.home / "runs" / run["id"] / "record.json"
    assert proc.returncode == 1, err
    assert f"error: store: run {run['id']} ended (failed, exit 7), and its signed record is " \
           f"in {path}" in err
    assert "could not be written for 3 s" in err
    on_disk = _file(on_pg, run["id"])
    assert (on_disk["state"], on_disk["outcome"], on_disk["exit_code"]) == ("ended", "failed", 7)
    key = (on_pg.home / "record.key").read_bytes()
    assert sign_record(key, on_disk)[SIGNATURE_FIELD] == on_disk[SIGNATURE_FIELD]
    pg_own.start()
    # The next command that opens the store records it.
    listed = on_pg.ok("runs", "list").out.splitlines()
    assert run["id"] in listed[1] and "failed" in listed[1] and " 7 " in listed[1], listed
    rec = on_pg.ok("runs", "show", run["id"], "--json").json()
    assert isinstance(rec, dict)
    assert (rec["outcome"], rec["exit_code"]) == ("failed", 7)
    assert rec["signature"]["status"] == "valid"
    assert rec["notes"][-1].startswith("reconciled by `saphan runs list` at ")
    assert _file(on_pg, run["id"])["notes"][-1] == rec["notes"][-1]
