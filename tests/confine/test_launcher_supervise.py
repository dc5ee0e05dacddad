"""saphan-launcher as a supervisor (`exec` and `reap`), on the real kernel.

The built launcher (python/saphan/_bin/saphan-launcher) is run directly:
nothing the command leaves behind outlives it, its exit code passes
through, the status descriptor carries only the launcher's own lines,
Landlock scoping holds at ABI >= 6, planted links are refused — by the
launcher and by ``_native.check_grant_dir`` with the same words — and with
``--expect-sha256`` the launcher proves what it is (it hashes the inode it
runs from) before it applies or runs anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import saphan
from conftest import require
from saphan import _native

LAUNCHER = Path(saphan.__file__).resolve().parent / "_bin" / "saphan-launcher"
ABI = _native.landlock_abi()[0]
NOBODY = 65534

EXITED = "saphan-launcher: exited code="
CONFIRM = "saphan-launcher: landlock abi="


@pytest.fixture(autouse=True)
def _launcher_built() -> None:
    require(LAUNCHER.is_file(), f"the built launcher at {LAUNCHER} (ci/setup builds it)")


@dataclass
class Launched:
    code: int
    out: str
    err: str
    status: list[str]  # the lines read from the status descriptor
    seconds: float


def launch(verb: str, argv: list[str], *, policy: dict[str, object] | None = None,
           as_nobody: bool = False, cwd: str | None = None, timeout: float = 60,
           expect_sha256: str | None = None, launcher: Path | None = None) -> Launched:
    """Run ``saphan-launcher VERB --status-fd N [--expect-sha256 D] [--policy P] -- ARGV``
    (``launcher``: another copy of it); the status descriptor is a pipe whose
    read end only this test holds. The command finds N in $STATUS_FD (to try
    writing to it)."""
    r, w = os.pipe()
    if as_nobody:
        # The pipe is nobody's too, so its own mode bits would let the command
        # open it: only the launcher's dumpable flag stands in the way.
        os.fchown(w, NOBODY, NOBODY)
    exe = _launcher_for_everyone() if as_nobody else str(launcher or LAUNCHER)
    args = [exe, verb, "--status-fd", str(w)]
    if expect_sha256 is not None:
        args += ["--expect-sha256", expect_sha256]
    if policy is not None:
        args += ["--policy", json.dumps(policy)]
    args += ["--", *argv]
    env = {**os.environ, "STATUS_FD": str(w)}
    extra: dict[str, object] = {}
    if as_nobody:
        # What `runuser -u nobody` does, without a PAM session in between.
        extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(w,), env=env, cwd=cwd, **extra)  # type: ignore[call-overload]
    finally:
        os.close(w)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seconds = time.monotonic() - start
    with os.fdopen(r, "rb") as f:
        status = f.read().decode().splitlines()
    return Launched(proc.returncode, out.decode(), err.decode(), status, seconds)


def _policy(wd: Path, *extra: str) -> dict[str, object]:
    return {"version": 1, "workdir": str(wd), "writable": [str(wd), *extra],
            "readable": "everything"}


def _reaped(line: str) -> int:
    assert line.startswith(EXITED), line
    return int(line.rsplit("reaped=", 1)[1])


@pytest.fixture
def landlock_abi3() -> None:
    require(ABI >= 3, "a kernel with Landlock ABI >= 3")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    return wd


def _verb_args(verb: str, wd: Path) -> tuple[str, dict[str, object] | None]:
    if verb == "exec":
        require(ABI >= 3, "a kernel with Landlock ABI >= 3")
        return "exec", _policy(wd)
    return "reap", None


# -- what the command leaves behind ---------------------------------------------

def _daemon(marker: Path, exit_code: int = 0) -> list[str]:
    return ["/bin/sh", "-c",
            f"setsid sh -c 'sleep 3; echo late > {marker}' & sleep 0.2; exit {exit_code}"]


def test_the_daemon_survives_without_the_launcher(tmp_path: Path) -> None:
    """The control: the same daemon, run without the launcher, does write F
    (so F's absence below is the launcher's doing)."""
    marker = tmp_path / "F"
    subprocess.run(_daemon(marker), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=10)
    deadline = time.monotonic() + 6
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "late\n"


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_a_setsid_daemon_is_killed_when_the_command_exits(verb: str, workdir: Path) -> None:
    marker = workdir / "F"
    v, policy = _verb_args(verb, workdir)
    r = launch(v, _daemon(marker, exit_code=6), policy=policy)
    assert r.code == 6, r.err
    # The daemon held our stdout/stderr pipes: they closed because it died.
    assert r.seconds < 2.5, f"the launcher waited for the daemon ({r.seconds:.1f}s)"
    assert r.status[-1].startswith(f"{EXITED}6 reaped="), r.status
    assert _reaped(r.status[-1]) >= 1, r.status
    time.sleep(max(0.0, 5 - r.seconds))
    assert not marker.exists(), "the daemon outlived the run"


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_a_process_whose_leader_thread_exited_is_killed_too(verb: str, workdir: Path,
                                                            zombie_leader: str) -> None:
    """A helper whose main thread exited shows as 'Z' while another thread of
    it runs on (waitpid cannot reap it). The reaper skipped 'Z' processes, so
    this one outlived its run and the run was recorded as cleanly ended
    (found by review, measured): SIGKILL goes to it too, ending its thread group."""
    ticks = workdir / "ticks.txt"
    v, policy = _verb_args(verb, workdir)
    r = launch(v, [zombie_leader, str(ticks)], policy=policy)
    assert r.code == 0, r.err
    assert r.seconds < 5, f"the launcher took {r.seconds:.1f}s (it gave up?): {r.err}"
    assert not any(line.startswith("saphan-launcher: abandoned") for line in r.status), r.status
    assert r.status[-1].startswith(f"{EXITED}0 reaped="), r.status
    assert _reaped(r.status[-1]) >= 1, r.status
    before = ticks.read_text().count("\n")
    time.sleep(0.6)
    assert ticks.read_text().count("\n") == before, "the helper's thread still ticks"


@pytest.mark.parametrize("verb", ["reap", "exec"])
@pytest.mark.parametrize(("script", "code"), [
    ("exit 0", 0), ("exit 3", 3), ("exit 42", 42), ("kill -TERM $$", 143),
])
def test_the_exit_code_passes_through(verb: str, script: str, code: int, workdir: Path) -> None:
    v, policy = _verb_args(verb, workdir)
    r = launch(v, ["/bin/sh", "-c", script], policy=policy)
    assert r.code == code, r.err
    assert r.status[-1] == f"{EXITED}{code} reaped=0"


_COUNT_SIGINTS = r"""
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print("READY", flush=True)
senders = []
while True:
    got = signal.sigtimedwait({signal.SIGINT}, 0.5)
    if got is None:
        break
    senders.append(got.si_pid)
