"""A class's `network: off` is enforced on the run's path or the run is refused
(confine/network.py): a command run under bubblewrap and under the local
Landlock boundary cannot reach a server on the host's own loopback; a
claude run with the same class is refused `network-posture-unenforceable`,
recorded, before its seat; `network: open` makes no claim and reaches it."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Saphan
from saphan import Refusal
from saphan.confine import network

PROBE = ("import socket,sys\n"
         "try:\n"
         "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
         "    print('CONNECTED')\n"
         "except OSError as e:\n"
         "    print('REFUSED', e.errno)\n")


@pytest.mark.parametrize(("tool", "mechanism", "enforced"), [
    ("command", "bubblewrap", True),
    ("command", "landlock", True),
    ("codex", "vendor:codex", True),
    ("command", "seatbelt", False),
    ("command", "ssh", False),
    ("claude", "bubblewrap", False),
    ("claude", "vendor:claude", False),
    ("loop", "bubblewrap", False),
    ("loop", "landlock", False),
])
def test_off_is_enforced_or_refused_on_each_path(tool: str, mechanism: str,
                                                 enforced: bool) -> None:
    # No class, or `open`: no claim, nothing to refuse, anywhere.
    assert network.posture(None, tool=tool, mechanism=mechanism) == ("open", None)
    assert network.posture("open", tool=tool, mechanism=mechanism) == ("open", None)
    if enforced:
        posture, lever = network.posture("off", tool=tool, mechanism=mechanism)
        assert posture == "off" and lever
        return
    with pytest.raises(Refusal) as e:
        network.posture("off", tool=tool, mechanism=mechanism)
    assert e.value.cls == "network-posture-unenforceable"
    assert f"a {tool} run under {mechanism} cannot enforce it" in e.value.message
    assert '"network": "open"' in e.value.remediation


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's loopback that accepts and closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    srv.close()


def _class(tmp_path: Path, net: str | None) -> Path:
    data: dict[str, object] = {"schema": 2, "allowed_commands": [Path(sys.executable).name]}
    if net is not None:
        data["network"] = net
    path = tmp_path / f"class-{net}.json"
    path.write_text(json.dumps(data))
    return path


def _run(s: Saphan, wd: Path, pc: Path, port: int, *extra: str) -> tuple[dict[str, object], str]:
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), *extra,
          "--permission-class", str(pc), "--json", "--", sys.executable, "-c", PROBE, str(port))
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    return rec, Path(rec["output"]["stdout"]).read_text()


@pytest.mark.usefixtures("bwrap_available")
@pytest.mark.parametrize("boundary", ["bubblewrap", "landlock"])
def test_a_command_run_with_network_off_reaches_nothing(
    saphan_sqlite: Saphan, tmp_path: Path, host_server: int, boundary: str,
) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    extra: tuple[str, ...] = ()
    if boundary == "landlock":
        s.ok("machine", "probe-confinement", "here")
        extra = ("--boundary", "landlock")
    wd = tmp_path / "wd"
    wd.mkdir()
    # `open`: no claim, and the host's server is reached (the probe works).
    rec, out = _run(s, wd, _class(tmp_path, "open"), host_server, *extra)
    assert out.strip() == "CONNECTED"
    assert rec["network"] == "not restricted" and rec["policy"]["network"] == "not restricted"
    assert "--unshare-net" not in rec["boundary_argv"]
    assert any("network egress (no egress policy declared)" in n for n in rec["notes"])
    # `off` (said, and the default when a class names none): cut, and recorded so.
    for net in ("off", None):
        rec, out = _run(s, wd, _class(tmp_path, net), host_server, *extra)
        assert out.strip().startswith("REFUSED"), out
        assert rec["enforced_by"]["mechanism"] == boundary
        assert rec["network"] == f"off: {network.BWRAP_LEVER}"
        assert rec["policy"]["network"] == "off"
        assert "--unshare-net" in rec["boundary_argv"]
        assert not any("network egress" in n for n in rec["notes"])
        shown = s.ok("runs", "show", str(rec["id"])).out
        assert f"network:     off: {network.BWRAP_LEVER}" in shown


@pytest.mark.usefixtures("bwrap_available")
def test_a_claude_run_with_network_off_is_refused_before_its_seat(
    saphan_sqlite: Saphan, tmp_path: Path, claude_bin: str,
) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "cl", "--tool", "claude")
    wd = tmp_path / "wd"
    wd.mkdir()
    pc = tmp_path / "class.json"
    pc.write_text(json.dumps({"schema": 2, "allowed_commands": ["sh"]}))
    r = s("run", "--machine", "here", "--slot", "cl", "--workdir", str(wd), "--prompt", "hi",
          "--permission-class", str(pc), env=s.env(SAPHAN_CLAUDE_BIN=claude_bin))
    assert r.code == 3
    assert ("refused [network-posture-unenforceable]: the permission class says `network: off` "
            "(its default when it names none), and a claude run under bubblewrap cannot "
            "enforce it") in r.err
    [row] = json.loads(s.ok("runs", "list", "--json").out)
    assert row["outcome"] == "refused"
    assert row["refusal"]["class"] == "network-posture-unenforceable"
    assert not list(wd.iterdir())  # nothing was made for it
