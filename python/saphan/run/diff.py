"""A ``--repo`` run's diff, read from the main repository: what the dashboard shows.

A ``--repo`` run's record names its worktree (site/local.py): the main
repository's top level (``repo``), the run's worktree (``path``, which is
``$SAPHAN_HOME/worktrees/<run-id>``), its branch ``saphan/<run-id>``, the base
commit, and how the run's commits were imported (worktrees.import_run:
``import.result`` is "imported", "unchanged" or "refused"). :func:`branch_diff`
shows the imported branch against its base as a unified patch.

It is read from the MAIN repository's git directory only, never by running
git inside the run's worktree: a run could write anything there (a ``.git``
file pointing at a git directory of its own, a config naming an external
diff, a textconv or a hook, ``.gitattributes`` routing files to them), and git
run there would execute it as the operator. So:

* nothing is run for a record that does not verify under the workspace key
  (``signature`` other than "valid"): such a record could name any path;
* every field is checked before use: the base a full object id, the branch
  exactly ``saphan/<run-id>``, the repository an absolute directory (not a
  link) outside the run's worktree and outside the workspace's worktrees
  directory, and git must agree it is a repository's top level;
* the repository's git directory is found once (``git -C <repo> rev-parse
  --git-common-dir``) and every further git gets ``--git-dir=<it>`` and that
  directory as its working directory (without a work tree git reads
  ``.gitattributes`` from its working directory: measured), never ``-C``
  into a worktree;
* the diff runs with ``--no-ext-diff --no-textconv --submodule=short``
  (nothing external, nothing read from submodules), worktrees.py's ``_SAFE``
  options (hooks and fsmonitor off), lazy fetches of a partial clone off,
  and the environment of worktrees._git_env (the operator's own
  configuration; no caller's GIT_* variables);
* at most ``limit`` bytes of git's output are kept (git is killed past
  them), within :data:`DIFF_TIME_LIMIT` seconds and worktrees'
  GIT_MEMORY_LIMIT of address space: a run can make a diff of any size.

Nothing here raises for what git or the record says: the answer's ``note``
names it.
"""

from __future__ import annotations

import os
import resource
import selectors
import stat
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from saphan.errors import UserError
from saphan.ids import is_run_id
from saphan.worktrees import _OID, _SAFE, GIT_MEMORY_LIMIT, _git_env, _git_exe, branch_for

#: bytes of diff output kept
DIFF_LIMIT = 1 << 20
#: seconds every git here may take (the dashboard waits for it)
DIFF_TIME_LIMIT = 30.0
#: bytes read of git's answers other than the diff (paths, object ids)
_SMALL = 1 << 16


@dataclass(frozen=True)
class BranchDiff:
    """A run's branch against its base, or why it is not shown."""

    text: str | None  # the unified diff (UTF-8, undecodable bytes replaced); None when not read
    truncated: bool  # True when cut at the byte limit
    base: str | None  # the base commit's oid (once checked)
    head: str | None  # the branch's oid in the main repository
    note: str  # one line for the operator: why there is no diff, or its size


