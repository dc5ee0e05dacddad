"""Custody (SPEC.md §7, issue 8): who may replace what saphan runs from.

The binary matrix runs the real entry point (``saphan.entry:main`` behind a
console script) in a child process under real accounts created here with
``groupadd``/``useradd``; the child drops privileges with setgroups/setgid/
setuid (``subprocess``'s ``user=``/``group=``/``extra_groups=``), its groups
taken from the account database with getgrouplist, as a login would.

Each row gets its own throwaway install tree, so owner and mode can be set
per row without touching the installed saphan::

    <row>/bin/saphan            console script (pip's shape; shebang below)
    <row>/lib/saphan/           a copy of the installed package (with _native)
    <row>/lib/click/            a copy of click, the one import --version needs

The console script runs its interpreter with ``-S`` (no site-packages), so the
copied tree is the only saphan it can import.

Which interpreter: the non-root accounts must be able to execute it and read
its standard library. The interpreter running these tests is preferred; when
the accounts cannot reach it (pyenv under a 0700 /root, as on the development
machines) a system ``python3`` >= 3.11 is used instead. Loosening /root for
the duration was rejected: the mode of /root is machine-wide state that a
concurrently running suite (or a crash before restoring) would see. The check
under test stats files and does not depend on which CPython runs it; the
native module is abi3, so one build loads in either. When no interpreter is
reachable the tests fail in CI (conftest.require) and skip loudly elsewhere.

Key-file custody runs through the installed ``saphan`` (init, machine show).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

import saphan
from conftest import Saphan, require, saphan_exe
from saphan import _native, custody, refusals

CLASS = "custody-binary-unsafe"
NOT_ASSERTED_PARTS = (
    "which identity is the agent",
    "the ancestors above the immediate parent directory",
    "ACLs and extended attributes",
)


# -- accounts -------------------------------------------------------------------

@dataclass(frozen=True)
class Who:
    """An identity a child process runs as."""

    label: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str = "/nonexistent"

    def caller_text(self) -> str:
        """How the check prints this caller (sorted groups, egid included)."""
        gs = sorted({self.gid, *self.groups})
        return f"caller euid {self.uid} groups [{','.join(map(str, gs))}]"


def _account(name: str) -> Who:
    pw = pwd.getpwnam(name)
    return Who(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)), pw.pw_dir)


def _unused_uid() -> int:
    uid = 1_000_000_007
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@dataclass
class World:
    root: Path  # every row's tree lives under it (root-owned, 0755)
    who: dict[str, Who]
    group_gid: int  # a group created here; `grouped` is a member, `plain` is not
    staff_gid: int
    nogroup_gid: int
    python: str = ""
    rows_built: list[str] = field(default_factory=list)


def _sh(*argv: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(argv)} -> {p.returncode}: {p.stderr}"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require(os.geteuid() == 0, "root (the custody matrix creates accounts and drops privileges)")
    for tool in ("useradd", "userdel", "groupadd", "groupdel"):
        require(shutil.which(tool) is not None, f"`{tool}` (passwd package)")
    staff = nogroup = None
    try:
        staff = grp.getgrnam("staff").gr_gid
        nogroup = grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pass
    require(staff is not None and nogroup is not None, "the `staff` and `nogroup` groups (Debian base)")
    assert staff is not None and nogroup is not None

    root = Path(tempfile.mkdtemp(prefix="saphan-custody-"))  # under /tmp, not pytest's 0700 dir
    os.chmod(root, 0o755)
    tok = secrets.token_hex(3)
    group = f"sph{tok}g"
    users: list[str] = []
    _sh("groupadd", group)
    try:
        home_plain = root / "home" / f"sph{tok}a"
        specs = {
            "plain": (f"sph{tok}a", str(home_plain), []),           # no extra groups
            "gid0": (f"sph{tok}z", "/nonexistent", ["root"]),      # a non-root member of gid 0
            "grouped": (f"sph{tok}s", "/nonexistent", ["staff", "nogroup", group]),
            "other": (f"sph{tok}o", "/nonexistent", []),           # owns foreign binaries
        }
        for name, home, extra in specs.values():
            argv = ["useradd", "--no-create-home", "--home-dir", home,
                    "--shell", "/usr/sbin/nologin", "--user-group"]
            if extra:
                argv += ["--groups", ",".join(extra)]
            _sh(*argv, name)
            users.append(name)
        who = {key: _account(spec[0]) for key, spec in specs.items()}
        home_plain.mkdir(parents=True)
        os.chmod(home_plain.parent, 0o755)
        os.chown(home_plain, who["plain"].uid, who["plain"].gid)
        os.chmod(home_plain, 0o755)
        arbitrary = _unused_uid()
        who["root"] = Who("root", 0, 0, (0,), "/root")
        # The arbitrary-uid convention (OpenShift): a uid in no account
        # database, gid 0 as its group and among its supplementary groups.
        who["arbitrary"] = Who(f"uid {arbitrary}", arbitrary, 0, (0,))
        assert 0 in who["gid0"].groups and who["gid0"].uid != 0
        assert 0 not in who["plain"].groups
        w = World(root, who, grp.getgrnam(group).gr_gid, staff, nogroup)
        w.python = _reachable_python(w)
        yield w
    finally:
        for name in users:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _env(w: World, who: Who, **extra: str) -> dict[str, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": who.home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # No workspace exists here: a verb that got as far as resolving the
        # workspace would say so.
        "SAPHAN_HOME": str(w.root / "no-workspace"),
    }
    env.update(extra)
    return env


def run_as(w: World, who: Who, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, user=who.uid, group=who.gid, extra_groups=list(who.groups),
        env=_env(w, who, **env), cwd="/", capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _reachable_python(w: World) -> str:
    """An interpreter (>= 3.11) the non-root accounts can execute (see the
    module docstring for why this is not simply sys.executable)."""
    probe = "import sys, encodings, json; sys.exit(0 if sys.version_info >= (3, 11) else 1)"
    tried = []
    for py in dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3",
                             "/usr/local/bin/python3"]):
        if not os.path.isfile(py):
            continue
        try:
            p = run_as(w, w.who["plain"], [py, "-S", "-c", probe])
        except OSError as e:
            tried.append(f"{py}: {e.strerror}")
            continue
        if p.returncode == 0:
            return py
        tried.append(f"{py}: exit {p.returncode} {p.stderr.strip()[-200:]}")
    require(False, "a python3 >= 3.11 that a non-root account can execute "
                   f"(tried: {'; '.join(tried)})")
    raise AssertionError("unreachable")


# -- throwaway install trees ----------------------------------------------------

INSTALLED_PKG = Path(saphan.__file__).resolve().parent
CLICK_PKG = Path(click.__file__).resolve().parent


@dataclass(frozen=True)
class Tree:
    base: Path

    @property
    def bin(self) -> Path:
        return self.base / "bin"

    @property
    def script(self) -> Path:
        return self.bin / "saphan"

    @property
    def lib(self) -> Path:
        return self.base / "lib"

    @property
    def pkg(self) -> Path:
        return self.lib / "saphan"

    @property
    def main_module(self) -> Path:
        return self.pkg / "__main__.py"

    @property
    def native(self) -> Path:
        found = sorted(self.pkg.glob("_native*.so"))
        assert len(found) == 1, found
        return found[0]

    def chown_all(self, uid: int, gid: int) -> None:
        os.chown(self.base, uid, gid)
        for dirpath, dirnames, filenames in os.walk(self.base):
            for n in dirnames + filenames:
                os.lchown(os.path.join(dirpath, n), uid, gid)


def make_tree(base: Path, python: str) -> Tree:
    """A copy of the installed saphan that a row may chown/chmod freely."""
    assert sorted(INSTALLED_PKG.glob("_native*.so")), f"no native module in {INSTALLED_PKG}"
    t = Tree(base)
    for d in (t.base, t.bin, t.lib):
        d.mkdir(parents=True)
        os.chmod(d, 0o755)
    # _bin (the launcher) is left out: it has its own custody check, and
    # --version reports it missing without failing.
    shutil.copytree(INSTALLED_PKG, t.pkg, ignore=shutil.ignore_patterns("_bin"))
    shutil.copytree(CLICK_PKG, t.lib / "click")
    t.script.write_text(
        f"#!{python} -S\n"
        "# A console script like pip's, importing only from this tree.\n"
        "import sys\n"
        f"sys.path.insert(0, {str(t.lib)!r})\n"
        "from saphan.entry import main\n"
        "main()\n"
    )
    os.chmod(t.script, 0o755)
    return t


# -- the matrix -------------------------------------------------------------------

Shape = Callable[[Tree, World], None]


def _none(t: Tree, w: World) -> None:
    pass


@dataclass(frozen=True)
class Row:
    id: str
    who: str
    shape: Shape
    expect: str  # "runs" | "refused" | "kernel-denied"
    clause: int = 0
    role: str = "console script"
    argv: tuple[str, ...] = ("--version",)
    module: bool = False  # run as `python -S -m saphan` instead of the console script
    measured: Callable[[Tree], Path] | None = None  # the real path the refusal names
    under_home: bool = False  # the tree is the account's own install under its $HOME


def _chmod(attr: str, mode: int) -> Shape:
    def shape(t: Tree, w: World) -> None:
        os.chmod(getattr(t, attr), mode)
    return shape


def _chown(attr: str, who: str) -> Shape:
    def shape(t: Tree, w: World) -> None:
        os.chown(getattr(t, attr), w.who[who].uid, w.who[who].gid)
    return shape


def _all(*shapes: Shape) -> Shape:
    def shape(t: Tree, w: World) -> None:
        for s in shapes:
            s(t, w)
    return shape


def _group_all(which: str) -> Shape:
    def shape(t: Tree, w: World) -> None:
        gid = {"staff": w.staff_gid, "nogroup": w.nogroup_gid, "created": w.group_gid}[which]
        t.chown_all(0, gid)  # COPY --chown=root:<group>: the whole install
    return shape


def _owned_by(who: str) -> Shape:
    def shape(t: Tree, w: World) -> None:
        t.chown_all(w.who[who].uid, w.who[who].gid)
    return shape


def _symlinked_into_writable_dir(t: Tree, w: World) -> None:
    real_dir = t.base / "real"
    real_dir.mkdir()
    os.chmod(real_dir, 0o777)
    real = real_dir / "saphan"
    t.script.rename(real)
    t.script.symlink_to(real)


ROWS = [
    # accepted shapes
    Row("root:root-0755-as-non-root", "plain", _none, "runs"),
    Row("root:staff-0755-as-staff-member", "grouped", _group_all("staff"), "runs"),
    Row("root:nogroup-0755-as-nogroup-member", "grouped", _group_all("nogroup"), "runs"),
    Row("root:root-0755-as-arbitrary-uid-gid0", "arbitrary", _none, "runs"),
    Row("root:root-0755-as-gid0-member", "gid0", _none, "runs"),
    Row("own-install-under-home-0755", "plain", _owned_by("plain"), "runs", under_home=True),
    Row("python-m-saphan-root:root-0755", "plain", _none, "runs", module=True),
    # clause 3: the group is the only reach
    Row("root:root-0550-as-gid0-member", "gid0", _chmod("script", 0o550), "refused", clause=3),
    Row("root:root-0550-as-arbitrary-uid-gid0", "arbitrary", _chmod("script", 0o550),
        "refused", clause=3),
    Row("root:group-0550-as-group-member", "grouped",
        _all(_group_all("created"), _chmod("script", 0o550)), "refused", clause=3),
    # the kernel, not the check: no execute bit at all
    Row("root:root-0550-outside-its-group", "plain", _chmod("script", 0o550), "kernel-denied"),
    Row("root:group-0550-outside-its-group", "plain",
        _all(_group_all("created"), _chmod("script", 0o550)), "kernel-denied"),
    # clause 1: another account is the custodian
    Row("owned-by-another-account", "plain", _owned_by("other"), "refused", clause=1),
    Row("root-runs-another-accounts-install", "root", _owned_by("other"), "refused", clause=1),
    Row("native-module-owned-by-another-account", "plain", _chown("native", "other"),
        "refused", clause=1, role="native module"),
    # clause 2: group or others can write it
    Row("script-0775", "plain", _chmod("script", 0o775), "refused", clause=2),
    Row("script-0757", "plain", _chmod("script", 0o757), "refused", clause=2),
    Row("script-0775-as-root", "root", _chmod("script", 0o775), "refused", clause=2),
    Row("package-dir-0777", "plain", _chmod("pkg", 0o777), "refused", clause=2,
        role="package directory"),
    Row("native-module-0775", "plain", _chmod("native", 0o775), "refused", clause=2,
        role="native module"),
    Row("python-m-main-module-0666", "plain", _chmod("main_module", 0o666), "refused",
        clause=2, role="entry module", module=True),
    Row("python-m-native-module-0757", "plain", _chmod("native", 0o757), "refused", clause=2,
        role="native module", module=True),
    # clause 4: whoever can write the parent can replace the file
    Row("parent-dir-group-writable", "plain", _chmod("bin", 0o775), "refused", clause=4),
    Row("parent-dir-other-writable", "plain", _chmod("bin", 0o757), "refused", clause=4),
    Row("parent-dir-owned-by-another-account", "plain", _chown("bin", "other"), "refused",
        clause=4),
    Row("package-parent-group-writable", "plain", _chmod("lib", 0o775), "refused", clause=4,
        role="package directory"),
    Row("script-symlinked-into-a-writable-dir", "plain", _symlinked_into_writable_dir,
        "refused", clause=4, measured=lambda t: t.base / "real" / "saphan"),
    # before flag parsing and before the workspace is resolved
    Row("refused-before-click-parses-flags", "plain", _chmod("script", 0o775), "refused",
        clause=2, argv=("--no-such-flag",)),
    Row("refused-before-the-workspace-is-resolved", "plain", _chmod("script", 0o775),
        "refused", clause=2, argv=("machine", "list")),
]

_ROLE_PATH: dict[str, Callable[[Tree], Path]] = {
    "console script": lambda t: t.script,
    "entry module": lambda t: t.main_module,
    "package directory": lambda t: t.pkg,
    "native module": lambda t: t.native,
}


def _stat_text(p: Path) -> str:
    st = os.stat(p)
    return f"{st.st_uid}:{st.st_gid} mode {stat.S_IMODE(st.st_mode):04o}"


def _assert_refused(p: subprocess.CompletedProcess[str], row: Row, t: Tree, who: Who) -> None:
    assert p.returncode == 3, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 3, p.stderr
    path = (row.measured or _ROLE_PATH[row.role])(t)
    head = f"refused [{CLASS}]: saphan's {row.role}: clause {row.clause}: "
    assert lines[0].startswith(head), lines[0]
    # The file, its owner:group and octal mode, its parent's, and the caller.
    via = f" (reached through the symbolic link {t.script})" if t.script.is_symlink() else ""
    measured = (f"; measured: {path}{via} {_stat_text(path)}, parent {path.parent} "
                f"{_stat_text(path.parent)}, {who.caller_text()}")
    assert lines[0].endswith(measured), f"{lines[0]}\n  expected to end with\n{measured}"
    fix = lines[1]
    assert fix.startswith("fix: "), fix
    assert "owned by root or by the account that runs it, mode 0755" in fix
    assert "neither group nor others can write" in fix
    assert lines[2].startswith("not asserted: "), lines[2]
    for part in NOT_ASSERTED_PARTS:
        assert part in lines[2]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_binary_custody_matrix(world: World, row: Row) -> None:
    w = world
    who = w.who[row.who]
    if row.under_home:
        base = Path(who.home) / ".saphan"
        assert not base.exists()
    else:
        base = w.root / row.id.replace(":", "_")  # PYTHONPATH splits on ':'
    t = make_tree(base, w.python)
    row.shape(t, w)
    if row.under_home:
        home = Path(who.home)
        st = home.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (who.uid, 0o755)
        assert t.script.stat().st_uid == who.uid
    extra_env: dict[str, str] = {}
    if row.module:
        argv = [w.python, "-S", "-m", "saphan", *row.argv]
        extra_env["PYTHONPATH"] = str(t.lib)
    else:
        argv = [str(t.script), *row.argv]

    if row.expect == "kernel-denied":
        # Nobody but root or a group member holds an execute bit: execve
        # fails with the kernel's EACCES and our check never runs.
        with pytest.raises(PermissionError) as denied:
            run_as(w, who, argv)
        assert denied.value.errno == errno.EACCES
        assert denied.value.filename == str(t.script)
        sh = run_as(w, who, ["/bin/sh", "-c", 'exec "$0" "$@"', *argv])
        assert sh.returncode == 126, sh
        assert sh.stderr.strip().endswith(f"{t.script}: Permission denied"), sh.stderr
        assert "refused [" not in sh.stderr and "not asserted" not in sh.stderr
        assert sh.stdout == ""
        return

    p = run_as(w, who, argv, **extra_env)
    if row.expect == "runs":
        assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        assert p.stdout.startswith(f"saphan {saphan.__version__}\n"), p.stdout
        assert "refused" not in p.stderr
        return
    assert row.expect == "refused"
    _assert_refused(p, row, t, who)


def test_the_check_runs_first_and_the_copy_is_what_runs(world: World) -> None:
    """The control for the ordering rows: the same verbs on a good tree get
    click's usage error and the missing-workspace error, so the refusals
    above did come first."""
    w = world
    t = make_tree(w.root / "ordering-control", w.python)
    who = w.who["plain"]
    p = run_as(w, who, [str(t.script), "--no-such-flag"])
    assert p.returncode == 2 and "No such option" in p.stderr, p
    p = run_as(w, who, [str(t.script), "machine", "list"])
    assert p.returncode != 3 and "no saphan workspace" in p.stderr, p
    # The copy (not the installed saphan) is what is measured and imported.
    p = run_as(w, who, [str(t.script), "--version"])
    assert "saphan-launcher: not found" in p.stdout, p.stdout  # _bin is not copied


# -- what the entry check reports, and what it imports ----------------------------

def test_entry_check_speaks_the_refusal_table(tmp_path: Path) -> None:
    assert custody.CLASS == CLASS and CLASS in refusals.CLASSES
    assert custody.EXIT_CODE == refusals.EXIT_CODE == 3
    f = tmp_path / "f"
    f.write_text("x")
    os.chmod(f, 0o775)
    found = _native.check_binary_custody_as(str(f), 4242, [4242])
    assert found is not None and found["clause"] == 2
    # The fallback text (a file that cannot be measured) is rust/core's.
    assert found["not_asserted"] == custody.NOT_ASSERTED


def test_unmeasurable_file_is_refused_not_skipped(tmp_path: Path) -> None:
    text = custody.violation([("console script", str(tmp_path / "gone"))])
    assert text is not None
    lines = text.splitlines()
    assert lines[0].startswith(f"refused [{CLASS}]: saphan's console script: the custody of ")
    assert "cannot be measured" in lines[0] and f"caller euid {os.geteuid()}" in lines[0]
    assert lines[1].startswith("fix: ") and lines[2] == custody.NOT_ASSERTED


def test_entry_check_imports_nothing_heavy() -> None:
    """It runs on every start: no click, no other saphan module."""
    code = (
        "import sys, saphan.custody as c; c.check_entry(); "
        "mods = sorted(m for m in sys.modules if m.split('.')[0] in ('saphan', 'click')); "
        "print(' '.join(mods))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd="/")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["saphan", "saphan._native", "saphan.custody"]


# -- key files --------------------------------------------------------------------

def _key_shape(case: str, other_uid: int) -> tuple[Callable[[Path], None], str]:
    """How to spoil the key for ``case``, and what the refusal must say."""
    def mode_0644(k: Path) -> None:
        os.chmod(k, 0o644)

    def symlink(k: Path) -> None:
        good = k.parent.parent / "good.key"  # owner-only, 32 bytes: a good key
        good.write_bytes(k.read_bytes())
        os.chmod(good, 0o600)
        k.unlink()
        k.symlink_to(good)

    def length(n: int) -> Callable[[Path], None]:
        def shape(k: Path) -> None:
            k.write_bytes(b"\x01" * n)
        return shape

    def foreign(k: Path) -> None:
        os.chown(k, other_uid, -1)

    return {
        "mode-0644": (mode_0644, "has mode 0644; group and others must have no access"),
        "symlink-to-a-good-key": (symlink, "is a symbolic link"),
        "31-bytes": (length(31), "is 31 bytes long; a key is exactly 32 bytes"),
        "33-bytes": (length(33), "is 33 bytes long; a key is exactly 32 bytes"),
        "owned-by-another-uid": (foreign,
                                 f"is owned by uid {other_uid}, not by the caller (euid 0)"),
    }[case]


KEY_CASES = ["mode-0644", "symlink-to-a-good-key", "31-bytes", "33-bytes", "owned-by-another-uid"]
# The verbs that read the key: init (checks it at once) and machine show (its
# signed facts). `machine list` reads no key, so it has nothing to refuse.
KEY_VERBS = [("init",), ("machine", "show", "here")]


@pytest.mark.parametrize("verb", KEY_VERBS, ids=[" ".join(v) for v in KEY_VERBS])
@pytest.mark.parametrize("case", KEY_CASES)
def test_key_file_custody(saphan_sqlite: Saphan, request: pytest.FixtureRequest,
                          case: str, verb: tuple[str, ...]) -> None:
    s = saphan_sqlite
    key = s.home / "record.key"
    s.ok("machine", "add", "here", "--local")
    # The control: the untouched key passes on this very verb.
    s.ok(*verb)
    other_uid = 0
    if case == "owned-by-another-uid":
        other_uid = request.getfixturevalue("world").who["other"].uid
    shape, needle = _key_shape(case, other_uid)
    shape(key)
    before = (key.read_bytes(), os.lstat(key))
    r = s(*verb)
    assert r.code == 3, f"{r.code}\n{r.out}\n{r.err}"
    assert r.err.startswith(f"refused [custody-key-unsafe]: key file {key} "), r.err
    assert needle in r.err, r.err
    assert "\nfix: " in r.err
    # Refused, not repaired: the key is exactly as it was.
    after = (key.read_bytes(), os.lstat(key))
    assert before[0] == after[0]
    assert (before[1].st_mode, before[1].st_uid, before[1].st_ino) == \
        (after[1].st_mode, after[1].st_uid, after[1].st_ino)


# -- install-mode census ------------------------------------------------------------

def test_install_mode_census() -> None:
    """What `ci/setup` (the README's install: `pip install .`) leaves behind is
    0755 and passes its own custody check."""
    script = Path(sysconfig.get_path("scripts")) / "saphan"
    require(script.is_file(), f"the installed console script {script} (run ci/setup)")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    p = subprocess.run([saphan_exe(), "launcher", "path"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    launcher = Path(p.stdout.strip())
    require(launcher.is_file(), "saphan-launcher (run ci/setup)")
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755
    for path in (script, INSTALLED_PKG, *INSTALLED_PKG.glob("_native*.so"), launcher):
        assert _native.check_binary_custody(str(path)) is None, path
    c = subprocess.run([str(launcher), "custody"], capture_output=True, text=True, timeout=60)
    assert c.returncode == 0 and '"custody":"pass"' in c.stdout.replace(" ", ""), c