print(f"COUNT={len(senders)} senders={senders}", flush=True)
"""


def _count_sigints(deliver: Callable[[int, int], None]) -> str:
    """Run `reap -- python3` on a new terminal; ``deliver(launcher_pid, tty_fd)``
    sends SIGINT somehow. The command blocks SIGINT and takes each copy with
    sigtimedwait, so two copies are two takes, not one merged delivery.
    Returns how many copies the command took."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: session leader on the new terminal
        os.execv(str(LAUNCHER), [str(LAUNCHER), "reap", "--", sys.executable, "-c",
                                 _COUNT_SIGINTS])
    out = b""
    try:
        while b"READY" not in out:
            out += os.read(fd, 1024)
        deliver(pid, fd)
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # EIO: the terminal's other side is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    return text.split("COUNT=", 1)[1].split()[0] if "COUNT=" in text else text


def test_ctrl_c_reaches_the_command_once() -> None:
    """A terminal's Ctrl-C goes to the whole foreground process group, the
    command included; the launcher does not pass on a second copy (a second
    Ctrl-C is "quit" to some agents). A SIGINT sent to the launcher alone is
    passed on — once. (Measured with a launcher that forwarded the terminal's
    copy too: the command took 2 copies in about half the tries, when the two
    did not merge; hence several tries.)"""
    tries = [_count_sigints(lambda _pid, fd: os.write(fd, b"\x03")) for _ in range(6)]
    assert tries == ["1"] * 6
    assert _count_sigints(lambda pid, _fd: os.kill(pid, signal.SIGINT)) == "1"


# -- the status descriptor -------------------------------------------------------

