"""What saphan writes down: the run record and signed machine fact rows.

A run record names what ENFORCED (mechanism, version, the binary's digest) and
the writable set — never an option someone asked for. Every run record written
to the store is signed with the workspace's record key (HMAC-SHA256 over its
canonical JSON, in its ``record_signature`` field); reading it back verifies
the signature and holds the row's columns against the signed values. A record
that does not verify is shown FLAGGED (``signature``: invalid / missing), never
hidden and never silently trusted.

Machine facts (the Landlock level, container rows, runtime facts) are written
only by the probe that measured them, signed with the same key; a row whose
signature does not verify is refused (``record-signature-invalid``).
"""

from __future__ import annotations

import json
from typing import Any

from saphan import refusals
from saphan.store.rows import Fact, RunRow

#: The field of a run record that carries its signature (hex HMAC-SHA256).
SIGNATURE_FIELD = "record_signature"

#: The run row's columns held against the signed record when it is read.
#: ``id`` too: a record signed for one run, copied onto another run's row, is
#: not that run's record.
SIGNED_COLUMNS = (
    "id", "machine", "slot", "tool", "state", "outcome", "exit_code", "finished_at",
    "session_ordinal",
)

#: What ``runs show`` prints first when a record does not verify.
INVALID_HEADLINE = (
    "record-signature-invalid: this record does not verify against the workspace key "
    "(edited, or written under another key)"
)
MISSING_HEADLINE = (
    "record-signature-invalid: this record carries no signature (signature missing: written "
    "by a saphan build that did not sign run records, or its signature was removed)"
)
_REMEDIATION = (
    "nothing saphan can re-sign honestly (a new signature would vouch for content saphan "
    "did not write): investigate who had write access to the store and to the record files "
    "($SAPHAN_HOME/runs/<id>/record.json); compare with your backups"
)


class RunRecord:
    """A run's durable account, as stored in the run row and record.json.

    ``data`` is the record with the row's columns over it (the store's truth)
    and, under ``"signature"``, how it verified: ``status`` is "valid",
    "invalid" (the MAC does not verify, or a column disagrees with the signed
    value: ``mismatched``), "missing" (no signature) or "pending" (a live run
    whose record has not been written to the store yet). Invalid and missing
    carry ``class`` (record-signature-invalid), ``message`` and ``remediation``.
    """

    __slots__ = ("data",)

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def __repr__(self) -> str:
        return (f"RunRecord({self.data.get('id')!r}, outcome={self.data.get('outcome')!r}, "
                f"signature={self.signature!r})")

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

    @property
    def signature(self) -> str:
        """"valid", "invalid", "missing" or "pending" (see the class docstring).

        A record built by hand, not read from the store, was never verified:
        "missing".
        """
        verified = self.data.get("signature")
        if isinstance(verified, dict) and verified.get("status") in _STATUSES:
            return str(verified["status"])
        return "missing"

    @property
    def signature_flagged(self) -> bool:
        """True when the record must not be trusted as written (invalid or missing)."""
        return self.signature in ("invalid", "missing")

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.data, indent=indent, sort_keys=True)

    @classmethod
    def from_row(cls, row: RunRow, key: bytes) -> RunRecord:
        """The row's record, verified against ``key`` (the workspace record key)."""
        data, verified = verify_run_row(key, row)
        # The row's columns are the truth for what the store decides; a column
        # that disagrees with its signed value flags the record (``mismatched``).
        data.update(_columns(row))
        data["signature"] = verified
        return cls(data)


_STATUSES = ("valid", "invalid", "missing", "pending")


