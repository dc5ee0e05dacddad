"""The everyday verbs of issue 17 (item 5) and the output a program can
trust (item 6), through the real `saphan` console script: runs logs, runs
list's filters, slot remove, run --wait / --exit-code / --json, and the
hygiene rules (one word per header, `-` for an empty cell, no `None`,
bounded numbers)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Saphan, saphan_exe


def _setup(s: Saphan, tmp_path: Path, *, seats: int = 1) -> Path:
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", str(seats))
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    return wd


def _run(s: Saphan, wd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                           "--workdir", str(wd), *args], capture_output=True, text=True,
                          env=s.env(), timeout=120, stdin=subprocess.DEVNULL)


# -- runs logs --------------------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_runs_logs_copies_each_stream_and_follows_a_live_run(saphan_sqlite: Saphan,
                                                             tmp_path: Path) -> None:
    s = saphan_sqlite
    wd = _setup(s, tmp_path)
    r = _run(s, wd, "--", "sh", "-c", r"printf 'one\n\033[31mred\n'; echo two >&2; exit 4")
    assert r.returncode == 1
    logs = s.ok("runs", "logs", "last")
    assert logs.out == "one\n\x1b[31mred\n"  # not a terminal: byte for byte
    assert "two\n" in logs.err
    # -f on a live run: what it writes while followed, and the end once it ends
    p = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                          "--workdir", str(wd), "--", "sh", "-c",
                          "echo start; sleep 2; echo end"], env=s.env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not s.ok("runs", "list", "--state", "running", "--json").json():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        t0 = time.monotonic()
        followed = s.ok("runs", "logs", "last", "-f")
        assert followed.out == "start\nend\n"
        assert time.monotonic() - t0 > 0.5  # it waited for the run to end
    finally:
        p.wait(timeout=60)
    assert s("runs", "logs", "NOSUCHRUN").code == 2


# -- runs list: filters, one key set, table cells -----------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_runs_list_filters_and_one_key_set(saphan: Saphan, tmp_path: Path) -> None:
    s = saphan
    wd = _setup(s, tmp_path)
    s.ok("slot", "add", "here", "s2", "--tool", "command", "--pin-sha256", "0" * 64)
    ok = json.loads(_run(s, wd, "--json", "--", "true").stdout)
    bad = json.loads(_run(s, wd, "--json", "--", "sh", "-c", "exit 5").stdout)
    refused = s("run", "--machine", "here", "--slot", "s2", "--workdir", str(wd), "--json",
                "--", "true")  # another binary than the pinned one: refused, recorded
    assert refused.code == 3
    ref = json.loads(refused.out)
    assert ref["outcome"] == "refused" and ref["refusal"]["class"] == "digest-mismatch"

    def ids(*args: str) -> list[str]:
        return [x["id"] for x in s.ok("runs", "list", "--json", *args).json()]

    assert ids() == [ref["id"], bad["id"], ok["id"]]
    assert ids("--outcome", "failed") == [bad["id"]]
    assert ids("--state", "refused") == [ref["id"]]
    assert ids("--state", "ended") == [bad["id"], ok["id"]]
    assert ids("--state", "live") == []
    assert ids("--slot", "s2") == [ref["id"]]
    assert ids("--machine", "here", "--slot", "s1", "--limit", "1") == [bad["id"]]
    assert ids("--machine", "elsewhere") == []
    assert ids("--since", "1h") == ids()
    assert ids("--since", "2999-01-01") == []
    assert ids("--since", "2000-01-01T00:00") == ids()
    # every row has the same keys, refused or not
    rows = s.ok("runs", "list", "--json").json()
    assert len({tuple(sorted(r)) for r in rows}) == 1 and "live" in rows[0]
    # text: one word per cell, "-" when empty, no None
    text = s.ok("runs", "list").out
    assert "None" not in text
    lines = [line.split() for line in text.splitlines()]
    assert {len(cells) for cells in lines} == {9}
    assert lines[1][5:7] == ["refused", "digest-mismatch"]
    for args, needle in ((["--limit", "0"], "--limit"), (["--limit", "99999999999999999999"],
                                                         "--limit"),
                         (["--state", "bogus"], "--state 'bogus' is unknown"),
                         (["--since", "yesterday"], "--since 'yesterday' is not a duration"),
                         (["--since", "2026-13-40"], "is not a date")):
        r = s("runs", "list", *args)
        assert r.code == 2 and needle in r.err, (args, r.err)


def test_tables_have_one_word_headers_and_no_blank_cells(saphan_sqlite: Saphan,
                                                         tmp_path: Path) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    key = tmp_path / "key"
    key.write_text("sk-" + "a" * 30)
    key.chmod(0o600)
    s.ok("lane", "add", "l1", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
         "--credential-file", str(key))
    for args in (["slot", "list"], ["lane", "list"], ["machine", "list"], ["runs", "list"]):
        lines = s.ok(*args).out.splitlines()
        widths = {len(line.split()) for line in lines}
        assert len(widths) == 1, (args, lines)
        assert lines[0] == lines[0].upper()
    assert "None" not in s.ok("machine", "show", "here").out


def test_numeric_options_are_bounded(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    for args in (["slot", "add", "here", "s1", "--tool", "command", "--max-sessions",
                  "99999999999999999999"],
                 ["slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "1000001"]):
        r = s(*args)
        assert r.code == 2 and "Traceback" not in r.err and "--max-sessions" in r.err, r.err
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    r = s("slot", "set", "here", "s1", "--max-sessions", "99999999999999999999")
    assert r.code == 2 and "Traceback" not in r.err
    for wait in ("--wait=-1", "--wait=86401", "--wait=x"):
        r = s("run", "--machine", "here", "--slot", "s1", wait, "--", "true")
        assert r.code == 2 and "--wait" in r.err, r.err
    assert s.ok("runs", "list", "--json").json() == []  # nothing was written


# -- slot remove ---------------------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_slot_remove(saphan: Saphan, tmp_path: Path) -> None:
    s = saphan
    wd = _setup(s, tmp_path)
    done = json.loads(_run(s, wd, "--json", "--", "true").stdout)
    p = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                          "--workdir", str(wd), "--", "sleep", "30"], env=s.env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (live := s.ok("runs", "list", "--state", "running", "--json").json()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = s("slot", "remove", "here", "s1")
        assert r.code == 2 and live[0]["id"] in r.err and "runs cancel" in r.err
        assert [x["slot"] for x in s.ok("slot", "list", "--json").json()] == ["s1"]
        s.ok("runs", "cancel", live[0]["id"], "--grace", "2")
    finally:
        p.wait(timeout=60)
    assert s.ok("slot", "remove", "here", "s1").out == (
        "removed slot s1 on here (its run history is kept)\n")
    assert s.ok("slot", "list", "--json").json() == []
    assert s.ok("runs", "show", done["id"], "--json").json()["slot"] == "s1"  # history kept
    r = s("slot", "remove", "here", "s1")
    assert r.code == 2 and "no slot 's1'" in r.err


# -- run: --exit-code, --json, --wait, --remove-worktree ------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_run_exit_code_command(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    wd = _setup(s, tmp_path)
    assert _run(s, wd, "--", "sh", "-c", "exit 7").returncode == 1
    assert _run(s, wd, "--exit-code=command", "--", "sh", "-c", "exit 7").returncode == 7
    assert _run(s, wd, "--exit-code", "command", "--", "true").returncode == 0
    r = _run(s, wd, "--exit-code=command", "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + 15  # as the record has it (SIGTERM, or 143 from the jail)
    assert _run(s, wd, "--exit-code=bogus", "--", "true").returncode == 2


@pytest.mark.usefixtures("bwrap_available")
def test_run_json_streams_to_stderr_and_prints_only_json(saphan_sqlite: Saphan,
                                                         tmp_path: Path) -> None:
    s = saphan_sqlite
    wd = _setup(s, tmp_path)
    r = _run(s, wd, "--json", "--", "sh", "-c", "echo to-out; echo to-err >&2")
    assert r.returncode == 0
    record = json.loads(r.stdout)  # stdout: the record alone
    assert record["outcome"] == "exited"
    assert "to-out\n" in r.stderr and "to-err\n" in r.stderr  # the output, streamed
    # a refusal: the refused run's record as JSON on stdout, the refusal on stderr
    s.ok("slot", "set", "here", "s1", "--pin-sha256", "0" * 64)
    r = _run(s, wd, "--json", "--", "true")
    assert r.returncode == 3
    refused = json.loads(r.stdout)
    assert refused["outcome"] == "refused" and refused["refusal"]["class"] in r.stderr


@pytest.mark.usefixtures("bwrap_available")
def test_run_wait_takes_the_seat_when_it_frees(saphan: Saphan, tmp_path: Path) -> None:
    s = saphan
    wd = _setup(s, tmp_path)
    p = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                          "--workdir", str(wd), "--", "sleep", "2"], env=s.env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not s.ok("runs", "list", "--state", "live", "--json").json():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        full = _run(s, wd, "--", "true")
        assert full.returncode == 3 and "seat-full" in full.stderr
        assert "`saphan run --wait[=SECS]` waits for a seat" in full.stderr
        short = _run(s, wd, "--wait=0.3", "--", "true")
        assert short.returncode == 3 and "waited 0.3 s for a seat" in short.stderr
        waited = _run(s, wd, "--wait=60", "--json", "--", "echo", "got")
        assert waited.returncode == 0, waited.stderr
        assert "is full (1 of 1 seats held); waiting up to 60 s" in waited.stderr
        assert json.loads(waited.stdout)["outcome"] == "exited"
    finally:
        p.wait(timeout=60)
    # one row per run: the waiting run's reservation was retried, not remade
    rows = s.ok("runs", "list", "--json").json()
    assert [r["outcome"] for r in rows] == ["exited", "refused", "refused", "exited"]
    # no Python None in text: a run refused before it held a seat has no ordinal
    for r in rows:
        shown = s.ok("runs", "show", r["id"]).out
        assert "None" not in shown
    assert "ordinal: -\n" in s.ok("runs", "show", rows[1]["id"]).out


def test_remove_worktree_needs_repo(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    _setup(s, tmp_path)
    for flag in ("--remove-worktree", "--keep-worktree"):
        r = s("run", "--machine", "here", "--slot", "s1", flag, "--", "true")
        assert r.code == 2 and f"{flag} needs --repo" in r.err
    assert s.ok("runs", "list", "--json").json() == []


# -- a read-only workspace -------------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_a_read_only_workspace_still_reads(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """SAPHAN_HOME on a read-only mount (bubblewrap's --ro-bind: read-only
    even for root): the reading verbs work, a writing one says why."""
    import shutil

    s = saphan_sqlite
    wd = _setup(s, tmp_path)
    done = json.loads(_run(s, wd, "--json", "--", "echo", "kept").stdout)
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"

    def ro(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                               "--ro-bind", str(s.home), str(s.home), saphan_exe(), *args],
                              capture_output=True, text=True, env=s.env(), timeout=60,
                              stdin=subprocess.DEVNULL)

    listed = ro("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [x["id"] for x in json.loads(listed.stdout)] == [done["id"]]
    shown = ro("runs", "show", done["id"])
    assert shown.returncode == 0 and "signature:   valid" in shown.stdout, shown.stderr
    assert ro("runs", "logs", done["id"]).stdout == "kept\n"
    assert ro("slot", "list").returncode == 0
    wrote = ro("slot", "add", "here", "s9", "--tool", "command")
    assert wrote.returncode == 1 and "is read-only here" in wrote.stderr
    assert "Traceback" not in wrote.stderr


@pytest.mark.usefixtures("bwrap_available")
def test_a_dirty_tree_under_repo_is_a_one_line_warning(saphan_sqlite: Saphan,
                                                       tmp_path: Path) -> None:
    s = saphan_sqlite
    _setup(s, tmp_path)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "tracked.txt").write_text("v1\n")
    subprocess.run(["git", "-C", str(repo), "add", "tracked.txt"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a",
                    "commit", "-qm", "base"], check=True)
    args = ("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "true")
    assert "warning" not in s.ok(*args).err  # clean: nothing said
    (repo / "tracked.txt").write_text("v2\n")
    (repo / "new\x1bfile").write_text("x")
    warned = [line for line in s.ok(*args).err.splitlines() if "warning" in line]
    assert len(warned) == 1, warned
    line = warned[0]
    assert line.startswith(f"saphan: warning: {repo} has 2 uncommitted change(s) the run's "
                           "worktree will not carry (it starts from HEAD = ")
    assert "tracked.txt (M)" in line and "new\\x1bfile (??)" in line  # escaped


@pytest.mark.usefixtures("bwrap_available")
def test_run_wait_holds_no_lock_while_it_waits(saphan: Saphan, tmp_path: Path) -> None:
    """While a run waits for a seat, other commands write the store at once
    (nothing is held between its tries), and the waiter still gets the seat."""
    s = saphan
    wd = _setup(s, tmp_path)
    holder = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                               "--workdir", str(wd), "--", "sleep", "4"], env=s.env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waiter = None
    try:
        deadline = time.monotonic() + 30
        while not s.ok("runs", "list", "--state", "live", "--json").json():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waiter = subprocess.Popen([saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                                   "--workdir", str(wd), "--wait", "--", "true"], env=s.env(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert waiter.stderr is not None
        assert "waiting up to 600 s for a seat" in waiter.stderr.readline()
        for i in range(3):  # writes while it waits: none is kept waiting
            t0 = time.monotonic()
            s.ok("machine", "add", f"other{i}", "--local")
            assert time.monotonic() - t0 < 3
        assert waiter.wait(timeout=60) == 0
    finally:
        holder.wait(timeout=60)
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
