"""What an operator brings to `machine add --ssh`, on real sshd hosts: the
host key checked against what they were told (--expect-fingerprint,
--known-hosts) before anything is pinned, their ~/.ssh/config honoured,
logging in tried before anything is written, an encrypted key named."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import Saphan, saphan_exe
from integration.sshd.conftest import Remote


def _machines(far: Remote) -> list[str]:
    return [m["name"] for m in far.ok("machine", "list", "--json").json()]


def test_expect_fingerprint_right_pins_and_wrong_refuses(far: Remote) -> None:
    h = far.host("far1")
    key = str(far.hosts.client_key)
    wrong = "SHA256:" + "A" * 43
    r = far("machine", "add", "far1", "--ssh", h.target, "--identity", key,
            "--expect-fingerprint", wrong)
    assert r.code == 3, r.err
    assert f"refused [host-key-mismatch]: {h.addr}:22 (machine far1) presents host key" in r.err
    assert h.fingerprint() in r.err and f"not the expected {wrong}" in r.err
    assert _machines(far) == []
    r = far.ok("machine", "add", "far1", "--ssh", h.target, "--identity", key,
               "--expect-fingerprint", h.fingerprint())
    assert f"pinned host key ssh-ed25519 {h.fingerprint()} (it matched what you gave)" in r.out
    far.ok("machine", "deliver", "far1")


def test_known_hosts_file_pins_only_a_listed_key(far: Remote, tmp_path: Path) -> None:
    h = far.host("far1")
    key = str(far.hosts.client_key)
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    listed = tmp_path / "known_hosts"
    listed.write_text(f"{h.addr} {other.with_suffix('.pub').read_text().split(' ')[0]} "
                      f"{other.with_suffix('.pub').read_text().split(' ')[1]}\n")
    r = far("machine", "add", "far1", "--ssh", h.target, "--identity", key,
            "--known-hosts", str(listed))
    assert r.code == 3 and "refused [host-key-mismatch]" in r.err and "lists" in r.err, r.err
    assert _machines(far) == []
    real = Path(str(h.host_key) + ".pub").read_text().split()
    listed.write_text(f"{h.addr} {real[0]} {real[1]}\n")
    far.ok("machine", "add", "far1", "--ssh", h.target, "--identity", key,
           "--known-hosts", str(listed))
    assert _machines(far) == ["far1"]


def test_ssh_config_host_alias_is_honoured(far: Remote, tmp_path: Path) -> None:
    h = far.host("far2")
    conf = tmp_path / "ssh_config"
    conf.write_text(f"Host runner-two\n  HostName {h.addr}\n  User {h.user}\n  Port 22\n"
                    f"  IdentityFile {far.hosts.client_key}\n")
    far.ok("machine", "add", "far2", "--ssh", "runner-two", "--ssh-config", str(conf))
    m = far.ok("machine", "show", "far2", "--json").json()
    assert m["address"] == f"{h.user}@{h.addr}:22"
    assert m["identity_file"] == str(far.hosts.client_key)
    far.ok("machine", "deliver", "far2", "--probe")


def test_an_encrypted_identity_is_named_and_nothing_written(far: Remote, tmp_path: Path) -> None:
    h = far.host("far1")
    enc = tmp_path / "id_encrypted"
    shutil.copy(far.hosts.client_key, enc)
    enc.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", str(enc)],
                   check=True)
    r = far("machine", "add", "far1", "--ssh", h.target, "--identity", str(enc))
    assert r.code == 1, r.err
    assert f"the identity file {enc} is encrypted" in r.err
    assert "no terminal to ask for its passphrase" in r.err and "--ssh-agent" in r.err
    assert _machines(far) == []


def test_a_key_the_far_user_does_not_accept_writes_nothing(far: Remote, tmp_path: Path) -> None:
    h = far.host("far1")
    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                   check=True)
    r = far("machine", "add", "far1", "--ssh", h.target, "--identity", str(stranger))
    assert r.code == 1 and f"authentication failed for user {h.user}" in r.err, r.err
    assert _machines(far) == []


@pytest.mark.parametrize("flag", ["--ssh-agent"])
def test_ssh_agent_is_opt_in_and_recorded(far: Remote, tmp_path: Path, flag: str) -> None:
    """With --ssh-agent and no identity file, the operator's agent logs in."""
    h = far.host("far1")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        env = far.s.env(SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", str(far.hosts.client_key)], env=env, check=True,
                       capture_output=True)
        r = far.s("machine", "add", "far1", "--ssh", h.target, flag, env=env)
        assert r.code == 0, r.err
        assert far.ok("machine", "show", "far1", "--json").json()["ssh_agent"] is True
        r = far.s("machine", "deliver", "far1", env=env)
        assert r.code == 0, r.err
        # Without the agent, the same machine cannot log in (nothing else was given).
        r = far("machine", "deliver", "far1")
        assert r.code == 1 and "authentication failed" in r.err, r.err
    finally:
        agent.terminate()
        agent.wait(10)


