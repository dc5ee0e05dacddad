"""A confined local run end to end, through the real CLI, on both stores."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import Result, Saphan, require

pytestmark = pytest.mark.usefixtures("bwrap_available")


def _setup(s: Saphan, max_sessions: str | None = None) -> None:
    s.ok("machine", "add", "here", "--local")
    extra = ["--max-sessions", max_sessions] if max_sessions else []
    s.ok("slot", "add", "here", "s1", "--tool", "command", *extra)


def test_inside_write_succeeds_outside_refused_record_names_bubblewrap(
    saphan: Saphan, tmp_path: Path
) -> None:
    _setup(saphan)
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    script = (
        "echo inside > inside.txt; "
        f"echo clobber > {outside} && echo OUTSIDE-WROTE; "
        "echo tmp > $TMPDIR/t && echo TMPDIR-OK; "
        "echo ret > $SAPHAN_RETURN_PATH/result && echo RETURN-OK; true"
    )
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--",
               "sh", "-c", script)
    assert r.code == 0, r.err
    assert (wd / "inside.txt").read_text() == "inside\n"
    assert outside.read_text() == "original\n"
    assert "OUTSIDE-WROTE" not in r.out
    assert "TMPDIR-OK" in r.out and "RETURN-OK" in r.out
    assert (wd / ".saphan-run" / "tmp" / "t").exists()
    rec = saphan.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert rec["enforced_by"]["version"]
    assert len(rec["enforced_by"]["executable_sha256"]) == 64
    assert str(wd.resolve()) in rec["writable"]
    assert rec["exit_code"] == 0 and rec["outcome"] == "exited"
    # argv[0] is resolved before the run, and the binary that ran is digested.
    sh = shutil.which("sh")
    assert sh is not None
    assert rec["argv"] == [sh, "-c", script]
    assert rec["agent"] == {"path": sh, "sha256": hashlib.sha256(Path(sh).read_bytes()).hexdigest()}
    assert rec["session_ordinal"] == 0
    assert rec["started_at"] <= rec["finished_at"]
    # The whole workspace (key, config, store, other runs) is hidden inside the jail.
    assert os.path.realpath(saphan.home) in rec["policy"]["hidden"]
    run_dir = saphan.home / "runs" / rec["id"]
    assert (run_dir / "record.json").exists()
    assert "RETURN-OK" in (run_dir / "stdout.log").read_text()
    assert (run_dir / "out" / "result").read_text() == "ret\n"
    human = saphan.ok("runs", "show", rec["id"][:12]).out
    assert "enforced_by: bubblewrap" in human


def test_failed_command_exit_1_and_recorded(saphan: Saphan, tmp_path: Path) -> None:
    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--",
               "sh", "-c", "exit 7")
    assert r.code == 1
    runs = saphan.ok("runs", "list", "--json").json()
    assert isinstance(runs, list)
    assert runs[0]["exit_code"] == 7 and runs[0]["outcome"] == "failed"
    assert runs[0]["finished_at"] is not None
    table = saphan.ok("runs", "list").out
    assert runs[0]["id"] in table


def test_record_key_and_config_unreadable_inside_the_jail(saphan: Saphan, tmp_path: Path) -> None:
    _setup(saphan)
    wd = tmp_path / "wd"
    wd.mkdir()
    key = saphan.home / "record.key"
    cfg = saphan.home / "config.toml"
    script = "; ".join(
        f"if od -An -tx1 {p}; then echo 'READ {p.name}'; else echo 'DENIED {p.name}'; fi"
        for p in (key, cfg)
    )
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--",
               "sh", "-c", script)
    assert r.code == 0, r.err
    assert "DENIED record.key" in r.out and "DENIED config.toml" in r.out
    # Not a byte of the key appears in what the run printed.
    key_hex = " ".join(f"{b:02x}" for b in key.read_bytes()[:8])
    assert key_hex not in r.out


def test_workdir_holding_the_workspace_is_rejected(saphan: Saphan) -> None:
    _setup(saphan)
    for wd in (saphan.home.parent, saphan.home / "runs"):
        r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert r.code == 2
        assert "overlaps the saphan workspace" in r.err


def test_missing_workdir_is_refused_and_recorded(saphan: Saphan, tmp_path: Path) -> None:
    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "s1", "--workdir",
               str(tmp_path / "nope"), "--", "true")
    assert r.code == 3
    assert "refused [workdir-missing]" in r.err
    runs = saphan.ok("runs", "list", "--json").json()
    assert isinstance(runs, list)
    assert runs[0]["refusal"]["class"] == "workdir-missing"


def test_no_bubblewrap_is_a_named_refusal_never_an_unconfined_run(
    saphan: Saphan, tmp_path: Path
) -> None:
    _setup(saphan)
    marker = tmp_path / "ran"
    # A host without bubblewrap: saphan never takes bwrap from PATH (a run could
    # plant one there), so hide the system's own in a mount namespace of this
    # test's (root: `unshare -m` and a bind of /dev/null over it).
    require(os.geteuid() == 0 and shutil.which("unshare") is not None,
            "root and unshare(1) to hide /usr/bin/bwrap in a mount namespace")
    from conftest import saphan_exe

    hide = " && ".join(f"mount --bind /dev/null {d}/bwrap" for d in
                       ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")
                       if os.path.isfile(f"{d}/bwrap") and not os.path.islink(f"{d}/bwrap"))
    p = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'{hide or "true"} && exec "$0" "$@"', saphan_exe(), "run", "--machine", "here",
         "--slot", "s1", "--workdir", str(tmp_path), "--", "sh", "-c", f"touch {marker}"],
        capture_output=True, text=True, env=saphan.env(), timeout=120)
    r = Result(p.returncode, p.stdout, p.stderr)
    assert r.code == 3, r.err
    assert "refused [confinement-unavailable]" in r.err
    assert "apt-get install bubblewrap" in r.err
    assert not marker.exists()
    rec = saphan.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["refusal"]["class"] == "confinement-unavailable"
    assert rec["finished_at"] is not None
    # The ordinal was released: the next run can take the seat.
    saphan.ok("run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path), "--", "true")


def test_unknown_slot_exit_2_nothing_written(saphan: Saphan, tmp_path: Path) -> None:
    _setup(saphan)
    r = saphan("run", "--machine", "here", "--slot", "nope", "--workdir", str(tmp_path), "--",
               "true")
    assert r.code == 2
    assert "no slot 'nope'" in r.err
    assert saphan.ok("runs", "list", "--json").json() == []