def branch_diff(record: dict[str, Any], *, signature: str,
                limit: int = DIFF_LIMIT) -> BranchDiff | None:
    """The diff of the run's imported branch against its base, read from the
    main repository (module docstring); None for a run without ``--repo``.
    ``signature`` is the record's (``RunRecord.signature``): only a "valid"
    record has git run for it."""
    wt = record.get("worktree")
    if not isinstance(wt, dict):
        return None
    limit = max(0, limit)
    if signature != "valid":
        why = ("the run is live: its branch is imported when it ends" if signature == "pending"
               else "a record that does not verify could name any path")
        return _none(f"the diff is not read: the record does not verify ({signature}); {why}")
    try:
        repo, base, branch = _checked(record, wt)
    except _NotRead as e:
        return _none(f"the diff is not read: {e}")
    imported = wt.get("import")
    result = imported.get("result") if isinstance(imported, dict) else None
    if result != "imported":
        return _none(_not_imported(result, imported, branch, base), base=base)
    env = {**_git_env(), "GIT_NO_LAZY_FETCH": "1", "GIT_OPTIONAL_LOCKS": "0"}
    deadline = time.monotonic() + DIFF_TIME_LIMIT
    try:
        exe = _git_exe()
        common = _common_dir(exe, repo, str(wt["path"]), env, deadline)
    except (UserError, _NotRead) as e:
        return _none(f"the diff is not read: {e}", base=base)
    got = _run(exe, [f"--git-dir={common}", "rev-parse", "--verify", "--quiet",
                     f"refs/heads/{branch}^{{commit}}"], cwd=common, env=env, limit=_SMALL,
               deadline=deadline)
    head = got.out.decode("ascii", "replace").strip()
    if got.code == 1 and not head and not got.err:
        return _none(f"the branch {branch} is not in {repo} (deleted or pruned since the run)",
                     base=base)
    if got.code != 0 or not _OID.match(head):
        return _none(f"git could not read the branch {branch} in {repo}: {got.why()}", base=base)
    diff = _run(exe, [f"--git-dir={common}", "diff", "--no-ext-diff", "--no-textconv",
                      "--no-color", "--no-renames", "--submodule=short", "--patch", base, head,
                      "--"], cwd=common, env=env, limit=limit, deadline=deadline)
    if diff.late or (diff.code != 0 and not diff.over):
        return _none(f"git could not diff {branch} against its base {base[:12]}: {diff.why()}",
                     base=base, head=head)
    text, cut = _text(diff.out, limit)
    moved = ""
    if isinstance(imported, dict) and imported.get("head") not in (None, head):
        moved = f" (the branch has moved since the import of {str(imported.get('head'))[:12]})"
    span = f"{branch}: {base[:12]}..{head[:12]}{moved}"
    if cut or diff.over:
        note = f"{span}: the diff is cut at {len(text.encode())} bytes (limit {limit})"
    elif not text:
        note = f"{span}: no difference"
    else:
        note = f"{span}: {len(diff.out)} bytes of diff"
    return BranchDiff(text, cut or diff.over, base, head, _line(note))


class _NotRead(Exception):
    """What stops the diff from being read: the note says it."""


def _line(note: str) -> str:
    """One line (git's messages span several)."""
    return " | ".join(part.strip() for part in note.splitlines() if part.strip())


