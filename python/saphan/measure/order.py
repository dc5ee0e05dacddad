"""A measure-base order, checked before anything is reserved: the base the
order named (a SHA, an abbreviation, a branch or a tag), the SHA it was
written against (``expect``), the scratch path, the test command — and where
per-test outcomes come from, read off the test command:

- ``pytest`` (``pytest …``, ``py.test …``, ``python -m pytest …``): the
  driver appends ``--junitxml=<the run's return directory>/measure-PHASE.xml``;
- ``cargo`` (``cargo [+toolchain] test …``): libtest's JSON lines, asked for
  with ``-- -Z unstable-options --format json`` under ``RUSTC_BOOTSTRAP=1``
  (stable libtest prints JSON only so; the variable also reaches the build),
  and ``--no-fail-fast`` (a failing test binary must not hide the next's);
- anything else: the command's exit status, one item, labelled as such.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from saphan.errors import UserError

#: where the default scratch clone goes (under the per-run scratch tree,
#: which saphan ignores through info/exclude: worktrees.ignore_scratch)
DEFAULT_PARENT = ".saphan-run"
#: what ``cargo test`` is given so libtest prints one JSON object per event
CARGO_JSON = ("-Z", "unstable-options", "--format", "json")
#: how each kind's outcomes are labelled in the report
SOURCES = {
    "pytest": "per test, from pytest's --junitxml",
    "cargo": "per test, from libtest's JSON (RUSTC_BOOTSTRAP=1, -Z unstable-options "
             "--format json)",
    "exit": "the command's exit status only: one item, not per test",
}
_HEX = re.compile(r"[0-9a-f]{4,64}")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class Order:
    """What to measure: ``base`` as named, ``expect`` the SHA the order
    was written against (None: ``base`` itself, expanded in the repository),
    ``scratch`` relative to the working directory, ``test`` as given."""

    base: str
    test: tuple[str, ...]
    scratch: str
    expect: str | None = None
    default_scratch: bool = False

    @property
    def kind(self) -> str:
        return outcome_kind(self.test)

    def test_argv(self) -> list[str]:
        """The test command as the driver runs it (cargo's JSON asked for)."""
        argv = list(self.test)
        if self.kind != "cargo":
            return argv
        if "--no-fail-fast" not in argv[: argv.index("--") if "--" in argv else len(argv)]:
            # every test binary runs: one that fails must not hide the next's items
            at = argv.index("test")
            argv = [*argv[:at + 1], "--no-fail-fast", *argv[at + 1:]]
        return [*argv, *CARGO_JSON] if "--" in argv else [*argv, "--", *CARGO_JSON]

    def ignore_rule(self) -> str:
        """The line that makes git ignore the scratch (for the refusal)."""
        return f"/{self.scratch}/"

    def as_record(self) -> dict[str, Any]:
        return {"base": self.base, "expect": self.expect, "scratch": self.scratch,
                "scratch_default": self.default_scratch, "test": list(self.test),
                "outcomes_from": SOURCES[self.kind]}


def make(base: str, test: Sequence[str], *, scratch: str | None = None,
         expect: str | None = None, token: str | None = None) -> Order:
    """An order from what the operator gave; a UserError names what is wrong.
    The default scratch is ``.saphan-run/base-<token>`` (a new random token)."""
    if not test:
        raise UserError("nothing to measure: give the test command after `--` "
                        "(saphan measure-base … -- pytest -q)")
    if not base or len(base) > 255 or base.startswith("-") or _CONTROL.search(base) \
            or ".." in base or base.endswith((".lock", "/", ".")):
        raise UserError(f"--base {base!r} is not a commit name git takes: give a SHA, an "
                        "abbreviation of one, a branch or a tag")
    if expect is not None and not _HEX.fullmatch(expect.lower()):
        raise UserError(f"--expect {expect!r} is not a SHA: give the 4 to 64 hexadecimal "
                        "digits the order was written against")
    default = scratch is None
    if token is None:
        import secrets

        token = secrets.token_hex(6)
    name = f"{DEFAULT_PARENT}/base-{token}" if scratch is None else check_scratch(scratch)
    return Order(base=base, test=tuple(test), scratch=name,
                 expect=expect.lower() if expect is not None else None,
                 default_scratch=default)


def check_scratch(name: str) -> str:
    """A scratch path: relative, normal, below the working directory, no
    component git or saphan holds (``.git``, saphan's own ``tmp``)."""
    norm = posixpath.normpath(name.rstrip("/")) if name else ""
    parts = norm.split("/")
    why = None
    if not name or name.startswith("/") or os.path.isabs(name):
        why = "give a path relative to the working directory"
    elif _CONTROL.search(name) or len(name) > 200 \
            or any(p.startswith("-") for p in name.split("/")):
        why = "no spaces, control characters or component starting with '-', at most 200 " \
              "characters"
    elif norm != name.rstrip("/") or norm in (".", "..") or ".." in parts:
        why = "a normal path below the working directory (no '.', '..' or '//')"
    elif any(p.casefold().rstrip(". ") == ".git" for p in parts):
        why = "not inside, or named, .git"
    elif parts[0] == DEFAULT_PARENT and (len(parts) == 1 or parts[1] == "tmp"):
        why = f"{DEFAULT_PARENT}/ and {DEFAULT_PARENT}/tmp are saphan's own"
    if why is not None:
        raise UserError(f"--scratch {name!r}: {why}")
    return norm


def outcome_kind(test: Sequence[str]) -> str:
    """``pytest``, ``cargo`` or ``exit`` (module docstring)."""
    if not test:
        return "exit"
    name = os.path.basename(test[0])
    if name in ("pytest", "py.test", "pytest-3"):
        return "pytest"
    if re.fullmatch(r"python[0-9.]*", name) and list(test[1:3]) == ["-m", "pytest"]:
        return "pytest"
    if name == "cargo":
        args = [a for a in test[1:] if not a.startswith("+")]
        if args and args[0] == "test":
            return "cargo"
    return "exit"
