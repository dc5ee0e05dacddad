"""The SSH transport: host keys pinned at `machine add`, a changed or
unpinned key refused, an unreachable machine named with its cause."""

from __future__ import annotations

import sqlite3

from integration.sshd.conftest import Remote


def test_add_pins_the_host_key_and_shows_its_fingerprint(far: Remote) -> None:
    h = far.host("far1")
    r = far.ok("machine", "add", "far1", "--ssh", h.target, "--identity",
               str(far.hosts.client_key))
    assert f"pinned host key ssh-ed25519 {h.fingerprint()}" in r.out
    shown = far.ok("machine", "show", "far1", "--json").json()
    pub = (h.host_key.with_suffix(".pub")).read_text().split()
    assert shown["host_key"] == f"{pub[0]} {pub[1]}"
    assert f"host_key_fingerprint: {h.fingerprint()}" in far.ok("machine", "show", "far1").out


def test_changed_host_key_is_refused_and_nothing_changes(far: Remote) -> None:
    far.add("far3")
    far.ok("machine", "deliver", "far3", "--probe")
    before = far.ok("machine", "show", "far3", "--json").json()
    h = far.host("far3")
    pinned = h.fingerprint()
    h.rekey()
    presented = h.fingerprint()
    assert presented != pinned
    r = far("machine", "probe-confinement", "far3")
    assert r.code == 3, r.err
    assert "refused [host-key-mismatch]: machine far3" in r.err
    assert presented in r.err and pinned in r.err and "--expect-fingerprint" in r.err
    r = far("machine", "deliver", "far3")
    assert r.code == 3 and "refused [host-key-mismatch]" in r.err
    assert far.ok("machine", "show", "far3", "--json").json() == before
    # A run is refused by name and recorded, before any seat.
    far.ok("slot", "add", "far3", "s1", "--tool", "command")
    r = far("run", "--machine", "far3", "--slot", "s1", "--workdir", "/tmp", "--", "true")
    assert r.code == 3 and "refused [host-key-mismatch]" in r.err, r.err
    rec = far.record()
    assert rec["refusal"]["class"] == "host-key-mismatch" and rec["session_ordinal"] is None


def test_unpinned_host_key_is_never_accepted(far: Remote) -> None:
    far.add("far1")
    far.ok("machine", "deliver", "far1")
    db = sqlite3.connect(far.s.home / "saphan.db")
    db.execute("UPDATE machines SET host_key = NULL WHERE name = 'far1'")
    db.commit()
    db.close()
    # The machine's rows were bound to the pinned key: they are not believed now.
    r = far("machine", "probe-confinement", "far1")
    assert r.code == 3 and "refused [record-signature-invalid]" in r.err, r.err
    assert "now names ssh:" in r.err and "no-host-key" in r.err
    # And nothing connects without a pinned key.
    r = far("machine", "deliver", "far1")
    assert r.code == 1
    assert "no host key is pinned" in r.err and "never accepted" in r.err


def test_unreachable_machine_is_a_clear_error(far: Remote) -> None:
    far.add("far3")
    h = far.host("far3")
    h.link_down()
    try:
        r = far("machine", "deliver", "far3")
        assert r.code == 1
        assert f"machine far3 ({h.user}@{h.addr}:22)" in r.err
        assert "unreachable" in r.err
        assert "No route to host" in r.err or "Network is unreachable" in r.err
    finally:
        h.link_up()
    # A machine that cannot be reached is not added.
    r = far("machine", "add", "nobody", "--ssh", "agent@127.0.0.1:1", "--identity",
            str(far.hosts.client_key))
    assert r.code == 1
    assert "machine nobody (127.0.0.1:1) is unreachable" in r.err
    assert "nobody" not in far.ok("machine", "list").out
