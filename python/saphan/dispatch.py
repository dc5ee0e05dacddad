"""Compose, dispatch and record a reserved local run; always finalise its row.

The row is finalised whatever happens after the reservation: a normal exit,
a refusal at composition, Ctrl-C or SIGTERM to saphan (forwarded to the
child first), or an unexpected error. Only SIGKILL leaves a live row, and the
next conflict handling on the slot recovers it (capacity.py).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from saphan.confine.compose import compose_local
from saphan.confine.grants import derive
from saphan.refusals import Refusal
from saphan.store.rows import Slot
from saphan.timefmt import now_iso
from saphan.transport import local

if TYPE_CHECKING:
    from saphan.engine import Engine
    from saphan.records import RunRecord

NOT_CONFINED = (
    "what this boundary does not restrict: reads (anything readable by this user is "
    "readable by the run, except the read denials listed), network egress (no egress "
    "policy declared), and metadata changes are limited only by the read-only mounts"
)


def execute_local(
    engine: Engine,
    slot: Slot,
    base: dict[str, Any],
    argv: list[str],
    wd: str,
    *,
    stream: bool = True,
) -> RunRecord:
    store = engine.store
    ws = engine.workspace
    run_id = base["id"]
    record: dict[str, Any] = {**base, "started_at": now_iso(), "enforced_by": None}
    outcome, state, exit_code, refusal_class = "error", "ended", None, None
    try:
        run_dir = ws.run_dir(run_id)
        out_dir = run_dir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        policy = derive(
            wd,
            return_path=str(out_dir),
            read_denials=(str(ws.key_path), str(ws.config_path)),
        )
        boundary = compose_local(policy, run_dir=str(run_dir))
        os.makedirs(policy.scratch_dir, exist_ok=True)
        record.update(
            {
                "enforced_by": boundary.record(),
                "policy": policy.as_record(),
                "writable": policy.writable_set(),
                "notes": [*policy.notes, NOT_CONFINED],
                "return_path": str(out_dir),
                "boundary_argv": boundary.prefix,
            }
        )
        env = dict(os.environ)
        env["TMPDIR"] = policy.scratch_dir
        env["SAPHAN_RUN_ID"] = run_id
        env["SAPHAN_RETURN_PATH"] = str(out_dir)
        store.mark_running(run_id)
        engine.write_record_file({**record, "state": "running"})
        finished = local.run(
            [*boundary.prefix, *argv], cwd=wd, run_dir=str(run_dir), env=env,
            stream=stream,
        )
        exit_code = finished.exit_code
        outcome = "exited" if exit_code == 0 else "failed"
        record["output"] = {"stdout": finished.stdout_path, "stderr": finished.stderr_path}
    except Refusal as refusal:
        outcome, state, refusal_class = "refused", "refused", refusal.cls
        record["refusal"] = refusal.as_dict()
        refusal.run_id = run_id
        raise
    except local.Interrupted as intr:
        outcome, exit_code = "interrupted", intr.exit_code
        record["notes"] = [*record.get("notes", []), str(intr)]
        raise
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    except BaseException as e:
        outcome = "error"
        record["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        record.update(
            {"finished_at": now_iso(), "outcome": outcome, "exit_code": exit_code,
             "state": state}
        )
        store.finalize(
            run_id, state=state, outcome=outcome, exit_code=exit_code,
            refusal_class=refusal_class, record_json=json.dumps(record, sort_keys=True),
        )
        engine.write_record_file(record)
    return engine.run_record(run_id)
