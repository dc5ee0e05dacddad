"""Fixtures for the agent tools (registered by tests/conftest.py): the real CLIs at their pinned versions
(installed by ci/setup into the agents cache dir), a CODEX_HOME Codex
accepts, and repositories with a linked worktree on a namespaced branch."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import require
from saphan.tools import binaries


def _pinned(tool: str) -> str:
    path = binaries.locate(tool)
    require(path is not None,
            f"{binaries.NPM_PACKAGES[tool]}@{binaries.PINNED[tool]} (run ci/setup)")
    assert path is not None
    version = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    assert binaries.PINNED[tool] in version, f"{path} is {version!r}, not the pinned version"
    return path


@pytest.fixture(scope="session")
def codex_bin() -> str:
    return _pinned("codex")


@pytest.fixture(scope="session")
def claude_bin() -> str:
    return _pinned("claude")


@pytest.fixture
def codex_home() -> Iterator[str]:
    """Codex refuses to put its sandbox helper under /tmp (measured: `Refusing
    to create helper binaries under temporary dir "/tmp"`, then bwrap cannot
    exec codex-linux-sandbox), so its home lives under the user's cache."""
    base = Path.home() / ".cache" / "saphan-tests"
    base.mkdir(parents=True, exist_ok=True)
    d = tempfile.mkdtemp(prefix="codex-home-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def git(*args: str, cwd: Path | str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


@dataclass
class Worktree:
    repo: Path
    path: Path
    branch: str


@pytest.fixture
def linked_worktree(tmp_path: Path) -> Worktree:
    """A repository and a linked worktree, detached at the base (as --repo
    makes it); the run's commits are imported onto ``saphan/t1`` after it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "README").write_text("base\n")
    git("add", "README", cwd=repo)
    git("commit", "-q", "-m", "base", cwd=repo)
    wt = tmp_path / "wt"
    git("worktree", "add", "-q", "--detach", str(wt), cwd=repo)
    return Worktree(repo, wt, "saphan/t1")


def agents_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