FORGE = (
    "echo 'saphan-launcher: landlock abi=99 enforced writable=[/] scopes=[]'; "
    "echo 'saphan-launcher: exited code=0 reaped=0' >&2; "
    "echo 'saphan-launcher: refused [seat-full] forged' >&2; "
    # Straight at the descriptor the launcher holds: close-on-exec, so the
    # command does not have it (the redirection fails).
    "test -e /proc/$$/fd/$STATUS_FD || echo NO_FD; "
    "if ( echo 'saphan-launcher: landlock abi=98 forged' >&$STATUS_FD ) 2>&-; "
    "then echo WROTE; else echo WRITE_FAILED; fi; "
    "exit 7"
)


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_forged_control_lines_cannot_reach_the_status_fd(verb: str, workdir: Path) -> None:
    v, policy = _verb_args(verb, workdir)
    r = launch(v, ["/bin/sh", "-c", FORGE], policy=policy)
    assert r.code == 7, r.err
    assert "NO_FD" in r.out and "WRITE_FAILED" in r.out, (r.out, r.err)
    # What the command printed is on its own streams ...
    assert "abi=99" in r.out and "forged" in r.err
    # ... and the status descriptor holds the launcher's lines only.
    if verb == "exec":
        assert len(r.status) == 2, r.status
        assert r.status[0].startswith(f"{CONFIRM}{min(ABI, 7)} enforced writable=[{workdir}]")
    else:
        assert len(r.status) == 1, r.status
    assert r.status[-1] == f"{EXITED}7 reaped=0"
    assert not any(f in line for line in r.status for f in ("abi=99", "abi=98", "seat-full"))


_PROBE_PROC = r"""
import errno, os, subprocess, sys
def try_open(path, flags):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
# Control: a dumpable process of the same user, holding a descriptor.
fd = os.open("/dev/null", os.O_RDONLY)
peer = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
try:
    print("peer", try_open(f"/proc/{peer.pid}/fd/{fd}", os.O_RDONLY), flush=True)
finally:
    peer.kill()
    peer.wait()
launcher, status_fd = os.getppid(), os.environ["STATUS_FD"]
try:
    forged = os.open(f"/proc/{launcher}/fd/{status_fd}", os.O_WRONLY)
    os.write(forged, b"saphan-launcher: exited code=0 reaped=0 FORGED\n")
    os.close(forged)
    print("launcher ok", flush=True)
except OSError as e:
    print("launcher", errno.errorcode[e.errno], flush=True)
try:
    os.listdir(f"/proc/{launcher}/fd")
    print("launcher_fd_dir ok")
except OSError as e:
    print("launcher_fd_dir", errno.errorcode[e.errno])
"""


_EVERYONE: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _remove_everyone_copy() -> Iterator[None]:
    yield
    for copy in _EVERYONE:
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    _EVERYONE.clear()


def _launcher_for_everyone() -> str:
    """The launcher where uid 65534 can execute it (an installed copy may
    live under /root, 0700): a root-owned 0755 copy in a root-owned 0755
    directory, so its own custody check passes for that user too."""
    if not _EVERYONE:
        d = Path(tempfile.mkdtemp(prefix="saphan-launcher-everyone-", dir="/tmp"))
        d.chmod(0o755)
        copy = d / "saphan-launcher"
        shutil.copy2(LAUNCHER, copy)
        copy.chmod(0o755)
        _EVERYONE.append(str(copy))
    return _EVERYONE[0]