def test_two_workspaces_sharing_a_runner_account_keep_their_own_launchers(
        far: Remote, tmp_path: Path) -> None:
    """Each workspace installs under its own ~/.saphan/w-<id>: a second
    install delivering to the same account leaves the first one's launcher
    (and its signed row) as they were."""
    far.ready("far1")
    h = far.host("far1")
    first = far.launcher_path("far1")
    before = h.far_path(first).read_bytes()
    other = Saphan(tmp_path / "second")
    other.ok("init", "--database-url", "sqlite")
    other.ok("machine", "add", "far1", "--ssh", h.target, "--identity", str(far.hosts.client_key))
    other.ok("machine", "deliver", "far1", "--probe")
    second = Path(other.ok("machine", "show", "far1", "--json").json()
                  ["facts"]["launcher"]["value"]["path"])
    assert second != first and second.parent.parent != first.parent.parent
    assert h.far_path(first).read_bytes() == before and h.far_path(second).exists()
    wd = h.mkdir("two/wd")
    far.ok("run", "--machine", "far1", "--slot", "s1", "--workdir", str(wd), "--", "true")


def test_proxy_jump_through_a_second_test_host(far: Remote, tmp_path: Path) -> None:
    """far2 lets the client key in only from far1's address; ~/.ssh/config
    reaches it with ProxyJump through far1. Both host keys are pinned, and
    delivery, probe and a run all go through the jump."""
    jump, target = far.host("far1"), far.host("far2")
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    was = forward.read_text()
    keys = target.cfg / "authorized_keys"
    allowed = keys.read_text()
    routes = [(jump.netns, f"{target.addr}/32", jump.host_addr),
              (target.netns, f"{jump.addr}/32", target.host_addr)]
    try:
        forward.write_text("1\n")
        for ns, dest, via in routes:
            subprocess.run(["ip", "-n", ns, "route", "add", dest, "via", via], check=True)
        keys.write_text(f'from="{jump.addr}" {allowed}')
        conf = tmp_path / "ssh_config"
        conf.write_text(f"Host jumper\n  HostName {jump.addr}\n  User {jump.user}\n"
                        f"Host behind\n  HostName {target.addr}\n  User {target.user}\n"
                        f"  ProxyJump jumper\n  IdentityFile {far.hosts.client_key}\n")
        # Directly, far2 refuses the key (the from= restriction): the jump is what works.
        r = far("machine", "add", "direct", "--ssh", target.target, "--identity",
                str(far.hosts.client_key))
        assert r.code == 1 and "authentication failed" in r.err, r.err
        r = far.ok("machine", "add", "far2", "--ssh", "behind", "--ssh-config", str(conf))
        assert f"through jump host {jump.user}@{jump.addr}:22: pinned host key " \
               f"{jump.fingerprint()}" in r.out
        shown = far.ok("machine", "show", "far2", "--json").json()
        assert shown["proxy_jump"].startswith(f"{jump.user}@{jump.addr}:22 ssh-ed25519 ")
        far.ok("machine", "deliver", "far2", "--probe")
        far.ok("slot", "add", "far2", "s1", "--tool", "command")
        wd = target.mkdir("jump/wd")
        far.ok("run", "--machine", "far2", "--slot", "s1", "--workdir", str(wd), "--",
               "sh", "-c", "echo via-jump > out.txt")
        assert target.far_path(wd / "out.txt").read_text() == "via-jump\n"
    finally:
        keys.write_text(allowed)
        for ns, dest, via in routes:
            subprocess.run(["ip", "-n", ns, "route", "del", dest, "via", via], check=False)
        forward.write_text(was)


