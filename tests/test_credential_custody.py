"""Custody of lane credential files (API keys for model endpoints).

``saphan._native.read_secret_file(path, max_len)`` reads a credential only
after proving, on the open descriptor, what ``read_key_file`` proves for the
record key (no final symlink, a regular file owned by the caller, no group or
other access) and, in addition, exactly one hard link and 1 to ``max_len``
bytes. Refusals raise ``saphan._native.KeyCustodyError`` naming a *credential
file*; plain I/O errors raise the ``OSError`` subclass ``read_key_file``
raises.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import require
from saphan import _native

MAX = 4096


def _cred(tmp_path: Path, data: bytes = b"sk-test-0123456789\n", mode: int = 0o600,
          name: str = "api.key") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    os.chmod(p, mode)
    return p


def _refusal(path: Path, max_len: int = MAX) -> str:
    with pytest.raises(_native.KeyCustodyError) as info:
        _native.read_secret_file(str(path), max_len)
    return str(info.value.args[0])


def test_owner_only_single_link_is_read_as_is(tmp_path: Path) -> None:
    p = _cred(tmp_path)
    got = _native.read_secret_file(str(p), MAX)
    assert isinstance(got, bytes)
    assert got == b"sk-test-0123456789\n"  # the trailing newline is the caller's to strip
    # A Path is accepted too, and exactly max_len bytes is within bounds.
    assert _native.read_secret_file(p, len(got)) == got


def test_mode_0644_is_refused_naming_the_mode(tmp_path: Path) -> None:
    p = _cred(tmp_path, mode=0o644)
    assert _refusal(p) == (
        f"credential file {p} has mode 0644; group and others must have no access (0600)"
    )


def test_second_hard_link_is_refused(tmp_path: Path) -> None:
    p = _cred(tmp_path)
    other = tmp_path / "other-name"
    os.link(p, other)
    for name in (p, other):
        assert _refusal(name) == (
            f"credential file {name} has 2 hard links; a credential must have exactly one name "
            "(a read denial on this path would not cover the others)"
        )
    other.unlink()
    assert _native.read_secret_file(str(p), MAX) == b"sk-test-0123456789\n"


def test_symlink_is_refused_even_to_a_good_credential(tmp_path: Path) -> None:
    good = _cred(tmp_path, name="good.key")
    link = tmp_path / "link.key"
    link.symlink_to(good)
    assert _refusal(link) == (
        f"credential file {link} is a symbolic link; credential files are opened without "
        "following links"
    )


def test_directory_is_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path) == f"credential file {tmp_path} is a directory, not a regular file"


def test_empty_is_refused(tmp_path: Path) -> None:
    p = _cred(tmp_path, data=b"")
    assert _refusal(p) == f"credential file {p} is empty"


def test_too_long_is_refused(tmp_path: Path) -> None:
    p = _cred(tmp_path, data=b"a" * 65)
    assert _refusal(p, 64) == (
        f"credential file {p} is 65 bytes long; a credential is at most 64 bytes"
    )
    assert _native.read_secret_file(str(p), 65) == b"a" * 65


def test_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "root, to give the file away (the Rust tests cover it without)")
    p = _cred(tmp_path)
    os.chown(p, 65534, -1)
    assert _refusal(p) == f"credential file {p} is owned by uid 65534, not by the caller (euid 0)"


def test_missing_file_is_file_not_found_like_read_key_file(tmp_path: Path) -> None:
    absent = tmp_path / "absent.key"
    with pytest.raises(FileNotFoundError) as cred:
        _native.read_secret_file(str(absent), MAX)
    with pytest.raises(FileNotFoundError) as key:
        _native.read_key_file(str(absent), 32)
    assert not isinstance(cred.value, _native.KeyCustodyError)
    assert cred.value.filename == key.value.filename == str(absent)
    assert cred.value.errno == key.value.errno


def test_key_file_messages_still_say_key_file(tmp_path: Path) -> None:
    p = _cred(tmp_path, data=b"\x01" * 32, mode=0o644)
    with pytest.raises(_native.KeyCustodyError) as info:
        _native.read_key_file(str(p), 32)
    assert info.value.args[0] == (
        f"key file {p} has mode 0644; group and others must have no access (0600)"
    )
