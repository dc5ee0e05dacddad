"""Machines: add, list, remove, and their signed facts (read side).

Names are checked here; an SSH machine's host key is fetched and pinned when
it is added (transport/ssh.py), and every later connection trusts exactly it.
"""

from __future__ import annotations

import os
import re
from typing import Any

from saphan.context import Context
from saphan.errors import UserError
from saphan.store.rows import Machine
from saphan.timefmt import now_iso

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SSH = re.compile(
    r"^(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9._-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d+))?$"
)


def check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
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
) -> Machine:
    check_name("machine", name)
    if local == (ssh is not None):
        raise UserError("give exactly one of --local or --ssh USER@HOST[:PORT]")
    if local:
        if identity is not None:
            raise UserError("--identity is for --ssh machines; drop it for --local")
        machine = Machine(name, "local", created_at=now_iso())
    else:
        assert ssh is not None
        m = _SSH.match(ssh)
        if not m:
            raise UserError(f"--ssh {ssh!r} is not USER@HOST[:PORT]; e.g. agent@10.0.0.5:22")
        if identity is None:
            raise UserError("--ssh needs --identity FILE (the private key to log in with)")
        ident = os.path.abspath(os.path.expanduser(identity))
        if not os.path.isfile(ident):
            raise UserError(f"--identity {identity}: no such file; give the private key path")
        port = int(m.group("port") or 22)
        if not 0 < port < 65536:
            raise UserError(f"--ssh port {port} is out of range 1-65535")
        if ctx.store.get_machine(name) is not None:
            raise UserError(
                f"machine {name!r} already exists; pick another name or "
                f"`saphan machine remove {name}` first"
            )
        from saphan.transport.ssh import fetch_host_key

        host = m.group("host").strip("[]")
        # Pinned now, shown as a fingerprint; every later connection trusts
        # exactly this key and refuses any other (transport/ssh.py).
        key = fetch_host_key(name, host, port, timeout=ctx.config.ssh_connect_timeout)
        machine = Machine(
            name, "ssh", ssh_user=m.group("user"), ssh_host=host, ssh_port=port,
            identity_file=ident, host_key=key.line, created_at=now_iso(),
        )
    if not ctx.store.add_machine(machine):
        raise UserError(
            f"machine {name!r} already exists; pick another name or "
            f"`saphan machine remove {name}` first"
        )
    return machine


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
    """Every fact of the machine, verified (signature, binding, freshness)."""
    out: dict[str, Any] = {}
    for f in ctx.store.list_facts(name):
        got = ctx.verified_fact(name, f.kind)
        if got is not None:
            out[f.kind] = {"value": got[0], "measured_at": got[1]}
    return out
