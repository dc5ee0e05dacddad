"""launcher.py: where saphan-launcher is and what it is (version, SHA-256).

SAPHAN_LAUNCHER, when set, is the only place looked at: a missing file there
is "not found", never silently another launcher.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import require
from saphan import launcher


def _script(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fake-launcher"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return exe


def test_saphan_launcher_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, "echo saphan-launcher 9.9.9")
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    assert launcher.path() == str(exe)


def test_a_missing_saphan_launcher_is_not_found_not_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(tmp_path / "absent"))
    assert launcher.path() is None
    assert launcher.identity() is None
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(tmp_path))  # a directory is not a launcher
    assert launcher.path() is None


def test_identity_names_version_digest_and_path(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, 'echo "saphan-launcher 1.2.3"')
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    ident = launcher.identity()
    assert ident is not None
    assert ident.path == str(exe)
    assert ident.version == "1.2.3"
    assert ident.sha256 == hashlib.sha256(exe.read_bytes()).hexdigest()


def test_a_launcher_that_cannot_say_its_version_is_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, "echo 'bad flag' >&2; exit 2")
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    ident = launcher.identity()
    assert ident is not None
    assert ident.version == "unknown (bad flag)"
    assert len(ident.sha256) == 64


def test_the_real_launcher_identifies_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPHAN_LAUNCHER", raising=False)
    found = launcher.path()
    require(found is not None, "saphan-launcher (run ci/setup)")
    assert found is not None
    assert os.path.basename(found) == launcher.NAME and os.access(found, os.X_OK)
    packaged = Path(launcher.__file__).parent / "_bin" / launcher.NAME
    if packaged.is_file():
        assert found == str(packaged)  # the package's own copy before PATH
    ident = launcher.identity()
    assert ident is not None
    said = subprocess.run([found, "--version"], capture_output=True, text=True,
                          timeout=10).stdout.strip()
    assert said == f"{launcher.NAME} {ident.version}"
    assert ident.sha256 == hashlib.sha256(Path(found).read_bytes()).hexdigest()


# -- `--stdin-frame`: secrets and stdin over the launcher's stdin --------------

LAUNCHER = Path(launcher.__file__).resolve().parent / "_bin" / launcher.NAME
SECRET = "s3cr3t-value-7f1c2a"


def _frame(*items: bytes) -> bytes:
    return b"saphan-frame 1\n" + b"".join(items) + b"end\n"


def _env(name: str, value: bytes) -> bytes:
    return f"env {name} {len(value)}\n".encode() + value


def _stdin(payload: bytes) -> bytes:
    return f"stdin {len(payload)}\n".encode() + payload


def _framed(argv: list[str], *, extra_env: dict[str, str] | None = None,
            expect_sha256: str | None = None, stdin: int | None = None,
            policy: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``saphan-launcher reap --status-fd N --stdin-frame -- ARGV`` (with
    ``policy``: ``exec --policy POLICY``) with its stdin a pipe (or the
    descriptor ``stdin``); returns the process and the read end of the
    status pipe."""
    require(LAUNCHER.is_file(), f"the built launcher at {LAUNCHER} (ci/setup builds it)")
    r, w = os.pipe()
    verb = ["reap"] if policy is None else ["exec", "--policy", policy]
    args = [str(LAUNCHER), *verb, "--status-fd", str(w)]
    if expect_sha256 is not None:
        args += ["--expect-sha256", expect_sha256]
    args += ["--stdin-frame", "--", *argv]
    env = {**os.environ, **(extra_env or {})}
    proc = subprocess.Popen(args, stdin=subprocess.PIPE if stdin is None else stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(w,), env=env)
    os.close(w)
    return proc, r


def _status(r: int) -> str:
    with os.fdopen(r, "rb") as f:
        return f.read().decode()


