"""Where the agent CLIs are, and which exact binary runs.

Resolution order for tool ``T`` (``claude`` or ``codex``):

1. ``$SAPHAN_<T>_BIN`` (absolute path), if set;
2. ``$SAPHAN_AGENTS_DIR/node_modules/.bin/T`` (default
   ``~/.cache/saphan-agents``, where ci/setup installs the pinned npm
   packages);
3. ``T`` on ``PATH``.

npm's ``codex`` entry is a Node wrapper that starts a native binary shipped
in ``@openai/codex-linux-x64``; the engine runs (and digests) that native
binary directly, so the record names the code that ran rather than a
launcher script. ``claude`` resolves to Claude Code's native executable.
The record carries the path, SHA-256 and ``--version`` of what ran.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from saphan import refusals
from saphan.errors import UserError

#: the versions this build composes command lines for and was measured with
PINNED = {"claude": "2.1.197", "codex": "0.169.0"}
NPM_PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

_CODEX_TRIPLES = {
    ("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
}


@dataclass(frozen=True)
class AgentBinary:
    tool: str
    path: str
    sha256: str
    version: str

    def as_record(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256, "version": self.version}


def agents_dir() -> Path:
    return Path(os.environ.get("SAPHAN_AGENTS_DIR")
                or Path.home() / ".cache" / "saphan-agents")


def locate(tool: str) -> str | None:
    """The executable for ``tool``, or None."""
    env = os.environ.get(f"SAPHAN_{tool.upper()}_BIN")
    if env:
        return os.path.realpath(env) if os.path.isfile(env) else None
    cached = agents_dir() / "node_modules" / ".bin" / tool
    found = str(cached) if cached.exists() else shutil.which(tool)
    if found is None:
        return None
    real = os.path.realpath(found)
    if tool == "codex" and real.endswith(".js"):
        return _codex_native(Path(real))
    return real


def _codex_native(wrapper: Path) -> str | None:
    triple = _CODEX_TRIPLES.get((platform.system(), platform.machine()))
    if triple is None:
        return None
    package, target = triple
    # .../node_modules/@openai/codex/bin/codex.js -> .../node_modules/@openai/<package>/...
    scope = wrapper.parent.parent.parent
    native = scope / package / "vendor" / target / "bin" / "codex"
    return str(native) if native.is_file() else None


def identify(tool: str, path: str | None = None, *, workdir: str | None = None,
             pinned: tuple[str, str, str | None] | None = None) -> AgentBinary:
    """Resolve, digest and ask the version of ``tool``'s binary (``path``: the
    slot's ``--agent-path``, taken as it is instead of looking).

    Before anything of it runs: a binary that lies (as named, or resolved)
    inside the run's ``workdir`` is refused ``workdir-unsafe`` — a run could
    replace what the next one executes (review: measured) — and a slot's pin
    (``pinned``: machine, slot, digest) is compared with the digest. Its
    ``--version`` then runs confined where this host can (:func:`version_of`)."""
    from saphan import _native

    given = path
    if path is not None:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise refusals.agent_binary_missing(
                f"the slot's agent path {path} is not an executable file on this machine",
                f"install {tool} there, or point the slot elsewhere (`saphan slot set MACHINE "
                "SLOT --agent-path PATH`)")
        path = os.path.realpath(path)
    else:
        path = locate(tool)
    if path is None:
        raise UserError(
            f"{tool} is not installed where saphan looks ($SAPHAN_{tool.upper()}_BIN, "
            f"{agents_dir()}/node_modules/.bin, PATH); install the pinned version: "
            f"`npm install --prefix {agents_dir()} --no-audit --no-fund "
            f"{NPM_PACKAGES[tool]}@{PINNED[tool]}` (ci/setup does this)"
        )
    if workdir is not None:
        check_outside(tool, (given or path, path), workdir)
    sha = _native.sha256_file(path)
    if pinned is not None:
        check_pin(pinned[0], pinned[1], pinned[2], path, sha)
    return AgentBinary(tool, path, sha, version_of(path, sha))


def check_outside(tool: str, paths: tuple[str, ...], workdir: str) -> None:
    """Refuse (``workdir-unsafe``) an agent binary any of whose ``paths``
    lies inside the run's working directory (resolved)."""
    wd = os.path.realpath(workdir)
    for p in paths:
        a = os.path.abspath(p)
        if a == wd or a.startswith(wd.rstrip("/") + "/"):
            raise refusals.workdir_unsafe(
                f"the {tool} binary {a} lies inside the run's working directory {wd}: a run "
                "there could replace what the next run executes",
                "install the agent outside every working directory and point the slot at it "
                "(`saphan slot set MACHINE SLOT --agent-path PATH`)")


def version_of(path: str, sha256: str) -> str:
    """``path --version``'s first line. Where this host has saphan-launcher
    and Landlock, it runs inside a domain that may write nothing but a fresh
    empty directory and that execs only the file with ``sha256`` (the
    launcher proves its own digest first); elsewhere it runs as saphan
    does (after the workdir and pin checks)."""
    import json
    import tempfile

    from saphan import launcher

    argv = [path, "--version"]
    tmp: str | None = None
    ident = launcher.identity() if platform.system() == "Linux" else None
    if ident is not None:
        tmp = tempfile.mkdtemp(prefix="saphan-version-")
        policy = json.dumps({"version": 1, "workdir": tmp, "writable": [tmp],
                             "readable": "everything", "agent_sha256": sha256})
        argv = [ident.path, "exec", "--expect-sha256", ident.sha256, "--policy", policy, "--",
                *argv]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                             stdin=subprocess.DEVNULL, cwd=tmp or "/")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"{path} --version could not run: {e}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    version = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    # the launcher's own control lines are not the binary's answer
    said = "\n".join(ln for ln in (out.stderr or out.stdout).splitlines()
                     if not ln.startswith("saphan-launcher: ")).strip()[:200]
    how = " (inside saphan-launcher's Landlock domain)" if tmp is not None else ""
    if tmp is not None and out.returncode == 127:
        raise UserError(f"{path} --version could not run{how}: {said or 'not executable'}")
    if out.returncode != 0 or not version:
        raise UserError(f"{path} --version failed (exit {out.returncode}){how}: {said}")
    return version


def check_pin_format(value: str) -> str:
    """A slot pin as given to ``--pin-sha256``: exactly 64 lowercase hex digits."""
    if not _SHA256_HEX.fullmatch(value):
        raise UserError(
            f"--pin-sha256 {value!r} is not a SHA-256 digest; give exactly 64 lowercase hex "
            "digits (e.g. the output of `sha256sum BINARY`)"
        )
    return value


def check_pin(machine: str, slot: str, pinned: str | None, path: str, sha256: str,
              *, far: bool = False) -> None:
    """Refuse (``digest-mismatch``) when a slot pins a digest the agent binary lacks.

    Called with the digest of the binary about to be launched, before launch;
    nothing happens when the slot pins nothing.
    """
    if pinned is None or pinned == sha256:
        return
    where = f" on {machine}" if far else ""
    raise refusals.digest_mismatch(
        f"slot {slot} on machine {machine} pins the agent binary to SHA-256 {pinned}, but "
        f"{path}{where} has SHA-256 {sha256}; it was not launched",
        f"if the new binary at {path}{where} is one you trust (verify it first), re-pin with "
        f"`saphan slot set {machine} {slot} --pin-sha256 {sha256}`; otherwise reinstall the "
        "pinned version there",
    )