def _python_for_everyone() -> str:
    """A Python interpreter an unprivileged account can execute (pytest's own
    may live under /root)."""
    for exe in ("/usr/bin/python3", sys.executable):
        real = Path(exe).resolve()
        dirs_ok = all(os.stat(d).st_mode & 0o001 for d in real.parents)
        if real.is_file() and os.stat(real).st_mode & 0o001 and dirs_ok:
            return str(real)
    require(False, "a python3 that uid 65534 can execute (e.g. /usr/bin/python3)")
    raise AssertionError("unreachable")


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_the_status_fd_cannot_be_opened_through_proc(verb: str) -> None:
    """The launcher is not dumpable, so a same-user process cannot open
    /proc/<launcher>/fd/N. Run as `nobody` (uid 65534): as root, with
    CAP_SYS_PTRACE, the ptrace-mode check that the dumpable flag feeds does
    not apply, so the meaningful case is an unprivileged command running as
    the launcher's own (unprivileged) user. The control opens the same kind
    of path of a dumpable peer of that user, which works; the status pipe is
    chowned to that user, so its own mode bits do not stop the open (measured
    under `reap` with the flag left on: the forged line reached the status
    pipe). Under `exec` at ABI >= 6 Landlock forbids it as well (the command's
    domain is nested below the launcher's, and Landlock refuses ptrace-mode
    access upwards); `reap`, with no domain, is the flag's case alone."""
    # Already unprivileged: the meaningful case as is.
    as_nobody = os.geteuid() == 0
    wd = Path(tempfile.mkdtemp(prefix="saphan-supervise-", dir="/tmp"))
    try:
        if as_nobody:
            os.chown(wd, NOBODY, NOBODY)
        v, policy = _verb_args(verb, wd)
        python = _python_for_everyone() if as_nobody else sys.executable
        r = launch(v, [python, "-c", _PROBE_PROC], policy=policy,
                   as_nobody=as_nobody, cwd=str(wd))
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    assert r.code == 0, r.err
    got = dict(line.split(" ", 1) for line in r.out.splitlines())
    assert got["peer"] == "ok", got
    assert got["launcher"] in ("EACCES", "EPERM"), got
    assert got["launcher_fd_dir"] in ("EACCES", "EPERM"), got
    assert r.status == [*r.status[:-1], f"{EXITED}0 reaped=0"]
    assert not any("FORGED" in line for line in r.status), r.status


# -- Landlock scoping (ABI >= 6) -------------------------------------------------

_PROBE_SCOPES = r"""
import errno, os, socket, sys
def kill0(pid):
    try:
        os.kill(pid, 0)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def connect(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(name)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        s.close()
print("outside", kill0(int(sys.argv[1])))
print("self", kill0(os.getpid()))
print("launcher", kill0(os.getppid()))
print("abstract", connect("\0" + sys.argv[2]))
"""


@pytest.fixture
def outsider() -> Iterator[tuple[int, str]]:
    """A process and an abstract unix socket, both outside any domain."""
    proc = subprocess.Popen(["sleep", "60"])
    name = f"saphan-scope-test-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(4)
    try:
        yield proc.pid, name
    finally:
        srv.close()
        proc.kill()
        proc.wait()


def test_exec_scopes_signals_and_abstract_sockets(workdir: Path,
                                                  outsider: tuple[int, str]) -> None:
    require(ABI >= 6, "a kernel with Landlock ABI >= 6 (scoping)")
    pid, name = outsider
    argv = [sys.executable, "-c", _PROBE_SCOPES, str(pid), name]
    r = launch("exec", argv, policy=_policy(workdir))
    assert r.code == 0, r.err
    got = dict(line.split(" ", 1) for line in r.out.splitlines())
    # The launcher too is out of reach: the command runs one domain below it,
    # so it cannot stop or kill its supervisor.
    assert got == {"outside": "EPERM", "self": "ok", "launcher": "EPERM", "abstract": "EPERM"}, got
    assert r.status[0].endswith(" scopes=[signal,abstract-unix-socket]"), r.status
    # Under reap the command gets a signal scope only (no filesystem rule,
    # no socket scope): it signals neither its supervisor nor anything
    # outside (review: it stopped its supervisor and was never reaped).
    r = launch("reap", argv)
    got = dict(line.split(" ", 1) for line in r.out.splitlines())
    assert got == {"outside": "EPERM", "self": "ok", "launcher": "EPERM", "abstract": "ok"}, got
    # And the outsider is still alive: nothing signalled it.
    os.kill(pid, 0)


# -- planted links ----------------------------------------------------------------

