"""Type stubs for saphan._native, the PyO3 module over rust/core.

Private: saphan's public API is Python. Hand-written; keep in step with
rust/pyext/src/lib.rs (the module's registry of exports).
"""

from typing import TypedDict

class KeyCustodyError(Exception):
    """A key or credential file failed custody: symlink, not a regular file,
    not owned by the caller, group/other access, wrong length, or (a
    credential file) more than one hard link. ``args`` is
    ``(message, remediation)``."""

class _CustodyViolation(TypedDict):
    """What ``check_binary_custody`` returns when a clause fails.

    Not a runtime class: the function returns a plain ``dict``.
    """

    clause: int  # 1..4, as in SPEC.md §7
    path: str  # the real path that was stat'ed
    symlink_from: str | None  # the path as given, when it went through a symlink
    owner_uid: int
    group_gid: int
    mode: int  # permission bits, st_mode & 0o7777
    parent: str
    parent_owner_uid: int
    parent_group_gid: int
    parent_mode: int
    caller_euid: int
    caller_groups: list[int]  # sorted, egid included
    message: str
    remediation: str
    not_asserted: str

def landlock_abi() -> tuple[int, str]:
    """``(level, reason)`` for the running kernel: level 0 unless reason is
    ``"supported"``; reason is ``"supported"``, ``"enosys"``, ``"eopnotsupp"``
    or ``"errno-N"`` (e.g. a seccomp filter answering EPERM)."""

def landlock_floor() -> int:
    """The lowest Landlock ABI saphan confines with (3)."""

def landlock_highest_known() -> int:
    """The highest Landlock ABI this build handles; a recorded level above it
    is refused as ``landlock-level-unknown``."""

def sha256_file(path: str) -> str:
    """SHA-256 of a file, 64 lowercase hex digits. Raises OSError."""

def check_binary_custody(path: str) -> _CustodyViolation | None:
    """``None`` when the four custody clauses hold for this process's euid
    and groups; otherwise the failed clause. Raises OSError when the file or
    its parent cannot be stat'ed."""

def check_binary_custody_as(path: str, euid: int, groups: list[int]) -> _CustodyViolation | None:
    """As :func:`check_binary_custody`, for an explicit caller."""

def read_key_file(path: str, length: int) -> bytes:
    """Reads a key file after its custody checks (O_NOFOLLOW, fstat on the
    descriptor, regular file, owned by the euid, no group/other bits, exactly
    ``length`` bytes — all before a byte is read). Raises KeyCustodyError on a
    custody failure, OSError (e.g. FileNotFoundError) on plain I/O errors."""

def read_secret_file(path: str, max_len: int) -> bytes:
    """Reads a lane credential file after its custody checks: those of
    :func:`read_key_file`, plus exactly one hard link and 1..``max_len``
    bytes. Raises KeyCustodyError on a custody failure, OSError otherwise."""

def read_lanes_file(path: str, max_len: int) -> bytes:
    """Reads the lanes file with the custody of :func:`read_secret_file`
    (messages name a "lanes file"): whoever could rewrite it could send a
    lane's key to their own endpoint."""

def set_parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on the calling process (between fork
    and exec: the child gets ``sig`` when its parent dies)."""

def set_dumpable(on: bool) -> bool:
    """Sets the calling process's dumpable flag; returns the previous setting."""

def parse_policy(json: str) -> str:
    """Parses a launcher policy with saphan-launcher's own parser and returns
    its canonical JSON. Raises ValueError with the parser's message (which
    names the offending field or key)."""

def check_grant_dir(path: str) -> str | None:
    """``None`` when ``path`` may be granted as a writable directory: absolute,
    normalised, and walked from ``/`` one component at a time without
    following any symbolic link, a real directory at every step. Otherwise
    the message naming the offending component and what it is (a symbolic
    link and its target, a regular file, missing, ...): the same text
    saphan-launcher refuses the same layout with."""

def version() -> str:
    """The Rust workspace version (the launcher's too)."""

def refusal_classes() -> list[str]:
    """Every refusal class rust/core and saphan-launcher can report
    (``saphan_core::RefusalClass``), in the table's order; equal as a set to
    ``saphan.refusals.CLASSES`` (tests/test_refusal_classes_rust.py)."""

def sha256_bytes(data: bytes) -> str: ...
def hmac_sha256(key: bytes, data: bytes) -> str: ...
def digests_equal(a: str, b: str) -> bool: ...
def open_grant_dir(path: str) -> int: ...
