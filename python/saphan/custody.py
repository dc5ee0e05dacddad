"""The entry check: saphan refuses to start when its own files are replaceable.

Runs first in the ``saphan`` console script (see :mod:`saphan.entry`), before
click parses a flag, before the workspace is resolved and before any verb.
It measures, with the four clauses of SPEC.md §7 implemented once in
rust/core (``saphan._native.check_binary_custody``):

* the script that is executing, ``sys.argv[0]`` when it names a file: the
  console script, or ``saphan/__main__.py`` (the "entry module") under
  ``python -m saphan``;
* the package directory (whoever can write it can replace any module in it);
* the native module (``saphan._native``'s shared object).

A failure prints the ``custody-binary-unsafe`` refusal in the CLI's format,
followed by what the check does not assert, and exits 3. A file whose custody
cannot be measured is refused the same way (fail closed).

This module imports only ``os``, ``sys`` and ``saphan._native``: it runs on
every start, so it must not pull in click or anything else. It is a barrier
against misconfiguration, not against an attacker who can already write the
files it checks (that attacker edits the check out).
"""

from __future__ import annotations

import os
import sys

from saphan import _native

#: The refusal class and exit code (mirrors saphan.refusals; a test holds
#: the two together, so this module need not import it).
CLASS = "custody-binary-unsafe"
EXIT_CODE = 3

#: What the check does not assert (rust/core's NOT_ASSERTED; the violation
#: dict carries the same text, and a test holds the two together). Used when
#: a file cannot be measured at all, so there is no violation to carry it.
NOT_ASSERTED = (
    "not asserted: which identity is the agent; the ancestors above the immediate parent "
    "directory; ACLs and extended attributes (which can grant write beyond the mode bits a "
    "stat can see)"
)

#: The shape this project installs and mandates, appended to every fix.
MANDATED_SHAPE = (
    "saphan is installed owned by root or by the account that runs it, mode 0755, in a "
    "directory neither group nor others can write"
)


def entry_paths() -> list[tuple[str, str]]:
    """``(role, path)`` for every file the entry check measures, in order."""
    paths: list[tuple[str, str]] = []
    package_dir = os.path.dirname(os.path.abspath(__file__))
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and os.path.isfile(argv0):
        if not os.path.isabs(argv0):
            argv0 = os.path.join(os.getcwd(), argv0)
        # `python -m saphan` runs saphan/__main__.py: argv[0] is its path.
        main_module = os.path.join(package_dir, "__main__.py")
        role = "entry module" if argv0 == main_module else "console script"
        paths.append((role, argv0))
    paths.append(("package directory", package_dir))
    native = _native.__file__
    if native is not None:
        paths.append(("native module", native))
    return paths


def _groups_text() -> str:
    groups = sorted({os.getegid(), *os.getgroups()})
    return "[" + ",".join(str(g) for g in groups) + "]"


def violation(paths: list[tuple[str, str]]) -> str | None:
    """The refusal text for the first path that fails custody, else ``None``.

    Three lines: ``refused [custody-binary-unsafe]: …``, ``fix: …`` and
    ``not asserted: …``.
    """
    for role, path in paths:
        try:
            found = _native.check_binary_custody(path)
        except OSError as e:
            return (
                f"refused [{CLASS}]: saphan's {role}: the custody of {path} cannot be measured "
                f"({e.strerror or e}); caller euid {os.geteuid()} groups {_groups_text()}\n"
                f"fix: run saphan from an installed copy this account can stat, with its parent "
                f"directory; {MANDATED_SHAPE}\n"
                f"{NOT_ASSERTED}"
            )
        if found is not None:
            return (
                f"refused [{CLASS}]: saphan's {role}: {found['message']}\n"
                f"fix: {found['remediation']}; {MANDATED_SHAPE}\n"
                f"{found['not_asserted']}"
            )
    return None


def check_entry() -> None:
    """Refuse to start (exit 3) when a file saphan runs from fails custody."""
    text = violation(entry_paths())
    if text is not None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_CODE)
