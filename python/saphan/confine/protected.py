"""Protected entries: what other tools load or execute when someone later
opens the working tree.

A run writes its working directory. Some names at the top of a tree are not
the task's work but instructions to the next program that opens it — git's
hooks and configuration, an editor's tasks, an agent's settings and MCP
servers, a shell's start-up files. A run that changes one of them acts later,
as whoever opens the tree, outside any boundary. The anchor for the list is
sandbox-runtime's "mandatory deny" set (anthropic-experimental/sandbox-runtime,
``DANGEROUS_FILES`` / ``DANGEROUS_DIRECTORIES``); :data:`NAMES` carries every
entry of it that is loaded from a tree's root, and more.

Three uses, one list:

- :func:`carve_outs` — before the run: the protected entries that exist as
  real files or directories, to be bound read-only inside the jail so the run
  cannot change them. A name that is absent, or is a symbolic link, is not
  carved out (a read-only bind would follow the link; an absent name has
  nothing to bind): the snapshot reports what the run does to it.
- :func:`snapshot` / :func:`changes` — before and after the run: what became
  of every protected entry (created, changed, removed, type-changed), for the
  record and the terminal. Nothing is followed or executed: links are
  recorded by target, FIFOs and devices by type, files hashed within bounds.
- :func:`touched_in_tree` — at import: the paths a run's commits change whose
  first component is protected; they are not imported unless the run's
  permission class names them (``writable_protected``, schema 3).

A permission class may name protected entries a run may change
(``writable_protected``): those are not carved out and not refused at
import, and the snapshot still reports what happened to them.

Only the top of the tree is covered: a protected name in a subdirectory (a
nested repository's ``.git``, a sub-project's ``.vscode``) is not — except
at import, for the names in :data:`AT_ANY_DEPTH`: git reads those in every
directory of the repository for the paths below it, so one a run commits
in a subdirectory acts on the operator's own git commands at the top.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

NAMES: tuple[str, ...] = (
    # git: hooks (.git/hooks), configuration (core.fsmonitor, core.hooksPath,
    # core.sshCommand, aliases, filter drivers) run by the next git command in
    # the tree; in a linked worktree `.git` is a file naming the git dir, and
    # replacing it points git at a repository the run chose.
    ".git",
    # git: submodule URLs and paths, fetched and checked out by
    # `git submodule update` / `clone --recurse-submodules` (anchor list).
    ".gitmodules",
    # git: selects filter/diff/merge drivers and eol conversions for paths, so
    # it decides which configured commands run on checkout, diff and merge.
    ".gitattributes",
    # git's configuration when the tree is someone's HOME (a dotfiles
    # repository, a home directory as workdir), or when included (anchor list).
    ".gitconfig",
    # direnv: `.envrc` is a shell script sourced on `cd` once allowed;
    # `.direnv` holds its layouts (virtualenvs, bin directories put on PATH).
    ".envrc",
    ".direnv",
    # VS Code: settings (interpreter and tool paths, terminal environment),
    # tasks with `runOn: folderOpen`, launch configurations (anchor list).
    ".vscode",
    # JetBrains IDEs: run configurations, external tools, startup tasks
    # (anchor list).
    ".idea",
    # Claude Code: project settings (hooks run shell commands, permissions),
    # commands, agents — loaded by the next Claude Code session here,
    # saphan's next run included (anchor list: .claude/commands, .claude/agents).
    ".claude",
    # Claude Code: project MCP servers, commands it starts (anchor list).
    ".mcp.json",
    # Codex CLI: project configuration (.codex/config.toml: MCP servers,
    # hooks, sandbox and approval settings) loaded in a trusted project.
    ".codex",
    # Shell start-up and logout files: executed by a shell whose HOME is this
    # tree (a home directory as workdir, a dotfiles repository) (anchor list:
    # .bashrc, .bash_profile, .zshrc, .zprofile, .profile).
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".zlogout",
    # npm: the project's `.npmrc` is read by every npm command in the package
    # root — registry (where installs come from), `script-shell`,
    # `node-options` (code loaded into every node npm starts).
    ".npmrc",
    # ripgrep: flags read where RIPGREP_CONFIG_PATH points (by convention
    # ~/.ripgreprc), e.g. `--pre=COMMAND` runs a program on every file
    # searched; matters when the tree is a HOME, like the shell files (anchor list).
    ".ripgreprc",
    # Git hook managers: husky's `.husky/` (core.hooksPath points there once
    # `husky install` ran), a repository's own `.githooks/`, and pre-commit's
    # configuration (which hooks the next commit runs).
    ".husky",
    ".githooks",
    ".pre-commit-config.yaml",
    # Yarn: `.yarnrc.yml`'s yarnPath names a JavaScript file every yarn command
    # executes.
    ".yarnrc.yml",
    # Dev containers: build and lifecycle commands run when the tree is opened.
    ".devcontainer",
    # Cargo: `.cargo/config.toml` in a project sets rustc-wrapper, runners and
    # aliases that cargo runs from any directory below it.
    ".cargo",
    # When the tree is a HOME: XDG configuration (git's `.config/git/config`
    # with core.fsmonitor — measured —, fish, systemd user units), `.local`
    # (`.local/bin` on PATH, `.local/state/saphan`), and `.ssh` (config with
    # ProxyCommand, authorized_keys).
    ".config",
    ".local",
    ".ssh",
)

#: protected names git reads in every directory, not only at the top: a
#: ``sub/.gitattributes`` routes ``sub/``'s files to the operator's configured
#: filter, diff and merge drivers as the top one does (import refuses both)
AT_ANY_DEPTH: tuple[str, ...] = (".gitattributes",)

#: a regular file larger than this is compared by size, times and inode, not read
MAX_FILE_BYTES = 1 << 20
#: bytes read for digests in one snapshot; past it, files are compared like large ones
MAX_HASH_BYTES = 64 << 20
#: entries recorded under one protected name; past it the walk stops (reported)
MAX_ENTRIES = 20_000
#: directory levels below a protected name that are walked
MAX_DEPTH = 32

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat opens without waiting for a
# writer, and fstat then shows it for what it is; nothing is read from it.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: code points HFS+ ignores in names (git's is_hfs_dotgit list)
_HFS_IGNORED = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


def _check_allowed(allowed: Collection[str]) -> frozenset[str]:
    unknown = sorted(set(allowed) - set(NAMES))
    if unknown:
        raise ValueError(f"not protected names: {', '.join(map(repr, unknown))} (protected: "
                         f"{', '.join(NAMES)})")
    return frozenset(allowed)


def carve_outs(workdir: str, allowed: Collection[str],
               extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Absolute paths of the protected entries at the top of ``workdir`` that
    are real files or directories (``lstat``; a link is never followed) and
    not named in ``allowed``: to be bound read-only in the jail.

    ``workdir`` is the run's resolved working directory; ``allowed`` holds
    names from :data:`NAMES` (anything else is a ``ValueError``).
    """
    if not os.path.isabs(workdir):
        raise ValueError(f"{workdir!r} is not an absolute path")
    keep = _check_allowed(allowed)
    out: list[str] = []
    for name in (*NAMES, *extra):
        if name in keep:
            continue
        path = os.path.join(workdir, name)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            out.append(path)
    return tuple(out)


