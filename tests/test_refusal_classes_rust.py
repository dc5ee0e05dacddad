"""Rust's refusal classes (``saphan_core::RefusalClass``) and Python's table
(:data:`saphan.refusals.CLASSES`) are the same closed set.

saphan-launcher's refusals carry a ``RefusalClass`` (a type, not a string),
so every class it can print is one of ``_native.refusal_classes()``; the
launcher runs at the end check that what it really prints, on stderr and on
the status descriptor, parses to a class of the table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import require
from saphan import _native, launcher
from saphan.refusals import CLASSES

#: `refused [CLASS]: MESSAGE` (stderr) and `saphan-launcher: refused [CLASS]
#: MESSAGE` (the status descriptor).
STDERR_LINE = re.compile(r"^refused \[([a-z-]+)\]: ")
STATUS_LINE = re.compile(r"^saphan-launcher: refused \[([a-z-]+)\] ")


def test_rust_classes_are_the_python_table() -> None:
    rust = _native.refusal_classes()
    assert len(rust) == len(set(rust)), rust
    assert set(rust) == set(CLASSES)


def test_every_rust_class_is_a_kebab_case_name_the_lines_parse() -> None:
    for cls in _native.refusal_classes():
        assert cls in CLASSES, cls
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", cls), cls
        m = STDERR_LINE.match(f"refused [{cls}]: m")
        assert m is not None and m.group(1) == cls
        m = STATUS_LINE.match(f"saphan-launcher: refused [{cls}] m")
        assert m is not None and m.group(1) == cls


def _policy(**overrides: object) -> str:
    value: dict[str, object] = {"version": 1, "workdir": "/", "writable": ["/"],
                                "readable": "everything"}
    value.update(overrides)
    return json.dumps(value)


@pytest.mark.parametrize("policy", [
    "{}",
    _policy(surprise=1),
    _policy(agent_sha256="0" * 64),  # pinned, with a command that is not absolute
], ids=["empty", "unknown-key", "pinned-relative"])
def test_what_the_launcher_prints_is_in_the_table(policy: str) -> None:
    path = launcher.path()
    require(path is not None, "saphan-launcher (run ci/setup)")
    assert path is not None
    read_end, write_end = os.pipe()
    try:
        p = subprocess.run(
            [path, "exec", "--status-fd", str(write_end), "--policy", policy, "--", "true"],
            capture_output=True, text=True, timeout=30, pass_fds=(write_end,), check=False)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        status = f.read().decode().splitlines()
    assert p.returncode == 3, (p.returncode, p.stderr)
    m = STDERR_LINE.match(p.stderr)
    assert m is not None, p.stderr
    assert m.group(1) in CLASSES
    assert m.group(1) in _native.refusal_classes()
    refused = [s for s in status if s.startswith("saphan-launcher: refused ")]
    assert len(refused) == 1, status
    m2 = STATUS_LINE.match(refused[0])
    assert m2 is not None and m2.group(1) == m.group(1), refused
