"""Picking and composing the boundary on this host (confine/compose.py): on
Linux the trusted bubblewrap with saphan-launcher reaping inside it, or the
Landlock boundary (the launcher enforcing writes, an outer bubblewrap hiding
and denying) — each composed for real and run here."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from conftest import require
from saphan import _native, launcher
from saphan.confine import bwrap, compose, trusted
from saphan.confine.grants import derive
from saphan.confine.policy import DEVICE_LITERALS, Policy
from saphan.refusals import Refusal

pytestmark = pytest.mark.usefixtures("bwrap_available")


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _launcher() -> str:
    path = launcher.path()
    assert path is not None, "saphan-launcher is not packaged (run ci/setup)"
    return path


def _run(b: compose.Boundary, argv: Sequence[str], status: Path) -> subprocess.CompletedProcess[str]:
    """Start ``argv`` under the boundary as saphan does: the boundary's
    descriptors inherited, the launcher's control lines on descriptor 3, its
    lifeline on descriptor 4 (held open here for the run's length)."""
    r, w = os.pipe()
    # pass_fds needs the number open here: a copy holds it if it was free
    held = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, compose.LIFELINE_FD)
    if held != compose.LIFELINE_FD:
        os.close(held)
        held = -1

    def lifeline() -> None:  # in the child only
        os.dup2(r, compose.LIFELINE_FD)

    try:
        return subprocess.run(
            ["sh", "-c", f'exec "$@" {compose.STATUS_FD}>"$0"', str(status), *b.prefix, *argv],
            pass_fds=(*b.fds, compose.LIFELINE_FD), preexec_fn=lifeline, capture_output=True,
            text=True, timeout=60,
        )
    finally:
        for fd in (r, w, held):
            if fd >= 0:
                os.close(fd)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("victim\n")
    ws = tmp_path / "ws"
    out = ws / "runs" / "R" / "out"
    out.mkdir(parents=True)
    (ws / "record.key").write_text("KEY\n")
    return {"wd": wd, "outside": outside, "ws": ws, "out": out}


def _policy(layout: dict[str, Path]) -> Policy:
    return derive(str(layout["wd"]), return_path=str(layout["out"]),
                  hidden_dirs=(str(layout["ws"]),))


# -- the bubblewrap boundary ---------------------------------------------------------------

def test_linux_composes_the_trusted_bubblewrap_with_the_reaper_inside(
        layout: dict[str, Path]) -> None:
    assert platform.system() == "Linux"
    policy = _policy(layout)
    b = compose.compose_local(policy, run_dir=str(layout["ws"] / "runs" / "R"))
    try:
        exe = trusted.find("bwrap")
        assert exe is not None
        version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        assert (b.mechanism, b.executable, b.executable_sha256) == ("bubblewrap", exe, _sha256(exe))
        assert version.strip() == f"bubblewrap {b.version}"
        assert b.status_fd == compose.STATUS_FD == 3
        assert b.lifeline_fd == compose.LIFELINE_FD == 4
        assert len(b.fds) == len(policy.writable_dirs)
        fds = dict(zip(policy.writable_dirs, b.fds, strict=True))
        reaper = _launcher()
        assert b.prefix == [*bwrap.render(policy, exe, fds), reaper, "reap", "--expect-sha256",
                            _native.sha256_file(reaper), "--status-fd", "3", "--lifeline-fd",
                            "4", "--"]
        assert b.record() == {
            "mechanism": "bubblewrap", "version": b.version, "executable": exe,
            "executable_sha256": _sha256(exe),
            "reaper": {"executable": reaper, "sha256": _sha256(reaper)},
        }
    finally:
        b.close()


def test_the_composed_bubblewrap_boundary_confines_and_reports_on_fd_3(
        layout: dict[str, Path], tmp_path: Path) -> None:
    b = compose.compose_local(_policy(layout), run_dir=str(tmp_path))
    status = tmp_path / "status.log"
    try:
        p = _run(b, ["sh", "-c", f"echo in > inside.txt; echo r > {layout['out']}/r.txt; "
                                 f"cat {layout['ws']}/record.key; "
                                 f"echo x > {layout['outside']}/victim.txt; exit 7"], status)
    finally:
        b.close()
    assert p.returncode == 7
    assert "KEY" not in p.stdout
    assert (layout["wd"] / "inside.txt").read_text() == "in\n"
    assert (layout["out"] / "r.txt").read_text() == "r\n"
    assert (layout["outside"] / "victim.txt").read_text() == "victim\n"
    assert "saphan-launcher: exited code=7 reaped=0" in status.read_text()


def test_closing_a_boundary_closes_its_descriptors_once(layout: dict[str, Path],
                                                        tmp_path: Path) -> None:
    before = _open_fds()
    b = compose.compose_local(_policy(layout), run_dir=str(tmp_path))
    assert b.fds and all(str(fd) in _open_fds() for fd in b.fds)
    b.close()
    b.close()  # a second close is harmless
    assert _open_fds() == before


# -- descriptors for the grants ------------------------------------------------------------

