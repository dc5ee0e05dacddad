"""`saphan runs cancel ID [--signal S] [--grace SECS]`: end a live run's whole
process tree, here or on its far machine, and record it ``cancelled``.

Who writes the outcome: the run's own driver (the saphan process running
it) whenever it is alive. Cancel leaves a request in the run's directory
(run/end.py: the signal, the grace), then signals; the driver passes the
signal on, waits for its tree, and records ``cancelled`` itself
(run/record.finished reads the request). When the driver is gone (killed,
or a far run left live after a lost connection), cancel ends what still
runs and records it through run/record.cancelled_by_operator.

What it signals — only processes saphan recorded itself, each identified as
liveness.py does (pid, start time, boot id) and checked again right before
the signal (here through a pidfd):
- the driver: a local run's holder (the row), or a far run's ``driven_by``
  (its live record file, signed with the workspace key: a far run's row
  names the far process once it started);
- a far run's process: the row's far holder, the launcher the far script
  exec'd after writing its pid (site/far.signal_holder); SIGKILL goes to the
  launcher's own children as that kernel lists them, so the launcher, a
  subreaper, still ends the rest of the tree.
Nothing a run wrote is read as a pid.

The steps, with G the grace (default 10 s):
- local, driver alive: SIGTERM to the driver, which sends its child S (a
  bubblewrap run's PID namespace ends with it; saphan-launcher passes S on
  and ends what is left). At G a second SIGTERM: the driver SIGKILLs its
  child. ESCALATE_WAIT later, if the row is still live, the driver is
  SIGKILLed (its child dies with it: PR_SET_PDEATHSIG) and cancel records.
- far: S to the far launcher over SSH; at G SIGKILL to its children;
  ESCALATE_WAIT later SIGKILL to the launcher itself. A live driver records
  what the far status says; otherwise cancel does, with the exit status the
  far launcher wrote. A far process still there after all that is an error
  (exit 1) and the row stays live: its seat is never freed on doubt.
- local, driver already dead: its boundary died with it; cancel records.

A driver that cannot be signalled (another user's saphan: permission denied;
or its start time or boot id not recorded) is alive or unknown, never taken
for dead: cancel refuses (exit 1, naming why and the fix), takes its request
back, and the row stays live, its seat held. Only a driver measured dead (its
pid gone, or its start time or boot id differ) lets cancel record the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saphan.errors import TransportError, UserError
from saphan.liveness import Holder, Liveness
from saphan.run.end import CANCEL_REQUEST, CANCEL_SIGNALS, write_cancel_request
from saphan.timefmt import now_iso

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.records import RunRecord
    from saphan.store.rows import Machine, RunRow

#: after the grace and each escalation, how long cancel waits for the next
#: step to show (seconds): the launcher's own reaping takes up to 10 s
ESCALATE_WAIT = 12.0
#: how often the row (and a far holder) is read while waiting (seconds)
POLL = 0.2
#: the largest grace `runs cancel` accepts (seconds)
MAX_GRACE = 600.0


def parse_signal(text: str) -> str:
    """``TERM``, ``SIGTERM`` or ``15`` (any case) as its name in
    run/end.CANCEL_SIGNALS; a UserError for anything else."""
    t = text.strip().upper()
    if t.isdigit():
        try:
            t = signal.Signals(int(t)).name
        except ValueError:
            t = text
    name = t if t.startswith("SIG") else f"SIG{t}"
    if name not in CANCEL_SIGNALS:
        raise UserError(f"--signal {text!r} is not one runs cancel sends; give one of "
                        f"{', '.join(CANCEL_SIGNALS)} (or its number)")
    return name


@dataclass
class Cancelled:
    """What `runs cancel` did and saw."""

    record: RunRecord
    #: who recorded the end: "driver" (the run's own saphan), "cancel" (this
    #: command, the driver being gone), or "itself" (it ended before the
    #: request took effect; outcome other than cancelled)
    recorded_by: str
    waited: float
    steps: list[str] = field(default_factory=list)


def cancel(ctx: Context, run_id: str, *, sig: str = "SIGTERM",
           grace: float = 10.0) -> Cancelled:
    """End run ``run_id`` (module docstring). Raises UserError when it is not
    live or cannot be reached from here, TransportError when its far machine
    cannot be, RuntimeError when a far process outlives every signal."""
    name = parse_signal(sig)
    if not 0 <= grace <= MAX_GRACE:
        raise UserError(f"--grace {grace} is out of bounds; give 0..{MAX_GRACE:.0f} seconds")
    row = ctx.find_run(run_id)
    if not row.live:
        raise UserError(f"run {row.id} already finished at {row.finished_at} (outcome "
                        f"{row.outcome}); there is nothing to cancel")
    from saphan.liveness import check, this_host
    from saphan.run import live

    key = ctx.record_key()
    found = live.read_record(ctx, key, row)
    far = _far(ctx, row)
    driver = _driver(row, found)
    d_life = check(driver) if driver is not None else None
    if far is None and driver is not None and driver.host == this_host() and (
            d_life is not None and d_life.state == "unknown"):
        raise UserError(
            f"run {row.id} is held by pid {driver.pid} on this host, but its start time or "
            f"boot id was not recorded, so whether that pid is still the run's saphan cannot "
            f"be measured: nothing was signalled and the row stays live; end pid "
            f"{driver.pid} yourself once you know it is the run's saphan, then `saphan runs "
            f"finalize {row.id} --force`")
    if far is None and (d_life is None or d_life.state == "unknown"):
        where = row.holder_host or "no recorded host"
        raise UserError(
            f"run {row.id} is held by pid {row.holder_pid} on {where}, not on this host "
            f"({this_host()}): cancel it where it runs, or end its row with `saphan runs "
            f"finalize {row.id} --force` if that host is gone")
    request = {"signal": name, "grace": grace, "requested_at": now_iso(),
               "by": f"saphan runs cancel (pid {os.getpid()}, uid {os.getuid()})"}
    write_cancel_request(ctx.workspace.run_dir(row.id), request)
    job = _Job(ctx, row, name, grace, far, driver, d_life)
    return job.run(found, request)


class _Job:
    def __init__(self, ctx: Context, row: RunRow, sig: str, grace: float,
                 far: tuple[Machine, Holder] | None, driver: Holder | None,
                 d_life: Liveness | None) -> None:
        self.ctx, self.row, self.sig, self.grace = ctx, row, sig, grace
        self.far, self.driver = far, driver
        # Alive or unknown: only a driver measured dead (its pid gone, or its
        # start time or boot id differ) lets cancel record the end itself.
        self.driver_alive = d_life is not None and d_life.state != "dead"
        #: a signal reached the driver (its request is then acted on)
        self.sent = False
        self.far_alive = far is not None
        self.steps: list[str] = []
        self.t0 = time.monotonic()
        self.now_row: RunRow = row

    # -- what is there ------------------------------------------------------------
    def _step(self, text: str) -> None:
        self.steps.append(f"+{time.monotonic() - self.t0:.1f}s {text}")

    def _settled(self) -> bool:
        """The row was finished (by the driver, most likely), or nothing is
        left that could finish it or still runs."""
        from saphan.liveness import check

        got = self.ctx.store.get_run(self.row.id)
        if got is None or not got.live:
            return True
        self.now_row = got
        if self.driver_alive and self.driver is not None:
            self.driver_alive = check(self.driver).state != "dead"
        if self.far is not None and self.far_alive:
            from saphan.site import far as far_side

            m, holder = self.far
            try:
                self.far_alive = far_side.holder_liveness(self.ctx.ssh(m), holder).state != "dead"
            except TransportError:
                self.far_alive = True  # unreachable: not gone
        return not self.driver_alive and not self.far_alive

    def _wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if self._settled():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    # -- signals --------------------------------------------------------------------
    def _to_driver(self, sig: int) -> None:
        if self.driver is None or not self.driver_alive:
            return
        said = _signal_here(self.driver, sig)
        self._step(f"{signal.Signals(sig).name} to the run's driver, pid {self.driver.pid} "
                   f"on {self.driver.host}: {said}")
        if said == "sent":
            self.sent = True
        elif said.startswith("gone"):
            self.driver_alive = False
        else:
            self._refuse(said)

    def _refuse(self, said: str) -> None:
        """A driver that could not be signalled is alive or unknown: the run
        goes on, so its row stays live and its seat held (exit 1). A request
        no signal followed is taken back, so the driver does not end the run
        ``cancelled`` on some later signal."""
        assert self.driver is not None
        if not self.sent:
            with contextlib.suppress(OSError):
                os.unlink(self.ctx.workspace.run_dir(self.row.id) / CANCEL_REQUEST)
        d, rid = self.driver, self.row.id
        if "permission" in said:
            try:
                uid: int | str = os.stat(f"/proc/{d.pid}").st_uid
            except OSError:
                uid = "?"
            fix = (f"run `saphan runs cancel {rid}` as the user whose saphan drives it "
                   f"(uid {uid})")
        else:
            fix = (f"its liveness cannot be measured: end pid {d.pid} yourself once you know "
                   f"it is the run's saphan, then `saphan runs finalize {rid} --force`")
        raise RuntimeError(
            f"run {rid}: its driver, pid {d.pid} on {d.host}, was not signalled ({said}); "
            f"it may still be running the run, so the row stays live and its seat held: {fix}"
            + (f" ({'; '.join(self.steps)})" if self.steps else ""))

    def _to_far(self, sig: str, *, children: bool) -> None:
        if self.far is None or not self.far_alive:
            return
        from saphan.site import far as far_side

        m, holder = self.far
        said = far_side.signal_holder(self.ctx.ssh(m), holder, sig, children=children)
        whose = "the far launcher's children" if children else "the far launcher"
        self._step(f"SIG{sig} to {whose} (pid {holder.pid} on {m.name}): {said}")
        if said.startswith("gone"):
            self.far_alive = False

    # -- the steps ------------------------------------------------------------------
    def run(self, found: dict[str, Any] | None, request: dict[str, Any]) -> Cancelled:
        first = self.sig.removeprefix("SIG")
        if self.far is not None:
            self._to_far(first, children=first == "KILL")
        elif self.driver_alive:
            self._to_driver(signal.SIGTERM)
        if not self._wait(self.grace):
            if self.far is not None:
                self._to_far("KILL", children=True)
            else:
                self._to_driver(signal.SIGTERM)  # a second one: the driver SIGKILLs its child
            if not self._wait(ESCALATE_WAIT) and self.far is not None and self.far_alive:
                self._to_far("KILL", children=False)
                self._wait(2.0)
        got = self.ctx.store.get_run(self.row.id)
        if got is not None and got.live and self.driver_alive and not self.far_alive:
            # The tree is gone but the driver has not recorded it (or a local
            # driver ignored both signals): it is ended here.
            self._to_driver(signal.SIGKILL)
            self._wait(5.0)
        return self._finish(found, request)

    def _finish(self, found: dict[str, Any] | None, request: dict[str, Any]) -> Cancelled:
        from saphan.run import record as recorder

        waited = time.monotonic() - self.t0
        row = self.ctx.store.get_run(self.row.id)
        if row is None or not row.live:
            rec = self.ctx.run_record(self.row.id)
            by = "driver" if rec.outcome == "cancelled" else "itself"
            return Cancelled(rec, by, waited, self.steps)
        if self.far_alive:
            assert self.far is not None
            raise RuntimeError(
                f"run {row.id}: the far process (pid {self.far[1].pid} on {self.far[0].name}) "
                f"is still there after SIGKILL ({'; '.join(self.steps)}); the row stays live, "
                "its seat held")
        if self.driver_alive:
            raise RuntimeError(
                f"run {row.id}: its driver (pid {self.driver.pid if self.driver else '?'}) is "
                f"still alive after SIGKILL ({'; '.join(self.steps)}); the row stays live")
        exit_code, extra = self._far_end()
        what = ("the run's driver was gone" if self.driver is None or not self.steps
                else "the run's driver did not record the end")
        note = (f"cancelled by `saphan runs cancel` at {request['requested_at']} (signal "
                f"{request['signal']}, grace {request['grace']} s); {what}, so `runs cancel` "
                f"recorded it: {'; '.join(self.steps) or 'nothing of the run was left running'}")
        if self.far is None:
            note += ("; nothing of a local run outlives its driver (its boundary gets SIGKILL "
                     "when the driver dies)")
        if recorder.cancelled_by_operator(self.ctx, row, note=note, live=found,
                                          exit_code=exit_code,
                                          extra={"cancel": {**request, "steps": self.steps},
                                                 **extra}):
            return Cancelled(self.ctx.run_record(row.id), "cancel", waited, self.steps)
        rec = self.ctx.run_record(row.id)
        return Cancelled(rec, "driver" if rec.outcome == "cancelled" else "itself", waited,
                         self.steps)

    def _far_end(self) -> tuple[int | None, dict[str, Any]]:
        """The far launcher's status once its process is gone: the exit code
        it wrote (128+N when a signal ended the command), and its lines."""
        if self.far is None:
            return None, {}
        from saphan.site import far as far_side
        from saphan.site import launcher_status

        m, _holder = self.far
        try:
            conn = self.ctx.ssh(m)
            root = far_side.install_dir(self.ctx.record_key())
            lines = launcher_status.lines_of(far_side.read_status(conn, root, self.row.id))
            far_side.forget_run(conn, root, self.row.id)
        except TransportError as e:
            return None, {"far_status_error": str(e)}
        return launcher_status.exit_code(lines), {"far_status": lines}


def _far(ctx: Context, row: RunRow) -> tuple[Machine, Holder] | None:
    """The row's far holder and its machine, when the row names one."""
    if not (row.holder_host or "").startswith("ssh://") or row.holder_pid is None:
        return None
    from saphan.site.far import holder_host

    m = ctx.machine(row.machine)
    if m.transport != "ssh" or holder_host(m) != row.holder_host:
        raise UserError(
            f"run {row.id}'s far holder is {row.holder_host}, which machine {m.name} "
            f"({m.address()}) no longer names; end its row with `saphan runs finalize "
            f"{row.id} --force` once that process is known gone")
    return m, Holder(str(row.holder_host), int(row.holder_pid), row.holder_start_ticks,
                     row.holder_boot_id)


