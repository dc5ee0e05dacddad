"""SSH test hosts: a network namespace and a mount namespace each, joined to
this host by a veth pair on its own 10.x address, each running its own real
OpenSSH ``sshd`` (from Debian's openssh-server) with host keys generated for
this session.

Hosts apart. A far host does not share this machine's filesystem: its sshd —
and so everything its far user runs — sees an overlay over ``/`` (lower: this
machine's root filesystem, read through; upper and work: a tmpfs in the
host's own temp dir), a fresh ``/tmp``, ``/run`` and ``/dev/shm``, a fresh
``/proc``. Whatever the far user writes (its home, ``~/.saphan``, ``/tmp``)
lands in that host's upper layer, never on the control plane, so a test can
tell a far path from a near one. The view is held by a keeper process (a
``sleep`` that is the mount namespace's first process); sshd is started into
it with ``nsenter``, so a restarted sshd (``rekey``) finds the same far
filesystem. The control plane reaches the far view through the keeper:
``far_path(p)`` is ``/proc/<keeper>/root/p`` (for reading and planting far
files in assertions), and ``as_user`` runs a command as the far user inside
the far view (``nsenter`` into the keeper's mount and network namespaces and
root). sshd's own files (config, host key, authorized key, the sha256sum
wrapper) live in the host's ``cfg`` dir on the control plane, bound
read-only into the far view at ``/etc/saphan-testhost``.

Far users. Each host logs in its own unprivileged account, created here with
``useradd`` (and removed at teardown); its home, ``/home/<user>``, exists only
in that host's far view. Not root: a far root could write anywhere regardless
of the boundary. An unprivileged user makes "refused outside the workdir" the
boundary's doing, not a permissions accident.

Kernels. ``HostSet.add(name, landlock=...)`` adds a host whose sshd runs
under a seccomp filter (tests/helpers/no_landlock.c, compiled here): with
``landlock="none"`` the Landlock system calls fail with ENOSYS (a kernel
without Landlock); with ``landlock=N`` the ABI query answers N (a kernel at
ABI N). The stand-ins TESTING.md allows for such kernels.

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
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"

#: where a host's cfg dir appears in its far view
FAR_CFG = Path("/etc/saphan-testhost")

#: the seccomp stand-in for other kernels (compiled on first use)
NO_LANDLOCK_SRC = Path(__file__).resolve().parents[2] / "helpers" / "no_landlock.c"

#: wrapper placed first on every far user's PATH (sshd SetEnv; saphan's far
#: scripts use the system's directories instead, so test_delivery also puts
#: it at /usr/local/bin): the real sha256sum, unless the user's home holds the
#: flag file — then it hashes different bytes than it was given (the test of
#: a corrupted upload).
SHA256SUM_WRAPPER = """\
#!/bin/sh
if [ -e "$HOME/.corrupt-sha256sum" ]; then
  { cat; printf corrupted; } | /usr/bin/sha256sum
else
  exec /usr/bin/sha256sum "$@"
