"""Far machines whose kernel cannot confine: one without Landlock (ENOSYS),
one at Landlock ABI 2 (below the floor of 3) — real sshd hosts whose sshd,
and so every far process, runs under a seccomp filter answering as such a
kernel would (tests/helpers/no_landlock.c, TESTING.md's stand-in).

The probe over SSH measures them as they are; a run is refused by the
measured row, before anything runs; and the delivered launcher itself, run
there directly (the engine's gate bypassed), measures the live kernel again
and refuses."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from integration.sshd.conftest import Remote, facts
from saphan import Engine

if TYPE_CHECKING:
    from saphan.transport.ssh import Completed

pytestmark = pytest.mark.usefixtures("kernel_hosts")

#: host, measured level, probe reason, refusal class, words of the refusal
KERNELS = [
    ("far_nolandlock", 0, "enosys", "landlock-incapable", "measured Landlock level 0 (enosys"),
    ("far_abi2", 2, "supported", "landlock-below-floor",
     "measured Landlock level 2, below the floor of 3"),
]


@pytest.mark.parametrize(("name", "level", "reason", "cls", "said"), KERNELS)
def test_probe_measures_the_far_kernel_and_a_run_is_refused(
        far: Remote, name: str, level: int, reason: str, cls: str, said: str) -> None:
    far.add(name)
    delivered = far.ok("machine", "deliver", name, "--probe", "--json").json()
    assert [(d["machine"], d["result"]) for d in delivered] == [(name, "installed")]
    assert delivered[0]["probe"]["level"] == level
    row = facts(far, name)["landlock"]["value"]
    assert row["level"] == level and row["reason"] == reason and row["transport"] == "ssh"
    far.ok("slot", "add", name, "s1", "--tool", "command")
    h = far.host(name)
    wd = h.mkdir("kernel/wd")
    marker = wd / "ran"
    r = far("run", "--machine", name, "--slot", "s1", "--workdir", str(wd), "--",
            "touch", str(marker))
    assert r.code == 3, r.err
    assert f"refused [{cls}]: machine {name} {said}" in r.err
    rec = far.record()
    assert rec["outcome"] == "refused" and rec["refusal"]["class"] == cls
    assert rec["enforced_by"] is None and rec["finished_at"]
    assert not h.far_path(marker).exists()


def _launch_directly(far: Remote, name: str, wd: Path, argv: list[str]) -> Completed:
    """The delivered launcher's `exec`, run on ``name`` over saphan's own SSH
    transport with a policy granting ``wd`` — no gate, no row consulted."""
    far.ok("machine", "deliver", name)
    launcher = facts(far, name)["launcher"]["value"]["path"]
    policy = json.dumps({"version": 1, "workdir": str(wd), "writable": [str(wd)],
                         "readable": "everything"}, separators=(",", ":"))
    engine = Engine(far.s.home)
    try:
        return engine.ssh(engine.machine(name)).run(
            f"{shlex.quote(launcher)} exec --policy {shlex.quote(policy)} -- "
            + " ".join(shlex.quote(a) for a in argv))
    finally:
        engine.close()


@pytest.mark.parametrize(("name", "cls", "said"), [
    ("far_nolandlock", "landlock-incapable", "this kernel measures landlock abi=0 (enosys)"),
    ("far_abi2", "landlock-below-floor", "this kernel measures landlock abi=2, the floor is 3"),
])
def test_the_far_launcher_measures_the_live_kernel_and_refuses(
        far: Remote, name: str, cls: str, said: str) -> None:
    """The delivered launcher, run there directly with a policy a Landlock
    kernel would enforce, refuses: exit 3, the class and the measured ABI on
    its stderr, and the command never ran."""
    far.add(name)
    h = far.host(name)
    wd = h.mkdir("live/wd")
    marker = wd / "ran"
    done = _launch_directly(far, name, wd, ["/usr/bin/touch", str(marker)])
    assert done.exit_code == 3, done.err
    assert f"refused [{cls}]: {said}" in done.err
    assert "saphan-launcher: landlock abi=" not in done.err  # no enforcement claimed
    assert not h.far_path(marker).exists()
    assert not h.far_path(wd / ".saphan-run").exists()  # it stopped before the workdir


def test_a_normal_far_host_enforces_the_same_policy(far: Remote) -> None:
    """The same direct launcher call on far1 (the kernel's own Landlock):
    enforced, the command ran — the refusals above are the kernels' doing."""
    far.add("far1")
    h = far.host("far1")
    wd = h.mkdir("live/wd")
    marker = wd / "ran"
    done = _launch_directly(far, "far1", wd, ["/usr/bin/touch", str(marker)])
    assert done.exit_code == 0, done.err
    assert "saphan-launcher: landlock abi=" in done.err
    assert f" enforced writable=[{wd}" in done.err
    assert h.far_path(marker).exists()
