"""Timestamps: UTC, ISO-8601 with microseconds and a Z, so they sort as text."""

from __future__ import annotations

import time


def now_iso() -> str:
    t = time.time()
    secs = int(t)
    micros = int((t - secs) * 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{micros:06d}Z"


#: ``30s``, ``15m``, ``12h``, ``7d``, ``2w``: the durations options take
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: the longest duration any option takes (ten years)
MAX_DURATION = 3650 * 86400


def parse_duration(text: str, option: str) -> int:
    """Seconds of ``N[s|m|h|d|w]`` (a bare N is seconds), 0..MAX_DURATION;
    anything else is bad input naming ``option`` and the form."""
    from saphan.errors import UserError

    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    if not number.isdigit() or len(number) > 12:
        raise UserError(f"{option} {text!r} is not a duration; give N followed by s, m, h, d "
                        "or w (e.g. 30m, 12h, 7d)")
    seconds = int(number) * _UNITS[unit]
    if seconds > MAX_DURATION:
        raise UserError(f"{option} {text!r} is out of range; give at most 3650d")
    return seconds


def iso_ago(seconds: int) -> str:
    """The UTC time ``seconds`` ago, in :func:`now_iso`'s form (sorts as text)."""
    t = time.time() - seconds
    secs = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int((t - secs) * 1e6):06d}Z"


def parse_since(text: str, option: str = "--since") -> str:
    """A lower bound on started_at, as text that sorts against :func:`now_iso`:
    a duration back from now (``2h``) or a UTC date or time
    (``2026-11-30``, ``2026-11-30T12:00``, ``2026-11-30T12:00:05Z``)."""
    import re
    from datetime import datetime

    from saphan.errors import UserError

    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2})?))?Z?", text.strip())
    if m is None:
        return iso_ago(parse_duration(text, option))
    day, clock = m.group(1), m.group(2) or "00:00:00"
    if len(clock) == 5:
        clock += ":00"
    try:
        datetime.strptime(f"{day}T{clock}", "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise UserError(f"{option} {text!r} is not a date; give YYYY-MM-DD[THH:MM[:SS]] (UTC) "
                        "or a duration such as 2h or 7d") from None
    return f"{day}T{clock}"


def age_text(iso: str, now: float | None = None) -> str:
    """How long ago :func:`now_iso`'s ``iso`` was: ``42s ago``, ``3m ago``,
    ``5h ago``, ``12d ago`` (``in the future`` when it is; ``?`` when it is
    not such a time)."""
    from datetime import UTC, datetime

    try:
        then = datetime.strptime(iso.rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f")
    except ValueError:
        try:
            then = datetime.strptime(iso.rstrip("Z")[:19], "%Y-%m-%dT%H:%M:%S")
        except ValueError:
            return "?"
    seconds = (time.time() if now is None else now) - then.replace(tzinfo=UTC).timestamp()
    if seconds < -1:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(max(0, seconds))}s ago"
