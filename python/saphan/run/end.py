"""How a run's body ended (RunEnd), as every site records it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from saphan.errors import Interrupted
from saphan.refusals import Refusal


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
