"""The system tools saphan runs outside any jail (confine/trusted.py): taken
only from the fixed system directories and only when their custody holds —
never from the inherited PATH, where a run could have planted one."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require
from saphan.confine import trusted
from saphan.refusals import Refusal

SCRIPT = "#!/bin/sh\nexit 0\n"


@pytest.fixture
def planted() -> Iterator[Path]:
    """A fresh tool name in /usr/local/bin (one of the trusted directories),
    removed afterwards; the name is new, so nothing cached it."""
    require(os.geteuid() == 0 and os.access("/usr/local/bin", os.W_OK),
            "root, to put a tool into /usr/local/bin")
    path = Path("/usr/local/bin") / f"saphan-trusted-test-{uuid.uuid4().hex[:12]}"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def test_the_trusted_directories_are_the_system_ones() -> None:
    assert trusted.TRUSTED_DIRS == ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")


def test_system_bubblewrap_and_git_are_found_by_their_real_path() -> None:
    for name in ("bwrap", "git"):
        system = shutil.which(name, path="/usr/bin:/bin")
        assert system is not None, f"{name} is not installed in /usr/bin"
        found = trusted.find(name)
        assert found == os.path.realpath(system)
        assert os.path.dirname(found) in ("/usr/bin", "/bin")


def test_a_tool_only_on_path_is_never_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"saphan-path-only-{uuid.uuid4().hex[:12]}"
    tool = tmp_path / name
    tool.write_text(SCRIPT)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert shutil.which(name) == str(tool)
    assert trusted.find(name) is None


def test_a_tool_planted_first_on_path_does_not_shadow_the_system_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "git"
    fake.write_text(SCRIPT)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert trusted._search("git") == os.path.realpath(shutil.which("git", path="/usr/bin:/bin") or "")


def test_a_root_owned_0755_tool_in_a_trusted_dir_is_found(planted: Path) -> None:
    planted.write_text(SCRIPT)
    planted.chmod(0o755)
    assert trusted.find(planted.name) == str(planted)


def test_a_tool_others_can_write_is_not_found(planted: Path) -> None:
    planted.write_text(SCRIPT)
    planted.chmod(0o777)
    assert trusted.find(planted.name) is None


def test_a_tool_owned_by_another_account_is_not_found_for_root(planted: Path) -> None:
    planted.write_text(SCRIPT)
    planted.chmod(0o755)
    os.chown(planted, 65534, 65534)
    assert trusted.find(planted.name) is None


def test_a_trusted_name_linking_to_a_world_writable_directory_is_not_found(
        planted: Path, tmp_path: Path) -> None:
    # /tmp-like: anyone may replace the file the link names
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    real = shared / "tool"
    real.write_text(SCRIPT)
    real.chmod(0o755)
    planted.symlink_to(real)
    assert trusted.find(planted.name) is None


def test_a_file_that_is_not_executable_is_not_found(planted: Path) -> None:
    planted.write_text(SCRIPT)
    planted.chmod(0o644)
    assert trusted.find(planted.name) is None


def test_require_returns_the_path_or_refuses_naming_the_directories_and_package() -> None:
    assert trusted.require("git", "git", "saphan's worktree steps") == trusted.find("git")
    name = f"saphan-missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(Refusal) as e:
        trusted.require(name, "some-package", "the test's purpose")
    assert e.value.cls == "confinement-unavailable"
    assert f"no `{name}` with safe custody in {', '.join(trusted.TRUSTED_DIRS)}" in e.value.message
    assert "(the test's purpose)" in e.value.message and "never takes it from PATH" in e.value.message
    assert "`apt-get install some-package`" in e.value.remediation
