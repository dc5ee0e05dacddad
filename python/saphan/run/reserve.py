"""Reserve: one of the slot's ordinals, in the database (capacity.py), or
the refusal (seat-full) recorded on the run's row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saphan.errors import Interrupted
from saphan.refusals import Refusal
from saphan.run import record as recorder

if TYPE_CHECKING:
    from collections.abc import Callable

    from saphan.context import Context
    from saphan.liveness import Holder, RemoteCheck
    from saphan.store.rows import Slot


def reserve(ctx: Context, s: Slot, base: dict[str, Any], wd: str, holder: Holder,
            remote: RemoteCheck | None = None, wait: float = 0.0,
            checkpoint: Callable[[], None] | None = None) -> int:
    """The ordinal this run holds; ``remote`` reads far holders' liveness;
    ``wait``: seconds a full slot is tried again (capacity.reserve_seat),
    ``checkpoint`` called between tries (it raises to stop waiting)."""
    from saphan.capacity import reserve_seat

    try:
        return reserve_seat(ctx.store, s, run_id=base["id"], tool=s.tool, workdir=wd,
                            holder=holder, remote=remote, record_key=ctx.record_key,
                            wait=wait, on_wait=_say, checkpoint=checkpoint)
    except Refusal as refusal:
        recorder.refused(ctx, base, s.tool, holder, refusal)
        raise
    except Interrupted as e:
        e.recorded = False  # while it waited for a seat: no row was written
        raise


def _say(text: str) -> None:
    import sys

    print(f"saphan: {text}", file=sys.stderr, flush=True)
