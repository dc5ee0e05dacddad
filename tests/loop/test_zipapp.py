"""loop/zipapp.py: the loop as one file for a runner — the same bytes from
the same saphan, runnable by a plain Python with nothing of saphan installed."""

from __future__ import annotations

import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

from saphan import __version__
from saphan.loop import zipapp


def test_the_same_saphan_builds_the_same_bytes() -> None:
    a, b = zipapp.build(), zipapp.build()
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert a.startswith(b"#!/usr/bin/env python3\n")
    names = zipfile.ZipFile(io.BytesIO(a)).namelist()
    assert "__main__.py" in names and "saphan/loop/agent.py" in names
    assert not [n for n in names if not n.endswith(".py")]  # no native code, no launcher


def test_a_plain_python_runs_it_isolated(tmp_path: Path) -> None:
    pyz = tmp_path / "loop"
    pyz.write_bytes(zipapp.build())
    # /usr/bin/python3 (the system's: saphan is not installed there), -I as on a runner
    got = subprocess.run(["/usr/bin/python3", "-I", str(pyz), "--version"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == zipapp.version() == f"saphan-loop {__version__}"
    # the loop itself starts there: a key shorter than any lane's is a broken channel
    (tmp_path / "spec.json").write_text(
        '{"scrub_env": [], "result": "%s"}' % (tmp_path / "r.json"))
    got = subprocess.run(["/usr/bin/python3", "-I", str(pyz), str(tmp_path / "spec.json")],
                         input="short", capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and "key-channel-broken" in (tmp_path / "r.json").read_text()
