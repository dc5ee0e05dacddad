"""Per-run git worktrees: made before the boundary, imported after it.

``saphan run --repo PATH`` gives each run a linked worktree under
``$SAPHAN_HOME/worktrees/<run-id>``, on a DETACHED head at the base commit.
Inside the jail the repository is read-only whole (objects, refs, config,
hooks); the run commits on its own HEAD in its worktree's git dir and
writes new objects into its own object directory (``.saphan-run/objects``,
with the repository's store as a read-only alternate). Nothing it writes
reaches the repository until saphan, after the run, imports it:

1. the run's HEAD is read without following links and must be a bare
   object id (a symbolic ref is a foreign ref: not imported);
2. the run's object directory must hold only object and pack files (no
   links, no alternates of its own, nothing else);
3. a bare repository saphan makes in the run's directory borrows the run's
   objects and the repository's store, and the repository FETCHES the run's
   head from it with ``transfer.fsckObjects``: git's pack protocol re-hashes
   every object it receives and checks the commit is connected, so a forged
   or corrupt object fails the import loudly;
4. onto ``refs/heads/saphan/<run-id>`` only — unless the run's commits touch
   a protected path (confine/protected.py) its permission class does not
   name, in which case nothing is imported and the record says which;
5. the worktree's git dir is then put back into a state saphan wrote: every
   file the run could have written there is removed, HEAD names the branch,
   and the index is rebuilt from the imported commit by git itself.

Every git command saphan runs here disables hooks and fsmonitor, and reads
only the repository's own (operator's) configuration.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from saphan.confine import nofollow
from saphan.confine.grants import OBJECTS, RUN_DIR_NAME
from saphan.errors import ImportRefused, PlantedLink, UserError

BRANCH_NAMESPACE = "saphan"
EXCLUDE_LINE = f"{RUN_DIR_NAME}/"

#: git must never execute anything on saphan's behalf in these repositories
_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
         "-c", "core.commitGraph=false", "-c", "core.multiPackIndex=false",
         "-c", "pack.useBitmaps=false", "-c", "protocol.file.allow=always")
_OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: entries a run's object directory may hold (relative paths)
#: (what `git gc` leaves there too: commit-graph, bitmaps, multi-pack-index —
#: accepted as files, never read: saphan's git runs with them switched off)
_OBJECT_FILE = re.compile(
    r"^(?:[0-9a-f]{2}/[0-9a-f]{38,62}"
    r"|pack/pack-[0-9a-f]{40,64}\.(?:pack|idx|rev|keep|mtimes|bitmap)"
    r"|pack/multi-pack-index|info/packs|info/commit-graph)$")


@dataclass(frozen=True)
class RepoSpec:
    toplevel: str
    common_dir: str
    base: str  # the commit the worktree starts from (full SHA)
    base_ref: str


def _git_exe() -> str:
    """git from the trusted system directories, never PATH (confine/trusted.py)."""
    from saphan.confine import trusted

    exe = trusted.find("git")
    if exe is None:
        raise UserError(
            f"--repo needs git with safe custody in {', '.join(trusted.TRUSTED_DIRS)} (saphan "
            "never runs a git found on PATH, where a run could have planted one); install it "
            "from the system's packages (`apt-get install git`)")
    return exe


#: what saphan reads of git's listing of a run's commits, and the memory and
#: time any such git may take: a run can build a tree of 10^10 paths from a
#: dozen objects (measured: an unbounded `git log --raw` took 24 GB)
LISTING_LIMIT = 64 << 20
GIT_MEMORY_LIMIT = 4 << 30
GIT_TIME_LIMIT = 120.0


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (GIT_MEMORY_LIMIT, GIT_MEMORY_LIMIT))


def _git_bounded(*args: str, env: dict[str, str]) -> str:
    """git's stdout for a listing of what a run made, read at most
    :data:`LISTING_LIMIT` bytes, under a memory and a time limit; anything
    over is the import refused, git killed."""
    import time

    proc = subprocess.Popen([_git_exe(), *_SAFE, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, preexec_fn=_limit_memory)
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + GIT_TIME_LIMIT
    try:
        while True:
            chunk = proc.stdout.read(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > LISTING_LIMIT or time.monotonic() > deadline:
                raise ImportRefused(
                    f"the run's commits change more than git's listing saphan reads "
                    f"({LISTING_LIMIT >> 20} MiB in {GIT_TIME_LIMIT:.0f} s): not imported")
            chunks.append(chunk)
        err = proc.stderr.read(4096) if proc.stderr is not None else b""
        if proc.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
            raise ImportRefused("git could not list the run's commits (within "
                                f"{GIT_MEMORY_LIMIT >> 30} GiB): "
                                f"{err.decode(errors='replace').strip()[-300:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _git(*args: str, cwd: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_git_exe(), *_SAFE, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False, env=env)


def _git_env() -> dict[str, str]:
    """The environment for saphan's own git commands: none of the run's or a
    caller's GIT_* variables (object dirs, alternates) leak in."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def resolve_repo(repo: str, base_ref: str | None) -> RepoSpec:
    """Validate ``--repo``/``--base`` before anything is reserved or written."""
    path = os.path.abspath(os.path.expanduser(repo))
    top = _git("-C", path, "rev-parse", "--path-format=absolute", "--show-toplevel",
               "--git-common-dir", env=_git_env())
    if top.returncode != 0:
        raise UserError(f"--repo {repo}: not a git repository ({top.stderr.strip()})")
    toplevel, common = top.stdout.splitlines()[:2]
    ref = base_ref or "HEAD"
    base = _git("-C", toplevel, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
                env=_git_env())
    if base.returncode != 0:
        raise UserError(f"--base {ref}: no such commit in {toplevel}; give a branch, tag or SHA")
    return RepoSpec(os.path.realpath(toplevel), os.path.realpath(common), base.stdout.strip(), ref)


