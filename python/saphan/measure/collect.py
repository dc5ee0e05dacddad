"""A measure-base run, from the sites' side: the driver's command line for
the run (``command``), and after the run the report (``local`` / ``far``):
the driver's files read (size-limited, never through a link), the scratch
checked from outside (measure/scratch.py), the report built
(measure/report.py) and written to ``measure.json`` in the run's directory.

A scratch path git does not ignore is refused here, by the driver's answer
from inside the boundary before anything was cloned: ``scratch-not-ignored``,
naming the rule to add.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.measure import driver, outcomes, report, scratch
from saphan.measure.order import Order

if TYPE_CHECKING:
    from saphan.transport.ssh import SSHConnection


def command(order: Order, *, out: str, repository: str, workdir: str, far: bool) -> list[str]:
    """The run's argv: the driver, for ``order``, in ``workdir``. On this host
    saphan wrote the default scratch's rule before the run
    (worktrees.ignore_scratch); on a runner (``far``) the driver adds it. A
    test argument naming a path in the working tree absolutely is refused:
    the base run would read head's files there (review: measured)."""
    wd = workdir.rstrip("/")
    for arg in order.test[1:]:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if value == wd or value.startswith(wd + "/"):
            from saphan.errors import UserError

            raise UserError(f"the test argument {arg!r} names the working tree absolutely; the "
                            "base run would read head's files there: give it relative to "
                            f"{workdir}")
    return driver.argv(out=out, repository=repository, workdir=workdir, scratch=order.scratch,
                       base=order.base, expect=order.expect, kind=order.kind,
                       add_rule=far and order.default_scratch, test=order.test_argv())


def local(order: Order, *, out_dir: str, workdir: str, repository: str, run_dir: str,
          exit_code: int | None, made: str | None) -> dict[str, Any]:
    """The report of a run on this host (its return directory ``out_dir``;
    ``made``: the first component of the scratch path saphan saw absent just
    before the run — what is there now is the run's, and is removed)."""

    def read(name: str) -> bytes | None:
        path = os.path.join(out_dir, f"measure-{name}")
        try:
            return outcomes.read_limited(path)
        except outcomes.ReportUnreadable:
            if not os.path.lexists(path):
                return None
            raise

    # removed only when the driver claimed the path (its first step, before
    # any test ran): of two runs given one path, the other's clone is left
    tree = scratch.check_local(workdir, order.scratch,
                               remove=made if _made_by_run(read) else None)
    return _finish(order, read, tree, workdir=workdir, repository=repository, run_dir=run_dir,
                   exit_code=exit_code)


def far(order: Order, conn: SSHConnection, *, out_dir: str, workdir: str, repository: str,
        run_dir: str, exit_code: int | None) -> dict[str, Any]:
    """The report of a run on a runner: its return directory ``out_dir``
    there is read file by file, then removed. The scratch is removed there
    only when the driver saw its path free (saphan did not look before)."""
    from saphan.site import far as far_side

    cache: dict[str, bytes | None] = {}
    names = report.files_for(order)
    for i, name in enumerate(names):
        cache[name] = far_side.read_run_file(conn, out_dir, f"measure-{name}",
                                             limit=outcomes.MAX_REPORT_BYTES,
                                             remove=i == len(names) - 1)

    def read(name: str) -> bytes | None:
        return cache.get(name)

    tree = scratch.check_far(conn, workdir, order.scratch, remove=_made_by_run(read))
    return _finish(order, read, tree, workdir=workdir, repository=repository, run_dir=run_dir,
                   exit_code=exit_code)


def _finish(order: Order, read: report.Reader, tree: dict[str, Any], *, workdir: str,
            repository: str, run_dir: str, exit_code: int | None) -> dict[str, Any]:
    """The report built and written — then, when the driver ended at its
    ignore check, the refusal (the report in measure.json says so too)."""
    built = report.build(order, read, workdir=workdir, repository=repository, one_tree=tree)
    refused = report.not_ignored(read, exit_code)
    if refused:
        built["result"] = "refused: scratch-not-ignored"
    if tree.get("scratch_present"):
        built["notes"].append(
            f"the scratch path {workdir.rstrip('/')}/{order.scratch} is still there after the "
            "run: a git repository a run wrote — do not run git inside it; remove it")
    try:
        built["file"] = report.write(run_dir, built)
    except OSError as e:
        built["notes"].append(f"measure.json could not be written in {run_dir}: "
                              f"{errno.errorcode.get(e.errno or 0, e)}")
    if refused:
        _refuse_unignored(order, workdir)
    return built


def _made_by_run(read: report.Reader) -> bool:
    """The driver saw the scratch path free before it cloned (so a scratch
    still there after the run is the run's, and saphan removes it)."""
    try:
        raw = read("steps") or b""
    except outcomes.ReportUnreadable:
        return False
    return raw.startswith(b"fresh 0\n")


def _refuse_unignored(order: Order, workdir: str) -> None:
    rule = order.ignore_rule()
    fix = (f"add the line `{rule}` to the repository's .gitignore or .git/info/exclude, or "
           "omit --scratch (the default, .saphan-run/base-<random>, is ignored through "
           "info/exclude)")
    if order.default_scratch:
        fix = (f"add the line `/{order.scratch.split('/')[0]}/` to the repository's "
               "info/exclude (saphan adds it itself before a run only where the working "
               "tree's .git is a directory: not in a linked worktree or a submodule), or "
               "give --scratch a path the repository ignores")
    raise refusals.scratch_not_ignored(
        f"the scratch path {order.scratch} is not ignored by the repository at {workdir} "
        "(`git check-ignore` inside the boundary, before anything was cloned): the scratch "
        "clone would show up as the run's own uncommitted work", fix)
