"""What `saphan run` hands back to the program that started it.

    exit_status(code, own)  the exit status: saphan's (0 exited 0, else 1) or,
                            with ``own`` (--exit-code=command), the command's:
                            its status, 128+N for a signal N, 1 when none
    json_stdout(...)        with --json, stdout carries one JSON document: the
                            command's output goes to stderr while it runs, and
                            a refusal is printed as JSON (the refused run's
                            record, or ``{"refusal": ...}`` when none was
                            written) before it propagates
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from saphan.errors import Refusal, StoreError, UserError

if TYPE_CHECKING:
    from saphan.engine import Engine


def exit_status(code: int | None, *, own: bool) -> int:
    if not own:
        return 0 if code == 0 else 1
    if code is None:
        return 1
    if code < 0:
        return 128 + min(-code, 127)
    return code if code <= 255 else 1


@contextmanager
def json_stdout(engine: Engine, as_json: bool) -> Iterator[None]:
    """Inside: ``sys.stdout`` is stderr when ``as_json`` (the run streams there)."""
    if not as_json:
        yield
        return
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    except Refusal as refusal:
        sys.stdout = out
        print(refusal_json(engine, refusal), file=out, flush=True)
        raise
    finally:
        sys.stdout = out


def refusal_json(engine: Engine, refusal: Refusal) -> str:
    """The refused run's record as `runs show --json` prints it, else the refusal."""
    if refusal.run_id is not None:
        try:
            return engine.ctx.run_record(refusal.run_id).to_json()
        except (StoreError, UserError, Refusal):
            pass  # not written: the refusal itself is the answer
    return json.dumps({"refusal": {**refusal.as_dict(), "run": refusal.run_id}}, indent=2,
                      sort_keys=True)