@pytest.mark.usefixtures("landlock_abi3")
@pytest.mark.parametrize("planted", [".saphan-run", ".saphan-run/tmp"])
def test_a_planted_scratch_link_is_refused_workdir_unsafe(planted: str, workdir: Path) -> None:
    target = Path(tempfile.mkdtemp(prefix="saphan-x-", dir="/tmp"))
    try:
        if planted.endswith("/tmp"):
            (workdir / ".saphan-run").mkdir()
        (workdir / planted).symlink_to(target)
        ran = workdir / "ran"
        r = launch("exec", ["/bin/sh", "-c", f"touch {ran}"],
                   policy=_policy(workdir, str(target)))
        assert r.code == 3, r.err
        assert not ran.exists()
        assert list(target.iterdir()) == [], "the scratch went through the link"
    finally:
        shutil.rmtree(target, ignore_errors=True)
    assert len(r.status) == 2, r.status
    assert r.status[1] == (
        f"saphan-launcher: refused [workdir-unsafe] the working directory {workdir} is not "
        f"safe to run in: {workdir}/{planted} is a symbolic link (-> {target}); the scratch "
        "directory .saphan-run/tmp is created without following links")
    assert f"refused [workdir-unsafe]: the working directory {workdir}" in r.err
    assert f"fix: remove {workdir}/{planted}" in r.err


Layout = Callable[[Path], Path]


def _real(b: Path) -> Path:
    (b / "real" / "sub").mkdir(parents=True)
    return b / "real" / "sub"


def _link_last(b: Path) -> Path:
    (b / "real").mkdir()
    (b / "link").symlink_to(b / "real")
    return b / "link"


def _link_middle(b: Path) -> Path:
    (b / "real" / "sub").mkdir(parents=True)
    (b / "alias").symlink_to("real")
    return b / "alias" / "sub"


def _relative_refs(b: Path) -> Path:
    # An earlier run's leftover: <repo>/.git/refs -> ../../.. , so the ref
    # grant <repo>/.git/refs/<base>/outside resolves to <base>/outside.
    (b / "outside").mkdir()
    (b / "repo" / ".git").mkdir(parents=True)
    (b / "repo" / ".git" / "refs").symlink_to("../../..")
    path = b / "repo" / ".git" / "refs" / b.name / "outside"
    assert path.resolve() == b / "outside"
    return path


def _link_to_root(b: Path) -> Path:
    (b / "root").symlink_to("/")
    return b / "root" / "tmp"


def _dangling(b: Path) -> Path:
    (b / "dangling").symlink_to(b / "nowhere")
    return b / "dangling"


def _link_to_file(b: Path) -> Path:
    (b / "null").symlink_to("/dev/null")
    return b / "null"


def _file_middle(b: Path) -> Path:
    (b / "f").write_text("")
    return b / "f" / "below"


def _fifo(b: Path) -> Path:
    os.mkfifo(b / "fifo")
    return b / "fifo"


def _missing(b: Path) -> Path:
    return b / "gone" / "deeper"


#: layout -> (how it is built, the expected class, or None when it may be
#: granted). A regular file as the LAST component is not here: the Landlock
#: lane grants files (e.g. /dev/null) as files, not as directories.
LAYOUTS: dict[str, tuple[Layout, str | None]] = {
    "real-directory": (_real, None),
    "symlink-last": (_link_last, "workdir-unsafe"),
    "symlink-middle": (_link_middle, "workdir-unsafe"),
    "relative-refs-up": (_relative_refs, "workdir-unsafe"),
    "symlink-to-root": (_link_to_root, "workdir-unsafe"),
    "dangling-symlink": (_dangling, "workdir-unsafe"),
    "symlink-to-a-file": (_link_to_file, "workdir-unsafe"),
    "file-in-the-middle": (_file_middle, "workdir-unsafe"),
    "fifo": (_fifo, "workdir-unsafe"),
    "missing": (_missing, "policy-invalid"),
}


@pytest.mark.usefixtures("landlock_abi3")
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_grant_layouts_get_the_same_verdict_on_both_lanes(name: str, tmp_path: Path) -> None:
    build, cls = LAYOUTS[name]
    base = tmp_path.resolve()
    wd = base / "wd"
    wd.mkdir()
    path = build(base)
    verdict = _native.check_grant_dir(str(path))
    r = launch("exec", ["/bin/true"], policy=_policy(wd, str(path)))
    if cls is None:
        assert verdict is None
        assert r.code == 0, r.err
        assert r.status[0].startswith(f"{CONFIRM}{min(ABI, 7)} enforced writable=[{wd},{path}]")
        assert r.status[-1] == f"{EXITED}0 reaped=0"
        return
    assert verdict is not None and verdict.startswith(
        f"the writable directory {path} cannot be granted: "), verdict
    assert r.code == 3, r.err
    assert r.status == [f"saphan-launcher: refused [{cls}] {verdict}"]
    assert r.err.startswith(f"refused [{cls}]: {verdict}\nfix: "), r.err


