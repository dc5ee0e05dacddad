"""Claude Code's session project key: where it keeps a working directory's
sessions (``<config home>/projects/<key>``). One definition, used by the
engine on both sides of a remote run: to tell the far preflight which leaf
to create, and to re-derive and check the leaf the far side reports.

The rule (SPEC.md §2, Claude Code's ``sanitizePath``): every character of the
canonical working directory that is not ``[A-Za-z0-9]`` becomes ``-`` (no
collapsing). JavaScript counts UTF-16 code units, so a character outside the
Basic Multilingual Plane becomes ``--``. A key longer than 200 characters is
cut to 200 and ``-<hash>`` appended, where the hash is what the pinned native
build (a Bun executable) uses: ``Bun.hash`` — wyhash with seed 0 over the
path's UTF-8 bytes — written in base 36. (The Node build of the same source
hashes with djb2 instead; saphan follows the native build.)
"""

from __future__ import annotations

MAX_LENGTH = 200

_MASK = (1 << 64) - 1
_SECRET = (0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3, 0x589965CC75374CC3)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def session_key(workdir: str) -> str:
    """The project key of ``workdir`` (already canonical: ``pwd -P``)."""
    sanitized = "".join(
        c if c.isascii() and c.isalnum() else ("--" if ord(c) > 0xFFFF else "-")
        for c in workdir
    )
    if len(sanitized) <= MAX_LENGTH:
        return sanitized
    digest = wyhash(0, workdir.encode("utf-8", errors="surrogateescape"))
    return f"{sanitized[:MAX_LENGTH]}-{_base36(digest)}"


def _base36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


# -- wyhash (final v4, as in Zig's std.hash.Wyhash, which Bun.hash calls) ------

def _mum(a: int, b: int) -> tuple[int, int]:
    x = a * b
    return x & _MASK, x >> 64


def _mix(a: int, b: int) -> int:
    lo, hi = _mum(a, b)
    return lo ^ hi


def _r8(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 8], "little")


def _r4(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "little")


def wyhash(seed: int, data: bytes) -> int:
    """64-bit wyhash of ``data``."""
    n = len(data)
    s0 = seed ^ _mix(seed ^ _SECRET[0], _SECRET[1])
    state = [s0, s0, s0]
    if n <= 16:
        if n >= 4:
            end = n - 4
            quarter = (n >> 3) << 2
            a = (_r4(data, 0) << 32) | _r4(data, quarter)
            b = (_r4(data, end) << 32) | _r4(data, end - quarter)
        elif n > 0:
            a = (data[0] << 16) | (data[n >> 1] << 8) | data[n - 1]
            b = 0
        else:
            a = b = 0
    else:
        i = 0
        if n >= 48:
            while i + 48 < n:
                for k in range(3):
                    x = _r8(data, i + 16 * k)
                    y = _r8(data, i + 16 * k + 8)
                    state[k] = _mix(x ^ _SECRET[k + 1], y ^ state[k])
                i += 48
            state[0] ^= state[1] ^ state[2]
        rest = data[i:]
        j = 0
        while j + 16 < len(rest):
            state[0] = _mix(_r8(rest, j) ^ _SECRET[1], _r8(rest, j + 8) ^ state[0])
            j += 16
        a = _r8(data, n - 16)
        b = _r8(data, n - 8)
    a ^= _SECRET[1]
    b ^= state[0]
    a, b = _mum(a, b)
    return _mix(a ^ _SECRET[0] ^ n, b ^ _SECRET[1])