def _driver(row: RunRow, found: dict[str, Any] | None) -> Holder | None:
    """The saphan process driving the run: the row's holder while it is on
    this host, else (a far run) the ``driven_by`` of its verified record."""
    from saphan.liveness import this_host

    if row.holder_host == this_host() and row.holder_pid is not None:
        return Holder(row.holder_host, row.holder_pid, row.holder_start_ticks,
                      row.holder_boot_id)
    d = (found or {}).get("driven_by")
    if isinstance(d, dict) and d.get("host") == this_host() and isinstance(d.get("pid"), int):
        ticks, boot = d.get("start_ticks"), d.get("boot_id")
        return Holder(str(d["host"]), int(d["pid"]), ticks if isinstance(ticks, int) else None,
                      boot if isinstance(boot, str) else None)
    return None


def _signal_here(h: Holder, sig: int) -> str:
    """``sig`` to the process ``h`` names on this host, only if it still is
    that process: a pidfd pins it, then its boot id and start time are
    checked (a pid reused since is left alone). "sent" or why not."""
    from saphan.liveness import boot_id, process_start_ticks, same_boot

    if h.start_ticks is None or h.boot_id is None:
        return "not sent: its start time or boot id was not recorded"
    try:
        fd = os.pidfd_open(h.pid)
    except ProcessLookupError:
        return "gone"
    except OSError as e:
        return f"not sent: {e.strerror}"
    try:
        try:
            ticks = process_start_ticks(h.pid)
        except (ValueError, IndexError):
            ticks = None
        here = boot_id()
        if here is None or not same_boot(h.boot_id, here) or ticks != h.start_ticks:
            return "gone (its pid is another process now)"
        signal.pidfd_send_signal(fd, sig)
        return "sent"
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "not sent: permission denied (another user's saphan drives it)"
    finally:
        os.close(fd)
