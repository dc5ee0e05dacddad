"""The test hosts are apart from the control plane: what a far user writes
(its workdir, /tmp, the install dir) is in that host's far view and nowhere
here, and what is here is not there — so every other test in this directory
can tell a far path from a near one."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.sshd.conftest import Remote
from saphan import Engine


def _far_sh(far: Remote, name: str, script: str) -> tuple[int, str, str]:
    """``script`` as the far user of ``name``, through saphan's own SSH
    transport (the real sshd of that host, its pinned key)."""
    engine = Engine(far.s.home)
    try:
        done = engine.ssh(engine.machine(name)).run(script)
    finally:
        engine.close()
    return done.exit_code, done.out, done.err


@pytest.fixture
def near_file() -> Iterator[Path]:
    """A file in the control plane's own /tmp."""
    fd, name = tempfile.mkstemp(prefix="saphan-near-", dir="/tmp")
    os.write(fd, b"near\n")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        os.unlink(name)


def test_a_runs_far_writes_are_in_its_far_view_only(far: Remote) -> None:
    far.ready("far1")
    h = far.host("far1")
    wd = h.mkdir("apart/wd")
    far.ok("run", "--machine", "far1", "--slot", "s1", "--workdir", str(wd), "--",
           "sh", "-c", "echo far > made.txt")
    assert far.record()["workdir"] == str(wd)
    # Through the far view: there, written by the far user.
    made = h.far_path(wd / "made.txt")
    assert made.read_text() == "far\n" and made.stat().st_uid == h.uid
    # In that host's upper layer, on its own tmpfs...
    assert (h.upper / wd.relative_to("/") / "made.txt").read_text() == "far\n"
    # ...and at that path here: nothing, not even the far home.
    assert not (wd / "made.txt").exists()
    assert not h.home.exists()


def test_far_tmp_is_the_far_hosts_own(far: Remote, near_file: Path) -> None:
    far.add("far1", "far2")
    h1, h2 = far.host("far1"), far.host("far2")
    name = f"/tmp/saphan-apart-{uuid.uuid4().hex}"
    code, _out, err = _far_sh(far, "far1", f"echo far1 > {name} && id -u")
    assert code == 0, err
    assert h1.far_path(name).read_text() == "far1\n"
    assert h1.far_path(name).stat().st_uid == h1.uid
    assert not Path(name).exists()  # not in the control plane's /tmp
    assert not h2.far_path(name).exists()  # nor in another host's
    code, _out, _err = _far_sh(far, "far2", f"test -e {name}")
    assert code == 1
    # The control plane's /tmp is not seen from far: a near file is absent there.
    assert near_file.read_text() == "near\n"
    code, out, err = _far_sh(far, "far1", f"test -e {near_file} && echo seen || echo absent")
    assert code == 0 and out.strip() == "absent", err
    assert not h1.far_path(near_file).exists()


def test_the_delivered_launcher_exists_only_in_the_far_view(far: Remote) -> None:
    far.add("far1")
    far.ok("machine", "deliver", "far1")
    h = far.host("far1")
    installed = far.launcher_path("far1")
    row = far.ok("machine", "show", "far1", "--json").json()["facts"]["launcher"]["value"]
    assert row["path"] == str(installed)
    local = far.ok("launcher", "path").out.strip()
    seen = h.far_path(installed)
    assert seen.read_bytes() == Path(local).read_bytes()
    assert seen.stat().st_uid == h.uid
    assert (h.upper / installed.relative_to("/")).is_file()
    assert not installed.exists() and not installed.parent.parent.exists()
    code, out, err = _far_sh(far, "far1", f"{installed} --version")
    assert code == 0 and out.startswith("saphan-launcher "), err
