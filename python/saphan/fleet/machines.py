"""Machines: add, list, remove, and their signed facts (read side).

Names are checked here; an SSH machine's host key is fetched and pinned when
it is added (transport/ssh.py), and every later connection trusts exactly it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saphan.context import Context
from saphan.errors import UserError
from saphan.store.rows import Machine, Slot
from saphan.timefmt import now_iso

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SSH = re.compile(
    r"^(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9._-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d+))?$"
)


def check_name(kind: str, name: str) -> None:
    if not _NAME.fullmatch(name):
        raise UserError(
            f"{kind} name {name!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def add_machine(
    ctx: Context,
    name: str,
    *,
    local: bool = False,
    ssh: str | None = None,
    identity: str | None = None,
    ssh_agent: bool = False,
    expect_fingerprint: str | None = None,
    known_hosts: str | None = None,
    ssh_config: str | None = None,
) -> Machine:
    """Register a machine. For ``ssh`` (``USER@HOST[:PORT]``, or a Host of
    the operator's ~/.ssh/config: HostName, User, Port, IdentityFile and
    ProxyJump are honoured), the host key is fetched, held against
    ``expect_fingerprint`` / ``known_hosts`` when given (else shown to the
    operator and pinned on first use), and authentication is tried — all
    before anything is written."""
    check_name("machine", name)
    if local == (ssh is not None):
        raise UserError("give exactly one of --local or --ssh USER@HOST[:PORT]")
    if ctx.store.get_machine(name) is not None:
        raise UserError(
            f"machine {name!r} already exists; pick another name or "
            f"`saphan machine remove {name}` first"
        )
    if local:
        if identity is not None or ssh_agent or expect_fingerprint or known_hosts:
            raise UserError("--identity is for --ssh machines (as are --ssh-agent, "
                            "--expect-fingerprint and --known-hosts); drop it for --local")
        machine = Machine(name, "local", created_at=now_iso())
    else:
        if ssh is None:
            raise UserError("--ssh needs USER@HOST[:PORT] or a Host of ~/.ssh/config")
        machine = _ssh_machine(ctx, name, ssh, identity=identity, ssh_agent=ssh_agent,
                               expect_fingerprint=expect_fingerprint, known_hosts=known_hosts,
                               ssh_config=ssh_config)
    if not ctx.store.add_machine(machine):
        raise UserError(
            f"machine {name!r} already exists; pick another name or "
            f"`saphan machine remove {name}` first"
        )
    return machine


@dataclass(frozen=True)
class _Target:
    user: str
    host: str
    port: int
    identity: str | None
    jump: str | None


def _target(spec: str, identity: str | None, config_path: str | None) -> _Target:
    """USER@HOST[:PORT] or a Host alias, completed from the SSH client config
    (explicit values win, as with OpenSSH)."""
    m = _SSH.match(spec)
    alias = spec
    user: str | None = None
    port: int | None = None
    if m:
        user, alias = m.group("user"), m.group("host").strip("[]")
        port = int(m.group("port")) if m.group("port") else None
    elif not re.match(r"^[A-Za-z0-9._-]+(?::\d+)?$", spec):
        raise UserError(f"--ssh {spec!r} is not USER@HOST[:PORT] or a Host of ~/.ssh/config; "
                        "e.g. agent@10.0.0.5:22")
    else:
        alias, _, p = spec.partition(":")
        port = int(p) if p else None
    conf = _ssh_config(config_path).get(alias, {})
    host = conf.get("hostname", alias)
    user = user or conf.get("user")
    if user is None:
        raise UserError(f"--ssh {spec!r} is not USER@HOST[:PORT], and ~/.ssh/config names no "
                        "User for it")
    if port is None:
        port = int(conf.get("port", 22))
    if not 0 < port < 65536:
        raise UserError(f"--ssh port {port} is out of range 1-65535")
    if identity is None:
        found = [os.path.expanduser(f) for f in conf.get("identityfile", [])]
        identity = next((f for f in found if os.path.isfile(f)), None)
    jump = conf.get("proxyjump")
    return _Target(user, host, port, identity, None if jump in (None, "none") else jump)


def _ssh_config(path: str | None) -> _Lookup:
    import paramiko

    where = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.isfile(where):
        if path is not None:
            raise UserError(f"--ssh-config {path}: no such file")
        return _Lookup(None)
    _refuse_commands(where)
    try:
        return _Lookup(paramiko.SSHConfig.from_path(where))
    except Exception as e:  # paramiko raises several types for a bad file
        raise UserError(f"{where} cannot be read as an SSH client config: {e}") from None


def _refuse_commands(where: str) -> None:
    """paramiko runs a ``Match exec`` command while it looks a host up (as
    OpenSSH would); saphan honours five keys of the config and runs nothing
    from it, so a config that would run a command is refused by name, before
    any lookup. (ProxyCommand is never used; only ProxyJump is.)"""
    try:
        text = Path(where).read_text(errors="replace")
    except OSError as e:
        raise UserError(f"{where} cannot be read: {e.strerror or e}") from None
    for n, line in enumerate(text.splitlines(), 1):
        words = line.replace("=", " ").split()
        if words and words[0].lower() == "match" and any(w.lower() == "exec" for w in words):
            raise UserError(
                f"{where}:{n} has `Match … exec`, which would run a command while saphan "
                "looks a host up; saphan reads only HostName, User, Port, IdentityFile and "
                "ProxyJump and runs nothing: give --ssh USER@HOST[:PORT] --identity FILE, or "
                "--ssh-config FILE with a config that has no `Match exec`")


class _Lookup:
    def __init__(self, conf: Any) -> None:
        self.conf = conf

    def get(self, alias: str, default: dict[str, Any]) -> dict[str, Any]:
        if self.conf is None:
            return default
        got: dict[str, Any] = dict(self.conf.lookup(alias))
        return got


def _ssh_machine(ctx: Context, name: str, spec: str, *, identity: str | None, ssh_agent: bool,
                 expect_fingerprint: str | None, known_hosts: str | None,
                 ssh_config: str | None) -> Machine:
    from saphan.transport.ssh import Jump, SSHConnection, fetch_host_key

    t = _target(spec, None, ssh_config)
    if identity is not None:
        shown, identity = identity, os.path.abspath(os.path.expanduser(identity))
        if not os.path.isfile(identity):
            raise UserError(f"--identity {shown}: no such file; give the private key path")
        t = _Target(t.user, t.host, t.port, identity, t.jump)
    if t.identity is None and not ssh_agent:
        raise UserError("--ssh needs --identity FILE (the private key to log in with), an "
                        "IdentityFile in ~/.ssh/config, or --ssh-agent")
    if expect_fingerprint is not None and not expect_fingerprint.startswith("SHA256:"):
        raise UserError(f"--expect-fingerprint {expect_fingerprint!r}: give it as OpenSSH "
                        "prints it, SHA256:… (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` "
                        "on the machine)")
    timeout = ctx.config.ssh_connect_timeout
    jump = None
    if t.jump is not None:
        if "," in t.jump:
            raise UserError(f"ProxyJump {t.jump!r} chains several hosts; saphan reaches a "
                            "machine through at most one jump host")
        j = _target(t.jump, None, ssh_config)
        if j.jump is not None:
            raise UserError(f"the jump host {t.jump} has a ProxyJump of its own; saphan "
                            "reaches a machine through at most one jump host")
        jkey = fetch_host_key(name, j.host, j.port, timeout=timeout)
        _check_presented(name, f"the jump host {j.user}@{j.host}:{j.port}", jkey.line, j.host,
                         j.port, None, known_hosts)
        jump = Jump(j.user, j.host, j.port, jkey.line, j.identity or t.identity, ssh_agent)
    key = fetch_host_key(name, t.host, t.port, timeout=timeout, via=jump)
    _check_presented(name, f"{t.host}:{t.port}", key.line, t.host, t.port, expect_fingerprint,
                     known_hosts)
    machine = Machine(
        name, "ssh", ssh_user=t.user, ssh_host=t.host, ssh_port=t.port,
        identity_file=t.identity, host_key=key.line, created_at=now_iso(),
        ssh_agent=ssh_agent, proxy_jump=jump.row() if jump is not None else None,
    )
    # Authentication, tried before anything is written.
    with SSHConnection(machine, connect_timeout=timeout,
                       command_timeout=ctx.config.ssh_command_timeout) as conn:
        conn.connect()
    return machine


def _check_presented(name: str, what: str, line: str, host: str, port: int,
                     expect: str | None, known_hosts: str | None) -> None:
    """The presented key against what the operator brought, if anything."""
    from saphan import refusals
    from saphan.transport.ssh import fingerprint

    got = fingerprint(line)
    if expect is not None and got != expect:
        raise refusals.host_key_mismatch(
            f"{what} (machine {name}) presents host key {line.split()[0]} {got}, not the "
            f"expected {expect}; nothing was written", _HOST_KEY_FIX)
    if known_hosts is None:
        return
    import paramiko

    path = os.path.expanduser(known_hosts)
    try:
        known = paramiko.HostKeys(path)
    except OSError as e:
        raise UserError(f"--known-hosts {known_hosts}: {e.strerror or e}") from None
    wanted = host if port == 22 else f"[{host}]:{port}"
    entry = known.lookup(wanted)
    if not entry:
        raise refusals.host_key_mismatch(
            f"{what} (machine {name}) is not in {path} (looked up as {wanted}); its "
            f"presented key {got} was not pinned", _HOST_KEY_FIX)
    listed = {fingerprint(f"{k.get_name()} {k.get_base64()}") for k in entry.values()}
    if got not in listed:
        raise refusals.host_key_mismatch(
            f"{what} (machine {name}) presents host key {got}, but {path} lists "
            f"{', '.join(sorted(listed))} for it; nothing was written", _HOST_KEY_FIX)


_HOST_KEY_FIX = ("confirm the machine's host key with its owner out of band (`ssh-keygen -lf "
                 "/etc/ssh/ssh_host_ed25519_key.pub` there) and give that fingerprint")


def remove_machine(ctx: Context, name: str) -> None:
    ctx.machine(name)
    live = [r for s in ctx.store.list_slots(name) for r in ctx.store.live_runs(name, s.name)]
    if live:
        raise UserError(
            f"machine {name!r} has {len(live)} live run(s) ({', '.join(r.id for r in live)}); "
            "let them finish or `saphan runs finalize ID` first"
        )
    ctx.store.remove_machine(name)


def machine_facts(ctx: Context, name: str) -> dict[str, Any]:
    """Every fact of the machine, verified (signature, binding, freshness).

    A fact signed by a key this workspace does not hold is shown as such
    (``signature``: the foreign object, its value ``unverified_value``),
    never as an invalid signature; nothing is gated on it (records.verify_fact).
    """
    from saphan.records import foreign_fact

    key = ctx.record_key()  # custody first, facts or none: the verb reads under the key
    out: dict[str, Any] = {}
    for f in ctx.store.list_facts(name):
        other = foreign_fact(key, f)
        if other is not None:
            try:
                unverified: object = json.loads(f.value_json)
            except ValueError:
                unverified = f.value_json
            out[f.kind] = {"signature": other, "unverified_value": unverified,
                           "measured_at": f.measured_at}
            continue
        got = ctx.verified_fact(name, f.kind)
        if got is not None:
            out[f.kind] = {"value": got[0], "measured_at": got[1]}
    return out


def agents(ctx: Context, name: str, slots: list[Slot], facts: dict[str, Any]
           ) -> list[dict[str, Any]]:
    """The agent binaries a machine's runs use (``machine show``): each one
    delivered there (its signed row: path, digest and version measured
    there), and each slot's --agent-path with the digest and version the
    runner reported for it at that slot's newest run whose record verifies
    (re-measured there at every run; nothing is dialled here)."""
    from saphan.fleet.facts import AGENT_FACT_PREFIX
    from saphan.records import verify_run_row

    out: list[dict[str, Any]] = []
    for kind, fact in sorted(facts.items()):
        if kind.startswith(AGENT_FACT_PREFIX) and "value" in fact:
            v = fact["value"]
            out.append({"tool": kind[len(AGENT_FACT_PREFIX):], "path": v.get("path"),
                        "sha256": v.get("sha256"), "version": v.get("version"),
                        "source": f"delivered {fact['measured_at']}"})
    key: bytes | None = None
    for s in slots:
        if s.agent_path is None:
            continue
        entry: dict[str, Any] = {"tool": s.tool, "path": s.agent_path, "sha256": None,
                                 "version": None, "source": f"slot {s.name}'s --agent-path"}
        key = key or ctx.record_key()
        for row in ctx.store.list_runs(20, machine=name, slot=s.name):
            if row.live or not row.record_json:
                continue
            record, sig = verify_run_row(key, row)
            agent = record.get("agent") if sig.get("status") == "valid" else None
            if isinstance(agent, dict) and agent.get("path") == s.agent_path \
                    and agent.get("sha256"):
                entry.update(sha256=agent["sha256"], version=agent.get("version"),
                             source=f"slot {s.name}'s --agent-path, measured there at run "
                                    f"{row.id} ({row.started_at})")
                break
        out.append(entry)
    return out