def test_a_frame_gives_the_command_exactly_its_env_and_stdin() -> None:
    payload = bytes(range(256)) * 1024 + b"\nend\nstop\n"  # larger than a pipe
    frame = _frame(b"keep SAPHAN_T_KEPT\n", b"keep SAPHAN_T_UNSET\n",
                   _env("SAPHAN_T_SECRET", SECRET.encode()), _stdin(payload))
    proc, r = _framed(["/usr/bin/env"],
                      extra_env={"SAPHAN_T_KEPT": "kept-value", "SAPHAN_T_NOT_KEPT": "leak"})
    out, err = proc.communicate(frame, timeout=30)
    assert proc.returncode == 0, err
    assert out.decode().splitlines() == ["SAPHAN_T_KEPT=kept-value",
                                         f"SAPHAN_T_SECRET={SECRET}"]
    assert SECRET not in err.decode() and SECRET not in _status(r)

    proc, r = _framed(["/bin/cat"])
    out, err = proc.communicate(_frame(_stdin(payload)), timeout=30)
    assert proc.returncode == 0, err
    assert out == payload
    _status(r)
    # Without a stdin item the command's stdin is /dev/null, not the lifeline.
    proc, r = _framed(["/bin/cat"])
    out, err = proc.communicate(_frame() + b"not for the command\n", timeout=30)
    assert (proc.returncode, out) == (0, b""), err
    _status(r)


def _read_until(proc: subprocess.Popen[bytes], want: bytes, timeout: float = 20) -> bytes:
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while want not in seen:
        assert time.monotonic() < deadline, f"no {want!r} in {seen!r}"
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, f"end of output before {want!r}: {seen!r}"
        seen += chunk
    return seen


