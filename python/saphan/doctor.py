"""``saphan doctor``: can this control plane confine and record runs?

One small function per check, each returning a :class:`Result`: PASS, WARN
or FAIL, what was measured, and for anything short of PASS the fix. Every
measurement is made by the code the runs themselves use, never a copy of it:
confine/compose.py's bubblewrap trial and saphan-launcher custody check,
rust/core's Landlock probe and custody clauses (through saphan._native and
custody.py), the record key's reader, the store's own methods, the agent
binaries' resolver (tools/binaries.py), and for an SSH machine its signed
rows (fleet/facts.py) and the delivered launcher's probe over the pinned
transport (site/far.py, fleet/probes.py).

Nothing is kept: the store's write check is rolled back, no migration is
applied, no fact is recorded. No network is needed but the store's and the
SSH machines' own, each bounded: the store's session by
:data:`STORE_LOCK_TIMEOUT` and :data:`STORE_STATEMENT_TIMEOUT` (a lock held
elsewhere is a FAIL, not a hang), an SSH machine by :data:`SSH_CONNECT_TIMEOUT`
and :data:`SSH_COMMAND_TIMEOUT`. :func:`checks` yields each result as it is
measured, so a slow check shows where it is.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from saphan import refusals
from saphan.errors import StoreError, TransportError, UserError
from saphan.workspace import Workspace

if TYPE_CHECKING:
    from saphan.config import Config
    from saphan.store import Store
    from saphan.store.rows import Machine, Slot

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

#: seconds the store's session waits for a lock another session holds, and
#: runs one statement, before the check FAILs (PostgreSQL's lock_timeout and
#: statement_timeout; SQLite's busy timeout is the first)
STORE_LOCK_TIMEOUT = 3.0
STORE_STATEMENT_TIMEOUT = 10.0

#: seconds an SSH machine gets to answer: to connect, then for its probe
SSH_CONNECT_TIMEOUT = 10.0
SSH_COMMAND_TIMEOUT = 20.0

#: the agent CLIs saphan composes command lines for
AGENT_TOOLS = ("claude", "codex")


class Result(NamedTuple):
    check: str
    status: str
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "detail": self.detail,
                "fix": self.fix}


def _line(text: str) -> str:
    """One line: what a tool or a far machine said may span several."""
    return " ".join(str(text).split())


def _result(check: str, status: str, detail: str, fix: str | None = None) -> Result:
    return Result(check, status, _line(detail), _line(fix) if fix else None)


def _refused(check: str, r: refusals.Refusal) -> Result:
    return _result(check, FAIL, f"[{r.cls}] {r.message}", r.remediation)


class Subject:
    """What the workspace checks share, each opened once by the check that
    measures it (None when it could not be had: that check says why)."""

    def __init__(self, home: str | os.PathLike[str] | None):
        self.workspace = Workspace.resolve(home)
        self.config: Config | None = None
        self.key: bytes | None = None
        self.store: Store | None = None
        #: None until the store's schema is read
        self.versions: list[int] | None = None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


def run(home: str | os.PathLike[str] | None = None) -> list[Result]:
    """Every check's result (:func:`checks`), once all are measured."""
    return list(checks(home))


def checks(home: str | os.PathLike[str] | None = None) -> Iterator[Result]:
    """Every check, in order, each yielded once measured: this host,
    saphan's own files, the workspace, the store, the agent CLIs, the
    machines."""
    b = bubblewrap()
    yield b
    yield bubblewrap_network(b)
    yield user_namespaces()
    yield landlock()
    yield saphan_custody()
    yield launcher_custody()
    s = Subject(home)
    try:
        yield config_file(s)
        if s.workspace.exists():
            yield record_key(s)
        if s.config is not None:
            yield store_reachable(s)
        if s.versions is not None:  # the schema was read: what a write needs, what is due
            yield store_writable(s)
            yield migrations(s)
        for tool in AGENT_TOOLS:
            yield agent(s, tool)
        yield from machines(s)
    finally:
        s.close()


