"""The environment a jailed run starts with: an allow-list, never saphan's own.

saphan's environment is the operator's shell: it can hold an SSH agent
socket, cloud keys, tokens for other services, the workspace location. None
of that is the run's business, so a run's environment is BUILT, name by name,
from three sources and nothing else:

1. :data:`BASE`, passed to every run when saphan's environment has them —
   ``PATH`` (to find programs), ``HOME``, ``USER``, ``LOGNAME`` (who the
   process is; tools key their config on them), ``LANG``, ``TERM``, ``TZ``
   and the locale categories ``LC_ALL``, ``LC_CTYPE``, … (:data:`LOCALE`: how
   text, terminals and time are shown — by name, not every ``LC_*``). None of them
   carries a secret.
2. the names the run may take from saphan's environment, ``allow``:
   - an agent tool's own variables, declared by its adapter
     (:meth:`saphan.tools.adapter.Adapter.env_allowed`; each tool's list and
     why is written on its adapter): Claude Code gets its API key/token,
     endpoint and configuration directory; Codex its home and the key of the
     model provider saphan pins; saphan's own loop nothing (its key arrives
     on a pipe);
   - the permission class's ``credentials`` (variable NAMES; a ``command``
     slot gets exactly these on top of the base). A variable a run needs that
     no list here names is passed by naming it there.
3. the variables saphan sets for the run, ``set_vars``: ``TMPDIR`` (the
   run's scratch directory), ``SAPHAN_RUN_ID``, ``SAPHAN_RETURN_PATH``.
   A set variable wins over one of the same name taken from the source.

Never taken from saphan's environment, whatever a list says (:func:`build`
refuses to be asked, and a permission class cannot name them): ``TMPDIR``
(saphan sets it to the run's scratch directory; the invoking one is outside
the writable set), ``SSH_AUTH_SOCK`` (a socket that signs as the operator, to
any host the agent can reach), ``SAPHAN_HOME`` (where the workspace and its
keys live) and the names saphan sets for a run (``SAPHAN_RUN_ID``,
``SAPHAN_RETURN_PATH``: an outer run's values must not leak into an inner
one). Everything else in saphan's environment — its other ``SAPHAN_*``
settings included — is absent from the run's unless a list names it.

The record says which names passed and which saphan set — names only, never a
value (:meth:`Environment.as_record`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: passed to every run when present in the source (plus the :data:`LOCALE` names)
BASE: tuple[str, ...] = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ")
#: the locale categories that pass (POSIX and glibc's), by name: not every
#: ``LC_*`` — that prefix is how ssh's `AcceptEnv LC_*` carries other values,
#: so `LC_GITHUB_TOKEN` would otherwise reach the jail (measured)
LOCALE = ("LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME",
          "LC_MONETARY", "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE",
          "LC_MEASUREMENT", "LC_IDENTIFICATION")
#: never taken from the source, even when a list names them (see the module text)
NEVER: frozenset[str] = frozenset({"TMPDIR", "SSH_AUTH_SOCK", "SAPHAN_HOME", "SAPHAN_RUN_ID",
                                   "SAPHAN_RETURN_PATH"})

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Environment:
    """A run's environment and where each name came from."""

    #: the environment the boundary is started with
    env: dict[str, str]
    #: names whose values were taken from the source (sorted)
    passed: tuple[str, ...]
    #: names saphan set for the run (sorted)
    set: tuple[str, ...]

    def as_record(self) -> dict[str, Any]:
        """Names only: a value never reaches the record."""
        return {"passed": list(self.passed), "set": list(self.set)}


def valid_name(name: str) -> bool:
    """A portable environment variable name: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return bool(_NAME.match(name))


def never_passed(name: str) -> bool:
    """Whether ``name`` is one that no run ever takes from saphan's environment."""
    return name in NEVER


def build(
    source: Mapping[str, str],
    *,
    allow: Iterable[str] = (),
    set_vars: Mapping[str, str] | None = None,
) -> Environment:
    """The run's environment: :data:`BASE` and the :data:`LOCALE` names present in
    ``source``, the ``allow``-ed names present in ``source``, then
    ``set_vars`` (which win). Nothing else of ``source`` passes.

    Raises ``ValueError`` for a name that is not a variable name, for an
    ``allow``-ed name that is never passed (:func:`never_passed`), and for a
    set value holding a NUL byte (it could not be exported).
    """
    allowed: list[str] = []
    for name in allow:
        if not valid_name(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if never_passed(name):
            raise ValueError(f"{name} is never passed from saphan's environment to a run "
                             f"(never passed: {', '.join(sorted(NEVER))})")
        allowed.append(name)
    chosen = dict(set_vars or {})
    for name, value in chosen.items():
        if not valid_name(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if "\x00" in value:
            raise ValueError(f"the value saphan sets for {name} holds a NUL byte")
    wanted = {*BASE, *allowed,
              *(k for k in LOCALE if k in source)}
    # The NEVER names are not read from the source even when listed (BASE
    # could one day name one): the caller sets TMPDIR and saphan's run names.
    taken = sorted(k for k in wanted
                   if k in source and k not in chosen and not never_passed(k))
    env = {k: source[k] for k in taken}
    env.update(chosen)
    return Environment(env=env, passed=tuple(taken), set=tuple(sorted(chosen)))