def test_stop_on_the_lifeline_hangs_the_command_up_and_no_secret_is_exposed() -> None:
    script = ("trap 'echo got-hup; exit 7' HUP; echo ready $$; "
              "while :; do sleep 0.1; done")
    proc, r = _framed(["/bin/sh", "-c", script])
    assert proc.stdin is not None
    proc.stdin.write(_frame(b"keep PATH\n", _env("SAPHAN_T_SECRET", SECRET.encode())))
    proc.stdin.flush()
    seen = _read_until(proc, b"\n")
    pid = int(seen.split()[1])
    # The secret is the command's (its environment), on no command line, and
    # nowhere in the launcher's own environment.
    assert SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    for where in (f"/proc/{pid}/cmdline", f"/proc/{proc.pid}/cmdline"):
        assert SECRET.encode() not in Path(where).read_bytes(), where
    try:
        launcher_env = Path(f"/proc/{proc.pid}/environ").read_bytes()
    except PermissionError:
        launcher_env = b""  # not dumpable, and we are not root: not readable
    assert SECRET.encode() not in launcher_env
    assert b"SAPHAN_T_SECRET" not in launcher_env

    proc.stdin.write(b"not-stop\nstop\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 7, err
    assert b"got-hup" in seen + out
    status = _status(r)
    assert "saphan-launcher: exited code=7" in status
    assert SECRET not in status and SECRET not in err.decode()


def test_a_closed_lifeline_does_not_end_the_run() -> None:
    proc, r = _framed(["/bin/sh", "-c", "trap 'exit 9' HUP; /bin/sleep 1; echo done; exit 5"])
    started = time.monotonic()
    out, err = proc.communicate(_frame(), timeout=30)  # closes the pipe at once
    assert proc.returncode == 5, err
    assert out == b"done\n" and time.monotonic() - started >= 1
    assert "saphan-launcher: exited code=5" in _status(r)


@pytest.mark.parametrize("frame", [
    b"saphan-frame 2\n" + _env("A", SECRET.encode()) + b"end\n",
    _frame(_env("A", SECRET.encode()), _env("A", SECRET.encode())),
    _frame(_env("A", SECRET[:6].encode() + b"\0" + SECRET[6:].encode())),
    _frame(b"env A 4\n" + SECRET.encode() + b"\n"),  # LEN too small
    b"saphan-frame 1\n" + f"env A {len(SECRET) + 9}\n".encode() + SECRET.encode(),
    b"saphan-frame 1\n" + _env("A", SECRET.encode()),  # no end line
    _frame(b"keep 9A\n"),
    _frame(b"env A +3\nabc"),
    _frame(_stdin(b"x"), _stdin(SECRET.encode())),
])
def test_a_bad_frame_is_refused_policy_invalid_without_the_value(
        frame: bytes, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc, r = _framed(["/bin/sh", "-c", f"touch {marker}"])
    out, err = proc.communicate(frame, timeout=30)
    status = _status(r)
    assert proc.returncode == 3, err
    assert "saphan-launcher: refused [policy-invalid] the --stdin-frame frame" in status
    assert not marker.exists()
    for text in (out.decode(errors="replace"), err.decode(errors="replace"), status):
        for piece in (SECRET, SECRET[4:], SECRET[:6]):
            assert piece not in text, text


def test_tmpdir_comes_from_the_frame_under_reap_and_never_under_exec(tmp_path: Path) -> None:
    proc, r = _framed(["/bin/sh", "-c", 'echo "T=$TMPDIR"'])
    out, err = proc.communicate(_frame(_env("TMPDIR", b"/w/.saphan-run/tmp")), timeout=30)
    assert proc.returncode == 0, err
    assert out == b"T=/w/.saphan-run/tmp\n"
    _status(r)
    wd = tmp_path / "wd"
    wd.mkdir()
    policy = json.dumps({"version": 1, "workdir": str(wd), "writable": [str(wd)],
                         "readable": "everything"})
    marker = tmp_path / "ran"
    proc, r = _framed(["/bin/sh", "-c", f"touch {marker}"], policy=policy)
    out, err = proc.communicate(_frame(_env("TMPDIR", b"/elsewhere")), timeout=30)
    assert proc.returncode == 3, err
    assert "refused [policy-invalid]" in _status(r) and "TMPDIR" in err.decode()
    assert not marker.exists()


def test_a_launcher_that_fails_its_digest_never_reads_the_frame() -> None:
    frame = _frame(_env("SAPHAN_T_SECRET", SECRET.encode())) + b"stop\n"
    fr, fw = os.pipe()
    os.write(fw, frame)
    os.close(fw)
    try:
        proc, r = _framed(["/bin/true"], expect_sha256="0" * 64, stdin=fr)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 3, err
        assert "refused [digest-mismatch]" in _status(r)
        assert os.read(fr, 65536) == frame  # every byte still in the pipe
    finally:
        os.close(fr)


# -- the local lifeline (--lifeline-fd) ------------------------------------------------

def _held(argv: list[str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """``saphan-launcher reap --status-fd S --lifeline-fd L -- ARGV``: returns
    the process, the lifeline's write end (only this test holds it) and the
    status pipe's read end."""
    require(LAUNCHER.is_file(), f"the built launcher at {LAUNCHER} (ci/setup builds it)")
    sr, sw = os.pipe()
    lr, lw = os.pipe()
    proc = subprocess.Popen([str(LAUNCHER), "reap", "--status-fd", str(sw), "--lifeline-fd",
                             str(lr), "--", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(sw, lr), cwd=tmp_path)
    os.close(sw)
    os.close(lr)
    return proc, lw, sr


def _gone(pid: int, within: float = 5) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_a_signal_line_reaches_the_command(tmp_path: Path) -> None:
    script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    proc, lw, sr = _held(["/bin/sh", "-c", script], tmp_path)
    _read_until(proc, b"ready\n")
    os.write(lw, b"signal STOP\nsignal TERM\n")
    out, err = proc.communicate(timeout=20)
    os.close(lw)
    assert proc.returncode == 7, err
    assert b"got-term" in out
    assert "saphan-launcher: exited code=7" in _status(sr)


def test_the_lifeline_ending_kills_the_command_and_what_it_left(tmp_path: Path) -> None:
    """Its caller gone (saphan died, or the boundary process between them
    ended: review, a signal during bubblewrap's set-up left the jail running
    after the run was recorded): the command and its daemons are killed."""
    script = ("trap '' TERM HUP INT; setsid sh -c 'trap \"\" TERM HUP; echo $$ > daemon; "
              "sleep 300' & echo ready; while :; do sleep 0.05; done")
    proc, lw, sr = _held(["/bin/sh", "-c", script], tmp_path)
    _read_until(proc, b"ready\n")
    deadline = time.monotonic() + 10
    while not (tmp_path / "daemon").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    daemon = int((tmp_path / "daemon").read_text())
    os.close(lw)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + 9, err
    assert _gone(daemon), "the daemon the command left outlived its run"
    assert "saphan-launcher: exited code=137" in _status(sr)


def test_signal_kill_on_the_lifeline_kills_the_command(tmp_path: Path) -> None:
    proc, lw, sr = _held(["/bin/sh", "-c", "trap '' TERM; echo ready; sleep 300"], tmp_path)
    _read_until(proc, b"ready\n")
    os.write(lw, b"signal KILL\n")
    proc.communicate(timeout=20)
    os.close(lw)
    assert proc.returncode == 137
    _status(sr)


@pytest.mark.parametrize("before", [b"", b"signal TERM\n"])
def test_a_lifeline_ended_or_told_before_the_start_runs_nothing(tmp_path: Path,
                                                                before: bytes) -> None:
    require(LAUNCHER.is_file(), f"the built launcher at {LAUNCHER} (ci/setup builds it)")
    sr, sw = os.pipe()
    lr, lw = os.pipe()
    os.write(lw, before)
    os.close(lw)
    proc = subprocess.run([str(LAUNCHER), "reap", "--status-fd", str(sw), "--lifeline-fd",
                           str(lr), "--", "/bin/sh", "-c", ": > ran"], stdin=subprocess.DEVNULL,
                          capture_output=True, pass_fds=(sw, lr), cwd=tmp_path, timeout=20)
    os.close(sw)
    os.close(lr)
    assert proc.returncode == 129, proc.stderr
    assert not (tmp_path / "ran").exists()
    assert "not started: the lifeline ended or said stop first" in _status(sr)


def test_the_command_never_holds_the_lifeline(tmp_path: Path) -> None:
    """Nor the status descriptor: the command inherits its stdio only."""
    proc, lw, sr = _held(["/bin/sh", "-c", "echo $$; exec sleep 30"], tmp_path)
    pid = int(_read_until(proc, b"\n"))
    time.sleep(0.2)  # exec'd
    try:
        assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]
    finally:
        os.close(lw)  # ... which ends it
        proc.communicate(timeout=20)
    assert proc.returncode == 137
    _status(sr)


def test_a_command_that_starves_the_launcher_of_descriptors_gets_no_clean_end(
        tmp_path: Path) -> None:
    """Review: the command (same user) lowered the launcher's open-file limit,
    so it could not read /proc to find what was left; it reported a clean
    end (`reaped=0`, nothing abandoned) while a process ran on. It now says
    what it cannot know."""
    require(LAUNCHER.is_file(), f"the built launcher at {LAUNCHER} (ci/setup builds it)")
    import sys as _sys

    starve = ("import sys, resource; resource.prlimit(int(sys.argv[1]), resource.RLIMIT_NOFILE, "
              "(3, 3))")
    # $PPID: the shell's parent, the launcher
    script = (f"{_sys.executable} -c '{starve}' $PPID; sleep 300 >/dev/null 2>&1 & echo $! > left; exit 0")
    sr, sw = os.pipe()
    proc = subprocess.run([str(LAUNCHER), "reap", "--status-fd", str(sw), "--", "/bin/sh", "-c",
                           script], stdin=subprocess.DEVNULL, capture_output=True,
                          pass_fds=(sw,), cwd=tmp_path, timeout=60)
    os.close(sw)
    left = int((tmp_path / "left").read_text())
    try:
        status = _status(sr)
        assert "saphan-launcher: abandoned pids=[unknown]" in status, (status, proc.stderr)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, 9)
