"""tools/binaries.py: which exact agent binary runs (path, SHA-256, version),
and the slot pin that refuses any other (digest-mismatch)."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import pytest

from conftest import require
from saphan.errors import UserError
from saphan.refusals import Refusal
from saphan.tools import binaries


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No resolution source but the ones a test sets."""
    for tool in ("claude", "codex"):
        monkeypatch.delenv(f"SAPHAN_{tool.upper()}_BIN", raising=False)
    monkeypatch.setenv("SAPHAN_AGENTS_DIR", str(tmp_path / "agents"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    return monkeypatch


def _exe(path: Path, body: str = 'echo "2.1.197 (Claude Code)"') -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_nothing_installed_is_none(clean: pytest.MonkeyPatch) -> None:
    assert binaries.locate("claude") is None and binaries.locate("codex") is None


def test_the_variable_wins_and_is_resolved(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = _exe(tmp_path / "real" / "claude")
    link = tmp_path / "claude-link"
    link.symlink_to(real)
    _exe(tmp_path / "agents" / "node_modules" / ".bin" / "claude")
    clean.setenv("SAPHAN_CLAUDE_BIN", str(link))
    assert binaries.locate("claude") == str(real)  # the file that runs, not the link
    clean.setenv("SAPHAN_CLAUDE_BIN", str(tmp_path / "absent"))
    assert binaries.locate("claude") is None  # never another one instead


def test_the_agents_dir_before_path(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_path = _exe(tmp_path / "empty-path" / "claude")
    assert binaries.locate("claude") == str(on_path)
    cached = _exe(tmp_path / "agents" / "node_modules" / ".bin" / "claude")
    assert binaries.locate("claude") == str(cached)
    assert binaries.agents_dir() == tmp_path / "agents"


def test_the_default_agents_dir(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean.delenv("SAPHAN_AGENTS_DIR")
    clean.setenv("HOME", str(tmp_path / "me"))
    assert binaries.agents_dir() == tmp_path / "me" / ".cache" / "saphan-agents"


def test_codex_wrapper_resolves_to_its_native_binary(clean: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    triple = {("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
              ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl")}.get(
        (platform.system(), platform.machine()))
    require(triple is not None,
            f"a platform with a Codex native package (not {platform.system()} {platform.machine()})")
    assert triple is not None
    scope = tmp_path / "agents" / "node_modules" / "@openai"
    wrapper = _exe(scope / "codex" / "bin" / "codex.js", "exit 0")
    bin_dir = tmp_path / "agents" / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "codex").symlink_to(wrapper)
    # The wrapper alone: there is no native binary to run, so nothing is found.
    assert binaries.locate("codex") is None
    native = _exe(scope / triple[0] / "vendor" / triple[1] / "bin" / "codex",
                  'echo "codex-cli 0.169.0"')
    assert binaries.locate("codex") == str(native)


def test_identify_digests_and_asks_the_version(clean: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    exe = _exe(tmp_path / "claude", 'echo "2.1.197 (Claude Code)"; echo second line')
    clean.setenv("SAPHAN_CLAUDE_BIN", str(exe))
    got = binaries.identify("claude")
    assert got == binaries.AgentBinary("claude", str(exe),
                                       hashlib.sha256(exe.read_bytes()).hexdigest(),
                                       "2.1.197 (Claude Code)")
    assert got.as_record() == {"path": str(exe), "sha256": got.sha256,
                               "version": "2.1.197 (Claude Code)"}


def test_identify_names_the_install_command_when_missing(clean: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        binaries.identify("codex")
    message = str(info.value)
    assert "codex is not installed where saphan looks ($SAPHAN_CODEX_BIN" in message
    assert (f"npm install --prefix {tmp_path / 'agents'} --no-audit --no-fund "
            f"@openai/codex@{binaries.PINNED['codex']}") in message


@pytest.mark.parametrize("body", ["echo boom >&2; exit 1", "exit 0"])
def test_identify_refuses_a_binary_that_cannot_say_its_version(
        clean: pytest.MonkeyPatch, tmp_path: Path, body: str) -> None:
    exe = _exe(tmp_path / "claude", body)
    clean.setenv("SAPHAN_CLAUDE_BIN", str(exe))
    with pytest.raises(UserError, match=r"--version failed \(exit [01]\)"):
        binaries.identify("claude")


def test_identify_a_file_that_cannot_run(clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = tmp_path / "claude"
    exe.write_text("not a program")
    os.chmod(exe, 0o644)
    clean.setenv("SAPHAN_CLAUDE_BIN", str(exe))
    with pytest.raises(UserError, match="--version could not run"):
        binaries.identify("claude")


@pytest.mark.parametrize("bad", [
    "", "a" * 63, "a" * 65, "A" * 64, "g" * 64, " " + "a" * 63,
    "a" * 64 + "\n",
])
def test_pin_format(bad: str) -> None:
    assert binaries.check_pin_format("0123456789abcdef" * 4) == "0123456789abcdef" * 4
    with pytest.raises(UserError, match="not a SHA-256 digest; give exactly 64 lowercase hex"):
        binaries.check_pin_format(bad)


def test_a_pin_refuses_any_other_binary() -> None:
    pinned, actual = "a" * 64, "b" * 64
    binaries.check_pin("m1", "s1", None, "/opt/claude", actual)  # no pin: nothing happens
    binaries.check_pin("m1", "s1", actual, "/opt/claude", actual)  # the pinned one runs
    with pytest.raises(Refusal) as info:
        binaries.check_pin("m1", "s1", pinned, "/opt/claude", actual)
    r = info.value
    assert r.cls == "digest-mismatch"
    assert r.message == (f"slot s1 on machine m1 pins the agent binary to SHA-256 {pinned}, but "
                         f"/opt/claude has SHA-256 {actual}; it was not launched")
    assert f"saphan slot set m1 s1 --pin-sha256 {actual}" in r.remediation
    near = actual[:-1] + "c"  # one digit apart is another binary
    with pytest.raises(Refusal, match=f"pins the agent binary to SHA-256 {near}"):
        binaries.check_pin("m1", "s1", near, "/opt/claude", actual)
    with pytest.raises(Refusal) as info:
        binaries.check_pin("far", "s1", pinned, "/opt/claude", actual, far=True)
    assert "/opt/claude on far has SHA-256" in info.value.message


def test_an_agent_a_run_could_replace_is_refused_before_it_runs(
        clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Review: a slot's --agent-path linked into the working directory was
    run (--version, as saphan) before any check. Now it is refused
    workdir-unsafe, whether named inside it or resolving into it, and never
    run."""
    from saphan.refusals import Refusal

    wd = tmp_path / "wd"
    marker = tmp_path / "ran"
    planted = _exe(wd / "bin" / "claude", f"touch {marker}; echo 9")
    link = tmp_path / "opt" / "claude"
    link.parent.mkdir()
    link.symlink_to(planted)
    for given in (str(planted), str(link)):
        with pytest.raises(Refusal) as e:
            binaries.identify("claude", given, workdir=str(wd))
        assert e.value.cls == "workdir-unsafe" and str(wd) in e.value.message
    # found on PATH inside the workdir: the same
    clean.setenv("PATH", str(wd / "bin"))
    with pytest.raises(Refusal):
        binaries.identify("claude", workdir=str(wd))
    assert not marker.exists()


def test_a_pinned_agent_is_compared_before_its_version_is_asked(tmp_path: Path) -> None:
    from saphan.refusals import Refusal

    marker = tmp_path / "ran"
    exe = _exe(tmp_path / "opt" / "claude", f"touch {marker}; echo 9")
    with pytest.raises(Refusal) as e:
        binaries.identify("claude", str(exe), workdir=str(tmp_path / "wd"),
                          pinned=("here", "cl", "0" * 64))
    assert e.value.cls == "digest-mismatch" and not marker.exists()


def test_the_version_is_asked_inside_a_landlock_domain(tmp_path: Path) -> None:
    """Where the launcher and Landlock are here: the binary's --version may
    write nothing but a fresh empty directory."""
    outside = tmp_path / "outside.txt"
    exe = _exe(tmp_path / "opt" / "claude", f"echo x > {outside}; echo 2.1.197")
    got = binaries.identify("claude", str(exe), workdir=str(tmp_path / "wd"))
    assert got.version == "2.1.197"
    assert not outside.exists()