def not_carried(spec: RepoSpec, shown: int = 5) -> str | None:
    """One line naming the repository's uncommitted changes, which the run's
    worktree (made from a commit) will not have; None when the tree is clean.
    Read with ``git status`` (untracked files too, ignored ones not)."""
    got = _git("-C", spec.toplevel, "status", "--porcelain=v1", "-z", "--untracked-files=all",
               "--no-renames", env=_git_env())
    if got.returncode != 0:
        return None
    entries = [e for e in got.stdout.split("\0") if len(e) > 3]
    if not entries:
        return None
    names = ", ".join(f"{e[3:]} ({e[:2].strip()})" for e in entries[:shown])
    more = f" and {len(entries) - shown} more" if len(entries) > shown else ""
    return (f"warning: {spec.toplevel} has {len(entries)} uncommitted change(s) the run's "
            f"worktree will not carry (it starts from {spec.base_ref} = {spec.base[:12]}): "
            f"{names}{more}; commit them first to give them to the run")


def branch_for(run_id: str) -> str:
    return f"{BRANCH_NAMESPACE}/{run_id}"


def create(spec: RepoSpec, path: str, run_id: str) -> str:
    """Make the worktree at ``path``, detached at the base; returns the branch
    the run's commits will be imported onto."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    made = _git("-C", spec.toplevel, "worktree", "add", "-q", "--detach", path, spec.base,
                env=_git_env())
    if made.returncode != 0:
        raise RuntimeError(f"git worktree add failed: {made.stderr.strip()}")
    return branch_for(run_id)


def ignore_scratch(common_dir: str) -> str | None:
    """Add ``.saphan-run/`` to the repository's info/exclude once (never a
    tracked file), without following a link; returns a note when a planted
    link stopped it."""
    try:
        info = nofollow.makedirs(common_dir, "info")
        exclude = os.path.join(info, "exclude")
        try:
            text = nofollow.read_small(exclude, 1 << 20).decode("utf-8", "replace")
        except FileNotFoundError:
            text = ""
        if EXCLUDE_LINE in (line.strip() for line in text.splitlines()):
            return None
        nofollow.append_line(exclude, f"\n# saphan's per-run scratch directory\n{EXCLUDE_LINE}")
    except PlantedLink as e:
        return f"{RUN_DIR_NAME}/ was not added to info/exclude: {e}"
    return None


def tree_hooks_dir(spec: RepoSpec) -> str | None:
    """The first component of the repository's ``core.hooksPath`` when it
    lies inside the working tree (a tracked hooks directory the operator's
    next commit runs): a protected name for the run. Read from the operator's
    repository configuration, never from the run's."""
    # Without _SAFE's own core.hooksPath override, which `--get` would print;
    # `git config --get` executes nothing.
    got = subprocess.run([_git_exe(), "-C", spec.toplevel, "config", "--get", "core.hooksPath"],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=_git_env())
    value = got.stdout.strip()
    if got.returncode != 0 or not value:
        return None
    if os.path.isabs(value):
        if not (value + "/").startswith(spec.toplevel.rstrip("/") + "/"):
            return None
        value = os.path.relpath(value, spec.toplevel)
    first = os.path.normpath(value).split("/", 1)[0]
    return first if first not in ("", ".", "..") else None


