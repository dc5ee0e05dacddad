"""Signed machine facts, bound to the machine they were measured on and
sequenced, so a row is believed only for that machine and only while no
newer one has been seen.

A fact's signed value carries:

    bound_to   the machine's identity when it was measured: for an SSH
               machine its user, host, port and pinned host-key fingerprint;
               for a local machine this host's name. A machine re-pointed in
               the store (another host, another key) no longer matches: its
               rows say nothing about what it points at now.
    seq        the fact's sequence number for (machine, kind), one above the
               highest this workspace has seen. The workspace keeps that high
               water mark in its own file (``fact-seq.json``, owner only,
               never in the store), so an older row restored into the store
               — signed, but superseded — is refused.

Only probes write facts (fleet/probes.py, fleet/delivery.py); every reader
goes through :func:`read`.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saphan import refusals
from saphan.records import sign_fact, verify_fact
from saphan.store.base import Store
from saphan.store.rows import Fact, Machine

SEQ_FILE = "fact-seq.json"
#: the signed fact `machine deliver --agent TOOL` writes (fleet/delivery.py)
AGENT_FACT_PREFIX = "agent:"
#: a machine's verified fact of a kind (:func:`read` with a key and home
#: bound), or None: how a cast reads rows (fleet/cast.py)
FactReader = Callable[[Machine, str], "tuple[dict[str, Any], str] | None"]


def identity(m: Machine) -> str:
    """What a fact about ``m`` is bound to."""
    if m.transport == "ssh":
        from saphan.transport.ssh import fingerprint

        fp = fingerprint(m.host_key) if m.host_key else "no-host-key"
        return f"ssh:{m.ssh_user}@{m.ssh_host}:{m.ssh_port or 22} {fp}"
    return f"local:{socket.gethostname()}"


def write(store: Store, key: bytes, home: Path, m: Machine, kind: str, value: dict[str, Any],
          measured_at: str) -> Fact:
    """Sign ``value`` bound to ``m`` with the next sequence number, store it,
    and raise the workspace's high water mark to it."""
    with _seq_file(home) as seen:
        prior = store.get_fact(m.name, kind)
        prior_seq = 0
        if prior is not None:
            try:
                prior_seq = int(verify_fact(key, prior).get("seq", 0))
            except refusals.Refusal:
                prior_seq = 0
        seq = max(prior_seq, int(seen.get(_slot(m.name, kind), 0))) + 1
        fact = sign_fact(key, m.name, kind, {**value, "bound_to": identity(m), "seq": seq},
                         measured_at)
        store.put_fact(fact)
        seen[_slot(m.name, kind)] = seq
    return fact


def read(store: Store, key: bytes, home: Path, m: Machine, kind: str
         ) -> tuple[dict[str, Any], str] | None:
    """The fact's value and when it was measured, or None when there is none;
    a Refusal when it does not verify, is bound to another machine than the
    one ``m`` now names, or is older than one this workspace has seen."""
    fact = store.get_fact(m.name, kind)
    if fact is None:
        return None
    value = verify_fact(key, fact)
    check(value, home, m, kind, fact.measured_at)
    return value, fact.measured_at


def check(value: dict[str, Any], home: Path, m: Machine, kind: str, measured_at: str) -> None:
    """A verified value's binding and freshness (see the module's text)."""
    again = ("measure it again: `saphan machine probe-confinement "
             f"{m.name}`" if kind == "landlock" else
             f"deliver and measure again: `saphan machine deliver {m.name} --probe`")
    bound = value.get("bound_to")
    now = identity(m)
    if bound is None:
        raise refusals.record_signature_invalid(
            f"the {kind} row of machine {m.name} (measured {measured_at}) is not bound to a "
            "machine (written by a saphan that did not bind rows), so it cannot say it was "
            f"measured on what {m.name} now names ({now})", again)
    if bound != now:
        raise refusals.record_signature_invalid(
            f"the {kind} row of machine {m.name} was measured on {bound}, but {m.name} now "
            f"names {now}: the machine was re-pointed since, and the row says nothing about "
            "what it points at now", again)
    seq = value.get("seq")
    with _seq_file(home) as seen:
        high = int(seen.get(_slot(m.name, kind), 0))
        if not isinstance(seq, int) or seq < high:
            raise refusals.record_signature_invalid(
                f"the {kind} row of machine {m.name} (measured {measured_at}) is number {seq} "
                f"of its kind, but this workspace has seen number {high}: an older row was "
                "put back into the store", f"investigate who can write the store; then {again}")
        if seq > high:  # written by another control plane sharing this store and key
            seen[_slot(m.name, kind)] = seq


def _slot(machine: str, kind: str) -> str:
    return json.dumps([machine, kind])


class _seq_file:
    """The workspace's high water marks, read and rewritten under an
    exclusive lock on a file of its own (``fact-seq.lock``, never replaced),
    never through a link; the marks are written to a new file renamed over
    the old one, so a crash never leaves a half-written mark."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / SEQ_FILE
        self.lock = -1
        self.data: dict[str, int] = {}
        self.before: dict[str, int] = {}

    def __enter__(self) -> dict[str, int]:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self.lock = os.open(self.path.with_name(SEQ_FILE + ".lock"), flags, 0o600)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX)
            self.data = self._load()
        except BaseException:
            os.close(self.lock)
            raise
        self.before = dict(self.data)
        return self.data

    def _load(self) -> dict[str, int]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise self._unreadable(str(e)) from None
        try:
            raw = b""
            while chunk := os.read(fd, 1 << 16):
                raw += chunk
        finally:
            os.close(fd)
        try:
            loaded = json.loads(raw) if raw.strip() else {}
            if not isinstance(loaded, dict):
                raise ValueError("not a JSON object")
            return {str(k): int(v) for k, v in loaded.items()}
        except (ValueError, TypeError) as e:
            raise self._unreadable(str(e)) from None

    def _unreadable(self, why: str) -> refusals.Refusal:
        # Starting again from nothing would believe any older row: say so.
        return refusals.record_signature_invalid(
            f"this workspace's record of the newest machine rows it has seen ({self.path}) "
            f"cannot be read ({why}), so an older row put back into the store could not be "
            "told apart",
            f"restore {self.path} from backup, or remove it and probe (and deliver to) every "
            "machine again")

    def __exit__(self, *_exc: object) -> None:
        try:
            if self.data != self.before:
                tmp = self.path.with_name(f".{SEQ_FILE}.{os.getpid()}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, json.dumps(self.data, sort_keys=True).encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
        finally:
            os.close(self.lock)
