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

Every signed row carries the KEY ID of the key that signed it
(:func:`key_id`: a short, non-secret name for the key, never the key). A
row signed by a key this workspace does not hold is FOREIGN: "signed by key
K, not held here" — not verified here, and not called invalid either (a
workspace that holds K verifies it; docs/operators.md). Rows written before
key ids verify as they always did.
"""

from __future__ import annotations

import json
from typing import Any

from saphan import refusals
from saphan.store.rows import Fact, RunRow

#: The field of a run record that carries its signature (hex HMAC-SHA256).
SIGNATURE_FIELD = "record_signature"
#: The (signed) field of a run record naming the key that signed it.
KEY_ID_FIELD = "record_key_id"
#: What the key id is derived from: HMAC-SHA256(key, this), domain-separated
#: from every record MAC (a record is canonical JSON, never this text).
_KEY_ID_DOMAIN = b"saphan record key id v1"

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
    value: ``mismatched``), "missing" (no signature), "foreign" (signed by a
    key this workspace does not hold: ``key_id`` names it; not verified here)
    or "pending" (a live run whose record has not been written to the store
    yet). Invalid and missing carry ``class`` (record-signature-invalid),
    ``message`` and ``remediation``; foreign carries ``message`` and
    ``remediation`` but no class: it is not an invalid signature.
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
        """"valid", "invalid", "missing", "foreign" or "pending" (see the class docstring).

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

    @property
    def signature_unverified(self) -> bool:
        """True when nothing here vouches for the record: flagged, or foreign
        (the key id a foreign record names is in the store's hands too, so a
        foreign record is never treated better than an invalid one)."""
        return self.signature in ("invalid", "missing", "foreign")

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


_STATUSES = ("valid", "invalid", "missing", "foreign", "pending")


