"""Remote runs through the real CLI: the Landlock boundary on the far host,
the preflight's refusals, the record, the exit status and interruption."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import escapes
from integration.sshd.conftest import Remote, pid_alive, stop

RUN = ("run", "--machine", "far1", "--slot", "s1")

#: the escape battery without the attempts on a main worktree's .git: on the
#: far side Landlock cannot hold .git read-only inside the granted workdir
#: (docs/boundaries.md); that residual is asserted separately below.
FAR_CONTENT = {k: v for k, v in escapes.CONTENT.items() if not k.startswith("git_")}


def test_remote_run_writes_inside_and_is_refused_outside(far: Remote) -> None:
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("battery/wd")
    outside = h.mkdir("battery/outside")
    victim = outside / "victim.txt"
    h.as_user("sh", "-c", f"printf 'precious contents\\n%.0s' $(seq 100) > {victim}")
    before = escapes.digest(h.far_path(victim))
    h.as_user("sh", "-c", f"cd {wd} && git init -q . && mkdir -p .git/hooks")
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c",
            escapes.script({**FAR_CONTENT, **escapes.METADATA,
                            "git_inside": "echo x >> .git/description"}))
    assert r.code == 0, r.err
    lines = set(r.out.splitlines())
    for name in FAR_CONTENT:
        assert f"REFUSED {name}" in lines, f"escape {name!r} succeeded on far1:\n{r.out}"
    for name in escapes.METADATA:
        assert f"ESCAPED {name}" in lines, f"residual {name!r} no longer exists:\n{r.out}"
    assert "ESCAPED git_inside" in lines  # documented: .git inside the workdir is writable
    assert "INSIDE ok" in lines and h.far_path(wd / "inside.txt").read_text() == "inside\n"
    assert escapes.digest(h.far_path(victim)) == before
    assert sorted(p.name for p in h.far_path(outside).iterdir()) == ["victim.txt"]
    assert not list(h.far_path(h.home).glob("saphan-escape-*"))

    rec = far.record()
    launcher = far.ok("machine", "show", "far1", "--json").json()["facts"]["launcher"]["value"]
    enforced = rec["enforced_by"]
    assert enforced["mechanism"] == "landlock" and enforced["machine"] == "far1"
    assert enforced["executable"] == launcher["path"]
    assert enforced["executable_sha256"] == launcher["sha256"]
    assert enforced["launcher_version"] == launcher["version"]
    assert enforced["confirmation"].startswith(
        f"saphan-launcher: landlock abi={enforced['abi']} enforced writable=[{wd},")
    policy = json.loads(enforced["policy_json"])
    assert policy["workdir"] == str(wd) and policy["writable"][0] == str(wd)
    assert policy["readable"] == "everything" and policy["agent_sha256"] == rec["agent"]["sha256"]
    assert rec["agent"]["path"] in ("/usr/bin/sh", "/bin/sh")
    assert rec["agent"]["resolved_on"] == "far1"
    assert rec["far_process"]["pid"] > 0 and rec["far_process"]["boot_id"]
    assert rec["transport"]["address"] == h.target
    assert any("metadata changes" in n for n in rec["notes"])
    # The holder line is the engine's, not the run's output.
    assert "saphan-far-holder" not in r.err


def test_exit_status_propagates_and_output_streams_back(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("status/wd")
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert r.code == 1
    assert r.out.splitlines()[0] == "out" and "err" in r.err.splitlines()
    rec = far.record()
    assert rec["exit_code"] == 7 and rec["outcome"] == "failed"
    with open(rec["output"]["stdout"]) as f:
        assert f.read() == "out\n"


def test_missing_far_workdir_is_refused(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").data / "no" / "such" / "dir"
    r = far(*RUN, "--workdir", str(wd), "--", "true")
    assert r.code == 3
    assert f"refused [workdir-missing]: the working directory {wd} does not exist on far1" in r.err
    rec = far.record()
    assert rec["refusal"]["class"] == "workdir-missing" and rec["finished_at"]
    assert not far.host("far1").far_path(wd).exists()
    # The seat was given back: the next run gets it.
    far.ok(*RUN, "--workdir", str(far.host("far1").mkdir("ok")), "--", "true")


def test_slot_pin_checks_the_far_agent_digest(far: Remote) -> None:
    """The pin is checked against the digest the preflight measured on far1."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("pin/wd")
    marker = wd / "ran"
    other = "0" * 64
    far.ok("slot", "set", "far1", "s1", "--pin-sha256", other)
    r = far(*RUN, "--workdir", str(wd), "--", "touch", str(marker))
    assert r.code == 3, r.err
    assert "refused [digest-mismatch]" in r.err and "slot s1 on machine far1" in r.err
    assert not h.far_path(marker).exists()
    rec = far.record()
    assert rec["refusal"]["class"] == "digest-mismatch" and rec["finished_at"]
    far_digest = rec["agent"]["sha256"]
    assert far_digest in r.err and other in r.err and rec["agent"]["path"] in r.err
    assert far.ok("slot", "show", "far1", "s1", "--json").json()["holders"] == []
    far.ok("slot", "set", "far1", "s1", "--pin-sha256", far_digest)
    far.ok(*RUN, "--workdir", str(wd), "--", "touch", str(marker))
    assert h.far_path(marker).exists()
    assert far.record()["agent"]["pinned_sha256"] == far_digest


