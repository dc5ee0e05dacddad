"""Fixtures for the remote lane: real sshd hosts, each in a network and a
mount namespace of its own (sshhosts.py), and workspaces that know them as
SSH machines. A far file is a far path: a test reads or plants it through the
host's far view (``FarHost.far_path``, ``FarHost.as_user``), never at the same
path here.

Under CI=true a missing part (root, ip, sshd, a Landlock kernel) FAILS every
test here; elsewhere they skip loudly (conftest.require).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan, require, saphan_exe
from integration.sshd.sshhosts import FarHost, HostSet, missing_parts
from saphan import _native


@pytest.fixture(scope="session")
def hosts() -> Iterator[HostSet]:
    """Three far hosts for the whole session: far1, far2, and far3 (the one
    tests may re-key or cut off); ``kernel_hosts`` adds two more."""
    missing = missing_parts()
    require(not missing, f"SSH test hosts need: {', '.join(missing)}")
    require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
    hs = HostSet(3).up()
    try:
        yield hs
    finally:
        hs.down()


#: the hosts ``kernel_hosts`` adds, and the Landlock their sshd sees
KERNEL_HOSTS: dict[str, str | int] = {"far_nolandlock": "none", "far_abi2": 2}


@pytest.fixture(scope="session")
def kernel_hosts(hosts: HostSet) -> dict[str, FarHost]:
    """Two more far hosts of ``hosts``, made on first use: far_nolandlock (a
    kernel without Landlock: ENOSYS) and far_abi2 (a kernel at Landlock ABI 2,
    below the floor) — a seccomp filter under their sshd, so under every far
    process (tests/helpers/no_landlock.c)."""
    require(shutil.which("gcc") is not None or shutil.which("cc") is not None,
            "a C compiler (gcc) to build tests/helpers/no_landlock.c")
    made = {}
    for name, landlock in KERNEL_HOSTS.items():
        try:
            made[name] = hosts[name]
        except KeyError:
            made[name] = hosts.add(name, landlock=landlock)
    return made


class Remote:
    """A workspace (real CLI) plus the far hosts it knows as machines."""

    def __init__(self, s: Saphan, hosts: HostSet):
        self.s = s
        self.hosts = hosts

    def __call__(self, *args: str, **kw: Any) -> Any:
        return self.s(*args, **kw)

    def ok(self, *args: str, **kw: Any) -> Any:
        return self.s.ok(*args, **kw)

    def host(self, name: str) -> FarHost:
        return self.hosts[name]

    def add(self, *names: str) -> None:
        for name in names:
            self.ok("machine", "add", name, "--ssh", self.host(name).target,
                    "--identity", str(self.hosts.client_key))

    def ready(self, name: str, slot: str = "s1", tool: str = "command",
              max_sessions: int | None = None) -> None:
        """Added, launcher delivered, Landlock measured, one slot."""
        self.add(name)
        self.ok("machine", "deliver", name, "--probe")
        extra = ["--max-sessions", str(max_sessions)] if max_sessions else []
        self.ok("slot", "add", name, slot, "--tool", tool, *extra)

    def launcher_path(self, name: str) -> Path:
        """The far path where delivery puts the launcher on ``name``: this
        workspace's own install directory (site/far.install_dir)."""
        from saphan.site.far import install_dir

        key = (self.s.home / "record.key").read_bytes()
        return self.host(name).home / install_dir(key) / "bin" / "saphan-launcher"

    def record(self, run_id: str = "last") -> dict[str, Any]:
        rec = self.ok("runs", "show", run_id, "--json").json()
        assert isinstance(rec, dict)
        return rec

    def start_run(self, name: str, workdir: Path, *argv: str,
                  slot: str = "s1") -> subprocess.Popen[str]:
        """A `saphan run` in the background (the holder of a seat)."""
        return subprocess.Popen(
            [saphan_exe(), "run", "--machine", name, "--slot", slot, "--workdir",
             str(workdir), "--", *argv],
            env=self.s.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )

    def wait_far_holder(self, name: str, slot: str = "s1", timeout: float = 20) -> dict[str, Any]:
        """The slot's live holder, once it is the far process."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.ok("slot", "show", name, slot, "--json").json()
            for h in shown["holders"]:
                if str(h["host"]).startswith("ssh://"):
                    return dict(h)
            time.sleep(0.1)
        raise AssertionError(f"no far holder on {name}/{slot} within {timeout} s")


@pytest.fixture
def far(saphan_sqlite: Saphan, hosts: HostSet) -> Remote:
    return Remote(saphan_sqlite, hosts)


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str, str]:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@contextmanager
def linked_projects(h: FarHost, target: Path) -> Iterator[Path]:
    """The far user's ``~/.claude/projects`` as a link to ``target`` (a real
    one an earlier test left is kept aside, and put back); yields the
    configuration home."""
    claude = h.home / ".claude"
    h.as_user("mkdir", "-p", str(claude / "projects"))
    h.as_user("mv", str(claude / "projects"), str(claude / "projects.kept"))
    h.as_user("ln", "-s", str(target), str(claude / "projects"))
    try:
        yield claude
    finally:
        h.far_path(claude / "projects").unlink()
        h.as_user("mv", str(claude / "projects.kept"), str(claude / "projects"))


def facts(far: Remote, name: str) -> dict[str, Any]:
    shown = far.ok("machine", "show", name, "--json").json()
    return dict(shown["facts"])

