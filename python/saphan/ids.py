"""Run identifiers: ULIDs (48-bit ms time + 80 random bits, Crockford base32).

They sort by creation time, so a prefix of a recent run id is usually unique.
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_run_id() -> str:
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def is_run_id(text: str) -> bool:
    """``text`` has a run id's shape (what :func:`new_run_id` makes)."""
    return len(text) == 26 and text[0] in "01234567" and all(c in _ALPHABET for c in text)