def head(path: str) -> str | None:
    out = _git("-C", path, "rev-parse", "HEAD", env=_git_env())
    return out.stdout.strip() if out.returncode == 0 else None


def remove(spec: RepoSpec, path: str) -> None:
    """Remove the worktree (the branch and its commits stay in the repository)."""
    out = _git("-C", spec.toplevel, "worktree", "remove", "--force", path, env=_git_env())
    if out.returncode != 0:
        raise RuntimeError(f"git worktree remove failed: {out.stderr.strip()}")


# -- after the run -------------------------------------------------------------



def run_head(git_dir: str) -> str:
    """The run's HEAD: a bare object id, read without following links."""
    try:
        raw = nofollow.read_small(os.path.join(git_dir, "HEAD"), 256).decode("ascii").strip()
    except (PlantedLink, OSError, UnicodeDecodeError) as e:
        raise ImportRefused(f"the run's HEAD cannot be read safely: {e}") from None
    if not _OID.match(raw):
        raise ImportRefused(
            f"the run's HEAD is {raw[:80]!r}, not a commit id: a run commits on its detached "
            "HEAD; a symbolic ref is a foreign ref and is not imported")
    return raw


def check_object_dir(objects: str) -> list[str]:
    """The run's object directory holds only objects and packs; returns them."""
    found: list[str] = []
    try:
        with nofollow.open_dir(objects) as top:
            stack = [("", os.dup(top))]
            while stack:
                rel, fd = stack.pop()
                try:
                    for entry in os.scandir(fd):
                        name = f"{rel}{entry.name}"
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if rel:
                                raise ImportRefused(f"unexpected directory {name} in the run's "
                                                    "object directory")
                            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY
                                          | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                            stack.append((name + "/", sub))
                        elif stat.S_ISREG(st.st_mode) and _OBJECT_FILE.match(name):
                            found.append(name)
                        else:
                            raise ImportRefused(
                                f"{os.path.join(objects, name)} is not an object or pack file "
                                "(links, alternates and other files are not imported)")
                        if len(found) > 1_000_000:
                            raise ImportRefused("the run's object directory holds over a "
                                                "million files")
                finally:
                    os.close(fd)
    except (PlantedLink, FileNotFoundError) as e:
        raise ImportRefused(f"the run's object directory cannot be walked safely: {e}") from None
    return found


