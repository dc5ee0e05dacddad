"""Reserve one of a slot's ordinals, with bounded conflict handling.

1. try the ordinals 0..N-1 (store.reserve: one INSERT … ON CONFLICT each);
2. all taken: read the blocking live runs (on PostgreSQL in the same round
   trip: Store.reserve_or_holders) and test each holder's liveness;
3. finalise each genuinely dead holder individually, by run id;
4. retry once (with the same reading of the holders, in the same trip);
5. otherwise refuse ``seat-full``, naming both numbers and the holders that
   retry read.

Nothing here waits unless asked (``wait``, `saphan run --wait`): then step 4
repeats with backoff, holding nothing between tries.
"""

from __future__ import annotations

from collections.abc import Callable

from saphan import refusals
from saphan.liveness import Holder, Liveness, RemoteCheck, check
from saphan.store import Store
from saphan.store.rows import RunRow, Slot

#: Returns the workspace record key (Workspace.record_key), read only when a
#: dead holder's record is to be signed.
KeySource = Callable[[], bytes]


def holder_of(run: RunRow) -> Holder:
    return Holder(
        run.holder_host or "?", run.holder_pid or -1, run.holder_start_ticks, run.holder_boot_id
    )


def holder_liveness(run: RunRow, remote: RemoteCheck | None = None) -> Liveness:
    """``remote`` reads holders on another machine (saphan.site.far); without
    it, a holder on another host is "unknown" and counted as alive."""
    return check(holder_of(run), remote)


def recover_dead_holders(
    store: Store, slot: Slot, remote: RemoteCheck | None = None,
    record_key: KeySource | None = None,
) -> list[tuple[RunRow, Liveness]]:
    """Test every live run on the slot; finalise the dead ones by id.

    Each finalised record is signed with ``record_key()`` (records.py). The
    engine always passes it; without it (store-level callers: tests, benches)
    the record is written unsigned and reads back flagged "missing".
    Returns the runs still holding, with their liveness ("alive" or "unknown").
    """
    return _recover(store, store.live_runs(slot.machine, slot.name), remote, record_key)


def _recover(store: Store, runs: list[RunRow], remote: RemoteCheck | None,
             record_key: KeySource | None) -> list[tuple[RunRow, Liveness]]:
    """:func:`recover_dead_holders` of the live ``runs`` as read."""
    holding: list[tuple[RunRow, Liveness]] = []
    for run in runs:
        life = holder_liveness(run, remote)
        if life.state == "dead":
            from saphan.run.record import holder_dead

            holder_dead(store, run, life.evidence, record_key)
        else:
            holding.append((run, life))
    return holding


def reserve_seat(
    store: Store, slot: Slot, *, run_id: str, tool: str, workdir: str | None, holder: Holder,
    remote: RemoteCheck | None = None, record_key: KeySource | None = None,
    wait: float = 0.0, on_wait: Callable[[str], None] | None = None,
    checkpoint: Callable[[], None] | None = None,
) -> int:
    """The ordinal this run holds, or the ``seat-full`` refusal.

    ``record_key`` signs the records of dead holders finalised on the way.
    ``wait`` (seconds, `saphan run --wait`): a full slot is tried again —
    the same reservation, the same run id — with a backoff of 0.25 s
    doubling to 4 s, until a seat is taken or the time is spent. Each try is
    one statement; nothing (no transaction, no lock) is held between tries.
    ``on_wait`` is told once, when the waiting starts; ``checkpoint`` is
    called after each pause (it raises to stop the waiting: a signal).
    """
    args = dict(
        run_id=run_id, machine=slot.machine, slot=slot.name, capacity=slot.capacity,
        tool=tool, workdir=workdir, holder=holder.as_tuple(),
    )
    # One round trip on PostgreSQL: the seat, or the runs holding every ordinal.
    ordinal, rows = store.reserve_or_holders(**args)  # type: ignore[arg-type]
    if ordinal is not None:
        return ordinal
    tested = {run.id: life for run, life in _recover(store, rows, remote, record_key)}
    ordinal, rows = store.reserve_or_holders(**args)  # type: ignore[arg-type]
    if ordinal is not None:
        return ordinal
    waited = ""
    if wait > 0:
        ordinal = _wait_for_seat(store, slot, args, wait, remote, record_key, on_wait,
                                 checkpoint)
        if ordinal is not None:
            return ordinal
        tested, waited = {}, f"; waited {wait:g} s for a seat"
        rows = store.live_runs(slot.machine, slot.name)
    # The last reading is what holds the seats now. Holders tested a moment
    # ago keep that verdict; only newcomers are tested.
    holding = [(r, tested[r.id] if r.id in tested else holder_liveness(r, remote))
               for r in rows]
    raise refusals.seat_full(
        seat_full_message(slot, holding) + waited,
        f"wait for a holder to finish (`saphan run --wait[=SECS]` waits for a seat), raise "
        f"the capacity with `saphan slot set "
        f"{slot.machine} {slot.name} --max-sessions N`, or end a run with `saphan runs "
        "cancel ID` (it ends the run's processes and records it cancelled)",
    )


#: `saphan run --wait`'s backoff between tries of the same reservation (seconds)
WAIT_FIRST, WAIT_MOST = 0.25, 4.0


def _wait_for_seat(
    store: Store, slot: Slot, args: dict[str, object], wait: float,
    remote: RemoteCheck | None, record_key: KeySource | None,
    on_wait: Callable[[str], None] | None, checkpoint: Callable[[], None] | None = None,
) -> int | None:
    """Try ``args``' reservation again until ``wait`` seconds are spent (reserve_seat)."""
    import time

    if on_wait is not None:
        on_wait(f"slot {slot.name} on {slot.machine} is full ({slot.capacity} of "
                f"{slot.capacity} seats held); waiting up to {wait:g} s for a seat")
    deadline = time.monotonic() + wait
    delay = WAIT_FIRST
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(delay, left))
        if checkpoint is not None:
            checkpoint()
        delay = min(delay * 2, WAIT_MOST)
        ordinal, rows = store.reserve_or_holders(**args)  # type: ignore[arg-type]
        if ordinal is None:
            _recover(store, rows, remote, record_key)
            ordinal, _ = store.reserve_or_holders(**args)  # type: ignore[arg-type]
        if ordinal is not None:
            return ordinal
    return None


def seat_full_message(slot: Slot, holding: list[tuple[RunRow, Liveness]]) -> str:
    parts = []
    for run, life in holding:
        desc = f"run {run.id} (pid {run.holder_pid} on {run.holder_host} since {run.started_at}"
        if life.state == "unknown":
            desc += f"; liveness unknown: {life.evidence}, counted as alive"
        parts.append(desc + ")")
    return (
        f"slot {slot.name} on {slot.machine} carries {len(holding)} "
        f"run{'s' if len(holding) != 1 else ''} and may carry {slot.capacity}; "
        f"holding: {', '.join(parts) if parts else 'none (freed since; retry)'}"
    )
