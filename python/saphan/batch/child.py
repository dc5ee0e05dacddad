"""One batch task's run, in its own process: ``python -m saphan.batch.child``.

The worker (batch/worker.py) starts it in a session of its own and writes
one JSON line on its standard input: the workspace, the batch, the task's
sequence number, the run id its claim was made for, and how long to wait
for a seat. The worker keeps that pipe open while it lives: its end tells
the child its worker died, and the child ends (SIGTERM to itself).

The child first names itself on that claim (Store.register_child): if the
claim is no longer for that run id (given back after its worker was judged
dead), it runs nothing. It reads the task from the store and runs it only
if its signature verifies with the record key (records.task_signature):
write access to the store does not make a worker run a command. Then it is
``saphan run --tool … --wait``: one
cast through the one pipeline (Engine.run), with the claim's run id. Its
output is the run's (runs/<id>/); on standard output it writes one JSON
line only when no run was recorded ({"error": ...}).

Exit status: 0 a run was recorded (whatever its outcome), 3 refused (the
refusal recorded), 2 a task saphan cannot run (nothing recorded), 69 the
store or a transport failed first (claimed again), 75 the claim was gone,
128+N a signal ended it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from saphan.batch import EXIT_BAD_TASK, EXIT_CLAIM_GONE, EXIT_RETRY

__all__ = ["EXIT_BAD_TASK", "EXIT_CLAIM_GONE", "EXIT_RETRY", "main"]


def main() -> int:
    from saphan.batch.spec import pinned_files, run_arguments
    from saphan.engine import Engine
    from saphan.errors import Interrupted, TransportError, UserError
    from saphan.liveness import current_holder
    from saphan.records import task_verifies
    from saphan.refusals import EXIT_CODE as REFUSED
    from saphan.refusals import Refusal
    from saphan.store import StoreError

    order = json.loads(sys.stdin.buffer.readline(1 << 20))
    _lifeline()
    engine: Engine | None = None
    try:
        engine = Engine(order["home"])
        store = engine.store
        if not store.register_child(order["batch"], order["seq"], order["run_id"],
                                    current_holder().as_tuple()):
            return _say(EXIT_CLAIM_GONE, "the claim is no longer for this run id; nothing run")
        t = store.get_task(order["batch"], order["seq"])
        if t is None or t.run_id != order["run_id"]:
            return _say(EXIT_CLAIM_GONE, "the claim is no longer for this run id; nothing run")
        try:
            key = engine.ctx.record_key()
        except Refusal as r:  # its custody fails: nothing can be verified, nothing is run
            return _say(EXIT_BAD_TASK, r.render())
        if not task_verifies(key, t.batch, t.seq, t.task_id, t.spec_json, t.signature):
            return _say(EXIT_BAD_TASK, (
                f"[record-signature-invalid] task {t.task_id!r} of batch {t.batch} does not "
                "verify with this workspace's record key: it was not written by a holder of "
                "the key (or was changed in the store since); nothing was run. Investigate "
                "who can write the store"))
        # the policy files' signed bytes, in private copies the run loads
        spec: dict[str, Any] = pinned_files(
            t.spec(), str(engine.workspace.home / "batches" / t.batch))
        argv, kwargs = run_arguments(spec)
        engine.run(spec.get("machine"), None, argv, stream=False, wait=float(order["wait"]),
                   run_id=order["run_id"], **kwargs)
        return 0
    except Refusal:
        return REFUSED  # recorded on the run's row
    except Interrupted as e:
        return 128 + e.signum
    except (StoreError, TransportError) as e:  # a passing fault: the worker claims it again
        return _say(EXIT_RETRY, str(e))
    except UserError as e:
        return _say(EXIT_BAD_TASK, str(e))
    finally:
        if engine is not None:
            engine.close()


def _lifeline() -> None:
    """The worker keeps this child's stdin open while it lives: end of file
    means it died, and the child ends as Ctrl-C would end it (SIGTERM: a run
    is told and recorded interrupted; a wait for a seat stops, nothing
    held). A task never goes on unobserved in a batch its operator stopped."""
    import os
    import signal
    import threading

    def watch() -> None:
        while os.read(0, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


def _say(code: int, error: str) -> int:
    sys.stdout.write(json.dumps({"error": error}) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
