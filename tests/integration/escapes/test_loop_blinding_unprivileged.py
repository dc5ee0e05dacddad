"""The loop's blinding, live, with saphan run by an UNPRIVILEGED account.

tests/integration/escapes/test_loop_blinding.py runs as whoever runs the suite, which in
CI is root. As root bubblewrap creates no user namespace, and what keeps a
jailed process out of other processes' /proc entries is the capability
check (the jail has none, most root processes have all). A real operator is
usually not root: bubblewrap then puts the jail in a user namespace of its
own, and the protections rest on other kernel rules (a process in a child
user namespace holds no capability in its parent's; PR_SET_DUMPABLE).

So here an account is created for the test (useradd, removed afterwards)
and every saphan command runs as that account (setpriv), with its own
workspace, key files (0600, its own) and working directory. Besides the
routes of the root test (direct reads, grep/find, links, env and every
ancestor's environ, descriptors and memory), the authored script tries every
process of that account, among them one started OUTSIDE the jail with the
keys exported (``sleep``): its environ, its memory, and the key files through
its root (``/proc/PID/root/<key path>``), which from outside the jail leads to
the real files (a positive control shows both routes work there). It also
tries the key through the root of saphan's and bubblewrap's own processes,
writing outside through them, unmounting or re-binding the denial in a
nested user namespace, and it lists the descriptors a tool call inherits.

The one test below the line documents a route that is OPEN when saphan runs
as root: the bubblewrap parent process (uid 0, no capabilities, dumpable,
outside the jail's mount namespace) opens the host's whole filesystem through
``/proc/<its pid>/root``. It asserts what happens today, so the leak is
pinned; when the boundary closes it, that test fails and must be inverted.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import pytest

import saphan
from conftest import Saphan, require, saphan_exe
from tools.loop_routes import files_under, link_and_outside_turns
from tools.model_servers import ChatCompletionsServer

#: Runs inside the jail as a tool call. Each probe prints one line
#: ``ROUTE PID COMM: VERDICT``; a verdict is ``FOUND`` (the key's bytes were
#: read), ``WROTE`` (a file outside was written), ``open …`` (the route opened
#: but held no key) or ``denied ERRNO``. The environment is printed raw, so a
#: key there would reach the redactor (and count).
ROUTES_PY = r"""
import errno, os, sys
needle = sys.argv[1].encode()
sleeper = int(sys.argv[2])
outside = sys.argv[3]
paths = sys.argv[4:]
me = os.getpid()

def err(e):
    return "denied " + errno.errorcode.get(e.errno, str(e.errno))

def comm(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return "?"

def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

def uid_of(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None

def verdict(data):
    return "FOUND" if needle in data else f"open, {len(data)} bytes, no key"

def read(path, limit=1 << 20):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        return err(e)
    try:
        return verdict(os.read(fd, limit))
    except OSError as e:
        return "open, read " + err(e)
    finally:
        os.close(fd)

print("== env")
for k, v in sorted(os.environ.items()):
    print(f"{k}={v}")
print("== self environ")
print(open("/proc/self/environ", "rb").read().replace(b"\0", b"\n").decode(errors="replace"))

ancestors = []
p = os.getppid()
while p > 1:
    ancestors.append(p)
    p = parent(p)
mine = os.getuid()
same_user = [int(d) for d in os.listdir("/proc") if d.isdigit() and uid_of(int(d)) == mine]
targets = list(dict.fromkeys([*ancestors, sleeper, *same_user]))
for pid in targets:
    if pid == me:
        continue
    c = comm(pid)
    role = "ancestor" if pid in ancestors else "sleeper" if pid == sleeper else "same-user"
    print(f"== target {pid} {c} {role}")
    out = lambda route, v: print(f"{route} {pid} {c}: {v}")
    out("environ", read(f"/proc/{pid}/environ"))
    out("cmdline", read(f"/proc/{pid}/cmdline"))
    for path in paths:
        out("root-key", read(f"/proc/{pid}/root{path}"))
    try:
        with open(f"/proc/{pid}/root{outside}", "a") as f:
            f.write(f"written from the jail through {pid}\n")
        out("write-via-root", "WROTE")
    except OSError as e:
        out("write-via-root", err(e))
    try:
        os.listdir(f"/proc/{pid}/cwd/")
        out("cwd", "open")
    except OSError as e:
        out("cwd", err(e))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError as e:
        out("fd-list", err(e))
        fds = []
    for fd in fds:
        out(f"fd/{fd}", read(f"/proc/{pid}/fd/{fd}", 65536))
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError as e:
        out("mem", err(e))
        continue
    found = False
    for line in maps:
        addr, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in addr.split("-"))
        if not perms.startswith("r") or hi - lo > 1 << 28:
            continue
        try:
            mem.seek(lo)
            found = found or needle in mem.read(hi - lo)
        except (OSError, OverflowError, ValueError):
            continue
    out("mem", "FOUND" if found else "open, scanned, no key")
print("== done", len(targets), "targets")
"""

#: A nested user namespace holds every capability over a copy of the jail's
#: mounts: it tries to remove the denial (umount) or to look under it (a
#: non-recursive bind of the key's directory). The kernel locks mounts copied
#: into a less privileged namespace; this shows it.
NSMOUNT_PY = r"""
import ctypes, errno, os, sys
needle = sys.argv[1].encode()
key = sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)

