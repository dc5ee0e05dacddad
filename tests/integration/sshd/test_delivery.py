"""Delivery of saphan-launcher, and probe-confinement over SSH."""

from __future__ import annotations

import json
import os
from pathlib import Path

from integration.sshd.conftest import Remote, facts
from saphan import _native


def _installed(far: Remote, name: str) -> Path:
    """The far path of the delivered launcher (as its host names it)."""
    return far.launcher_path(name)


def _seen(far: Remote, name: str) -> Path:
    """The delivered launcher, reached through its host's far view."""
    return far.host(name).far_path(_installed(far, name))


def _leftovers(far: Remote, name: str) -> list[str]:
    d = _seen(far, name).parent
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_parallel_delivery_installs_and_records_what_each_machine_measured(far: Remote) -> None:
    far.add("far1", "far2")
    local = far.ok("launcher", "path").out.strip()
    sha = _native.sha256_file(local)
    r = far.ok("machine", "deliver", "far1", "far2")
    lines = r.out.splitlines()
    assert lines[0].split() == ["MACHINE", "RESULT", "SHA256", "VERSION", "DETAIL"]
    assert any(line.startswith("far1") and "installed" in line for line in lines)
    assert any(line.startswith("far2") and "installed" in line for line in lines)
    for name in ("far1", "far2"):
        path = _installed(far, name)
        st = _seen(far, name).stat()
        assert _native.sha256_file(str(_seen(far, name))) == sha
        assert st.st_mode & 0o777 == 0o755 and st.st_uid == far.host(name).uid
        assert _leftovers(far, name) == ["saphan-launcher"]
        row = facts(far, name)["launcher"]["value"]
        assert row["sha256"] == sha and row["path"] == str(path)
        assert row["version"].startswith("saphan-launcher ")
    as_json = far.ok("machine", "deliver", "--all", "--json").json()
    assert [(x["machine"], x["result"]) for x in as_json] == [("far1", "installed"),
                                                               ("far2", "installed")]


def test_corrupted_upload_is_refused_and_the_previous_launcher_stays(far: Remote) -> None:
    """The far machine's own sha256sum sees other bytes than were sent (a
    wrapper at /usr/local/bin/sha256sum, first on the system PATH the far
    scripts use — the far user's own PATH is not used for saphan's tools —
    switched on by a flag file)."""
    from integration.sshd.sshhosts import SHA256SUM_WRAPPER

    far.add("far2")
    h = far.host("far2")
    far.ok("machine", "deliver", "far2")
    path = _seen(far, "far2")
    before = path.read_bytes()
    row_before = facts(far, "far2")["launcher"]
    wrapper = h.far_path("/usr/local/bin/sha256sum")
    wrapper.write_text(SHA256SUM_WRAPPER)
    wrapper.chmod(0o755)
    flag = h.far_path(h.home / ".corrupt-sha256sum")
    flag.write_text("")
    try:
        r = far("machine", "deliver", "far2")
        assert r.code == 3, r.err
        assert "refused [digest-mismatch]: the launcher uploaded to far2 measures sha256" in r.err
        assert "the previously installed launcher (sha256" in r.err and "is kept" in r.err
        assert path.read_bytes() == before
        assert _leftovers(far, "far2") == ["saphan-launcher"]
        assert facts(far, "far2")["launcher"] == row_before
        # With nothing installed before, nothing is installed now.
        path.unlink()
        r = far("machine", "deliver", "far2", "--json")
        assert r.code == 3
        assert json.loads(r.out)[0]["refusal"]["class"] == "digest-mismatch"
        assert _leftovers(far, "far2") == []
    finally:
        flag.unlink()
        wrapper.unlink()
    far.ok("machine", "deliver", "far2")
    assert path.read_bytes() == before


def test_probe_over_ssh_measures_with_the_delivered_launcher(far: Remote) -> None:
    far.add("far1")
    r = far("machine", "probe-confinement", "far1")
    assert r.code == 2 and "deliver it first" in r.err
    far.ok("machine", "deliver", "far1")
    value = far.ok("machine", "probe-confinement", "far1", "--json").json()
    delivered = facts(far, "far1")["launcher"]["value"]
    assert value["level"] == _native.landlock_abi()[0] and value["transport"] == "ssh"
    assert value["launcher_sha256"] == delivered["sha256"]
    assert set(value) >= {"level", "reason", "kernel_release", "launcher_version",
                          "launcher_sha256", "floor", "highest_known", "transport"}
    assert facts(far, "far1")["landlock"]["value"]["level"] == value["level"]
    text = far.ok("machine", "probe-confinement", "far1").out
    assert f"far1: landlock level {value['level']}" in text and "meets the floor" in text
    # The launcher that probes must be the one delivered.
    path = _seen(far, "far1")
    os.chmod(path, 0o755)
    path.write_bytes(path.read_bytes() + b"\0")
    try:
        r = far("machine", "probe-confinement", "far1")
        assert r.code == 3 and "refused [digest-mismatch]" in r.err
    finally:
        far.ok("machine", "deliver", "far1")