def import_run(
    spec: RepoSpec, wt_git_dir: str, workdir: str, run_dir: str, run_id: str,
    *, allowed_protected: Collection[str] = (), extra_protected: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Import the run's commits onto ``saphan/<run_id>``; always leaves the
    worktree's git dir in saphan's own state. Returns the record's account:
    ``result`` is "imported", "unchanged" or "refused" (with ``why``)."""
    from saphan.confine import protected

    branch = branch_for(run_id)
    ref = f"refs/heads/{branch}"
    out: dict[str, Any] = {"branch": branch, "base": spec.base}
    env = _git_env()
    try:
        new = run_head(wt_git_dir)
        out["run_head"] = new
        if new == spec.base:
            made = _git("-C", spec.toplevel, "update-ref", ref, spec.base, "", env=env)
            if made.returncode != 0:
                raise ImportRefused(f"git update-ref {ref}: {made.stderr.strip()}")
            out.update({"result": "unchanged", "head": spec.base, "commits": 0})
            return out
        objects = os.path.join(workdir, OBJECTS)
        out["object_files"] = len(check_object_dir(objects))
        main_objects = os.path.join(spec.common_dir, "objects")
        # The run's side: a bare repository saphan makes, borrowing the run's
        # objects and the repository's store, whose one ref is the run's head.
        source = _bare(os.path.join(run_dir, "import.git"), [objects, main_objects],
                       {"run": new})
        # A staging repository with no worktrees and the store as a read-only
        # alternate: git's verified fetch lands here (every object re-hashed,
        # fsck'd, the head's connectivity checked), never in the repository —
        # whose other worktrees' HEADs a concurrent run may point anywhere.
        stage = _bare(os.path.join(run_dir, "stage.git"), [main_objects], {"base": spec.base})
        fetched = _git("-C", stage, "-c", "transfer.fsckObjects=true",
                       "-c", "fetch.fsckObjects=true", "-c", "transfer.unpackLimit=1",
                       "-c", "fetch.unpackLimit=1", "fetch", "-q", "--no-tags",
                       "--no-write-fetch-head", "--no-recurse-submodules", "--no-auto-gc",
                       "--no-auto-maintenance", source, "refs/heads/run:refs/heads/run", env=env)
        shutil.rmtree(source, ignore_errors=True)
        if fetched.returncode != 0:
            raise ImportRefused(
                f"git fetch refused the run's objects: {fetched.stderr.strip()[-600:]}")
        got = _git("-C", stage, "rev-parse", "--verify", "--quiet", "refs/heads/run", env=env)
        if got.stdout.strip() != new:
            raise ImportRefused(f"the staged head is {got.stdout.strip()!r}, not {new}")
        # Every commit's changes, not only base..head as a whole: a file added
        # and removed again still sits in the history the branch carries.
        changed = _git_bounded("-C", stage, "log", "-m", "--no-renames", "--raw", "-z",
                               "--format=", f"{spec.base}..{new}", env=env)
        paths, gitlinks = _raw_changes(changed)
        if gitlinks:
            # A gitlink makes the operator's `git status` run git inside that
            # directory, with whatever .git/config the run left there.
            raise ImportRefused(
                "the run's commits add or change submodule entries (gitlinks): "
                f"{protected.printable(', '.join(gitlinks))}; git would run inside them for "
                "the operator; the commits stay in the run's object directory for inspection")
        touched = protected.touched_in_tree(paths, allowed_protected, extra_protected)
        if touched:
            raise ImportRefused(
                "the run's commits change protected paths its permission class does not "
                f"name: {protected.printable(', '.join(touched))} (files other tools load or "
                "execute); "
                f"the commits stay in {objects} for inspection")
        # Into the repository: each verified pack through index-pack --strict,
        # then the run's branch, created (never moved) at the verified head.
        pack_dir = os.path.join(stage, "objects", "pack")
        for name in sorted(os.listdir(pack_dir)):
            if not name.endswith(".pack"):
                continue
            with open(os.path.join(pack_dir, name), "rb") as pack:
                stored = subprocess.run(
                    [_git_exe(), *_SAFE, "-C", spec.toplevel, "index-pack", "--strict",
                     "--stdin"], stdin=pack, capture_output=True, timeout=300, check=False,
                    env=env)
            if stored.returncode != 0:
                raise ImportRefused("git index-pack refused a verified pack: "
                                    f"{stored.stderr.decode(errors='replace').strip()[-400:]}")
        made = _git("-C", spec.toplevel, "update-ref", ref, new, "", env=env)
        if made.returncode != 0:
            raise ImportRefused(f"git update-ref {ref}: {made.stderr.strip()}")
        count = _git("-C", stage, "rev-list", "--count", f"{spec.base}..{new}", env=env)
        out.update({"result": "imported", "head": new,
                    "commits": int(count.stdout.strip() or 0)})
        _remove_objects(workdir)
    except (ImportRefused, subprocess.TimeoutExpired) as e:
        why = str(e) if isinstance(e, ImportRefused) else f"git took too long ({e})"
        out.update({"result": "refused", "why": why})
        # The branch still names the base, so the worktree reads consistently.
        if _git("-C", spec.toplevel, "rev-parse", "--verify", "--quiet", ref,
                env=env).returncode != 0:
            _git("-C", spec.toplevel, "update-ref", ref, spec.base, "", env=env)
    finally:
        shutil.rmtree(os.path.join(run_dir, "import.git"), ignore_errors=True)
        shutil.rmtree(os.path.join(run_dir, "stage.git"), ignore_errors=True)
        out["git_dir_reset"] = reset_git_dir(wt_git_dir, ref, spec.toplevel)
    return out


_RAW_HEADER = re.compile(r"^\n*:(\d{6}) (\d{6}) [0-9a-f]+ [0-9a-f]+ [A-Z][0-9]*$")


def _raw_changes(raw: str) -> tuple[list[str], list[str]]:
    """Paths from ``git log --raw -z --format=`` output, and the paths whose
    new mode is a gitlink (160000). Strictly NUL-separated: a header
    ``:old new oid oid S`` then the path, verbatim (a run chooses the names:
    a newline in one must not be read as a record of its own — measured).
    A path with a control character, or output that does not parse, refuses
    the import."""
    fields = raw.split("\0")
    paths: list[str] = []
    gitlinks: list[str] = []
    i = 0
    while i < len(fields):
        head = fields[i]
        if head.strip("\n") == "":
            i += 1
            continue
        m = _RAW_HEADER.match(head)
        if m is None or i + 1 >= len(fields):
            raise ImportRefused("the run's commits could not be read as git's raw diff")
        path = fields[i + 1]
        if any(not c.isprintable() for c in path):
            raise ImportRefused(
                f"the run's commits name a path with a control character: {path!r}")
        paths.append(path)
        if m.group(2) == "160000":
            gitlinks.append(path)
        i += 2
    return paths, gitlinks


def _bare(path: str, alternates: list[str], refs: dict[str, str]) -> str:
    """A bare repository saphan makes in the run's directory (never a place a
    run can write), borrowing ``alternates``, with ``refs`` under refs/heads."""
    shutil.rmtree(path, ignore_errors=True)
    made = _git("init", "-q", "--bare", path, env=_git_env())
    if made.returncode != 0:
        raise ImportRefused(f"git init {path}: {made.stderr.strip()}")
    with open(os.path.join(path, "objects", "info", "alternates"), "w") as f:
        f.write("".join(f"{a}\n" for a in alternates))
    for name, oid in refs.items():
        with open(os.path.join(path, "refs", "heads", name), "w") as f:
            f.write(oid + "\n")
    return path


def _remove_objects(workdir: str) -> None:
    """Remove the run's object directory once imported, reached without
    following a link (``.saphan-run`` could be one on a site where a run's
    process outlived it)."""
    try:
        with nofollow.open_dir(os.path.join(workdir, RUN_DIR_NAME)) as d:
            shutil.rmtree("objects", dir_fd=d)
    except (OSError, PlantedLink):
        pass

#: what saphan keeps of a worktree's git dir after a run: git's own pointers
#: (read-only inside the jail, so still what git wrote)
_KEEP = frozenset({"commondir", "gitdir"})


def reset_git_dir(git_dir: str, ref: str, toplevel: str) -> list[str]:
    """Remove everything the run could have written in the worktree's git dir,
    point HEAD at ``ref`` and rebuild the index from it. Returns the names
    removed (besides HEAD, index and logs, which are always rewritten)."""
    removed: list[str] = []
    with nofollow.open_dir(git_dir) as d:
        for entry in os.scandir(d):
            if entry.name in _KEEP:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.name, dir_fd=d)
            else:
                os.unlink(entry.name, dir_fd=d)
            if entry.name not in ("HEAD", "index", "logs", "ORIG_HEAD"):
                removed.append(entry.name)
    nofollow.write_replace(os.path.join(git_dir, "HEAD"), f"ref: {ref}\n".encode())
    env = {**_git_env(), "GIT_DIR": git_dir, "GIT_INDEX_FILE": os.path.join(git_dir, "index")}
    _git("read-tree", ref, env=env)
    return sorted(removed)
