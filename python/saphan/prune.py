"""`saphan worktrees prune [--older-than D] [--dry-run]`: what `--repo` runs
left behind, once they have ended.

Only what saphan itself made and recorded is touched, named by the run's
signed record (a record that does not verify under the workspace key
names nothing here):

* the run's kept worktree, when it is exactly ``<workspace>/worktrees/<run-id>``
  and is a directory there (not a link): removed with ``git worktree remove
  --force`` (git unlinks what is inside, never following a link a run left;
  every git here runs with hooks and fsmonitor off, worktrees.py);
* its branch ``saphan/<run-id>``, only when it names the run's base commit
  (no commits beyond it), no worktree of the repository has it checked out
  and the run's worktree is gone: deleted with ``git update-ref -d REF OID``,
  which fails if the branch moved meanwhile. A branch with commits is
  never deleted.

Live runs are never looked at; ``older_than`` (seconds) keeps runs that
ended more recently. ``dry_run`` says what would be done and does nothing.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store.rows import RunRow

#: every action's keys (--json): one key set
KEYS = ("action", "kind", "run", "repo", "target", "why")


def _act(action: str, kind: str, run: str, repo: str | None, target: str | None,
         why: str) -> dict[str, Any]:
    return {"action": action, "kind": kind, "run": run, "repo": repo, "target": target,
            "why": why}


def prune(ctx: Context, *, older_than: int = 0, dry_run: bool = False) -> list[dict[str, Any]]:
    """The actions taken (or, ``dry_run``, that would be): module docstring."""
    from saphan.records import RunRecord
    from saphan.timefmt import iso_ago

    rows = [r for r in ctx.store.ended_runs_until(iso_ago(older_than))
            if r.record_json and '"worktree"' in r.record_json]
    if not rows:
        return []
    key = ctx.record_key()
    home = os.path.realpath(ctx.workspace.home)
    out: list[dict[str, Any]] = []
    for row in rows:
        rec = RunRecord.from_row(row, key)
        wt = rec.data.get("worktree")
        if not isinstance(wt, dict):
            continue
        repo = wt.get("repo") if isinstance(wt.get("repo"), str) else None
        if rec.signature != "valid":
            out.append(_act("kept", "worktree", row.id, repo, wt.get("path"),
                            f"its record does not verify ({rec.signature}): it names nothing "
                            "saphan acts on"))
            continue
        out.extend(_prune_run(row, wt, home, dry_run))
    return out


def _prune_run(row: RunRow, wt: dict[str, Any], home: str,
               dry_run: bool) -> list[dict[str, Any]]:
    from saphan.worktrees import branch_for

    repo, base = str(wt.get("repo")), str(wt.get("base"))
    path = os.path.join(home, "worktrees", row.id)
    done: list[dict[str, Any]] = []
    gone = True
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        gone = False
        named = str(wt.get("path"))
        if os.path.basename(named) != row.id or os.path.realpath(
                os.path.dirname(named)) != os.path.dirname(path):
            done.append(_act("kept", "worktree", row.id, repo, path,
                             "the record names another path"))
        elif not stat.S_ISDIR(st.st_mode):
            done.append(_act("kept", "worktree", row.id, repo, path,
                             "not a directory (a link or a file): left as it is"))
        elif dry_run:
            done.append(_act("would-remove", "worktree", row.id, repo, path,
                             f"run ended {row.finished_at}"))
            gone = True
        else:
            err = _remove_worktree(repo, path)
            if err is None:
                done.append(_act("removed", "worktree", row.id, repo, path,
                                 f"run ended {row.finished_at}"))
                gone = True
            else:
                done.append(_act("kept", "worktree", row.id, repo, path, err))
    branch = branch_for(row.id)
    if wt.get("branch") != branch or not os.path.isdir(repo):
        return done
    oid = _branch_oid(repo, branch)
    if oid is None:
        return done  # deleted already (or never made)
    if oid != base:
        commits = _count(repo, base, oid)
        done.append(_act("kept", "branch", row.id, repo, branch,
                         f"{commits} commit(s) beyond its base" if commits else
                         "it no longer names its base commit"))
    elif not gone:
        done.append(_act("kept", "branch", row.id, repo, branch, "its worktree is still there"))
    elif users := [w for w in _checked_out(repo, branch)
                   if not (dry_run and os.path.realpath(w) == path)]:
        done.append(_act("kept", "branch", row.id, repo, branch,
                         "checked out in a worktree: " + ", ".join(users)))
    elif dry_run:
        done.append(_act("would-delete", "branch", row.id, repo, branch,
                         f"no commits beyond its base {base[:12]}"))
    else:
        err = _delete_branch(repo, branch, oid)
        done.append(_act("deleted", "branch", row.id, repo, branch,
                         f"no commits beyond its base {base[:12]}") if err is None
                    else _act("kept", "branch", row.id, repo, branch, err))
    return done


def _remove_worktree(repo: str, path: str) -> str | None:
    from saphan.worktrees import _git, _git_env

    got = _git("-C", repo, "worktree", "remove", "--force", path, env=_git_env())
    if got.returncode != 0:
        return f"git worktree remove failed: {got.stderr.strip()[-300:]}"
    return None


def _branch_oid(repo: str, branch: str) -> str | None:
    from saphan.worktrees import _git, _git_env

    got = _git("-C", repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}",
               env=_git_env())
    return got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else None


def _count(repo: str, base: str, oid: str) -> int:
    from saphan.worktrees import _git, _git_env

    got = _git("-C", repo, "rev-list", "--count", f"{base}..{oid}", env=_git_env())
    try:
        return int(got.stdout.strip())
    except ValueError:
        return 0


def _checked_out(repo: str, branch: str) -> list[str]:
    """The worktrees of ``repo`` whose HEAD is ``branch``."""
    from saphan.worktrees import _git, _git_env

    got = _git("-C", repo, "worktree", "list", "--porcelain", "-z", env=_git_env())
    found, current = [], ""
    for field in got.stdout.split("\0"):
        if field.startswith("worktree "):
            current = field.removeprefix("worktree ")
        elif field == f"branch refs/heads/{branch}":
            found.append(current)
    return found


def _delete_branch(repo: str, branch: str, oid: str) -> str | None:
    from saphan.worktrees import _git, _git_env

    got = _git("-C", repo, "update-ref", "-d", f"refs/heads/{branch}", oid, env=_git_env())
    if got.returncode != 0:
        return f"git update-ref -d failed: {got.stderr.strip()[-300:]}"
    return None
