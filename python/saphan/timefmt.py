"""Timestamps: UTC, ISO-8601 with microseconds and a Z, so they sort as text."""

from __future__ import annotations

import time


def now_iso() -> str:
    t = time.time()
    secs = int(t)
    micros = int((t - secs) * 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{micros:06d}Z"
