"""The egress tests' upstream address: the door always denies loopback, so an
upstream it may reach listens on a veth pair's host end (10.231.<pid%250>.1),
its peer in a network namespace of this session's own."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check)


@pytest.fixture(scope="session")
def upstream_addr() -> Iterator[str]:
    """A non-loopback address of this machine (the veth's host end, up)."""
    # fail, never skip: CI runs as root, and a skipped door test proves nothing
    if os.geteuid() != 0:
        pytest.fail("the egress tests need root (ip netns, ip link)")
    if shutil.which("ip") is None:
        pytest.fail("the egress tests need the `ip` command (iproute2)")
    pid = os.getpid()
    netns, host_end, peer = f"saphan-egr-{pid}", f"segr{pid}h"[:15], f"segr{pid}n"[:15]
    # (10.213-10.249 are the sshd test hosts' /16s: tests/integration/sshd/sshhosts.py)
    net = f"10.212.{pid % 250}"
    if _ip("-4", "addr", "show", "to", f"{net}.0/24").stdout.strip():
        pytest.fail(f"{net}.0/24 is already on an interface of this machine")
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", netns)
        _ip("addr", "add", f"{net}.1/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", netns, "addr", "add", f"{net}.2/24", "dev", peer)
        _ip("-n", netns, "link", "set", peer, "up")
    except subprocess.CalledProcessError as e:
        _down(netns, host_end)
        pytest.fail(f"could not make the test veth pair: {e.stderr.strip()}")
    try:
        yield f"{net}.1"
    finally:
        _down(netns, host_end)


def _down(netns: str, host_end: str) -> None:
    _ip("link", "del", host_end, check=False)
    _ip("netns", "del", netns, check=False)