def _columns(row: RunRow) -> dict[str, Any]:
    return {
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


# -- signed run records --------------------------------------------------------

# HMAC-SHA256 comes from rust/core (saphan._native): Python's hashlib/hmac
# would load OpenSSL (~3-7 ms) on every run that signs its record.


def _mac(key: bytes, data: bytes) -> str:
    from saphan import _native

    return _native.hmac_sha256(key, data)


def _same(a: str, b: str) -> bool:
    from saphan import _native

    return _native.digests_equal(a, b)


def _record_mac(key: bytes, record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return _mac(key, canonical)


def sign_record(key: bytes, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as it will read back from JSON, with its ``record_signature``.

    The MAC covers the canonical JSON (sorted keys, no whitespace) of the
    record without its signature field. The record goes through JSON first so
    that what is signed is exactly what a reader will re-serialise (tuples
    become lists, keys become strings).
    """
    plain: dict[str, Any] = json.loads(json.dumps(record, sort_keys=True))
    plain.pop(SIGNATURE_FIELD, None)
    plain[SIGNATURE_FIELD] = _record_mac(key, plain)
    return plain


def signed_record_json(key: bytes, record: dict[str, Any]) -> str:
    """The ``record_json`` to store for ``record``: signed, keys sorted."""
    return json.dumps(sign_record(key, record), sort_keys=True)


def _flag(status: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"status": status, "class": "record-signature-invalid", "message": message,
            "remediation": _REMEDIATION, **extra}


def verify_run_row(key: bytes, row: RunRow) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's record as stored, and how it verified (``RunRecord.signature``)."""
    if not row.record_json:
        if (row.finished_at is None and row.state in ("reserved", "running")
                and row.outcome is None and row.exit_code is None):
            return {}, {"status": "pending", "message": (
                f"run {row.id} is live and its record has not been written to the store yet; "
                "it is signed when the run ends")}
        return {}, _flag("missing", (
            f"run {row.id}: the row carries no record at all, though it is {row.state} "
            f"(outcome {row.outcome}); nothing was signed"))
    try:
        record = json.loads(row.record_json)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return {"unparsed_record_json": row.record_json}, _flag("invalid", (
            f"run {row.id}: the stored record is not a JSON object, so it cannot verify"))
    signature = record.get(SIGNATURE_FIELD)
    if signature is None:
        return record, _flag("missing", (
            f"run {row.id}: this record carries no signature (written by a saphan build that "
            "did not sign run records, or its signature was removed)"))
    if not isinstance(signature, str) or not _same(_record_mac(key, record), signature):
        return record, _flag("invalid", (
            f"run {row.id}: the record's signature does not verify against this workspace's "
            "record key: it was edited, or written under another key"))
    columns = _columns(row)
    mismatched = [
        {"column": c, "row": columns[c], "signed": record.get(c)}
        for c in SIGNED_COLUMNS if record.get(c) != columns[c]
    ]
    if mismatched:
        said = "; ".join(f"{m['column']}: the row says {m['row']!r}, the signed record "
                         f"{m['signed']!r}" for m in mismatched)
        return record, _flag("invalid", (
            f"run {row.id}: the record's signature verifies, but the row's columns disagree "
            f"with what was signed ({said}): the store was edited after the record was "
            "written"), mismatched=mismatched)
    return record, {"status": "valid"}


def verify_record(key: bytes, record: dict[str, Any]) -> bool:
    """True when ``record`` (a record file's content) carries a signature
    that verifies against ``key``: saphan wrote it with this workspace's key."""
    signature = record.get(SIGNATURE_FIELD)
    return isinstance(signature, str) and _same(_record_mac(key, record), signature)


def finalised_record_json(
    key: bytes, row: RunRow, *, outcome: str, note: str, finished_at: str,
    live: dict[str, Any] | None = None, exit_code: int | None = None,
) -> str:
    """The signed record for a live run finalised without its runner (by the
    operator, by `runs cancel`, or because its holder is dead): the run's own
    record if it verifies, else what was found kept apart as unverified, never
    re-signed as saphan's own. ``live``: the run's live record file, already
    verified (run/live.read_record), used when the row holds no record yet."""
    found, verified = verify_run_row(key, row)
    if verified["status"] == "pending" and live is not None:
        found = live
    record: dict[str, Any]
    if verified["status"] in ("valid", "pending"):
        record = {k: v for k, v in found.items() if k != SIGNATURE_FIELD}
    else:
        record = {
            "id": row.id, "workdir": row.workdir,
            "prior_record_signature": verified["status"],
            "unverified_prior_record": found,
            "notes": [
                f"the record found at finalisation did not verify ({verified['status']}: "
                f"{verified['message']}); it is kept under unverified_prior_record, as found, "
                "and this signature does not vouch for it"
            ],
        }
    record.setdefault("notes", []).append(note)
    record.setdefault("workdir", row.workdir)
    columns = _columns(row)
    record.setdefault("started_at", columns.pop("started_at"))
    record.update(columns)
    record.update({"state": "ended", "outcome": outcome, "exit_code": exit_code,
                   "finished_at": finished_at})
    return signed_record_json(key, record)


# -- signed machine facts ------------------------------------------------------


def _payload(machine: str, kind: str, value_json: str, measured_at: str) -> bytes:
    return json.dumps([machine, kind, value_json, measured_at], separators=(",", ":")).encode()


def sign_fact(key: bytes, machine: str, kind: str, value: dict[str, Any], measured_at: str) -> Fact:
    value_json = json.dumps(value, sort_keys=True, separators=(",", ":"))
    sig = _mac(key, _payload(machine, kind, value_json, measured_at))
    return Fact(machine, kind, value_json, measured_at, sig)


def verify_fact(key: bytes, fact: Fact) -> dict[str, Any]:
    """The fact's value, or the refusal when its signature does not verify."""
    want = _mac(key, _payload(fact.machine, fact.kind, fact.value_json, fact.measured_at))
    if not _same(want, fact.signature):
        raise refusals.record_signature_invalid(
            f"the {fact.kind} row of machine {fact.machine} (measured {fact.measured_at}) "
            "does not verify against this workspace's record key: it was edited, or "
            "written under another key",
            f"re-measure it: `saphan machine probe-confinement {fact.machine}`",
        )
    value: dict[str, Any] = json.loads(fact.value_json)
    return value