def _none(note: str, *, base: str | None = None, head: str | None = None) -> BranchDiff:
    return BranchDiff(None, False, base, head, _line(note))


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _checked(record: dict[str, Any], wt: dict[str, Any]) -> tuple[str, str, str]:
    """The record's repository (resolved), base and branch; :class:`_NotRead`
    naming what is wrong with them."""
    run_id = record.get("id")
    if not isinstance(run_id, str) or not is_run_id(run_id):
        raise _NotRead(f"the record's run id {str(run_id)[:40]!r} is not a run id")
    base = wt.get("base")
    if not isinstance(base, str) or not _OID.match(base):
        raise _NotRead(f"the record's base {str(base)[:80]!r} is not a full commit id")
    branch = branch_for(run_id)
    if wt.get("branch") != branch:
        raise _NotRead(f"the record names the branch {str(wt.get('branch'))[:80]!r}, not {branch}")
    path = wt.get("path")
    if not isinstance(path, str) or "\0" in path or not os.path.isabs(path) \
            or os.path.basename(os.path.normpath(path)) != run_id:
        raise _NotRead(f"the record's worktree path {str(path)[:200]!r} is not an absolute "
                       f"<worktrees>/{run_id}")
    repo = wt.get("repo")
    if not isinstance(repo, str) or "\0" in repo or not os.path.isabs(repo):
        raise _NotRead(f"the record's repository {str(repo)[:200]!r} is not an absolute path")
    try:
        st = os.lstat(repo)
    except OSError as e:
        raise _NotRead(f"the repository {repo} cannot be read ({e.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _NotRead(f"the repository {repo} is not a directory (a link or a file)")
    real = os.path.realpath(repo)
    for place in _run_places(path):
        if _within(real, place):
            raise _NotRead(f"the repository {repo} lies inside {place}, where a run can write; "
                           "git is never run there")
    return real, base, branch


def _run_places(path: str) -> list[str]:
    """The run's worktree and the workspace's worktrees directory, as named
    and as resolved."""
    named = os.path.normpath(path)
    places = (named, os.path.realpath(named), os.path.dirname(named),
              os.path.realpath(os.path.dirname(named)))
    return list(dict.fromkeys(places))  # the worktree first: the narrower name


def _not_imported(result: object, imported: object, branch: str, base: str) -> str:
    why = imported.get("why") if isinstance(imported, dict) else None
    tail = f": {why}" if why else ""
    if result == "unchanged":
        return f"no diff: the run made no commits ({branch} names its base {base[:12]})"
    if result == "refused":
        return f"no diff: the run's commits were not imported onto {branch}{tail}"
    if result is None:
        return f"no diff: the record holds no import onto {branch}{tail}"
    return f"no diff: the import's result is {str(result)[:40]!r}, not imported{tail}"


def _common_dir(exe: str, repo: str, path: str, env: dict[str, str], deadline: float) -> str:
    """The main repository's git directory, checked: git must find ``repo``
    as a top level, and its git directory outside the run's places."""
    got = _run(exe, ["-C", repo, "rev-parse", "--path-format=absolute", "--show-toplevel",
                     "--git-common-dir"], cwd=repo, env=env, limit=_SMALL, deadline=deadline)
    lines = got.out.decode("utf-8", "surrogateescape").splitlines()
    if got.code != 0 or len(lines) < 2:
        raise _NotRead(f"git could not read {repo} as a repository: {got.why()}")
    top, common = os.path.realpath(lines[0]), os.path.realpath(lines[1])
    if top != repo:
        raise _NotRead(f"{repo} is not a repository's top level (git found {top[:200]})")
    for place in _run_places(path):
        if _within(common, place):
            raise _NotRead(f"the repository's git directory {common} lies inside {place}, "
                           "where a run can write; git is never run there")
    return common


def _text(out: bytes, limit: int) -> tuple[str, bool]:
    """git's output as text of at most ``limit`` UTF-8 bytes (a replaced byte
    takes three), cut after the last whole line when cut; and whether cut."""
    text = out[:limit].decode("utf-8", "replace")
    data = text.encode()
    if len(data) <= limit and len(out) <= limit:
        return text, False
    data = data[:limit]
    end = data.rfind(b"\n")
    if end >= 0:
        data = data[:end + 1]
    return data.decode("utf-8", "ignore"), True


@dataclass(frozen=True)
class _Read:
    code: int | None  # git's exit status; None when it did not start
    out: bytes  # stdout, at most limit + 1 bytes
    err: str  # the last of stderr
    over: bool  # stdout went past the limit: git was killed
    late: bool  # the time limit passed: git was killed

    def why(self) -> str:
        if self.late:
            return f"it took over {DIFF_TIME_LIMIT:.0f} s (stopped)"
        said = self.err.strip()[-300:]
        return said or f"exit status {self.code}"


def _bounded() -> None:
    """In the child, before exec: worktrees' memory limit (``resource`` bound
    at import, so nothing is imported between fork and exec)."""
    resource.setrlimit(resource.RLIMIT_AS, (GIT_MEMORY_LIMIT, GIT_MEMORY_LIMIT))


def _run(exe: str, args: list[str], *, cwd: str, env: dict[str, str], limit: int,
         deadline: float) -> _Read:
    """git with ``_SAFE``, its stdout read up to ``limit`` bytes (one more
    tells it was over: git is killed), until ``deadline``."""
    try:
        proc = subprocess.Popen([exe, *_SAFE, *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                                preexec_fn=_bounded)
    except (OSError, subprocess.SubprocessError) as e:
        return _Read(None, b"", f"git could not be started: {e}", False, False)
    assert proc.stdout is not None and proc.stderr is not None
    out: list[bytes] = []
    size, err, over, late = 0, b"", False, False
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            sel.register(proc.stderr, selectors.EVENT_READ)
            open_pipes = 2
            while open_pipes and not over:
                left = deadline - time.monotonic()
                ready = sel.select(left) if left > 0 else []
                if not ready:
                    late = True
                    break
                for key, _ in ready:
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_pipes -= 1
                    elif key.fileobj is proc.stdout:
                        out.append(chunk[:limit + 1 - size])
                        size += len(out[-1])
                        over = size > limit
                    else:
                        err = (err + chunk)[-4096:]
        if not (over or late):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return _Read(proc.returncode, b"".join(out), err.decode("utf-8", "replace"), over, late)