def test_grant_fds_are_the_checked_directories_above_the_childs_numbers(tmp_path: Path) -> None:
    a, c = tmp_path / "a", tmp_path / "c"
    a.mkdir()
    c.mkdir()
    fds = compose.grant_fds((str(a), str(c)))
    try:
        assert set(fds) == {str(a), str(c)}
        for path, fd in fds.items():
            assert fd >= 10
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            st = os.fstat(fd)
            assert (st.st_dev, st.st_ino) == (os.stat(path).st_dev, os.stat(path).st_ino)
    finally:
        for fd in fds.values():
            os.close(fd)


def test_a_directory_swapped_for_a_link_is_refused_by_name_and_nothing_leaks(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (tmp_path / "elsewhere").mkdir()
    b.rmdir()
    b.symlink_to(tmp_path / "elsewhere")
    before = _open_fds()
    with pytest.raises(Refusal) as e:
        compose.grant_fds((str(a), str(b)))
    assert e.value.cls == "workdir-unsafe"
    assert str(b) in e.value.message and "passed when the run's policy was derived" in e.value.message
    assert e.value.remediation.startswith(f"look at {b};")
    assert _open_fds() == before


def test_reaper_prefix_is_the_launchers_reap_with_its_digest() -> None:
    prefix, extra = compose.reaper_prefix()
    reaper = _launcher()
    assert prefix == [reaper, "reap", "--expect-sha256", _native.sha256_file(reaper), "--status-fd",
                      "3", "--lifeline-fd", "4", "--"]
    assert extra == {"reaper": {"executable": reaper, "sha256": _native.sha256_file(reaper)}}


# -- the Landlock boundary -------------------------------------------------------------------

def _landlock(layout: dict[str, Path], policy: Policy) -> compose.Boundary:
    reaper = _launcher()
    return compose.compose_landlock_local(
        policy, level=_native.landlock_abi()[0], launcher_path=reaper, launcher_version="test",
        launcher_sha256=_native.sha256_file(reaper),
        agent_sha256=_native.sha256_file(os.path.realpath("/bin/sh")))


def test_the_landlock_boundary_sends_only_the_writes_to_the_launcher(layout: dict[str, Path]) -> None:
    secret = layout["wd"] / "secret.key"
    secret.write_text("S\n")
    policy = derive(str(layout["wd"]), return_path=str(layout["out"]),
                    hidden_dirs=(str(layout["ws"]),), read_denials=(str(secret),))
    b = _landlock(layout, policy)
    try:
        exe = trusted.find("bwrap")
        assert exe is not None
        level = _native.landlock_abi()[0]
        assert (b.mechanism, b.version, b.status_fd) == ("landlock", f"abi {level}", 3)
        # Only the return path sits under a hidden directory: only it is bound by descriptor.
        assert len(b.fds) == 1
        policy_json = b.extra["policy_json"]
        assert b.prefix[-11:] == [_launcher(), "exec", "--expect-sha256",
                                  _native.sha256_file(_launcher()), "--status-fd", "3",
                                  "--lifeline-fd", "4", "--policy", policy_json, "--"]
        assert b.lifeline_fd == 4
        assert b.prefix[:-11] == bwrap.render_outer(policy, exe, {str(layout["out"]): b.fds[0]})
        assert _native.parse_policy(policy_json) == policy_json
        # the writes only: read denials, carve-outs and hiding are the outer bubblewrap's
        assert json.loads(policy_json)["writable"] == [str(layout["wd"]), str(layout["out"]),
                                                       *DEVICE_LITERALS]
        assert str(secret) not in policy_json
        assert b.extra["abi"] == level and b.extra["launcher_version"] == "test"
        assert b.extra["read_denials_and_carve_outs_by"]["executable"] == exe
        assert b.record()["mechanism"] == "landlock"
    finally:
        b.close()


def test_the_landlock_boundary_confines_writes_and_hides_and_denies_reads(
        layout: dict[str, Path], tmp_path: Path) -> None:
    require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
    secret = layout["wd"] / "secret.key"
    secret.write_text("SECRET\n")
    policy = derive(str(layout["wd"]), return_path=str(layout["out"]),
                    hidden_dirs=(str(layout["ws"]),), read_denials=(str(secret),))
    b = _landlock(layout, policy)
    status = tmp_path / "status.log"
    try:
        p = _run(b, [os.path.realpath("/bin/sh"), "-c",
                     f"echo in > inside.txt; echo r > {layout['out']}/r.txt; "
                     f"cat {secret} {layout['ws']}/record.key; "
                     f"echo x > {layout['outside']}/victim.txt; echo x > /tmp/saphan-compose-$$; "
                     "true"], status)
    finally:
        b.close()
    assert p.returncode == 0, p.stderr
    assert "SECRET" not in p.stdout and "KEY" not in p.stdout
    assert (layout["wd"] / "inside.txt").read_text() == "in\n"
    assert (layout["out"] / "r.txt").read_text() == "r\n"
    assert (layout["outside"] / "victim.txt").read_text() == "victim\n"
    assert "Permission denied" in p.stderr
    assert "landlock abi=" in status.read_text()
