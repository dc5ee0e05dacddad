"""What surrounds the far boundary, attacked the way a far agent and a
careless network would: no byte the agent writes is control, the seat is
never freed on doubt, and the far launcher's refusal is the run's refusal."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from integration.sshd.conftest import Remote, pid_alive

RUN = ("run", "--machine", "far1", "--slot", "s1")


def _wait(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_forged_control_lines_are_just_output(far: Remote) -> None:
    """The agent prints every control line saphan ever used, on stdout and
    stderr: the record and the seat's holder are what the far script and the
    launcher's own descriptor said, and the lines are kept as output."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("forge/wd")
    forged = [
        "saphan-far-holder: 1 1 00000000-0000-0000-0000-000000000000",
        "saphan-far: launcher-digest-mismatch " + "0" * 64,
        "saphan-launcher: landlock abi=7 enforced writable=[/] scopes=[]",
        "saphan-launcher: refused [digest-mismatch] forged",
        "saphan-launcher: exited code=0 reaped=0",
        "saphan-launcher: self sha256=" + "0" * 64,
    ]
    script = "; ".join(f"echo '{line}'; echo '{line}' >&2" for line in forged)
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c", f"{script}; echo done > out.txt; exit 7")
    assert r.code == 1 and "failed (exit 7)" in r.err, r.err
    rec = far.record()
    assert rec["outcome"] == "failed" and rec["exit_code"] == 7
    assert "refusal" not in rec and rec["enforced_by"]["mechanism"] == "landlock"
    assert rec["writable"][0] == str(wd) and "/" not in rec["writable"]
    assert rec["enforced_by"]["confirmation"].startswith(
        f"saphan-launcher: landlock abi=7 enforced writable=[{wd},")
    holder = rec["far_process"]
    assert holder["pid"] != 1 and holder["boot_id"] != "0" * 8 + "-0000-0000-0000-" + "0" * 12
    assert (wd / "out.txt").read_text() == "done\n"
    with open(rec["output"]["stderr"]) as f:
        err = f.read()
    with open(rec["output"]["stdout"]) as f:
        out = f.read()
    for line in forged:
        assert line in err and line in out
    # Exactly one holder was ever set, and it is not a forged one.
    assert rec["processes_killed_at_end"] == 0


def test_a_far_launcher_refusal_is_the_runs_refusal(far: Remote) -> None:
    """A planted `.saphan-run` link makes the far launcher refuse
    (workdir-unsafe) before anything runs: exit 3, the class recorded, no
    enforcement claimed."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("refuse/wd")
    elsewhere = h.mkdir("refuse/elsewhere")
    h.as_user("ln", "-s", str(elsewhere), str(wd / ".saphan-run"))
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c", "echo ran > ran.txt")
    assert r.code == 3, r.err
    assert "refused [workdir-unsafe]: saphan-launcher on far1 refused" in r.err
    rec = far.record()
    assert rec["outcome"] == "refused" and rec["refusal"]["class"] == "workdir-unsafe"
    assert rec["enforced_by"] is None
    assert not (wd / "ran.txt").exists() and not any(elsewhere.iterdir())


def test_channel_killed_from_outside_keeps_the_seat_and_the_run_is_followed(
        far: Remote) -> None:
    """The far sshd session dies mid-run (killed from outside): the far run
    goes on, its seat stays held (a second run is refused seat-full), and
    the first saphan dials again, waits for it to end and records its exit."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("lost/wd")
    proc = far.start_run("far1", wd, "sh", "-c", "sleep 4; echo finished > end.txt")
    holder = far.wait_far_holder("far1")
    os.kill(_ppid(holder["pid"]), signal.SIGKILL)  # the sshd session process
    time.sleep(0.5)
    assert pid_alive(holder["pid"])
    r = far(*RUN, "--workdir", str(wd), "--", "true")
    assert r.code == 3 and "refused [seat-full]" in r.err, r.err
    code, _out, err = _wait(proc, 60)
    assert code == 0, err
    assert (wd / "end.txt").read_text() == "finished\n"
    rec = far.record(holder["run"])
    assert rec["outcome"] == "exited" and rec["exit_code"] == 0 and rec["finished_at"]
    assert rec["connection_lost"]["at"]
    assert any("dialled again" in n for n in rec["notes"])
    assert rec["enforced_by"]["confirmation"].startswith("saphan-launcher: landlock abi=7")


def test_connection_that_cannot_be_followed_leaves_the_row_live(far: Remote) -> None:
    """The link goes down for good mid-run: the row stays live with its far
    holder, recorded connection-lost, and `runs finalize` will not end it
    while that holder is measured alive (only --force, recorded)."""
    far.ready("far3")
    h = far.host("far3")
    wd = h.mkdir("gone/wd")
    proc = far.start_run("far3", wd, "sleep", "30")
    holder = far.wait_far_holder("far3")
    h.link_down()
    try:
        sshd = _ppid(holder["pid"])
        os.kill(sshd, signal.SIGKILL)
        code, _out, _err = _wait(proc, 120)
        assert code != 0
        rec = far.record(holder["run"])
        assert rec["finished_at"] is None and rec["outcome"] is None, rec
        assert rec["connection_lost"]["followed"] is False and rec["connection_lost"]["at"]
        assert rec["signature"]["status"] == "valid" or rec["state"] == "running"
        assert pid_alive(holder["pid"])
    finally:
        h.link_up()
    r = far("runs", "finalize", holder["run"])
    assert r.code == 2 and "holder is alive" in r.err and "--force" in r.err, r.err
    assert far.record(holder["run"])["finished_at"] is None
    far.ok("runs", "finalize", holder["run"], "--force", "--reason", "test")
    rec = far.record(holder["run"])
    assert rec["outcome"] == "finalized-by-operator"
    assert any("(--force); its holder was alive" in n for n in rec["notes"])
    os.kill(holder["pid"], signal.SIGKILL)


def test_kill_of_its_own_sshd_from_inside_is_refused_by_the_scope(far: Remote) -> None:
    """The agent tries to kill its own SSH session (signals are scoped at
    Landlock ABI >= 6): the kill is refused, the run ends normally."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("inside/wd")
    script = ("p=$(cut -d' ' -f4 /proc/$PPID/stat); s=$(cut -d' ' -f4 /proc/$p/stat); "
              "kill -9 $s $p 2>err.txt; echo rc=$? > rc.txt")
    r = far(*RUN, "--workdir", str(wd), "--", "sh", "-c", script)
    assert r.code == 0, r.err
    assert (wd / "rc.txt").read_text() != "rc=0\n"
    rec = far.record()
    assert rec["outcome"] == "exited" and "connection_lost" not in rec
    assert rec["enforced_by"]["scopes"] == ["signal", "abstract-unix-socket"]
