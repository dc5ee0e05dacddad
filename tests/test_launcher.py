"""launcher.py: where saphan-launcher is and what it is (version, SHA-256).

SAPHAN_LAUNCHER, when set, is the only place looked at: a missing file there
is "not found", never silently another launcher.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from conftest import require
from saphan import launcher


def _script(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fake-launcher"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return exe


def test_saphan_launcher_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, "echo saphan-launcher 9.9.9")
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    assert launcher.path() == str(exe)


def test_a_missing_saphan_launcher_is_not_found_not_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(tmp_path / "absent"))
    assert launcher.path() is None
    assert launcher.identity() is None
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(tmp_path))  # a directory is not a launcher
    assert launcher.path() is None


def test_identity_names_version_digest_and_path(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, 'echo "saphan-launcher 1.2.3"')
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    ident = launcher.identity()
    assert ident is not None
    assert ident.path == str(exe)
    assert ident.version == "1.2.3"
    assert ident.sha256 == hashlib.sha256(exe.read_bytes()).hexdigest()


def test_a_launcher_that_cannot_say_its_version_is_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _script(tmp_path, "echo 'bad flag' >&2; exit 2")
    monkeypatch.setenv("SAPHAN_LAUNCHER", str(exe))
    ident = launcher.identity()
    assert ident is not None
    assert ident.version == "unknown (bad flag)"
    assert len(ident.sha256) == 64


def test_the_real_launcher_identifies_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPHAN_LAUNCHER", raising=False)
    found = launcher.path()
    require(found is not None, "saphan-launcher (run ci/setup)")
    assert found is not None
    assert os.path.basename(found) == launcher.NAME and os.access(found, os.X_OK)
    packaged = Path(launcher.__file__).parent / "_bin" / launcher.NAME
    if packaged.is_file():
        assert found == str(packaged)  # the package's own copy before PATH
    ident = launcher.identity()
    assert ident is not None
    said = subprocess.run([found, "--version"], capture_output=True, text=True,
                          timeout=10).stdout.strip()
    assert said == f"{launcher.NAME} {ident.version}"
    assert ident.sha256 == hashlib.sha256(Path(found).read_bytes()).hexdigest()