# -- this host ---------------------------------------------------------------------

def _not_linux(check: str) -> Result | None:
    system = platform.system()
    if system == "Linux":
        return None
    return _result(check, WARN, f"not measured on {system or 'this OS'}: runs here are "
                   "confined by " + ("Seatbelt" if system == "Darwin" else "nothing saphan has"),
                   "none for Seatbelt runs (doctor does not measure it yet); bubblewrap and "
                   "Landlock need a Linux control plane")


def bubblewrap() -> Result:
    """bubblewrap from the trusted directories, custody held, and a sandbox
    made with it: the very trial every local run's composition makes."""
    from saphan.confine import compose

    skipped = _not_linux("bubblewrap")
    if skipped is not None:
        return skipped
    try:
        b = compose.usable_bwrap()
    except refusals.Refusal as r:
        return _refused("bubblewrap", r)
    return _result("bubblewrap", PASS, f"{b.exe} {b.version} (sha256 {b.sha256[:16]}) made a "
                   "sandbox: --unshare-user --unshare-pid --proc /proc --cap-drop ALL -- true "
                   "exited 0")


def bubblewrap_network(before: Result) -> Result:
    """The bubblewrap trial again with --unshare-net: what every ``network:
    off`` run gets (compose.usable_bwrap's own trial, asked for it)."""
    from saphan.confine import compose

    check = "bubblewrap-network"
    skipped = _not_linux(check)
    if skipped is not None:
        return skipped
    if before.status != PASS:
        return _result(check, before.status, "not tried: bubblewrap made no sandbox (above)",
                       "fix bubblewrap first (above)")
    try:
        b = compose.usable_bwrap(unshare_net=True)
    except refusals.Refusal as r:
        return _refused(check, r)
    return _result(check, PASS, f"{b.exe} made a sandbox with a network namespace of its "
                   "own, as `network: off` runs get: --unshare-user --unshare-net --unshare-pid "
                   "--proc /proc --cap-drop ALL -- true exited 0")


