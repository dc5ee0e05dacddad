"""Every request parameter, checked against its shape before anything is
read: a run or batch id is a run id's 26 characters, a machine or slot name
the names saphan accepts, a filter one of its known values, a cursor a
started_at and a run id, an offset a bounded integer. Anything else — a
path, ``..``, a NUL, a parameter no page takes — is :class:`BadParameter`:
the request gets 400 naming the parameter, and nothing is looked up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: a page cursor's started_at, base64url without padding (a few hundred bytes at most)
_B64 = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_WORD = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
#: the largest byte offset a log tail is asked from
MAX_OFFSET = 1 << 50
#: the runs page's sizes
PAGE_SIZES = (25, 50, 100, 200)


class BadParameter(ValueError):
    def __init__(self, name: str, why: str):
        super().__init__(f"parameter {name!r}: {why}")
        self.name = name


def only(given: Iterable[str], allowed: Iterable[str]) -> None:
    """Refuse a parameter the page does not take."""
    allowed = set(allowed)
    for name in given:
        if name not in allowed:
            raise BadParameter(name, "this page takes no such parameter")


def run_id(value: str, name: str = "run") -> str:
    from saphan.ids import is_run_id

    if not is_run_id(value):
        raise BadParameter(name, "not a run id (26 characters of Crockford base32)")
    return value


def name(value: str, param: str) -> str:
    if not _NAME.fullmatch(value):
        raise BadParameter(param, "not a machine or slot name (1-63 letters, digits, '.', '_', "
                                  "'-', starting with a letter or digit)")
    return value


def one_of(value: str, choices: Iterable[str], param: str) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise BadParameter(param, f"choose one of {', '.join(choices)}")
    return value


def word(value: str, param: str) -> str:
    if not _WORD.fullmatch(value):
        raise BadParameter(param, "not an outcome (lower-case letters, digits and '-')")
    return value


def offset(value: str, param: str = "offset") -> int:
    if not value.isdigit() or len(value) > 16 or int(value) > MAX_OFFSET:
        raise BadParameter(param, f"give a byte offset 0..{MAX_OFFSET}")
    return int(value)


#: a start time as saphan writes it (timefmt.now_iso): the only kind a page
#: cursor carries. A row with any other (text, a BLOB SQLite sorts after all
#: text) ends the paging with a note (serve/reader.runs), never a wrong page
_STARTED = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z?")


def cursor(value: str) -> tuple[str, str]:
    """``B64~RUNID``: the last run of the page before — its started_at
    (base64url) in the shape saphan writes (:data:`_STARTED`) and its run id."""
    import base64
    import binascii

    encoded, sep, rid = value.partition("~")
    if not sep or not _B64.fullmatch(encoded):
        raise BadParameter("before", "not a page cursor (the older → link writes it)")
    try:
        started = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, ValueError):
        raise BadParameter("before", "not a page cursor (the older → link writes it)") from None
    if not cursor_ok(started, rid):
        raise BadParameter("before", "not a page cursor (the older → link writes it)")
    return started, rid


def cursor_ok(started_at: object, rid: object) -> bool:
    """A page can end at this run: a cursor can carry it (:func:`cursor`)."""
    from saphan.ids import is_run_id

    return (isinstance(started_at, str) and isinstance(rid, str) and is_run_id(rid)
            and _STARTED.fullmatch(started_at) is not None)


def cursor_text(started_at: str, rid: str) -> str:
    import base64

    encoded = base64.urlsafe_b64encode(started_at.encode()).decode().rstrip("=")
    return f"{encoded}~{rid}"


@dataclass(frozen=True)
class RunFilters:
    """The runs page's filters: ``store`` is what Store.list_runs takes."""

    state: str | None = None
    machine: str | None = None
    slot: str | None = None
    tool: str | None = None
    outcome: str | None = None
    before: tuple[str, str] | None = None
    limit: int = 50

    @property
    def store(self) -> dict[str, Any]:
        out: dict[str, Any] = {"machine": self.machine, "slot": self.slot, "tool": self.tool,
                               "outcome": self.outcome, "before": self.before}
        if self.state == "live":
            out["live"] = True
        elif self.state is not None:
            out["state"] = self.state
        return out

    def query(self, **changes: Any) -> dict[str, str]:
        """The filters as query parameters (``changes`` applied; None dropped)."""
        values: dict[str, Any] = {"state": self.state, "machine": self.machine,
                                  "slot": self.slot, "tool": self.tool, "outcome": self.outcome,
                                  "before": (cursor_text(*self.before) if self.before else None),
                                  "limit": None if self.limit == 50 else str(self.limit)}
        values.update(changes)
        return {k: str(v) for k, v in values.items() if v is not None and v != ""}


RUN_FILTER_PARAMS = ("state", "machine", "slot", "tool", "outcome", "before", "limit")


def run_filters(query: Mapping[str, str], extra: Iterable[str] = ()) -> RunFilters:
    """The runs page's query, checked (module docstring); an empty value is no filter."""
    from saphan.run.listing import STATES
    from saphan.tools import TOOLS

    only(query.keys(), (*RUN_FILTER_PARAMS, *extra))
    got = {k: v for k, v in query.items() if v != "" and k in RUN_FILTER_PARAMS}
    limit = 50
    if "limit" in got:
        limit = int(one_of(got["limit"], map(str, PAGE_SIZES), "limit"))
    return RunFilters(
        state=one_of(got["state"], STATES, "state") if "state" in got else None,
        machine=name(got["machine"], "machine") if "machine" in got else None,
        slot=name(got["slot"], "slot") if "slot" in got else None,
        tool=one_of(got["tool"], TOOLS, "tool") if "tool" in got else None,
        outcome=word(got["outcome"], "outcome") if "outcome" in got else None,
        before=cursor(got["before"]) if "before" in got else None,
        limit=limit,
    )