def test_a_runner_without_sha256sum_uses_shasum_and_one_with_neither_is_named(
        far: Remote) -> None:
    """The digest tool is found, not assumed: `shasum -a 256` where
    `sha256sum` is absent (recorded), and a runner with neither is told so.
    The tools are hidden in far3's own view only (a non-executable file bound
    over each), and given back after."""
    far.ready("far3")
    h = far.host("far3")
    wd = h.mkdir("digest/wd")
    wrapper = h.cfg / "bin" / "sha256sum"
    saved = wrapper.read_bytes()
    hidden: list[str] = []

    def hide(tool: str) -> None:
        h.in_view("mount", "--bind", "/dev/null", tool)
        hidden.append(tool)

    try:
        wrapper.unlink()
        hide("/usr/bin/sha256sum")
        far.ok("run", "--machine", "far3", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert far.record()["preflight"]["digest_tool"] == "shasum -a 256"
        hide("/usr/bin/shasum")
        r = far("run", "--machine", "far3", "--slot", "s1", "--workdir", str(wd), "--", "true")
        assert r.code == 3 and "refused [digest-mismatch]: far3 has no SHA-256 tool" in r.err, r.err
        r = far("machine", "deliver", "far3")
        assert r.code == 1 and "far3 has no SHA-256 tool" in r.err, r.err
        assert Path("/usr/bin/sha256sum").stat().st_size > 0  # the control plane's is untouched
    finally:
        for tool in reversed(hidden):
            h.in_view("umount", tool, check=False)
        wrapper.write_bytes(saved)
        wrapper.chmod(0o755)
    far.ok("run", "--machine", "far3", "--slot", "s1", "--workdir", str(wd), "--", "true")
    assert far.record()["preflight"]["digest_tool"] == "sha256sum"


def test_an_encrypted_identity_is_opened_with_a_passphrase_asked_on_a_terminal(
        far: Remote, tmp_path: Path) -> None:
    """On a terminal the passphrase is asked for (never echoed, never
    stored); a wrong one is named as such."""
    import os
    import pty
    import time

    h = far.host("far1")
    enc = tmp_path / "id_encrypted"
    shutil.copy(far.hosts.client_key, enc)
    enc.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", str(enc)],
                   check=True)

    def add(name: str, passphrase: str) -> tuple[int, str]:
        pid, fd = pty.fork()
        if pid == 0:  # the child: saphan on a terminal
            os.execvpe(saphan_exe(), [saphan_exe(), "machine", "add", name, "--ssh", h.target,
                                      "--identity", str(enc)], far.s.env())
        seen = b""
        deadline = time.monotonic() + 60
        sent = False
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            if not sent and b"passphrase for" in seen:
                os.write(fd, passphrase.encode() + b"\n")
                sent = True
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")

    code, out = add("wrong", "not-it")
    assert code == 1 and "the passphrase given was wrong" in out, out
    assert "not-it" not in out  # never echoed
    assert _machines(far) == []
    code, out = add("far1", "secret")
    assert code == 0, out
    assert "secret" not in out
    assert _machines(far) == ["far1"]
