"""One run, on one screen: cast → reserve → compose → dispatch → record.

    request   run/request.py      what was asked fits the slot (nothing written)
    cast      here                the named machine and slot; the tool can go
                                  there; the Site that runs it (site/)
    inspect   site/               before the seat: what the run needs exists
                                  there (for SSH: the one preflight dial)
    reserve   run/reserve.py      one of the slot's ordinals, in the database
    compose   site.prepare        the boundary from one Policy, the tool's argv
    dispatch  site.start          the run, on this host or over SSH
    record    run/record.py       the only writer of every outcome

Every "cannot" after the request is valid is a Refusal recorded on the run's
row before it is raised: by run/record.refused before a seat is held, by
:func:`execute`'s finish once one is. A UserError (a bad request) is raised
only before the seat, and writes nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from saphan import __version__
from saphan.errors import Interrupted, UserError
from saphan.ids import is_run_id, new_run_id
from saphan.refusals import Refusal
from saphan.run import record as recorder
from saphan.run import request as requests
from saphan.run.ask import Ask, check_command, check_tool, custody
from saphan.run.end import RunEnd
from saphan.run.reserve import reserve
from saphan.timefmt import now_iso

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.liveness import Holder
    from saphan.measure.order import Order
    from saphan.records import RunRecord
    from saphan.site import Site
    from saphan.store.rows import Machine, Slot
    from saphan.tools.instruction import Request as AgentRequest


#: the machine and slot columns of a cast refused before it held a seat
CAST_MACHINE, CAST_SLOT = "(fleet)", "(cast)"


def run(
    ctx: Context,
    machine: str | None,
    slot: str | None,
    argv: Sequence[str],
    *,
    workdir: str | os.PathLike[str] | None = None,
    stream: bool = True,
    boundary: str | None = None,
    repo: str | os.PathLike[str] | None = None,
    base_ref: str | None = None,
    keep_worktree: bool = True,
    request: AgentRequest | None = None,
    view: bool = False,
    wait: float = 0.0,
    measure: Order | None = None,
    tool: str | None = None,
    labels: Mapping[str, str] | None = None,
    image: str | None = None,
    run_id: str | None = None,
) -> RunRecord:
    """The five steps for every run shape (a local command, a local agent or
    loop, a remote command). See :meth:`saphan.Engine.run` for the arguments;
    ``measure``: the run is a measure-base order's (measure/), its command the
    driver the site composes for it; ``slot`` None: cast it on the fleet
    (run/cast.py) — a slot of ``tool`` (on ``machine``, matching ``labels``
    and ``image``); ``run_id``: the id to give it (a batch's claim is made
    for it before the run), else a new one."""
    from saphan.config import confinement_mode
    from saphan.liveness import current_holder

    command = list(argv) if measure is None else list(measure.test)
    if not command and request is None:
        raise UserError("nothing to run: give the command after `--`")
    holder = current_holder()
    if run_id is None:
        run_id = new_run_id()
    elif not is_run_id(run_id):
        raise UserError(f"{run_id!r} is not a run id (26 characters of Crockford base32)")
    if repo is not None and workdir is not None:
        raise UserError("give --repo or --workdir, not both (--repo makes the working directory)")
    if repo is None and base_ref is not None:
        raise UserError("--base needs --repo")
    base: dict[str, Any] = {
        "id": run_id, "machine": machine or CAST_MACHINE, "slot": slot or CAST_SLOT,
        "argv": command,
        # As asked; the site names it exactly (dispatch), before the seat.
        "workdir": os.fspath(workdir) if workdir is not None else None,
        "saphan_version": __version__, "requested_at": now_iso(),
    }
    if measure is not None:
        if request is not None:
            raise UserError("measure-base runs its test command; it takes no agent task")
        base["measure"] = {"order": measure.as_record(), "result": "not run"}
    # run.confinement is checked before any other branch of any run.
    try:
        mode = confinement_mode(ctx.config)
    except Refusal as refusal:
        recorder.refused(ctx, base, "unknown", holder, refusal)
        raise

    # -- cast: the named slot, or the fleet's (run/cast.py); the site that runs it --
    if boundary not in (None, "landlock"):
        raise UserError(f"--boundary {boundary!r} is unknown; omit it or use `landlock`")
    ask = Ask(command=command, run_id=run_id, mode=mode, workdir=workdir, stream=stream,
              boundary=boundary, repo=repo, base_ref=base_ref, keep_worktree=keep_worktree,
              request=request, view=view, measure=measure)
    base["confinement_setting"] = mode
    if slot is None:
        from saphan.run import cast
        from saphan.transport import streams

        with streams.run_signals():  # as dispatch's: from the first seat tried on
            site, reserved = cast.seat(ctx, ask, base, holder, tool=tool, machine=machine,
                                       labels=labels, image=image, wait=wait, make=make_site)
            return execute_reserved(ctx, site, reserved)
    if machine is None:
        raise UserError("--slot needs --machine (or cast with --tool instead of --slot)")
    s = ctx.slot(machine, slot)
    m = ctx.machine(machine)
    base["tool"] = s.tool
    custody(ctx, base, s.tool, holder)
    check_tool(s, ask)
    requests.check_fits(s, m, command, request, boundary)
    if s.tool == "command":
        check_command(ctx, base, command, holder)
    return dispatch(ctx, make_site(ctx, s, m, ask), base, holder, wait=wait)


def make_site(ctx: Context, s: Slot, m: Machine, ask: Ask) -> Site:
    """The site that runs ``ask`` on slot ``s`` of machine ``m`` (UserError:
    the ask cannot go there)."""
    request, command = ask.request, ask.command
    if m.transport == "ssh":
        from saphan.site.ssh import SshSite

        if ask.repo is not None:
            raise UserError(
                f"--repo makes a worktree on this machine; for SSH machine {m.name!r} give "
                "--workdir /absolute/path/on/that/machine"
            )
        far_wd = SshSite.far_workdir(m, ask.workdir)
        pc = (requests.command_class(request.permission_class, command[0], far_wd, far=True)
              if request is not None and request.permission_class is not None
              and s.tool == "command" else None)
        return SshSite(ctx, s, m, command, workdir=far_wd, stream=ask.stream, permission=pc,
                       request=request if s.tool != "command" else None, mode=ask.mode,
                       view=ask.view, measure=ask.measure,
                       egress_policy=request.egress_policy if request is not None else None)
    from saphan.site.local import LocalSite

    wd = (str(ctx.workspace.home / "worktrees" / ask.run_id) if ask.repo is not None
          else os.path.abspath(ask.workdir if ask.workdir is not None else os.getcwd()))
    return LocalSite(ctx, s, command, workdir=wd, mode=ask.mode, stream=ask.stream,
                     boundary=ask.boundary, repo=ask.repo, base_ref=ask.base_ref,
                     keep_worktree=ask.keep_worktree, request=request, view=ask.view,
                     measure=ask.measure)


def dispatch(ctx: Context, site: Site, base: dict[str, Any], holder: Holder, *,
             wait: float = 0.0) -> RunRecord:
    """Inspect (before the seat), reserve (a full slot tried again for ``wait``
    seconds), then :func:`execute`."""
    base["workdir"] = site.workdir
    try:
        site.inspect(base)
    except Refusal as refusal:
        recorder.refused(ctx, base, base["tool"], holder, refusal)
        raise
    from saphan.transport import streams

    # From the reservation to the record (and a --repo run's import), a
    # signal is never fatal (transport/streams.run_signals): before the child
    # the run does not start, during it the child is told, after it the
    # record and the import are completed first; then saphan exits 128+N.
    with streams.run_signals():
        # The slot as cast (the site holds it: its pin is what is enforced),
        # never read again between here and the reservation.
        base["session_ordinal"] = reserve(ctx, site.slot, base, site.workdir, holder,
                                          remote=site.liveness(), wait=wait,
                                          checkpoint=streams.checkpoint)
        return execute_reserved(ctx, site, base)


def execute_reserved(ctx: Context, site: Site, base: dict[str, Any]) -> RunRecord:
    """:func:`execute` a run that holds its seat, inside run_signals: a
    signal that came during it is raised once the record is written."""
    from saphan.transport import streams

    try:
        rec = execute(ctx, site, base)
    except BaseException as e:
        late = streams.pending()
        if late is None or isinstance(e, Interrupted):
            raise
        raise Interrupted(late, None, "while the run ended; the run was recorded "
                          "first") from e
    late = streams.pending()
    if late is not None:
        raise Interrupted(late, rec.exit_code, "after the command ended; the record "
                          "and the import were completed first")
    return rec


def execute(ctx: Context, site: Site, base: dict[str, Any]) -> RunRecord:
    """Compose, dispatch, record a reserved run on its site; the row is
    finished whatever happens (or, when the site says a far process may still
    run, left live with that process as its holder)."""
    from saphan.transport import streams

    record: dict[str, Any] = {**base, "started_at": now_iso(), "enforced_by": None}
    end = RunEnd()
    try:
        streams.checkpoint()  # a signal during the reservation: not started
        site.prepare(record)
        streams.checkpoint()
        recorder.running(ctx, record)
        site.start(record, end)
    except BaseException as e:
        end.absorb(e, record, site.interrupted)
        raise
    finally:
        streams.settled()  # from here a signal waits for the record
        late: BaseException | None = None
        try:
            live = site.settle(record, end)
        except BaseException as e:  # the row is written whatever happened here
            record["settle_error"] = f"{type(e).__name__}: {e}"
            live = False
            if not isinstance(e, Exception):
                late = e  # Ctrl-C during settling: finish the row, then honour it
        caught = streams.pending()
        if caught is not None and end.outcome != "interrupted":
            record["notes"] = [*record.get("notes", []), (
                f"saphan got {signal.Signals(caught).name} after the command ended: the "
                f"record{' and the import' if 'worktree' in record else ''} were completed "
                f"first, then saphan exited {128 + caught}")]
        if live:
            recorder.still_running(ctx, record)
        else:
            recorder.finished(ctx, record, end)
        if late is not None:
            raise late
    return ctx.run_record(record["id"])