def _sysctl(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _unshare_user() -> str | None:
    """None when a child of this process could enter a new user namespace;
    otherwise why not (the errno's name and text)."""
    import ctypes
    import errno

    pid = os.fork()
    if pid == 0:  # the child: one syscall, then out without any cleanup
        code = 255
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            code = 0 if libc.unshare(0x10000000) == 0 else (ctypes.get_errno() or 255)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    if 0 < code < 255:
        return f"{errno.errorcode.get(code, code)} ({os.strerror(code)})"
    return f"the check itself failed (exit status {code})"


def user_namespaces() -> Result:
    """A new user namespace, made by this account: what every jail gets
    (bubblewrap's --unshare-user), measured apart from bubblewrap."""
    skipped = _not_linux("user-namespaces")
    if skipped is not None:
        return skipped
    settings = [f"{name}={value}" for name, value in (
        ("user.max_user_namespaces", _sysctl("/proc/sys/user/max_user_namespaces")),
        ("kernel.unprivileged_userns_clone",
         _sysctl("/proc/sys/kernel/unprivileged_userns_clone")),
        ("kernel.apparmor_restrict_unprivileged_userns",
         _sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")),
    ) if value is not None]
    why = _unshare_user()
    where = f"uid {os.geteuid()}; {', '.join(settings) or 'no user-namespace sysctls'}"
    if why is None:
        return _result("user-namespaces", PASS, f"unshare(CLONE_NEWUSER) succeeded ({where})")
    return _result(
        "user-namespaces", FAIL, f"unshare(CLONE_NEWUSER) failed: {why} ({where})",
        "allow user namespaces: `sysctl -w user.max_user_namespaces=15000` and, on Debian, "
        "`sysctl -w kernel.unprivileged_userns_clone=1` (on Ubuntu 24.04+, an AppArmor "
        "profile allowing userns for /usr/bin/bwrap); a container may forbid them altogether",
    )


def landlock() -> Result:
    """This kernel's Landlock ABI, by rust/core's probe (the one
    saphan-launcher measures with), against the floor saphan confines with."""
    from saphan import _native

    level, reason = _native.landlock_abi()
    floor, highest = _native.landlock_floor(), _native.landlock_highest_known()
    detail = (f"ABI {level} ({reason}; kernel {platform.release()}; floor {floor}, highest "
              f"known {highest})")
    later = ("; bubblewrap runs are unaffected, `--boundary landlock` runs here are refused "
             "until then")
    if level == 0:
        return _result("landlock", WARN, detail + later,
                       "enable Landlock in this kernel (CONFIG_SECURITY_LANDLOCK=y and "
                       "`landlock` in the lsm= boot parameter; a container may hide it)")
    if level < floor:
        return _result("landlock", WARN, detail + " (truncation is not covered below the floor)"
                       + later, f"upgrade the kernel to one with Landlock ABI >= {floor} "
                       "(Linux 6.2 or later)")
    if level > highest:
        return _result("landlock", WARN, detail + ": a level this saphan does not know",
                       "upgrade saphan (and deliver its launcher)")
    return _result("landlock", PASS, detail)


# -- saphan's own files ---------------------------------------------------------------

def saphan_custody() -> Result:
    """The files saphan runs from (console script, package directory, native
    module) by the four custody clauses: the entry check, measured again."""
    from saphan import custody

    paths = custody.entry_paths()
    text = custody.violation(paths)
    if text is None:
        return _result("saphan-custody", PASS, "custody holds for "
                       + ", ".join(f"the {role} {path}" for role, path in paths))
    lines = text.splitlines()
    message = lines[0].split(": ", 1)[-1]
    fix = lines[1].removeprefix("fix: ") if len(lines) > 1 else custody.MANDATED_SHAPE
    return _result("saphan-custody", FAIL, f"[{custody.CLASS}] {message}", fix)


def launcher_custody() -> Result:
    """saphan-launcher, found and its custody held, as every run's reaper
    requires; its version, as it reports it."""
    from saphan import launcher
    from saphan.confine import compose

    try:
        reaper = compose.usable_reaper()
    except refusals.Refusal as r:
        return _refused("launcher-custody", r)
    ident = launcher.identity()
    version = ident.version if ident is not None else "unknown"
    return _result("launcher-custody", PASS, f"{reaper.path} {version} (sha256 "
                   f"{reaper.sha256[:16]}): custody holds")


# -- the workspace and its store -------------------------------------------------------

def config_file(s: Subject) -> Result:
    """config.toml parsed and validated (config.load, config.check)."""
    from saphan import config

    ws = s.workspace
    if not ws.exists():
        return _result("config", FAIL, f"no saphan workspace at {ws.home} (no {ws.config_path})",
                       "`saphan init` (or point SAPHAN_HOME / --home at your workspace)")
    try:
        loaded = config.load(ws.config_path)
        mode = config.check(loaded)
    except UserError as e:
        detail, _, fix = str(e).partition("; fix: ")
        return _result("config", FAIL, detail,
                       fix or f"edit {ws.config_path}; `saphan config check` names the key")
    s.config = loaded
    return _result("config", PASS, f"{ws.config_path} is valid (confinement {mode}; "
                   f"{len(loaded.given)} setting(s) from the file, the rest defaults)")


def record_key(s: Subject) -> Result:
    """The record key, read through its custody checks (workspace.record_key)."""
    path = s.workspace.key_path
    try:
        s.key = s.workspace.record_key()
    except refusals.Refusal as r:
        return _refused("record-key", r)
    st = os.stat(path)
    return _result("record-key", PASS, f"{path}: {len(s.key)} bytes, owner uid {st.st_uid}, "
                   f"mode {st.st_mode & 0o7777:04o}; read after its custody checks")


def _sqlite_file(s: Subject, url: str) -> str | None:
    from saphan.store import sqlite_file

    path = sqlite_file(url, s.workspace.sqlite_path)
    return None if path is None else str(path)


def store_reachable(s: Subject) -> Result:
    """The store opened (never created, never migrated) and read."""
    from saphan.store import open_store

    assert s.config is not None
    url = s.config.database_url
    sqlite_file = _sqlite_file(s, url)
    if sqlite_file is not None and not os.path.isfile(sqlite_file):
        return _result("store", FAIL, f"the SQLite store {sqlite_file} does not exist",
                       "`saphan db migrate` creates it (or restore it from backup)")
    try:
        store = open_store(url, s.workspace.sqlite_path, migrate=False)
    except StoreError as e:
        return _result("store", FAIL, str(e), (
            f"check that {sqlite_file} is a SQLite database this account can open"
            if sqlite_file else "check that the PostgreSQL server is up and that "
            f"database.url in {s.config.path} names it (`saphan config show`)"))
    s.store = store
    try:
        store.bound_waits(STORE_LOCK_TIMEOUT, STORE_STATEMENT_TIMEOUT)
        versions = store.schema_versions()
    except StoreError as e:
        return _result("store", FAIL, f"{store.description}: connected, but its schema could "
                       f"not be read: {e}", _waited(e) or "`saphan db migrate` (it creates "
                       "saphan's tables)")
    s.versions = versions
    return _result("store", PASS, f"{store.description}: connected and read (schema version "
                   f"{max(versions, default=0)}; {_BOUNDS})")


_BOUNDS = (f"doctor's session waits at most {STORE_LOCK_TIMEOUT:g} s for a lock and "
           f"{STORE_STATEMENT_TIMEOUT:g} s for a statement")


def _waited(e: StoreError) -> str | None:
    """The fix when a statement gave up waiting (:data:`STORE_LOCK_TIMEOUT`)."""
    text = str(e)
    if not any(x in text for x in ("lock timeout", "statement timeout", "database is locked")):
        return None
    return (f"another session holds a lock on saphan's tables ({_BOUNDS}): find it "
            "(PostgreSQL: pg_locks joined to pg_stat_activity), let it finish or end it, then "
            "`saphan doctor` again")


def store_writable(s: Subject) -> Result:
    """What every command and every run write, tried inside a transaction
    that is rolled back (Store.check_writable); on PostgreSQL, what the
    role lacks named as GRANT statements (Store.missing_grants)."""
    assert s.store is not None and s.config is not None
    sqlite_file = _sqlite_file(s, s.config.database_url)
    try:
        s.store.check_writable()
    except StoreError as e:
        fix = _waited(e)
        if fix is None and sqlite_file:
            fix = (f"make {sqlite_file} and its directory writable by uid {os.geteuid()}, on "
                   "a filesystem mounted read-write")
        elif fix is None:
            try:
                grants = s.store.missing_grants()
            except StoreError:
                grants = []
            fix = ("as the tables' owner (or a superuser): " + "; ".join(grants) if grants else
                   "point database.url at the primary (not a read-only standby) and check that "
                   "its role may write saphan's tables (doctor found no privilege missing)")
        return _result("store-write", FAIL, f"a write was refused: {e}", fix)
    return _result("store-write", PASS, f"{s.store.description}: what every command and run "
                   "write went through inside a transaction, rolled back (open_store's CREATE "
                   "TABLE IF NOT EXISTS schema_migrations; a run's reads, its seat reserved, "
                   "marked running, recorded and finalised; a refused run's row)")


def migrations(s: Subject) -> Result:
    """The applied migrations against the ones this saphan knows."""
    from saphan.store.migrations import LATEST, MIGRATIONS

    assert s.versions is not None
    versions = s.versions
    known = [version for version, _, _ in MIGRATIONS]
    unknown = sorted(set(versions) - set(known))
    pending = [v for v in known if v not in versions]
    if unknown:
        return _result("migrations", FAIL, f"the store has migration(s) {unknown} this saphan "
                       f"does not know (it knows 1..{LATEST}): a newer saphan migrated it",
                       "upgrade saphan here to the version that migrated the store")
    if pending:
        return _result("migrations", WARN, f"schema at version {max(versions, default=0)}; "
                       f"pending: {pending}", "`saphan db migrate` (the next command that "
                       "opens the store applies them too)")
    return _result("migrations", PASS, f"schema at version {LATEST}: migrations "
                   f"{known[0]}..{LATEST} applied")


# -- the agent CLIs ---------------------------------------------------------------------

def _local_slots(s: Subject, tool: str) -> list[Slot]:
    """The slots of local machines that run ``tool`` (none known without a store)."""
    if s.store is None:
        return []
    try:
        local = {m.name for m in s.store.list_machines() if m.transport == "local"}
        return [x for x in s.store.list_slots() if x.tool == tool and x.machine in local]
    except StoreError:
        return []


def agent(s: Subject, tool: str) -> Result:
    """The agent CLI a local ``tool`` slot would run (tools/binaries.py):
    present, its version against the pinned one, its digest against the
    slots' pins."""
    from saphan.tools import binaries

    check = f"agent-{tool}"
    slots = _local_slots(s, tool)
    pinned = binaries.PINNED[tool]
    install = (f"`npm install --prefix {binaries.agents_dir()} --no-audit --no-fund "
               f"{binaries.NPM_PACKAGES[tool]}@{pinned}`")
    if binaries.locate(tool) is None:
        used = (f"; local slot(s) {', '.join(f'{x.machine}/{x.name}' for x in slots)} run it"
                if slots else "; no local slot runs it")
        return _result(check, FAIL if slots else WARN,
                       f"{tool} is not where saphan looks ($SAPHAN_{tool.upper()}_BIN, "
                       f"{binaries.agents_dir()}/node_modules/.bin, PATH){used}",
                       f"install the pinned version: {install}")
    try:
        found = binaries.identify(tool)
    except UserError as e:
        return _result(check, FAIL, str(e), f"reinstall the pinned version: {install}")
    for x in slots:
        if x.agent_sha256 is not None and x.agent_sha256 != found.sha256:
            return _result(
                check, FAIL, f"slot {x.machine}/{x.name} pins sha256 {x.agent_sha256}, but "
                f"{found.path} has sha256 {found.sha256}: its runs are refused (digest-mismatch)",
                f"if {found.path} is one you trust, `saphan slot set {x.machine} {x.name} "
                f"--pin-sha256 {found.sha256}`; otherwise reinstall the pinned version",
            )
    m = re.search(r"\d+(?:\.\d+)+", found.version)
    detail = (f"{found.path} reports {found.version!r} (pinned {pinned}; sha256 "
              f"{found.sha256[:16]})")
    if m is None or m.group() != pinned:
        return _result(check, WARN, detail + ": saphan composes command lines for the pinned "
                       "version", f"install the pinned version: {install}")
    return _result(check, PASS, detail)


# -- the machines -------------------------------------------------------------------------

def machines(s: Subject) -> list[Result]:
    """Each machine's signed rows; each SSH machine reached, bounded."""
    if s.store is None or s.key is None:
        return []  # the store or the key check says why
    try:
        found = s.store.list_machines()
    except StoreError as e:
        return [_result("machines", FAIL, f"the machines could not be listed: {e}",
                        "see the store and migrations checks")]
    results = [local_machine(s, m) for m in found if m.transport != "ssh"]
    far = [m for m in found if m.transport == "ssh"]
    results += [ssh_machine(s, m) for m in far]
    if not far:
        results.append(_result("ssh-machines", PASS,
                               "no SSH machines registered; nothing to reach"))
    return results


def _read_facts(s: Subject, m: Machine) -> dict[str, tuple[dict[str, object], str] | None]:
    """The machine's landlock and launcher rows, verified (fleet/facts.read):
    signature, binding to the machine as it is now, and sequence."""
    from saphan.confine.landlock_gate import FACT_KIND as LANDLOCK
    from saphan.fleet import facts
    from saphan.site.far import FACT_KIND as LAUNCHER

    assert s.store is not None and s.key is not None
    kinds = (LANDLOCK, LAUNCHER) if m.transport == "ssh" else (LANDLOCK,)
    return {kind: facts.read(s.store, s.key, s.workspace.home, m, kind) for kind in kinds}


def local_machine(s: Subject, m: Machine) -> Result:
    """A local machine's rows verify, and its Landlock row says what this
    kernel measures now."""
    from saphan import _native

    check = f"machine:{m.name}"
    try:
        row = _read_facts(s, m)["landlock"]
    except refusals.Refusal as r:
        return _refused(check, r)
    except (StoreError, OSError) as e:
        return _result(check, FAIL, f"its rows could not be read: {e}",
                       "see the store and migrations checks")
    if row is None:
        return _result(check, PASS, "local; no Landlock level recorded (only `--boundary "
                       f"landlock` runs need one: `saphan machine probe-confinement {m.name}`)")
    value, measured_at = row
    now = _native.landlock_abi()[0]
    if value.get("level") != now:
        return _result(check, WARN, f"local; its row says Landlock level {value.get('level')} "
                       f"(measured {measured_at}), this kernel measures {now} now",
                       f"`saphan machine probe-confinement {m.name}`")
    return _result(check, PASS, f"local; its Landlock row (level {now}, measured "
                   f"{measured_at}) verifies and matches this kernel")


def ssh_machine(s: Subject, m: Machine) -> Result:
    """An SSH machine: its rows verify, it is reached over its pinned host
    key within the bounds, and its delivered launcher's probe there says
    what the rows say."""
    import time

    from saphan.fleet import probes
    from saphan.site import far
    from saphan.transport.ssh import SSHConnection

    assert s.config is not None
    check = f"machine:{m.name}"
    try:
        rows = _read_facts(s, m)
    except refusals.Refusal as r:
        return _refused(check, r)
    except (StoreError, OSError) as e:
        return _result(check, FAIL, f"its rows could not be read: {e}",
                       "see the store and migrations checks")
    delivered, level_row = rows[far.FACT_KIND], rows["landlock"]
    if delivered is None:
        return _result(check, FAIL, "no saphan-launcher delivered: its runs are refused",
                       f"`saphan machine deliver {m.name} --probe`")
    if level_row is None:
        return _result(check, FAIL, "no Landlock level measured: its runs are refused "
                       "(landlock-unprobed)", f"`saphan machine probe-confinement {m.name}`")
    conn = SSHConnection(m, connect_timeout=min(s.config.ssh_connect_timeout,
                                                SSH_CONNECT_TIMEOUT),
                         command_timeout=SSH_COMMAND_TIMEOUT)
    started = time.monotonic()
    try:
        conn.connect()
        out, err, code = far.probe(conn, str(delivered[0]["path"]))
        value = probes.probe_value(m.name, m.transport, out, err, code)
        probes.check_probed_launcher(m.name, value, delivered[0])
    except refusals.Refusal as r:
        return _refused(check, r)
    except TransportError as e:
        return _result(check, FAIL, str(e),
                       f"check that {conn.where} is up and reachable from here, then "
                       f"`saphan doctor` again (bounds: {conn.connect_timeout:g} s to connect, "
                       f"{SSH_COMMAND_TIMEOUT:g} s for the probe)")
    except UserError as e:
        return _result(check, FAIL, str(e), f"`saphan machine deliver {m.name} --probe`")
    finally:
        conn.close()
    took = time.monotonic() - started
    recorded, measured_at = level_row[0].get("level"), level_row[1]
    if value["level"] != recorded:
        return _result(check, WARN, f"{conn.where} reached in {took:.1f} s; its launcher "
                       f"measures Landlock level {value['level']} now, its row says {recorded} "
                       f"(measured {measured_at})", f"`saphan machine probe-confinement {m.name}`")
    return _result(check, PASS, f"{conn.where} reached in {took:.1f} s; the delivered launcher "
                   f"(sha256 {value['launcher_sha256'][:16]}) measures Landlock level "
                   f"{value['level']}, as its row says (measured {measured_at}); rows verify")
