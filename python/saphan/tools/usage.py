"""What a run's agent reports it used: models, tokens, cost — in one shape.

Every agent adapter's ``after_run`` reads these from what the tool printed
(Claude Code's ``result`` event, Codex's ``turn.completed`` events, the
loop's result file). All of it came out of the run, so none of it is a
measurement of saphan's: it is kept as the tool reported it, checked for
shape and bounds only, and ``reported_by`` says where it was read. The
record's ``usage``::

    {"models": [str, ...], "tokens": {"input": int|None, "output": int|None,
     "cache_read": int|None, "cache_creation": int|None},
     "cost_usd": float|None, "reported_by": str}
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")
#: a model name as a record keeps it: printable, no spaces, bounded
_MODEL = re.compile(r"[\x21-\x7e]{1,200}")
#: bounds a reported number must lie in to be kept (else None)
_MAX_TOKENS = 10**12
_MAX_COST = 10.0**7


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        return None
    return value


def _cost(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    cost = float(value)
    return cost if math.isfinite(cost) and 0 <= cost <= _MAX_COST else None


def record(*, models: Iterable[Any], tokens: Mapping[str, Any], cost_usd: Any,
           reported_by: str) -> dict[str, Any]:
    """The record's ``usage``: model names that are not names, counts that
    are not non-negative integers and costs that are not finite non-negative
    numbers are dropped (None), never passed on as they came."""
    names = sorted({m for m in models if isinstance(m, str) and _MODEL.fullmatch(m)})
    return {
        "models": names,
        "tokens": {k: _count(tokens.get(k)) for k in TOKEN_KINDS},
        "cost_usd": _cost(cost_usd),
        "reported_by": reported_by,
    }


def add(total: dict[str, int | None], more: Mapping[str, Any]) -> None:
    """Add ``more``'s counts into ``total`` (a kind stays None until reported)."""
    for k in TOKEN_KINDS:
        n = _count(more.get(k))
        if n is not None:
            total[k] = min((total.get(k) or 0) + n, _MAX_TOKENS)


def summary(usage: Mapping[str, Any]) -> str:
    """One line for ``runs show``: models, tokens, cost, and who said so."""
    tokens = usage.get("tokens") or {}

    def n(kind: str) -> str:
        v = tokens.get(kind)
        return "-" if v is None else str(v)

    models = ", ".join(usage.get("models") or []) or "none reported"
    cost = usage.get("cost_usd")
    cost_text = "not reported" if cost is None else f"${cost:.4f}"
    return (f"models {models}; tokens in {n('input')} (cache read {n('cache_read')}, "
            f"cache write {n('cache_creation')}) out {n('output')}; cost {cost_text} "
            f"(as reported by the {usage.get('reported_by') or 'tool'}; the run could have "
            "written it)")
