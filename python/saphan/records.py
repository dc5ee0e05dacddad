"""What saphan writes down: the run record and signed machine fact rows.

A run record names what ENFORCED (mechanism, version, the binary's digest) and
the writable set — never an option someone asked for. Machine facts (the
Landlock level, container rows, runtime facts) are written only by the probe
that measured them, signed with the workspace's record key; a row whose
signature does not verify is refused (``record-signature-invalid``).
"""

from __future__ import annotations

import json
from typing import Any

from saphan.refusals import Refusal
from saphan.store.rows import Fact, RunRow


class RunRecord:
    """A run's durable account, as stored in the run row and record.json."""

    __slots__ = ("data",)

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def __repr__(self) -> str:
        return f"RunRecord({self.data.get('id')!r}, outcome={self.data.get('outcome')!r})"

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def outcome(self) -> str | None:
        return self.data.get("outcome")

    @property
    def exit_code(self) -> int | None:
        return self.data.get("exit_code")

    @property
    def enforced_by(self) -> dict[str, Any] | None:
        return self.data.get("enforced_by")

    @property
    def refusal_class(self) -> str | None:
        refusal = self.data.get("refusal")
        return refusal["class"] if refusal else None

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.data, indent=indent, sort_keys=True)

    @classmethod
    def from_row(cls, row: RunRow) -> RunRecord:
        data = row.record()
        # The row's columns are the truth for what the store decides.
        data.update(
            {
                "id": row.id,
                "machine": row.machine,
                "slot": row.slot,
                "session_ordinal": row.session_ordinal if row.session_ordinal >= 0 else None,
                "state": row.state,
                "started_at": row.started_at,
                "finished_at": row.finished_at,
                "outcome": row.outcome,
                "exit_code": row.exit_code,
                "tool": row.tool,
            }
        )
        return cls(data)


# -- signed machine facts ------------------------------------------------------

# hashlib/hmac load OpenSSL (~10 ms): imported where a row is signed or
# verified, never on the start-up path of verbs that only list runs.


def _payload(machine: str, kind: str, value_json: str, measured_at: str) -> bytes:
    return json.dumps([machine, kind, value_json, measured_at], separators=(",", ":")).encode()


def sign_fact(key: bytes, machine: str, kind: str, value: dict[str, Any], measured_at: str) -> Fact:
    import hashlib
    import hmac

    value_json = json.dumps(value, sort_keys=True, separators=(",", ":"))
    sig = hmac.new(key, _payload(machine, kind, value_json, measured_at), hashlib.sha256)
    return Fact(machine, kind, value_json, measured_at, sig.hexdigest())


def verify_fact(key: bytes, fact: Fact) -> dict[str, Any]:
    """The fact's value, or the refusal when its signature does not verify."""
    import hashlib
    import hmac

    want = hmac.new(
        key, _payload(fact.machine, fact.kind, fact.value_json, fact.measured_at), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(want, fact.signature):
        raise Refusal(
            "record-signature-invalid",
            f"the {fact.kind} row of machine {fact.machine} (measured {fact.measured_at}) "
            "does not verify against this workspace's record key: it was edited, or "
            "written under another key",
            f"re-measure it: `saphan machine probe-confinement {fact.machine}`",
        )
    value: dict[str, Any] = json.loads(fact.value_json)
    return value