fi
"""

#: run by the keeper (in its netns, in a new private mount namespace): the
#: overlay, the fresh mounts, the cfg bind, then pivot_root into the view.
KEEPER_SCRIPT = """\
set -eu
L="$1"; CFG="$2"; M="$L/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$L/upper,workdir=$L/work" "$M"
mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
mount --rbind /dev "$M/dev"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$M/dev/shm"
mount --rbind /sys "$M/sys"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$M/run"
mkdir -m 0755 "$M/run/sshd"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$M/tmp"
mkdir -p "$M{far_cfg}"
mount --bind "$CFG" "$M{far_cfg}"
mount -o remount,bind,ro "$M{far_cfg}"
cd "$M"
pivot_root . .
umount -l .
cd /
echo ready
exec sleep infinity </dev/null >/dev/null
""".replace("{far_cfg}", str(FAR_CFG))


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def missing_parts() -> list[str]:
    """What this machine lacks to build the hosts (empty when nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (ip netns, useradd, mount)")
    for exe in ("ip", "useradd", "userdel", "ssh-keygen", "runuser", "sha256sum", "unshare",
                "nsenter", "pivot_root", "mount", "umount"):
        if shutil.which(exe) is None:
            missing.append(exe)
    if not os.path.exists(SSHD):
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    with contextlib.suppress(OSError), open("/proc/filesystems") as f:
        if not any(line.split()[-1:] == ["overlay"] for line in f):
            missing.append("overlayfs (modprobe overlay)")
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


def kill_processes_in(mnt_ns: str, but: int) -> None:
    """SIGKILL, by pid, every process (but ``but``) in the mount namespace
    ``mnt_ns`` names — a far view these fixtures made."""
    try:
        ns = os.readlink(mnt_ns)
    except OSError:
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == but:
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                os.kill(int(entry), 9)


def _reap(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
    #: the far user's home: a far path, present only in this host's view
    home: Path
    #: this host's temp dir on the control plane (cfg, layers, logs)
    root: Path
    #: None: this kernel's Landlock; "none": ENOSYS; an int: that ABI
    landlock: str | int | None = None
    #: the seccomp stand-in (a control-plane path), when ``landlock`` is set
    helper: Path | None = None
    keeper: subprocess.Popen[bytes] | None = None
    proc: subprocess.Popen[bytes] | None = None
    layer_mounted: bool = False

    @property
    def target(self) -> str:
        return f"{self.user}@{self.addr}:22"

    @property
    def cfg(self) -> Path:
        """sshd's files, on the control plane (``FAR_CFG`` in the far view)."""
        return self.root / "cfg"

    @property
    def layer(self) -> Path:
        """The tmpfs holding the overlay's upper, work and merged dirs."""
        return self.root / "layer"

    @property
    def upper(self) -> Path:
        """The far view's upper layer: every far write lands here (but those
        to /tmp, /run and /dev/shm: fresh tmpfs mounts of the far view's own)."""
        return self.layer / "upper"

    @property
    def host_key(self) -> Path:
        return self.cfg / "ssh_host_ed25519_key"

    @property
    def data(self) -> Path:
        """A far directory owned by the far user, for workdirs and victims."""
        return self.home / "data"

    # -- the far view, from the control plane ----------------------------------
    @property
    def view_pid(self) -> int:
        """The keeper: the process whose namespaces and root are the far view."""
        if self.keeper is None or self.keeper.poll() is not None:
            raise RuntimeError(f"{self.name} has no far view (its keeper is not running)")
        return self.keeper.pid

    @property
    def view(self) -> Path:
        """The far view's root, reached from the control plane."""
        return Path(f"/proc/{self.view_pid}/root")

    def far_path(self, p: str | os.PathLike[str]) -> Path:
        """The control plane's path to far absolute path ``p`` — for a test's
        own reads and plants. (Absolute links inside resolve on the control
        plane: plant and follow them with ``as_user``.)"""
        far = Path(p)
        if not far.is_absolute():
            raise ValueError(f"far_path wants an absolute far path, got {p}")
        return self.view / far.relative_to("/")

    def in_view(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``argv`` as root in the far view (its mounts, its network, its root)."""
        return _run("nsenter", "--target", str(self.view_pid), "--mount", "--net", "--root",
                    "--wd", *argv, check=check)

    def as_user(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``argv`` as the far user, in the far view."""
        return self.in_view("runuser", "-u", self.user, "--", *argv, check=check)

    def mkdir(self, rel: str) -> Path:
        """A far directory under the far user's data dir, owned by the far user."""
        p = self.data / rel
        self.as_user("mkdir", "-p", str(p))
        return p

    def fingerprint(self) -> str:
        out = _run("ssh-keygen", "-lf", str(self.host_key) + ".pub").stdout
        return out.split()[1]

    # -- the far view ------------------------------------------------------------
    def make_view(self) -> None:
        """The overlay's layers on a tmpfs of their own, the far home in the
        upper layer, and the keeper holding the view."""
        self.layer.mkdir(mode=0o700)
        _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(self.layer))
        self.layer_mounted = True
        for d in ("upper", "work", "merged"):
            (self.layer / d).mkdir(mode=0o755)
        upper_home = self.upper / self.home.relative_to("/")
        upper_home.parent.mkdir(mode=0o755, parents=True)
        upper_home.mkdir(mode=0o755)
        os.chown(upper_home, self.uid, self.uid)
        log = open(self.root / "keeper.log", "ab")  # noqa: SIM115 - handed to the process
        self.keeper = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private",
             "sh", "-c", KEEPER_SCRIPT, "keeper", str(self.layer), str(self.cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
        )
        log.close()
        assert self.keeper.stdout is not None
        line = self.keeper.stdout.readline()
        self.keeper.stdout.close()
        if line.strip() != b"ready":
            _reap(self.keeper, signal.SIGKILL)
            raise RuntimeError(f"the far view of {self.name} was not made: "
                               f"{(self.root / 'keeper.log').read_text()[-2000:]}")
        if os.readlink(f"/proc/{self.keeper.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            raise RuntimeError(f"the keeper of {self.name} is not in a mount namespace of its own")

    def drop_view(self) -> None:
        """Every process in the far view killed (by pid: only the tests
        started them), the view released, its layers unmounted."""
        if self.keeper is not None and self.keeper.poll() is None:
            kill_processes_in(f"/proc/{self.keeper.pid}/ns/mnt", but=self.keeper.pid)
        _reap(self.keeper, signal.SIGKILL)
        self.keeper = None
        if self.layer_mounted:
            _run("umount", "-l", str(self.layer), check=False)
            self.layer_mounted = False

    # -- sshd ----------------------------------------------------------------
    def start(self) -> None:
        prefix: list[str] = []
        if self.landlock == "none":
            prefix = [str(FAR_CFG / "no_landlock")]
        elif self.landlock is not None:
            prefix = [str(FAR_CFG / "no_landlock"), "--abi", str(self.landlock)]
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - handed to the process
        self.proc = subprocess.Popen(
            ["nsenter", "--target", str(self.view_pid), "--mount", "--net", "--root", "--wd",
             *prefix, SSHD, "-D", "-e", "-f", str(FAR_CFG / "sshd_config")],
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
        _reap(self.proc)
        self.proc = None

    def rekey(self) -> None:
        """A new host key, and sshd restarted with it (in the same far view)."""
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
    """``count`` far hosts, far1..far<count>, on 10.<octet>.<i>.0/24; the
    octet is the first of ``octets`` whose /16 no other set holds. More hosts
    (other kernels among them) with :meth:`add`."""

    count: int
    octets: range = range(213, 250)
    octet: int = 0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="saphan-remote-")))
    hosts: list[FarHost] = field(default_factory=list)
    client_key: Path = field(init=False)
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    _next: int = field(default=1, init=False)
    _helper: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.client_key = self.root / "id_ed25519"

    @property
    def net(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def up(self) -> HostSet:
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "saphan-tests",
             "-f", str(self.client_key))
        for octet in self.octets:
            if _run("ip", "route", "add", "unreachable", f"10.{octet}.0.0/16",
                    check=False).returncode == 0:
                self.octet = octet
                break
        else:
            raise RuntimeError(f"no free 10.x.0.0/16 for test hosts among {self.octets}")
        try:
            for i in range(1, self.count + 1):
                self.add(f"far{i}")
        except BaseException:
            self.down()
            raise
        return self

    def helper(self) -> Path:
        """tests/helpers/no_landlock.c, compiled once for this set."""
        if self._helper is None:
            gcc = shutil.which("gcc") or shutil.which("cc")
            if gcc is None:
                raise RuntimeError("a C compiler (gcc) is needed for hosts with other kernels")
            out = self.root / "no_landlock"
            _run(gcc, "-O2", "-Wall", "-o", str(out), str(NO_LANDLOCK_SRC))
            self._helper = out
        return self._helper

    def add(self, name: str, *, landlock: str | int | None = None) -> FarHost:
        """One more far host. ``landlock``: None, the kernel's own; "none",
        no Landlock (ENOSYS); N, a kernel answering Landlock ABI N."""
        if any(h.name == name for h in self.hosts):
            raise ValueError(f"a host named {name} exists")
        if landlock is not None and landlock != "none" and not isinstance(landlock, int):
            raise ValueError(f"landlock is None, 'none' or an ABI number, not {landlock!r}")
        helper = self.helper() if landlock is not None else None
        i = self._next
        self._next += 1
        hroot = self.root / name
        hroot.mkdir(mode=0o755)
        user = f"sphfar{i}x{self.tag}"
        home = Path("/home") / user
        _run("useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-p", "*", user)
        uid = int(_run("id", "-u", user).stdout)
        h = FarHost(
            name=name, index=i, netns=f"saphan-{self.tag}-{i}",
            veth_host=f"sph{self.tag}h{i}"[:15], veth_ns=f"sph{self.tag}n{i}"[:15],
            host_addr=f"10.{self.octet}.{i}.1", addr=f"10.{self.octet}.{i}.2",
            user=user, uid=uid, home=home, root=hroot, landlock=landlock, helper=helper,
        )
        self.hosts.append(h)  # registered before anything else can fail: down() undoes it
        self._configure(h)
        _run("ip", "netns", "add", h.netns)
        _run("ip", "link", "add", h.veth_host, "type", "veth", "peer", "name", h.veth_ns)
        _run("ip", "link", "set", h.veth_ns, "netns", h.netns)
        _run("ip", "addr", "add", f"{h.host_addr}/24", "dev", h.veth_host)
        _run("ip", "link", "set", h.veth_host, "up")
        _run("ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.veth_ns)
        _run("ip", "-n", h.netns, "link", "set", h.veth_ns, "up")
        _run("ip", "-n", h.netns, "link", "set", "lo", "up")
        h.make_view()
        h.as_user("mkdir", "-p", str(h.data))
        h.start()
        return h

    def _configure(self, h: FarHost) -> None:
        """sshd's files in the host's cfg dir (``FAR_CFG`` in its view)."""
        cfg = h.cfg
        (cfg / "bin").mkdir(mode=0o755, parents=True)
        (cfg / "bin" / "sha256sum").write_text(SHA256SUM_WRAPPER)
        (cfg / "bin" / "sha256sum").chmod(0o755)
        if h.helper is not None:
            shutil.copy2(h.helper, cfg / "no_landlock")
        (cfg / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(h.host_key))
        (cfg / "sshd_config").write_text(f"""\
ListenAddress {h.addr}:22
HostKey {FAR_CFG / h.host_key.name}
PidFile /run/sshd-saphan-test.pid
AuthorizedKeysFile {FAR_CFG}/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin no
AllowUsers {h.user}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UseDNS no
PrintMotd no
MaxSessions 64
MaxStartups 64
SetEnv PATH={FAR_CFG / 'bin'}:/usr/local/bin:/usr/bin:/bin
LogLevel ERROR
""")

    def down(self) -> None:
        for h in self.hosts:
            h.stop()
            kill_processes_of(h.uid)
            h.drop_view()
            _run("ip", "link", "del", h.veth_host, check=False)
            _run("ip", "netns", "del", h.netns, check=False)
            _run("userdel", h.user, check=False)
        self.hosts.clear()
        if self.octet:
            _run("ip", "route", "del", "unreachable", self.net, check=False)
            self.octet = 0
        shutil.rmtree(self.root, ignore_errors=True)

    def __getitem__(self, name: str) -> FarHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)