class Entry(NamedTuple):
    """One path under a protected name, as ``lstat``/``fstat`` saw it."""

    #: file, dir, symlink, fifo, socket, char-device, block-device, other
    kind: str
    #: permission bits
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    #: a regular file read within the bounds
    sha256: str | None = None
    #: a symbolic link: what it points to (never followed)
    target: str | None = None
    #: why a regular file has no digest
    note: str | None = None


class Snapshot(NamedTuple):
    """Every protected entry of a working directory at one moment."""

    workdir: str
    #: path relative to the working directory (``.vscode/settings.json``) -> entry
    entries: Mapping[str, Entry]
    #: directories whose every child is in ``entries``
    listed: frozenset[str]
    #: protected names whose walk did not finish (bound reached, unreadable)
    incomplete: Mapping[str, str] = {}


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device")):
        if test(mode):
            return name
    return "other"


def _meta(st: os.stat_result, **extra: Any) -> Entry:
    return Entry(kind=_kind(st.st_mode), mode=stat.S_IMODE(st.st_mode), size=st.st_size,
                 mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino, **extra)


class _Budget:
    def __init__(self) -> None:
        self.hash_bytes = MAX_HASH_BYTES


def _entry(dir_fd: int, name: str, st: os.stat_result, budget: _Budget) -> Entry:
    """Describe ``name`` in ``dir_fd`` without following it or blocking on it."""
    if stat.S_ISLNK(st.st_mode):
        try:
            return _meta(st, target=os.readlink(name, dir_fd=dir_fd))
        except OSError as e:
            return _meta(st, note=f"link target unreadable ({e.strerror})")
    if not stat.S_ISREG(st.st_mode):
        return _meta(st)  # directories, FIFOs, sockets, devices: by type, never opened
    if st.st_size > MAX_FILE_BYTES:
        return _meta(st, note=f"larger than {MAX_FILE_BYTES} bytes: compared by size, "
                              "times and inode")
    if st.st_size > budget.hash_bytes:
        return _meta(st, note="the snapshot's read budget is spent: compared by size, "
                              "times and inode")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        return _meta(st, note=f"unreadable ({e.strerror}): compared by size, times and inode")
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            return _meta(fst)  # swapped between lstat and open: what was opened, unread
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        read = MAX_FILE_BYTES + 1 - left
        budget.hash_bytes -= read
        if left <= 0:
            return _meta(fst, note=f"grew past {MAX_FILE_BYTES} bytes while read: compared "
                                   "by size, times and inode")
        from saphan import _native  # rust/core's SHA-256: no OpenSSL load on the run path

        return _meta(fst, sha256=_native.sha256_bytes(b"".join(chunks)))
    except OSError as e:
        return _meta(st, note=f"unreadable ({e.strerror}): compared by size, times and inode")
    finally:
        os.close(fd)


