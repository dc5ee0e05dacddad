"""What surrounds the far boundary, attacked the way a far agent and a
careless network would: no byte the agent writes is control, the seat is
never freed on doubt, and the far launcher's refusal is the run's refusal."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from integration.sshd.conftest import Remote, pid_alive
from saphan import Engine, Refusal
from saphan.ids import new_run_id
from saphan.liveness import current_holder
from saphan.run import pipeline
from saphan.run.reserve import reserve
from saphan.site.ssh import SshSite
from saphan.store import Store, open_store
from saphan.timefmt import now_iso

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
    assert h.far_path(wd / "out.txt").read_text() == "done\n"
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
    assert not h.far_path(wd / "ran.txt").exists() and not any(h.far_path(elsewhere).iterdir())


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
    assert h.far_path(wd / "end.txt").read_text() == "finished\n"
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
    assert h.far_path(wd / "rc.txt").read_text() != "rc=0\n"
    rec = far.record()
    assert rec["outcome"] == "exited" and "connection_lost" not in rec
    assert rec["enforced_by"]["scopes"] == ["signal", "abstract-unix-socket"]


def _store(far: Remote) -> Store:
    return open_store("sqlite", far.s.home / "saphan.db")


def test_a_repointed_machine_is_refused_until_probed_again(far: Remote) -> None:
    """far1's row is re-pointed in the store at far2 (its host and host key):
    its signed Landlock and launcher rows were measured on far1, so they say
    nothing about far2 — refused by name, until far2 is delivered and probed."""
    far.ready("far1")
    far.add("far2")
    wd = far.host("far1").mkdir("repoint/wd")
    far.ok(*RUN, "--workdir", str(wd), "--", "true")
    store = _store(far)
    try:
        other = store.get_machine("far2")
        assert other is not None
        store.db.execute("UPDATE machines SET ssh_host = ?, ssh_user = ?, host_key = ? "
                         "WHERE name = ?", (other.ssh_host, other.ssh_user, other.host_key, "far1"))
    finally:
        store.close()
    h2 = far.host("far2")
    wd2 = h2.mkdir("repoint/wd")
    r = far(*RUN, "--workdir", str(wd2), "--", "sh", "-c", "echo ran > ran.txt")
    assert r.code == 3 and "refused [record-signature-invalid]" in r.err, r.err
    assert "was re-pointed since" in r.err and "now names ssh:" in r.err
    assert not h2.far_path(wd2 / "ran.txt").exists()
    far.ok("machine", "deliver", "far1", "--probe")
    far.ok(*RUN, "--workdir", str(wd2), "--", "sh", "-c", "echo ran > ran.txt")
    assert h2.far_path(wd2 / "ran.txt").read_text() == "ran\n"


def test_an_older_landlock_row_put_back_is_refused(far: Remote) -> None:
    far.ready("far1")
    wd = far.host("far1").mkdir("replay/wd")
    store = _store(far)
    try:
        old = store.get_fact("far1", "landlock")
        assert old is not None
        far.ok("machine", "probe-confinement", "far1")  # a newer measurement
        store.put_fact(old)  # and the older row restored over it
    finally:
        store.close()
    r = far(*RUN, "--workdir", str(wd), "--", "true")
    assert r.code == 3 and "refused [record-signature-invalid]" in r.err, r.err
    assert "number 1 of its kind, but this workspace has seen number 2" in r.err


def test_a_launcher_swapped_between_check_and_exec_is_refused(far: Remote) -> None:
    """The far launcher is replaced after the preflight measured it and
    before the run execs it (the window an inotify watcher won, measured):
    the launcher hashes /proc/self/exe against the digest sent, and refuses."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("swap/wd")
    launcher = far.launcher_path("far1")
    engine = Engine(far.s.home)
    try:
        base = {"id": new_run_id(), "machine": "far1", "slot": "s1", "tool": "command",
                "argv": ["sh"], "saphan_version": "test", "requested_at": now_iso()}
        m = engine.machine("far1")
        site = SshSite(engine.ctx, engine.slot("far1", "s1"), m,
                       ["sh", "-c", "echo ran > ran.txt"],
                       workdir=SshSite.far_workdir(m, str(wd)), stream=False)
        base["workdir"] = site.workdir
        site.inspect(base)  # the preflight measured the delivered launcher
        # Swap: the same program plus one byte (it still runs), renamed over it.
        swapped = launcher.with_name("swapped")
        h.as_user("sh", "-c", f"cat {launcher} > {swapped} && printf x >> {swapped} && "
                              f"chmod 755 {swapped} && mv -f {swapped} {launcher}")
        base["session_ordinal"] = reserve(engine.ctx, engine.slot("far1", "s1"), base,
                                          site.workdir, current_holder(), remote=site.liveness())
        with pytest.raises(Refusal) as e:
            pipeline.execute(engine.ctx, site, base)
    finally:
        engine.close()
    assert e.value.cls == "digest-mismatch" and "/proc/self/exe" in e.value.message
    rec = far.record(base["id"])
    assert rec["outcome"] == "refused" and rec["enforced_by"] is None
    assert not h.far_path(wd / "ran.txt").exists()


def test_a_process_that_looks_dead_does_not_outlive_its_run(far: Remote,
                                                           zombie_leader: str) -> None:
    """The review's route: a helper whose main thread exited ('Z') keeps a
    thread running; the far launcher skipped it, recorded a clean end, and
    the seat went to the next run while it still wrote (measured). Now it is
    killed with its run, and the run's end says so."""
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("leader/wd")
    exe = h.data / "zombie_leader"
    shutil.copy(zombie_leader, h.far_path(exe))
    os.chmod(h.far_path(exe), 0o755)
    r = far(*RUN, "--workdir", str(wd), "--", str(exe), str(wd / "ticks.txt"))
    assert r.code == 0, r.err
    rec = far.record()
    assert rec["outcome"] == "exited" and rec["processes_killed_at_end"] >= 1, rec
    assert "processes_left_running" not in rec
    ticks = h.far_path(wd / "ticks.txt")
    before = ticks.read_text().count("\n")
    time.sleep(0.6)
    assert ticks.read_text().count("\n") == before, "the helper's thread still writes"