def test_check_grant_dir_refuses_malformed_paths() -> None:
    for bad in ("relative/dir", "/a//b", "/a/./b", "/a/../b", "/tmp/"):
        why = _native.check_grant_dir(bad)
        assert why is not None and why.startswith(f"the writable directory {bad} cannot be granted"), why
    assert _native.check_grant_dir("/") is None


# -- the launcher proves what it is (--expect-sha256) -----------------------------

SELF = "saphan-launcher: self sha256="


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mismatch(actual: str, expected: str) -> str:
    return (f"saphan-launcher: refused [digest-mismatch] the running launcher /proc/self/exe has "
            f"sha256 {actual}, the engine expects sha256 {expected}")


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_the_right_digest_is_reported_first_and_the_command_runs(verb: str, workdir: Path) -> None:
    ran = workdir / "ran"
    v, policy = _verb_args(verb, workdir)
    digest = _sha256(LAUNCHER)
    r = launch(v, ["/bin/sh", "-c", f"touch {ran}"], policy=policy, expect_sha256=digest)
    assert r.code == 0, r.err
    assert ran.exists()
    # Before the confirmation line (exec), before anything else (reap).
    assert r.status[0] == f"{SELF}{digest}", r.status
    if verb == "exec":
        assert len(r.status) == 3, r.status
        assert r.status[1].startswith(f"{CONFIRM}{min(ABI, 7)} enforced writable=[{workdir}]")
    else:
        assert len(r.status) == 2, r.status
    assert r.status[-1] == f"{EXITED}0 reaped=0"
    assert f"{SELF}{digest}\n" in r.err


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_a_wrong_digest_is_refused_before_anything_runs(verb: str, workdir: Path) -> None:
    ran = workdir / "ran"
    v, policy = _verb_args(verb, workdir)
    wrong = "0" * 64
    r = launch(v, ["/bin/sh", "-c", f"touch {ran}"], policy=policy, expect_sha256=wrong)
    assert r.code == 3, r.err
    assert not ran.exists(), "the command ran"
    # Refused before the domain was applied or the scratch directory made.
    assert not (workdir / ".saphan-run").exists()
    assert r.status == [_mismatch(_sha256(LAUNCHER), wrong)]
    assert r.err.startswith(f"refused [digest-mismatch]: the running launcher /proc/self/exe has "
                            f"sha256 {_sha256(LAUNCHER)}, the engine expects sha256 {wrong}\n"
                            "fix: deliver the launcher to this machine again "
                            "(`saphan machine deliver <machine> --probe`)"), r.err
    assert "investigate the host" in r.err


@pytest.mark.parametrize("verb", ["reap", "exec"])
def test_a_launcher_swapped_after_it_was_hashed_is_refused(verb: str, workdir: Path,
                                                           tmp_path: Path) -> None:
    """The measured race, made deterministic: the engine hashes the launcher
    by path, then a file renamed over that path is what gets executed. The
    swapped-in launcher is a real, working one (the same ELF with one byte
    appended), so only the digest tells them apart; it refuses to be the
    launcher the engine hashed."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    path = bindir / "saphan-launcher"
    shutil.copy2(LAUNCHER, path)
    hashed = _sha256(path)  # what the engine checked
    planted = bindir / "planted"
    planted.write_bytes(LAUNCHER.read_bytes() + b"\0")
    planted.chmod(0o755)
    planted.rename(path)  # the swap
    ran = workdir / "ran"
    v, policy = _verb_args(verb, workdir)
    r = launch(v, ["/bin/sh", "-c", f"touch {ran}"], policy=policy, expect_sha256=hashed,
               launcher=path)
    assert r.code == 3, r.err
    assert not ran.exists(), "the command ran"
    assert r.status == [_mismatch(_sha256(path), hashed)]
    # The control: the swapped-in file does run when nothing is expected of it.
    r = launch("reap", ["/bin/sh", "-c", f"touch {ran}"], launcher=path)
    assert r.code == 0, r.err
    assert ran.exists()
