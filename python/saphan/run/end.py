"""How a run's body ended (RunEnd), as every site records it; and the cancel
request `saphan runs cancel` leaves for the process driving the run.

The request is ``runs/<id>/cancel.json`` in the workspace (hidden from every
run, far runs never see this machine's workspace): the signal the run's
command gets first and the grace before SIGKILL. The driver reads it when a
signal reaches it (transport/local.py) and when it records the end
(run/record.finished): a run with a request ends ``cancelled``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saphan.errors import Interrupted
from saphan.refusals import Refusal

#: the cancel request's file name in a run's directory
CANCEL_REQUEST = "cancel.json"
#: the signals `runs cancel --signal` may send first: the three saphan-launcher
#: passes on to the command before it ends the tree, and SIGKILL (no grace)
CANCEL_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGKILL")
#: at most this much of a request is read (it is a few dozen bytes)
_REQUEST_LIMIT = 4096


def cancel_request(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's cancel request, or None (no request, or not one saphan writes:
    a link, not a JSON object, a signal outside :data:`CANCEL_SIGNALS`)."""
    path = os.path.join(run_dir, CANCEL_REQUEST)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = json.loads(os.read(fd, _REQUEST_LIMIT))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("signal") not in CANCEL_SIGNALS:
        return None
    return data


def requested_signal(run_dir: str | os.PathLike[str]) -> signal.Signals:
    """What the run's command gets when a signal reaches its driver: the
    cancel request's signal, else SIGTERM."""
    req = cancel_request(run_dir)
    return signal.Signals[req["signal"]] if req is not None else signal.SIGTERM


def write_cancel_request(run_dir: Path, request: dict[str, Any]) -> None:
    """Leave ``request`` in the run's directory (a new file renamed over any
    earlier one; never through a link)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{CANCEL_REQUEST}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, json.dumps(request, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, run_dir / CANCEL_REQUEST)


def signal_text(code: int | None) -> str:
    """An exit status as saphan prints it: a signal by name (``SIGTERM``, as
    Python reports a child killed by it: -15), ``-`` for none."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


class RunEnd:
    """How a run's body ended, as every lane records it.

    Starts as "error" (anything unforeseen); ``exited`` records a normal end;
    ``absorb`` classifies the exception on its way out (the caller re-raises).
    """

    def __init__(self) -> None:
        self.outcome = "error"
        self.state = "ended"
        self.exit_code: int | None = None
        self.refusal_class: str | None = None

    def exited(self, code: int) -> None:
        self.exit_code = code
        self.outcome = "exited" if code == 0 else "failed"

    def cancelled(self, request: dict[str, Any], record: dict[str, Any]) -> None:
        """The run ended after `saphan runs cancel` asked it to (``request``,
        :func:`cancel_request`): its outcome is ``cancelled``, whatever the
        command's status (kept as its exit code). A refusal stays a refusal."""
        if self.state == "refused":
            return
        was = self.outcome
        self.outcome = "cancelled"
        record["cancel"] = request
        record["notes"] = [*record.get("notes", []), (
            f"cancelled by `saphan runs cancel` (requested at {request.get('requested_at')}, "
            f"signal {request.get('signal')}, grace {request.get('grace')} s); the run's own "
            f"driver recorded it: the command ended {was} with status "
            f"{signal_text(self.exit_code)}")]

    def absorb(
        self,
        e: BaseException,
        record: dict[str, Any],
        interrupted_note: Callable[[Interrupted], str] = str,
    ) -> None:

        if isinstance(e, Refusal):
            self.outcome, self.state, self.refusal_class = "refused", "refused", e.cls
            record["refusal"] = e.as_dict()
            e.run_id = record["id"]
            if record.get("enforced_by") is not None:
                # Composed, never started: the record claims no enforcement.
                record["composed_boundary"] = record["enforced_by"]
                record["enforced_by"] = None
        elif isinstance(e, Interrupted):
            self.outcome, self.exit_code = "interrupted", e.exit_code
            record["notes"] = [*record.get("notes", []), interrupted_note(e)]
        elif isinstance(e, KeyboardInterrupt):
            self.outcome = "interrupted"
        else:
            self.outcome = "error"
            record["error"] = f"{type(e).__name__}: {e}"
