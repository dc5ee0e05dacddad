"""SSH test hosts: a network namespace each, joined to this host by a veth
pair on its own 10.x address, each running its own real OpenSSH ``sshd``
(from Debian's openssh-server) with host keys generated for this session.

Far users. Each host logs in its own unprivileged account, created here with
``useradd`` (and removed at teardown), with its own home under this
session's directory. Not root with an authorized_keys file: the namespaces
share this machine's filesystem (only the network is separate), so a far
root on every host would share one $HOME — one ~/.saphan/bin/saphan-launcher
for all of them — and would be allowed to write anywhere regardless of the
boundary. A separate unprivileged user per host gives every host a far home
of its own, and makes "refused outside the workdir" the boundary's doing,
not a permissions accident.

Safety. Every host set claims a /16 of its own (10.<octet>.0.0/16) by adding
an ``unreachable`` route for it — ``ip route add`` fails when another set
(another test or bench process on this machine) holds it, so two sets never
share addresses. That route also means a host whose veth is taken down fails
at once (``No route to host``) instead of its packets following the default
route off this machine.

Used by tests/integration/sshd/conftest.py and by bench/remote.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"

#: wrapper placed first on every far user's PATH (sshd SetEnv): the real
#: sha256sum, unless the user's home holds the flag file — then it hashes
#: different bytes than it was given (the test of a corrupted upload).
SHA256SUM_WRAPPER = """\
#!/bin/sh
if [ -e "$HOME/.corrupt-sha256sum" ]; then
  { cat; printf corrupted; } | /usr/bin/sha256sum
else
  exec /usr/bin/sha256sum "$@"