def read(path):
    try:
        data = open(path, "rb").read()
    except OSError as e:
        return "denied " + errno.errorcode.get(e.errno, str(e.errno))
    return "FOUND" if needle in data else f"open, {len(data)} bytes, no key"

def call(what, rc):
    e = ctypes.get_errno()
    print(f"{what}: " + ("ok" if rc == 0 else "refused " + errno.errorcode.get(e, str(e))))
    return rc == 0

CLONE_NEWUSER, CLONE_NEWNS, MS_BIND, MS_REC, MNT_DETACH = 0x10000000, 0x20000, 4096, 16384, 2
if call("unshare(user+mount)", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)):
    call("umount the denial", libc.umount2(key.encode(), MNT_DETACH))
    print("key after umount:", read(key))
    os.makedirs("m", exist_ok=True)
    if call("bind the key's directory", libc.mount(os.path.dirname(key).encode(), b"m", None,
                                                   MS_BIND, None)):
        print("key under the bind:", read(os.path.join("m", os.path.basename(key))))
    if call("rbind the key's directory", libc.mount(os.path.dirname(key).encode(), b"m", None,
                                                    MS_BIND | MS_REC, None)):
        print("key under the rbind:", read(os.path.join("m", os.path.basename(key))))
print("nsmount done")
"""


# -- the account and a saphan it can run -------------------------------------------

INSTALLED_PKG = Path(saphan.__file__).resolve().parent
#: bubblewrap and git are looked up on PATH by saphan
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
CLICK_PKG = Path(click.__file__).resolve().parent


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    root: Path  # root-owned 0755, under /tmp: the account can reach it
    home: Path  # the account's, 0700
    saphan: str  # a console script the account can execute
    python: str  # the interpreter behind it (the loop runs on it)
    path: str  # PATH for the account's commands

    def argv(self, *argv: str, **env: str) -> list[str]:
        base = {"PATH": self.path, "HOME": str(self.home), "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1"}
        return ["setpriv", "--reuid", str(self.uid), "--regid", str(self.gid), "--init-groups",
                "--", "env", "-i", *(f"{k}={v}" for k, v in {**base, **env}.items()), *argv]

    def run(self, *argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*argv, **env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, cwd="/")

    def own(self, *paths: Path) -> None:
        for p in paths:
            os.chown(p, self.uid, self.gid)


def _sh(*argv: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(argv)} -> {p.returncode}: {p.stderr}"


def _runs_as(acct: Account, exe: str) -> bool:
    try:
        return acct.run(exe, "--version", timeout=60).returncode == 0
    except OSError:
        return False


def _saphan_for(acct: Account) -> Account:
    """The installed console script when the account can run it; otherwise a
    root-owned venv (under the account-reachable root) holding a copy of the
    installed package, on an interpreter the account can execute. (On the
    development machines the install lives under pyenv in a 0700 /root, which
    no other account can enter; loosening /root was rejected in
    tests/test_custody.py for the same reason.) A venv is a supported install:
    the loop runs on the venv's own bin/python (saphan.loop.adapter)."""
    exe = saphan_exe()
    with open(exe, "rb") as f:
        shebang = f.readline().decode(errors="replace")
    interp = shebang[2:].split()[0] if shebang.startswith("#!") else sys.executable
    direct = replace(acct, saphan=exe, python=interp,
                     path=f"{os.path.dirname(exe)}:{SYSTEM_PATH}")
    if os.path.isfile(interp) and _runs_as(direct, exe):
        return direct
    tried = []
    for py in dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3",
                             "/usr/local/bin/python3"]):
        if not os.path.isfile(py):
            continue
        probe = acct.run(py, "-c", "import sys, venv; sys.exit(sys.version_info < (3, 11))")
        if probe.returncode != 0:
            tried.append(f"{py}: exit {probe.returncode} {probe.stderr.strip()[-200:]}")
            continue
        venv = acct.root / "venv"
        _sh(py, "-m", "venv", "--without-pip", str(venv))
        vpy = str(venv / "bin" / "python")
        purelib = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(INSTALLED_PKG, Path(purelib) / "saphan", ignore=ignore)
        shutil.copytree(CLICK_PKG, Path(purelib) / "click", ignore=ignore)
        script = venv / "bin" / "saphan"
        script.write_text(f"#!{vpy}\nimport sys\nfrom saphan.entry import main\nsys.exit(main())\n")
        script.chmod(0o755)
        built = replace(acct, saphan=str(script), python=vpy, path=f"{venv / 'bin'}:{SYSTEM_PATH}")
        if _runs_as(built, str(script)):
            return built
        tried.append(f"{py}: the venv's saphan does not run as {acct.name}")
        shutil.rmtree(venv)
    require(False, f"a saphan that the unprivileged account {acct.name} can run "
                   f"(installed: {exe}; tried: {'; '.join(tried) or 'no python3 >= 3.11'})")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    require(os.geteuid() == 0, "root (the test creates an account and runs saphan as it)")
    for tool in ("useradd", "userdel", "setpriv"):
        require(shutil.which(tool) is not None, f"`{tool}` (passwd / util-linux)")
    require(shutil.which("bwrap") is not None, "bubblewrap (apt-get install bubblewrap)")
    root = Path(tempfile.mkdtemp(prefix="saphan-unpriv-"))  # not pytest's 0700 tmp dir
    os.chmod(root, 0o755)
    name = f"sphl{secrets.token_hex(3)}"
    home = root / "home"
    made = False
    try:
        _sh("useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
            "--user-group", name)
        made = True
        pw = pwd.getpwnam(name)
        home.mkdir()
        os.chown(home, pw.pw_uid, pw.pw_gid)
        os.chmod(home, 0o700)
        acct = Account(name, pw.pw_uid, pw.pw_gid, root, home, "", "", SYSTEM_PATH)
        bw = acct.run("bwrap", "--ro-bind", "/", "/", "--", "true", timeout=60)
        require(bw.returncode == 0,
                "bubblewrap for an unprivileged account (unprivileged user namespaces): "
                f"`bwrap --ro-bind / / true` as {name} -> {bw.returncode}: {bw.stderr.strip()}")
        yield _saphan_for(acct)
    finally:
        if made:
            subprocess.run(["userdel", "--force", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _results(srv: ChatCompletionsServer) -> dict[tuple[str, str], str]:
    """(tool name, canonical arguments) -> the result the loop sent back."""
    results = {m["tool_call_id"]: str(m["content"]) for m in srv.requests[-1]["messages"]
               if m.get("role") == "tool"}
    out = {}
    for m in srv.requests[-1]["messages"]:
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = json.dumps(json.loads(fn["arguments"]), sort_keys=True)
            out[(fn["name"], args)] = results.get(call["id"], "")
    return out


def _lines(text: str, route: str, pid: int) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{route} {pid} ")]


@pytest.mark.slow
def test_unprivileged_operator_no_route_reveals_a_lane_credential(account: Account) -> None:
    a = account
    top = Path(tempfile.mkdtemp(dir=a.home))
    a.own(top)
    secret = "sk-saphan-" + secrets.token_hex(24)
    other_secret = "sk-other-" + secrets.token_hex(24)
    partial = secret[10:42]
    creds = top / "creds"
    creds.mkdir(mode=0o700)
    active_key, other_key = creds / "active.key", creds / "other.key"
    for path, value in ((active_key, secret), (other_key, other_secret)):
        path.write_text(value + "\n")
        path.chmod(0o600)
    ws = top / "ws"
    lanes_file = ws / "lanes.toml"
    wd = top / "wd"
    wd.mkdir()
    outside = top / "outside.txt"
    outside.write_text("original\n")
    a.own(creds, active_key, other_key, wd, outside)

    def saphan_ok(*args: str) -> None:
        r = a.run(a.saphan, *args, SAPHAN_HOME=str(ws))
        assert r.returncode == 0, f"saphan {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"

    # A process of the same account, OUTSIDE any jail, with both keys exported.
    sleeper = subprocess.Popen(a.argv("sleep", "300", OPENAI_API_KEY=secret,
                                      OTHER_LANE_KEY=other_secret), stdin=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if Path(f"/proc/{sleeper.pid}/comm").read_text().strip() == "sleep":
                break
            time.sleep(0.05)
        # Positive control: outside the jail those routes DO lead to the key.
        env_ctl = a.run("cat", f"/proc/{sleeper.pid}/environ")
        root_ctl = a.run("cat", f"/proc/{sleeper.pid}/root{active_key}")
        assert f"OPENAI_API_KEY={secret}" in env_ctl.stdout, env_ctl.stderr
        assert root_ctl.stdout.strip() == secret, root_ctl.stderr

        routes_argv = [a.python, "routes.py", partial, str(sleeper.pid), str(outside),
                       str(active_key), str(other_key), str(lanes_file)]
        nsmount_argv = [a.python, "nsmount.py", partial, str(active_key)]
        grep_argv = ["grep", "-r", "-F", partial, str(top)]
        find_argv = ["find", str(top), "-type", "f", "-exec", "grep", "-l", "-F", partial, "{}", "+"]
        script: list[Any] = [
            ("calls", [("read_file", {"path": str(active_key)}),
                       ("read_file", {"path": str(other_key)}),
                       ("read_file", {"path": str(lanes_file)})]),
            ("calls", [("run_command", {"argv": ["cat", str(active_key), str(other_key)]}),
                       ("run_command", {"argv": grep_argv}),
                       ("run_command", {"argv": find_argv})]),
            ("calls", [("write_file", {"path": "routes.py", "content": ROUTES_PY}),
                       ("run_command", {"argv": routes_argv, "timeout": 120}),
                       ("write_file", {"path": "nsmount.py", "content": NSMOUNT_PY}),
                       ("run_command", {"argv": nsmount_argv, "timeout": 60}),
                       ("run_command", {"argv": ["ls", "-l", "/proc/self/fd/"]})]),
            *link_and_outside_turns(active_key, outside),
            ("calls", [("finish", {"summary": "looked everywhere"})]),
        ]
        with ChatCompletionsServer(script) as srv:
            saphan_ok("init")
            saphan_ok("lane", "add", "active", "--base-url", f"{srv.base_url}/v1", "--model",
                      "m-local", "--credential-file", str(active_key))
            saphan_ok("lane", "add", "other", "--base-url", "http://127.0.0.1:9/v1", "--model",
                      "m2", "--credential-file", str(other_key), "--credential-env",
                      "OTHER_LANE_KEY")
            saphan_ok("machine", "add", "here", "--local")
            saphan_ok("slot", "add", "here", "lp", "--tool", "loop")
            # The operator's shell exports both keys, one under an unrelated name.
            r = a.run(a.saphan, "run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
                      "--lane", "active", "--prompt", "find the key", "--json", timeout=300,
                      SAPHAN_HOME=str(ws), OPENAI_API_KEY=secret, OTHER_LANE_KEY=other_secret,
                      SOME_OTHER_NAME=secret, LC_IDENTIFICATION="saphan-visible-marker")
            results = _results(srv)
            auth = [h.get("Authorization") for h in srv.headers]
            bodies = list(srv.bodies)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)

    def result(name: str, **args: Any) -> str:
        return results[(name, json.dumps(args, sort_keys=True))]

    # Who ran it, and the channel: the key crossed, to the one place it belongs.
    assert rec["enforced_by"]["mechanism"] == "bubblewrap"
    assert auth == [f"Bearer {secret}"] * len(bodies) and len(bodies) == len(script)
    assert rec["loop"]["end"] == "finished"
    assert rec["loop"]["tool_calls"] == len(results) + 1  # + finish
    # The boundary held by itself: the last-line filter never fired.
    assert rec["loop"]["redactions"] == 0
    assert {str(active_key), str(other_key), str(lanes_file)} <= set(
        rec["blinding"]["read_denied"])

    # Direct reads, searches, links: as in the root test.
    for path in (active_key, other_key, lanes_file):
        got = result("read_file", path=str(path))
        assert got == "" or got.startswith("error:"), got
    assert not result("run_command", argv=["cat", str(active_key), str(other_key)]).startswith(
        "exit 0")
    own = {str(ws / "runs" / rec["id"] / "out" / "transcript.jsonl"),
           str(ws / "runs" / rec["id"] / "stdout.log")}
    grep = result("run_command", argv=grep_argv)
    assert f"{active_key}: Permission denied" in grep, grep
    hits = [line for line in grep.splitlines()[1:] if partial in line]
    assert hits and all(line.split(":", 1)[0] in own for line in hits), grep
    found = result("run_command", argv=find_argv)
    assert {line for line in found.splitlines()[1:] if not line.startswith("grep:")} <= own, found
    assert not result("run_command", argv=["ln", str(active_key), "link.key"]).startswith("exit 0")
    assert result("read_file", path="link.key").startswith("error:")
    via_symlink = result("read_file", path="sym.key")
    assert via_symlink == "" or via_symlink.startswith("error:"), via_symlink

    # The authored script ran, saw the environment, and reached every process.
    routes = result("run_command", argv=routes_argv, timeout=120)
    assert routes.startswith("exit 0") and "== done" in routes, routes
    assert "LC_IDENTIFICATION=saphan-visible-marker" in routes, routes  # the env route printed
    for name in ("OPENAI_API_KEY", "OTHER_LANE_KEY", "SOME_OTHER_NAME"):
        assert name not in routes, name
    targets = {int(line.split()[2]): line.split()[3] for line in routes.splitlines()
               if line.startswith("== target ")}
    assert sleeper.pid in targets, routes
    engine = [pid for pid, comm in targets.items() if comm == "saphan"]
    bwrap = [pid for pid, comm in targets.items() if comm == "bwrap"]
    # The jail has its own PID namespace: the engine and the same-user sleeper
    # outside are not even visible (every route to the sleeper's pid fails);
    # bubblewrap's init is pid 1 inside it, and holds nothing of the key.
    assert not engine and bwrap == [1], targets
    assert "FOUND" not in routes and "WROTE" not in routes, routes  # nothing leaked
    for pid, routes_of in ((sleeper.pid, ("environ", "root-key", "mem", "write-via-root")),
                           (1, ("root-key", "write-via-root"))):
        for route in routes_of:
            got = _lines(routes, route, pid)
            assert got and all(": denied " in line for line in got), (route, pid, got)
    # The loop itself (the tool call's parent, the first target) is not dumpable.
    loop_pid = next(iter(targets))
    assert all(": denied " in line for line in _lines(routes, "mem", loop_pid)), routes

    # A nested user namespace cannot lift or look under the denial.
    ns = result("run_command", argv=nsmount_argv, timeout=60)
    assert ns.startswith("exit 0") and "nsmount done" in ns and "FOUND" not in ns, ns
    for line in ns.splitlines():
        if line.startswith(("umount the denial:", "bind the key's directory:")):
            assert "refused" in line, ns

    # The descriptors a tool call starts with: stdin /dev/null, the output pipe.
    fds = result("run_command", argv=["ls", "-l", "/proc/self/fd/"])
    entries = {line.split()[-3]: line.split()[-1] for line in fds.splitlines() if " -> " in line}
    assert set(entries) == {"0", "1", "2", "3"} and entries["0"] == "/dev/null", fds
    assert entries["1"].startswith("pipe:") and entries["1"] == entries["2"], fds

    # Writes outside are refused, directly and through any process's root.
    assert result("write_file", path=str(outside), content="overwritten\n").startswith("error:")
    assert outside.read_text() == "original\n"
    assert (wd / "inside.txt").read_text() == "made inside\n"

    # The key's bytes appear nowhere: requests, transcript, record, logs, files.
    for value in (secret, other_secret):
        needle = value.encode()
        assert all(needle not in b for b in bodies)
        assert needle not in r.stdout.encode() and needle not in r.stderr.encode()
        for f in files_under(ws, wd):
            assert needle not in f.read_bytes(), f
    transcript = Path(rec["loop"]["transcript"]).read_text()
    assert "routes.py" in transcript and partial in transcript  # it is the real transcript


# -- KNOWN LEAK (saphan run as root) -------------------------------------------------

ROOT_ESCAPE_SH = r"""
p=$PPID
while [ "$p" -gt 1 ]; do
  c=$(cat /proc/$p/comm)
  if v=$(cat /proc/$p/root$1 2>/dev/null) && [ -n "$v" ]; then
    case "$v" in *"$2"*) echo "root-key $p $c: FOUND";; *) echo "root-key $p $c: open, no key";; esac
  else echo "root-key $p $c: denied"; fi
  if echo "written from the jail through $p" 2>/dev/null > /proc/$p/root$3; then
    echo "write-via-root $p $c: WROTE"
  else echo "write-via-root $p $c: denied"; fi
  p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
done
"""


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_as_root_no_ancestor_root_opens_the_host_filesystem(
    saphan_sqlite: Saphan, tmp_path: Path
) -> None:
    """Run as root, bubblewrap creates no user namespace unless told to; its
    parent process (outside the jail's mount namespace) drops every
    capability and makes itself dumpable again, so a jailed uid 0 without
    capabilities passed the ptrace check on it, and ``/proc/<bwrap>/root``
    was the host's root: the hidden key file read in full, and files outside
    the writable set could be written (measured before the fix). The
    renderer now gives every jail its own user namespace (``--unshare-user``):
    across user namespaces the check fails. Every ancestor's root is closed,
    for reading the key and for writing outside."""
    require(os.geteuid() == 0, "root (the route existed only when saphan runs as root)")
    s = saphan_sqlite
    secret = "sk-saphan-" + secrets.token_hex(24)
    key = tmp_path / "active.key"
    key.write_text(secret + "\n")
    key.chmod(0o600)
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    argv = ["sh", "escape.sh", str(key), secret[10:42], str(outside)]
    script: list[Any] = [
        ("calls", [("write_file", {"path": "escape.sh", "content": ROOT_ESCAPE_SH}),
                   ("run_command", {"argv": argv})]),
        ("calls", [("finish", {"summary": "out"})]),
    ]
    with ChatCompletionsServer(script) as srv:
        s.ok("lane", "add", "active", "--base-url", f"{srv.base_url}/v1", "--model", "m",
             "--credential-file", str(key))
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd), "--prompt", "p",
              "--json", timeout=180)
        out = srv.tool_results()[1]
        bodies = list(srv.bodies)
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert rec["enforced_by"]["mechanism"] == "bubblewrap" and rec["loop"]["redactions"] == 0
    assert "--unshare-user" in rec["boundary_argv"]
    assert out.startswith("exit 0\n"), out
    lines = out.splitlines()[1:]
    comms = {line.split(":")[0].split()[2] for line in lines}
    # The walk reached the jail's reaper (saphan-launcher); the engine is not
    # visible from inside the jail's own PID namespace.
    assert "saphan-launcher" in comms and "saphan" not in comms, out
    assert lines and all(line.endswith(": denied") for line in lines), out
    assert outside.read_text() == "original\n"
    assert all(secret.encode() not in b for b in bodies)