def _columns(row: RunRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "machine": row.machine,
        "slot": row.slot,
        # (a value that is not a number — SQLite keeps what it is given — is
        # kept as it is: it then disagrees with any signed ordinal, flagged)
        "session_ordinal": (row.session_ordinal if not isinstance(row.session_ordinal, int)
                            or row.session_ordinal >= 0 else None),
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


def key_id(key: bytes) -> str:
    """The key's id: the first 16 hex digits of HMAC-SHA256(key, a fixed
    domain string). Names the key in rows and messages; reveals nothing
    that would sign a row (it is a one-way function of the key)."""
    return _mac(key, _KEY_ID_DOMAIN)[:16]


def _is_key_id(value: object) -> bool:
    return (isinstance(value, str) and len(value) == 16
            and all(c in "0123456789abcdef" for c in value))


def _record_mac(key: bytes, record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return _mac(key, canonical)


def sign_record(key: bytes, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as it will read back from JSON, with its ``record_signature``.

    The MAC covers the canonical JSON (sorted keys, no whitespace) of the
    record without its signature field; the record names the key that signs
    it (``record_key_id``, signed too). The record goes through JSON first so
    that what is signed is exactly what a reader will re-serialise (tuples
    become lists, keys become strings).
    """
    plain: dict[str, Any] = json.loads(json.dumps(record, sort_keys=True))
    plain.pop(SIGNATURE_FIELD, None)
    plain[KEY_ID_FIELD] = key_id(key)
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
    except (ValueError, RecursionError):  # nested past the parser's depth: not a record
        record = None
    if not isinstance(record, dict):
        return {"unparsed_record_json": row.record_json}, _flag("invalid", (
            f"run {row.id}: the stored record is not a JSON object, so it cannot verify"))
    signature = record.get(SIGNATURE_FIELD)
    if signature is None:
        return record, _flag("missing", (
            f"run {row.id}: this record carries no signature (written by a saphan build that "
            "did not sign run records, or its signature was removed)"))
    signer = record.get(KEY_ID_FIELD)
    held = key_id(key)
    if isinstance(signer, str) and _is_key_id(signer) and signer != held:
        return record, foreign(f"run {row.id}: signed by key {signer}, not held here", signer,
                               held)
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


def foreign(what: str, signer: str, held: str) -> dict[str, Any]:
    """The ``signature`` object of a row signed by key ``signer``, read
    under key ``held``."""
    return {"status": "foreign", "key_id": signer, "held_key_id": held, "message": (
        f"{what} (this workspace holds key {held}): it is not verified here, and it is not "
        f"an invalid signature; a workspace holding key {signer} verifies it"),
        "remediation": _FOREIGN_FIX}


_FOREIGN_FIX = (
    "to verify it here, this workspace must hold the key that signed it: operators sharing "
    "a store share one fleet key; make a workspace that joins it: `saphan init --database-url "
    "URL --join --key-file FILE` (docs/operators.md)"
)


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


# A fact's signature column is "KEYID:MAC" (the MAC covers the key id too);
# a row written before key ids holds the bare MAC and verifies as it did.


def _payload(machine: str, kind: str, value_json: str, measured_at: str,
             signer: str | None = None) -> bytes:
    items = [machine, kind, value_json, measured_at] + ([signer] if signer else [])
    return json.dumps(items, separators=(",", ":")).encode()


def fact_key_id(fact: Fact) -> str | None:
    """The key id a fact row names (None: a row from before key ids)."""
    signer, sep, _mac_hex = fact.signature.rpartition(":")
    return signer if sep and _is_key_id(signer) else None


def sign_fact(key: bytes, machine: str, kind: str, value: dict[str, Any], measured_at: str) -> Fact:
    value_json = json.dumps(value, sort_keys=True, separators=(",", ":"))
    signer = key_id(key)
    sig = _mac(key, _payload(machine, kind, value_json, measured_at, signer))
    return Fact(machine, kind, value_json, measured_at, f"{signer}:{sig}")


def foreign_fact(key: bytes, fact: Fact) -> dict[str, Any] | None:
    """The ``signature`` object of a fact signed by a key this workspace
    does not hold, else None."""
    signer, held = fact_key_id(fact), key_id(key)
    if signer is None or signer == held:
        return None
    return foreign(f"the {fact.kind} row of machine {fact.machine} (measured "
                   f"{fact.measured_at}) is signed by key {signer}, not held here", signer, held)


def verify_fact(key: bytes, fact: Fact) -> dict[str, Any]:
    """The fact's value, or the refusal when its signature does not verify
    here: it does not verify (invalid), or it was signed by a key this
    workspace does not hold (foreign: nothing here can confirm it, so
    nothing is gated on it; the message names the key id)."""
    signer, held = fact_key_id(fact), key_id(key)
    if signer is not None and signer != held:
        raise refusals.record_signature_invalid(
            f"the {fact.kind} row of machine {fact.machine} (measured {fact.measured_at}) is "
            f"signed by key {signer}, not held here (this workspace holds key {held}): not an "
            "invalid signature, but nothing here can confirm it, so nothing is decided on it",
            f"{_FOREIGN_FIX}; re-measuring from here would sign it under key {held} and make "
            f"it foreign to the workspaces holding {signer}",
        )
    signer, sep, mac_hex = fact.signature.rpartition(":")
    if not sep:
        signer, mac_hex = "", fact.signature
    want = _mac(key, _payload(fact.machine, fact.kind, fact.value_json, fact.measured_at,
                              signer or None))
    if not _same(want, mac_hex):
        raise refusals.record_signature_invalid(
            f"the {fact.kind} row of machine {fact.machine} (measured {fact.measured_at}) "
            "does not verify against this workspace's record key: it was edited, or "
            "written under another key",
            f"re-measure it: `saphan machine probe-confinement {fact.machine}`",
        )
    value: dict[str, Any] = json.loads(fact.value_json)
    return value


# -- signed batch tasks (batch/) ---------------------------------------------------

def task_signature(key: bytes, batch: str, seq: int, task_id: str, spec_json: str) -> str:
    """HMAC-SHA256 of one batch task, bound to its batch and its place in it:
    a worker runs only a task a holder of the record key wrote (write access
    to the store is not enough to make a worker run a command)."""
    body = json.dumps({"domain": "saphan batch task v1", "batch": batch, "seq": seq,
                       "task_id": task_id, "spec": spec_json},
                      sort_keys=True, separators=(",", ":")).encode()
    return _mac(key, body)


def task_verifies(key: bytes, batch: str, seq: int, task_id: str, spec_json: str,
                  signature: str) -> bool:
    return _same(task_signature(key, batch, seq, task_id, spec_json), signature)