fi
"""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def missing_parts() -> list[str]:
    """What this machine lacks to build the hosts (empty when nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (ip netns, useradd)")
    for exe in ("ip", "useradd", "userdel", "ssh-keygen", "runuser", "sha256sum"):
        if shutil.which(exe) is None:
            missing.append(exe)
    if not os.path.exists(SSHD):
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    return missing


def kill_processes_of(uid: int) -> None:
    """SIGKILL, by pid, every process of ``uid`` — a far user these fixtures
    created, whose processes only the tests started."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        if str(uid) in uids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), 9)


@dataclass
class FarHost:
    name: str
    index: int
    netns: str
    veth_host: str
    veth_ns: str
    host_addr: str
    addr: str
    user: str
    uid: int
    home: Path
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"{self.user}@{self.addr}:22"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def data(self) -> Path:
        """A directory owned by the far user, for workdirs and victims."""
        return self.home / "data"

    def fingerprint(self) -> str:
        out = _run("ssh-keygen", "-lf", str(self.host_key) + ".pub").stdout
        return out.split()[1]

    def as_user(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("runuser", "-u", self.user, "--", *argv, check=check)

    def mkdir(self, rel: str) -> Path:
        """A directory under the far user's data dir, owned by the far user."""
        p = self.data / rel
        self.as_user("mkdir", "-p", str(p))
        return p

    # -- sshd ----------------------------------------------------------------
    def start(self) -> None:
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - handed to the process
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, SSHD, "-D", "-e", "-f",
             str(self.root / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited: "
                                   f"{(self.root / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((self.addr, 22), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd for {self.name} did not start listening on {self.addr}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rekey(self) -> None:
        """A new host key, and sshd restarted with it."""
        self.stop()
        for p in (self.host_key, Path(str(self.host_key) + ".pub")):
            p.unlink(missing_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key))
        self.start()

    def link_down(self) -> None:
        _run("ip", "link", "set", self.veth_host, "down")

    def link_up(self) -> None:
        _run("ip", "link", "set", self.veth_host, "up")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.addr, 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not come back on {self.addr}")


@dataclass
class HostSet:
    """``count`` far hosts on 10.<octet>.<i>.0/24 (i = 1..count); the octet is
    the first of ``octets`` whose /16 no other set holds."""

    count: int
    octets: range = range(213, 250)
    octet: int = 0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="saphan-remote-")))
    hosts: list[FarHost] = field(default_factory=list)
    client_key: Path = field(init=False)

    def __post_init__(self) -> None:
        self.client_key = self.root / "id_ed25519"

    @property
    def net(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def up(self) -> HostSet:
        tag = f"{os.getpid() % 100000}"
        os.chmod(self.root, 0o755)  # far users traverse it to reach their homes
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "saphan-tests",
             "-f", str(self.client_key))
        bindir = self.root / "bin"
        bindir.mkdir()
        (bindir / "sha256sum").write_text(SHA256SUM_WRAPPER)
        (bindir / "sha256sum").chmod(0o755)
        keys = self.root / "authorized_keys"
        keys.mkdir(mode=0o755)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        for octet in self.octets:
            if _run("ip", "route", "add", "unreachable", f"10.{octet}.0.0/16",
                    check=False).returncode == 0:
                self.octet = octet
                break
        else:
            raise RuntimeError(f"no free 10.x.0.0/16 for test hosts among {self.octets}")
        try:
            for i in range(1, self.count + 1):
                self._make(i, tag, bindir, keys)
        except BaseException:
            self.down()
            raise
        return self

    def _make(self, i: int, tag: str, bindir: Path, keys: Path) -> None:
        hroot = self.root / f"far{i}"
        hroot.mkdir(mode=0o755)
        user = f"sphfar{i}x{tag}"
        home = hroot / "home"
        _run("useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-p", "*", user)
        uid = int(_run("id", "-u", user).stdout)
        home.mkdir(mode=0o755)
        os.chown(home, uid, uid)
        h = FarHost(
            name=f"far{i}", index=i, netns=f"saphan-{tag}-{i}",
            veth_host=f"sph{tag}h{i}"[:15], veth_ns=f"sph{tag}n{i}"[:15],
            host_addr=f"10.{self.octet}.{i}.1", addr=f"10.{self.octet}.{i}.2",
            user=user, uid=uid, home=home, root=hroot,
        )
        self.hosts.append(h)  # registered before anything else can fail: down() undoes it
        h.as_user("mkdir", "-p", str(h.data))
        (keys / user).write_text(self.client_key.with_suffix(".pub").read_text())
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(h.host_key))
        (hroot / "sshd_config").write_text(f"""\
ListenAddress {h.addr}:22
HostKey {h.host_key}
PidFile {hroot}/sshd.pid
AuthorizedKeysFile {keys}/%u
StrictModes no
UsePAM no
PermitRootLogin no
AllowUsers {user}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UseDNS no
PrintMotd no
MaxSessions 64
MaxStartups 64
SetEnv PATH={bindir}:/usr/local/bin:/usr/bin:/bin
LogLevel ERROR
""")
        _run("ip", "netns", "add", h.netns)
        _run("ip", "link", "add", h.veth_host, "type", "veth", "peer", "name", h.veth_ns)
        _run("ip", "link", "set", h.veth_ns, "netns", h.netns)
        _run("ip", "addr", "add", f"{h.host_addr}/24", "dev", h.veth_host)
        _run("ip", "link", "set", h.veth_host, "up")
        _run("ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.veth_ns)
        _run("ip", "-n", h.netns, "link", "set", h.veth_ns, "up")
        _run("ip", "-n", h.netns, "link", "set", "lo", "up")
        h.start()

    def down(self) -> None:
        for h in self.hosts:
            h.stop()
            kill_processes_of(h.uid)
            _run("ip", "link", "del", h.veth_host, check=False)
            _run("ip", "netns", "del", h.netns, check=False)
            _run("userdel", h.user, check=False)
        self.hosts.clear()
        if self.octet:
            _run("ip", "route", "del", "unreachable", self.net, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def __getitem__(self, name: str) -> FarHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)
