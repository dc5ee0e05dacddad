"""Casting a run on the fleet (run/cast.py, fleet/cast.py) with the real CLI
and real bubblewrap runs on this host's slots: the run lands on the only
eligible slot; labels exclude what they should; with every seat held the
refusal is fleet-full naming each candidate, recorded once; --wait takes a
seat that frees; and the race — 32 concurrent casts on 6 seats admit exactly
6, by an independent witness — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan, saphan_exe

pytestmark = pytest.mark.usefixtures("bwrap_available")

#: a command that marks itself live in the witness directory, waits for the
#: release file, then unmarks itself (inside the jail: the workdir is writable)
HOLD = ('mkdir -p live && : > "live/$SAPHAN_RUN_ID" && '
        'while [ ! -e release ]; do sleep 0.05; done; rm -f "live/$SAPHAN_RUN_ID"')


def _fleet(s: Saphan, seats: dict[str, int]) -> None:
    s.ok("machine", "add", "here", "--local")
    for name, n in seats.items():
        s.ok("slot", "add", "here", name, "--tool", "command", "--max-sessions", str(n))


def _start(s: Saphan, wd: Path, *extra: str, cmd: str = HOLD) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [saphan_exe(), "run", "--tool", "command", *extra, "--workdir", str(wd), "--json",
         "--", "sh", "-c", cmd],
        env=s.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _live(wd: Path) -> int:
    try:
        return len(os.listdir(wd / "live"))
    except FileNotFoundError:
        return 0


def _wait_live(wd: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _live(wd) < n:
        assert time.monotonic() < deadline, f"only {_live(wd)} of {n} runs went live"
        time.sleep(0.05)


def _done(p: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = p.communicate(timeout=120)
    return p.returncode, json.loads(out) if out.strip() else {"stderr": err}


def test_the_run_lands_on_the_only_eligible_slot(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1, "b": 1, "c": 1})
    s.ok("slot", "add", "here", "agent", "--tool", "loop")
    s.ok("machine", "set", "here", "--label", "zone=eu")
    s.ok("slot", "set", "here", "a", "--label", "zone=us")  # overrides the machine's
    s.ok("slot", "set", "here", "c", "--label", "gpu=a100")
    r = s("run", "--tool", "command", "--label", "zone=eu", "--label", "gpu=a100",
          "--workdir", str(tmp_path), "--json", "--", "true")
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert (rec["machine"], rec["slot"]) == ("here", "c")
    cast = rec["cast"]
    assert cast["chosen"] == {"machine": "here", "slot": "c"}
    assert cast["candidates"] == ["here/c"] and cast["tool"] == "command"
    assert cast["labels"] == {"gpu": "a100", "zone": "eu"}
    assert cast["passed_over"] == [
        {"machine": "here", "slot": "a",
         "why": "labels: zone=eu wanted, has zone=us; gpu=a100 wanted, has none"},
        {"machine": "here", "slot": "b", "why": "labels: gpu=a100 wanted, has none"}]
    assert cast["ranking"] == "local machines first, then by machine name, then by slot name"
    # the loop slot is another tool's: never a candidate, never named
    assert all(p["slot"] != "agent" for p in cast["passed_over"])
    # without labels: the first in the ranking
    rec = json.loads(s.ok("run", "--tool", "command", "--workdir", str(tmp_path), "--json",
                          "--", "true").out)
    assert rec["slot"] == "a"


def test_every_seat_held_is_fleet_full_naming_each(saphan_sqlite: Saphan,
                                                   tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1, "b": 2})
    s.ok("slot", "set", "here", "b", "--label", "zone=eu")
    holders = [_start(s, tmp_path) for _ in range(3)]
    try:
        _wait_live(tmp_path, 3)
        r = s("run", "--tool", "command", "--workdir", str(tmp_path), "--json", "--", "true")
        assert r.code == 3, r.err
        rec = json.loads(r.out)
        assert rec["refusal"]["class"] == "fleet-full"
        msg = rec["refusal"]["message"]
        assert "every candidate for tool command is at capacity" in msg
        assert "here/a: full: slot a on here carries 1 run and may carry 1" in msg
        assert "here/b: full: slot b on here carries 2 runs and may carry 2" in msg
        assert (rec["machine"], rec["slot"], rec["session_ordinal"]) == ("(fleet)", "(cast)",
                                                                         None)
        assert rec["enforced_by"] is None
        # recorded once, listed like any refused run
        listed = s.ok("runs", "list", "--json").json()
        assert [x["id"] for x in listed if x["outcome"] == "refused"] == [rec["id"]]
        # a label that matches no candidate: no-eligible-slot, not fleet-full
        r = s("run", "--tool", "command", "--label", "zone=mars", "--workdir", str(tmp_path),
              "--", "true")
        assert r.code == 3 and "refused [no-eligible-slot]" in r.err
        # --wait: a seat that frees is taken
        waiter = _start(s, tmp_path, "--wait=60", cmd="true")
        time.sleep(0.5)
        (tmp_path / "release").touch()
        code, rec = _done(waiter)
        assert code == 0, rec
        assert rec["cast"]["chosen"]["slot"] in ("a", "b")
    finally:
        (tmp_path / "release").touch()
        results = [_done(p) for p in holders]
    assert [code for code, _ in results] == [0, 0, 0]
    assert sorted(rec["slot"] for _, rec in results) == ["a", "b", "b"]


def test_no_slot_of_the_tool_is_no_eligible_slot(saphan_sqlite: Saphan,
                                                 tmp_path: Path) -> None:
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    r = s("run", "--tool", "codex", "--workdir", str(tmp_path), "--prompt", "x")
    assert r.code == 3
    assert "refused [no-eligible-slot]: no slot can take a run of tool codex: no slot of tool " \
           "codex exists" in r.err
    r = s("run", "--tool", "command", "--machine", "nosuch", "--", "true")
    assert r.code == 2 and "machine 'nosuch' is not known" in r.err


@pytest.mark.slow
def test_32_concurrent_casts_on_6_seats_admit_exactly_6(saphan: Saphan,
                                                       tmp_path: Path) -> None:
    s = saphan
    _fleet(s, {"a": 1, "b": 2, "c": 3})
    procs = [_start(s, tmp_path) for _ in range(32)]
    seen = 0
    try:
        # the witness: what the runs themselves say is live, sampled until
        # every contender that lost has answered
        deadline = time.monotonic() + 240
        while sum(p.poll() is not None for p in procs) < 26:
            seen = max(seen, _live(tmp_path))
            assert time.monotonic() < deadline, "the losing casts did not all answer"
            time.sleep(0.02)
        _wait_live(tmp_path, 6)
        time.sleep(0.5)
        seen = max(seen, _live(tmp_path))
        assert _live(tmp_path) == 6 and seen == 6
        assert sum(p.poll() is None for p in procs) == 6
    finally:
        (tmp_path / "release").touch()
        results = [_done(p) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0] * 6 + [3] * 26, codes
    won = [rec for code, rec in results if code == 0]
    assert sorted(r["slot"] for r in won) == ["a", "b", "b", "c", "c", "c"]
    assert all(rec["refusal"]["class"] == "fleet-full" for code, rec in results if code == 3)
    # the store agrees: six ordinals were held, none is now
    assert sorted((r["slot"], r["session_ordinal"]) for r in won) == [
        ("a", 0), ("b", 0), ("b", 1), ("c", 0), ("c", 1), ("c", 2)]
    assert s.ok("runs", "list", "--state", "live", "--json").json() == []


def test_a_cast_refused_for_the_record_key_is_recorded(saphan_sqlite: Saphan,
                                                       tmp_path: Path) -> None:
    # review: the cast read the key before the run's row existed: no record
    s = saphan_sqlite
    _fleet(s, {"a": 1})
    (s.home / "record.key").chmod(0o644)
    r = s("run", "--tool", "command", "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3 and "refused [custody-key-unsafe]" in r.err
    assert "\nrun: " in r.err


def test_an_interrupt_while_waiting_for_a_seat_says_nothing_was_recorded(
        saphan_sqlite: Saphan, tmp_path: Path) -> None:
    # review: it said "the run was finalised", and no row existed
    import signal

    s = saphan_sqlite
    _fleet(s, {"a": 1})
    holder = _start(s, tmp_path)
    try:
        _wait_live(tmp_path, 1)
        for how in (["--tool", "command"], ["--machine", "here", "--slot", "a"]):
            p = subprocess.Popen([saphan_exe(), "run", *how, "--wait=30", "--workdir",
                                  str(tmp_path), "--", "true"], env=s.env(),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            time.sleep(1.5)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=30)
            assert p.returncode == 130, err
            assert "it held no seat, and nothing was recorded" in err, err
        assert len(s.ok("runs", "list", "--json").json()) == 1  # the holder's own
    finally:
        (tmp_path / "release").touch()
        _done(holder)
