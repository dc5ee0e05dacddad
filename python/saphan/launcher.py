"""Where saphan-launcher is, and what it is (version, SHA-256).

The launcher ships inside the package (``saphan/_bin/saphan-launcher``, put
there by ci/setup before the wheel is built); ``SAPHAN_LAUNCHER`` or PATH are
consulted only when the package copy is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NAME = "saphan-launcher"


@dataclass(frozen=True)
class LauncherIdentity:
    path: str
    version: str
    sha256: str


def path() -> str | None:
    env = os.environ.get("SAPHAN_LAUNCHER")
    if env:
        return env if os.path.isfile(env) else None
    packaged = Path(__file__).parent / "_bin" / NAME
    if packaged.is_file():
        return str(packaged)
    return shutil.which(NAME)


def identity() -> LauncherIdentity | None:
    from saphan import _native

    p = path()
    if p is None:
        return None
    out = subprocess.run([p, "--version"], capture_output=True, text=True, timeout=10, check=False)
    version = out.stdout.strip().removeprefix(NAME).strip() or f"unknown ({out.stderr.strip()})"
    return LauncherIdentity(p, version, _native.sha256_file(p))