def _open_dir(root_fd: int, rel: str) -> int:
    """``rel`` under ``root_fd``, one component at a time, never through a link."""
    fd = os.dup(root_fd)
    try:
        for part in rel.split("/"):
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _content_addressed(rel: str) -> bool:
    """A git object fan-out directory (``objects/ab``) or ``objects/pack``:
    every file in it is named by the digest of its content, so it is
    recorded but not walked (it can hold most of a repository's files)."""
    parent, name = posixpath.split(rel)
    return (posixpath.basename(parent) == "objects" and rel.startswith(".git/")
            and (name == "pack" or (len(name) == 2
                                    and all(c in "0123456789abcdef" for c in name))))


def _walk(root_fd: int, name: str, entries: dict[str, Entry], listed: set[str],
          incomplete: dict[str, str], budget: _Budget) -> None:
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        incomplete[name] = f"cannot be examined ({e.strerror})"
        return
    entries[name] = _entry(root_fd, name, st, budget)
    if entries[name].kind != "dir":
        return
    count = 1
    queue = deque([name])  # breadth first: a cut-off falls on the deepest entries
    while queue:
        rel = queue.popleft()
        if _content_addressed(rel):
            continue
        try:
            fd = _open_dir(root_fd, rel)
        except OSError as e:
            incomplete.setdefault(name, f"{rel} cannot be listed ({e.strerror})")
            continue
        complete = True
        try:
            names: list[str] = []
            with os.scandir(fd) as it:
                for item in it:
                    names.append(item.name)
                    if count + len(names) > MAX_ENTRIES:
                        break
            if count + len(names) > MAX_ENTRIES:
                incomplete.setdefault(name, f"more than {MAX_ENTRIES} entries: the walk "
                                            "stopped; what lies past it is not compared")
                return
            count += len(names)
            for child in sorted(names):
                path = f"{rel}/{child}"
                try:
                    cst = os.stat(child, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    incomplete.setdefault(name, f"{path} cannot be examined ({e.strerror})")
                    complete = False
                    continue
                entries[path] = _entry(fd, child, cst, budget)
                if entries[path].kind == "dir":
                    if path.count("/") >= MAX_DEPTH:
                        # Each level is opened from the top again: a run's
                        # 10,000-deep chain must not cost saphan minutes.
                        incomplete.setdefault(name, f"deeper than {MAX_DEPTH} levels: what "
                                                    "lies below is not compared")
                        complete = False
                        continue
                    queue.append(path)
            if complete:
                listed.add(rel)
        except OSError as e:
            incomplete.setdefault(name, f"{rel} cannot be listed ({e.strerror})")
        finally:
            os.close(fd)


def snapshot(workdir: str, extra: Sequence[str] = ()) -> Snapshot:
    """Every protected entry at the top of ``workdir`` and, for directories,
    below it (breadth first, at most :data:`MAX_ENTRIES` per name).

    Nothing is followed: every name is examined with ``lstat`` relative to a
    descriptor of its directory, directories are opened ``O_NOFOLLOW`` one
    component at a time, files ``O_NOFOLLOW | O_NONBLOCK`` and ``fstat``-ed
    before a byte is read. Regular files up to :data:`MAX_FILE_BYTES` are
    hashed (SHA-256); FIFOs, sockets and devices are recorded by type only.
    Raises ``OSError`` when ``workdir`` itself cannot be opened.
    """
    root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    entries: dict[str, Entry] = {}
    listed: set[str] = set()
    incomplete: dict[str, str] = {}
    budget = _Budget()
    try:
        for name in dict.fromkeys((*NAMES, *extra)):
            _walk(root_fd, name, entries, listed, incomplete, budget)
    finally:
        os.close(root_fd)
    return Snapshot(workdir=workdir, entries=entries, listed=frozenset(listed),
                    incomplete=incomplete)


def _absent(snap: Snapshot, path: str) -> bool | None:
    """Whether ``snap`` shows ``path`` absent (None: it cannot tell).
    Iterative: a path may be as deep as a run made it."""
    if path in snap.entries:
        return False
    while True:
        parent = posixpath.dirname(path)
        if not parent:
            return path.split("/", 1)[0] not in snap.incomplete or None
        above = snap.entries.get(parent)
        if above is None:
            path = parent
            continue
        if above.kind != "dir":
            return True
        return True if parent in snap.listed else None


def _differences(a: Entry, b: Entry) -> list[str]:
    """What differs between two entries of the same kind (empty: nothing)."""
    how = ["mode"] if a.mode != b.mode else []
    if a.kind == "symlink":
        return how + (["target"] if a.target != b.target else [])
    if a.kind == "dir":
        return how  # its children are compared one by one
    if a.kind == "file" and a.sha256 is not None and b.sha256 is not None:
        return how + (["content"] if a.sha256 != b.sha256 else [])
    # Not read (large, unreadable, special): the inode change time moves on
    # every write and cannot be set back by the writer, unlike mtime.
    if (a.size, a.mtime_ns, a.ctime_ns, a.ino) != (b.size, b.mtime_ns, b.ctime_ns, b.ino):
        how.append("size, times or inode")
    return how


def changes(before: Snapshot, after: Snapshot) -> list[dict[str, Any]]:
    """What became of the protected entries between two snapshots, sorted by
    path: ``{"name": path, "what": "created" | "changed" | "removed" |
    "type-changed", "kind": ...}`` (a change says ``"how"``: mode, content,
    target, or size/times/inode for what was not read; a type change says
    ``"before"`` and ``"after"``), then ``{"name": NAME, "what": "unverified", "detail": ...}``
    for each protected name a snapshot could not walk completely — past that
    point nothing is claimed either way."""
    out: list[dict[str, Any]] = []
    for path in sorted(set(before.entries) | set(after.entries)):
        b, a = before.entries.get(path), after.entries.get(path)
        if b is not None and a is not None:
            if b.kind != a.kind:
                out.append({"name": path, "what": "type-changed", "before": b.kind,
                            "after": a.kind})
            elif how := _differences(b, a):
                out.append({"name": path, "what": "changed", "kind": a.kind, "how": how})
        elif a is not None:
            if _absent(before, path):
                out.append({"name": path, "what": "created", "kind": a.kind})
        elif b is not None and _absent(after, path):
            out.append({"name": path, "what": "removed", "kind": b.kind})
    for name in dict.fromkeys((*before.incomplete, *after.incomplete)):
        why = [f"{when}: {s.incomplete[name]}" for when, s in
               (("before the run", before), ("after the run", after)) if name in s.incomplete]
        if why:
            out.append({"name": name, "what": "unverified", "detail": "; ".join(why)})
    return out


def summarize(found: Sequence[Mapping[str, Any]], limit: int = 12) -> str:
    """One line for the terminal: the first ``limit`` changes and a count.
    Names are a run's to choose: control characters are shown escaped, never
    sent to the operator's terminal."""
    shown = [f"{printable(str(c['name']))} ({c['what']})" for c in found[:limit]]
    more = len(found) - len(shown)
    return ", ".join(shown) + (f" and {more} more (see the record)" if more > 0 else "")


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fold(name: str) -> str:
    """A name as a case-insensitive (macOS, Windows) filesystem sees it:
    without the code points HFS+ ignores, trailing dots and spaces (NTFS),
    case folded. Two names that fold alike can be the same file there."""
    return name.translate(_HFS_IGNORED).rstrip(". ").casefold()


def touched_in_tree(paths: Iterable[str], allowed: Collection[str],
                    extra: Sequence[str] = ()) -> list[str]:
    """The repository-relative ``paths`` (as ``git diff --name-only -z base
    new`` prints them) whose first component is a protected name not in
    ``allowed``, or any of whose components is one of :data:`AT_ANY_DEPTH`
    not in ``allowed``; in order, each once. Names are compared as a
    case-insensitive filesystem would (``.VSCode/x`` is ``.vscode/x`` on a
    Mac checkout)."""
    keep = {_fold(n) for n in _check_allowed(allowed)}
    guarded = {_fold(n) for n in (*NAMES, *extra)} - keep
    anywhere = {_fold(n) for n in AT_ANY_DEPTH} - keep
    out: dict[str, None] = {}
    for path in paths:
        parts = path.split("/")
        if _fold(parts[0]) in guarded or any(_fold(p) in anywhere for p in parts[1:]):
            out[path] = None
    return list(out)