def test_relative_or_absent_workdir_is_bad_input(far: Remote) -> None:
    far.ready("far1")
    for args in (["--workdir", "rel/path"], []):
        r = far(*RUN, *args, "--", "true")
        assert r.code == 2 and "absolute path on that machine" in r.err


def test_far_launcher_changed_after_probe_is_refused(far: Remote) -> None:
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("tamper/wd")
    launcher = h.far_path(far.launcher_path("far1"))
    good = launcher.read_bytes()
    launcher.write_bytes(good + b"\0")
    try:
        marker = wd / "ran"
        r = far(*RUN, "--workdir", str(wd), "--", "touch", str(marker))
        assert r.code == 3
        assert "refused [digest-mismatch]" in r.err and "was delivered" in r.err
        assert not h.far_path(marker).exists()
    finally:
        launcher.write_bytes(good)


def test_sigterm_hangs_up_the_far_process_and_finalises(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("sigterm/wd")
    proc = far.start_run("far1", wd, "sleep", "60")
    holder = far.wait_far_holder("far1")
    assert pid_alive(holder["pid"])
    code, _out, err = stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM; the run was finalised" in err
    deadline = time.monotonic() + 10
    while pid_alive(holder["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(holder["pid"])
    rec = far.record(holder["run"])
    assert rec["outcome"] == "interrupted" and rec["finished_at"]
    assert rec["exit_code"] == 128 + signal.SIGHUP
    assert any("hung up (SIGHUP)" in n for n in rec["notes"])


@pytest.mark.parametrize(("where", "said"), [
    ("root", "is the root directory"),
    ("home", "is the far user's home directory itself"),
    ("above-home", "contains the far user's SSH directory"),
    ("ssh", "lies inside the far user's SSH directory"),
    ("ssh-keys", "lies inside the far user's SSH directory"),
    ("install", "lies inside saphan's install directory"),
    ("tmp", "is a temporary root itself"),
])
def test_far_workdirs_a_run_must_never_hold_are_refused(far: Remote, where: str, said: str) -> None:
    """`/`, $HOME itself, anything under ~/.ssh (a run appended to
    authorized_keys, measured), saphan's install directory in or around the
    workdir, a temporary root itself: `workdir-unsafe` (SPEC §4), recorded,
    by name — nothing runs, nothing there changes."""
    far.ready("far1")
    h = far.host("far1")
    ssh = h.home / ".ssh"
    h.as_user("mkdir", "-p", str(ssh / "keys"))
    h.as_user("sh", "-c", f"echo key > {ssh}/authorized_keys")
    wd = {"root": Path("/"), "home": h.home, "above-home": h.home.parent, "ssh": ssh,
          "ssh-keys": ssh / "keys", "install": far.launcher_path("far1").parent,
          "tmp": Path("/tmp")}[where]
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c", f"echo evil >> {ssh}/authorized_keys")
    assert r.code == 3, r.err
    assert f"refused [workdir-unsafe]: the working directory {wd} on far1 {said}" in r.err
    rec = far.record()
    assert rec["refusal"]["class"] == "workdir-unsafe" and rec["finished_at"]
    assert rec["session_ordinal"] is None  # refused before any seat
    assert h.far_path(ssh / "authorized_keys").read_text() == "key\n"


def test_a_bad_request_found_by_the_far_dial_leaves_no_row(far: Remote) -> None:
    """The command does not exist on the far machine: a UserError (exit 2),
    and the seat the run had reserved is given back with no row left."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("badreq/wd")
    before = far.ok("runs", "list", "--json").json()
    r = far(*RUN, "--workdir", str(wd), "--", "no-such-command-saphan-test")
    assert r.code == 2, r.err
    assert "not found on far1" in r.err
    assert far.ok("runs", "list", "--json").json() == before
    far.ok(*RUN, "--workdir", str(wd), "--", "true")  # the seat is free
