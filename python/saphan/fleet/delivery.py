"""Delivery of saphan-launcher — or an agent tool's single executable
(``--agent codex``) — to SSH machines (SPEC.md §9), in parallel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import probes
from saphan.refusals import Refusal
from saphan.store.rows import Machine
from saphan.timefmt import now_iso


def deliver(
    ctx: Context,
    names: Sequence[str],
    *,
    all_machines: bool = False,
    probe: bool = False,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    agent: str | None = None,
) -> list[dict[str, Any]]:
    """Deliver saphan-launcher to SSH machines, in parallel (one thread and
    one connection per machine); with ``probe``, measure each machine's
    Landlock level with the launcher just installed. ``agent``: deliver
    that tool's single executable instead (site/far_agent.DELIVERABLE: the
    one this host resolves, tools/binaries.py), into the workspace's far
    ``agents/`` directory, its signed row ``agent:<tool>``. Every signed row
    is written here, on the calling thread. Returns one result per machine
    (``result``: installed / refused / error), in the order given."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from saphan import launcher
    from saphan.errors import TransportError
    from saphan.fleet import facts
    from saphan.site import far as remote
    from saphan.transport.ssh import SSHConnection

    if all_machines == bool(names):
        raise UserError("name the machines to deliver to, or give --all (not both)")
    machines = ([x for x in ctx.machines() if x.transport == "ssh"] if all_machines
                else [ctx.machine(n) for n in dict.fromkeys(names)])
    for x in machines:
        if x.transport != "ssh":
            raise UserError(
                f"machine {x.name!r} is local: its launcher ships inside the saphan package; "
                "deliver only to --ssh machines"
            )
    if not machines:
        raise UserError("there are no --ssh machines to deliver to; add one first")
    from saphan.site import far_agent

    fact_kind, what = remote.FACT_KIND, remote.LAUNCHER_NAME
    if agent is not None:
        if agent not in far_agent.DELIVERABLE:
            raise UserError(f"--agent {agent}: saphan delivers only single executables "
                            f"({', '.join(far_agent.DELIVERABLE)}); give a {agent} slot its "
                            "path on the machine with `saphan slot set MACHINE SLOT "
                            "--agent-path PATH`")
        if probe:
            raise UserError("--probe measures with the launcher; deliver the launcher with "
                            "--probe, the agent without it")
        fact_kind, what = far_agent.agent_fact_kind(agent), agent
    import hashlib

    if agent == "loop":
        from saphan.loop import zipapp

        # saphan's own modules, built the same byte for byte from this saphan
        data = zipapp.build()
        sha = hashlib.sha256(data).hexdigest()
        version = zipapp.version()
    else:
        if agent is not None:
            from saphan.tools import binaries

            path: str | None = binaries.identify(agent).path
        else:
            path = launcher.path()
        if path is None:
            raise UserError("saphan-launcher not found; run ci/setup (it builds and packages "
                            "it)")
        from saphan import _native

        with open(path, "rb") as f:
            data = f.read()
        sha = _native.sha256_file(path)
        if hashlib.sha256(data).hexdigest() != sha:
            raise UserError(f"{path} changed while it was read; deliver again")
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout.strip()
    key = ctx.record_key()
    previous: dict[str, str | None] = {}
    for x in machines:
        try:
            prev = ctx.verified_fact(x.name, fact_kind)
        except Refusal:
            prev = None
        previous[x.name] = prev[0].get("sha256") if prev else None

    def work(x: Machine) -> dict[str, Any]:
        out: dict[str, Any] = {"machine": x.name, "address": x.address()}
        try:
            with SSHConnection(x, connect_timeout=ctx.config.ssh_connect_timeout,
                               command_timeout=ctx.config.ssh_command_timeout) as conn:
                got = remote.deliver(conn, data, root=remote.install_dir(key), sha256=sha,
                                     version=version, previous=previous[x.name], what=what)
                out.update({"result": "installed", "path": got.path, "sha256": got.sha256,
                            "version": got.version})
                if probe:
                    out["probe_raw"] = remote.probe(conn, got.path)
        except Refusal as r:
            out.update({"result": "refused", "refusal": r.as_dict(), "error": r.render()})
        except TransportError as e:
            out.update({"result": "error", "error": f"error: {e}"})
        return out

    results: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=min(16, len(machines))) as pool:
        futures = [pool.submit(work, x) for x in machines]
        for fut in as_completed(futures):
            res = fut.result()
            if res["result"] == "installed":
                value = {"path": res["path"], "sha256": res["sha256"],
                         "version": res["version"], "transport": "ssh",
                         "measured_by": "sha256sum and --version on the machine itself"}
                fact = facts.write(ctx.store, key, ctx.workspace.home,
                                   ctx.machine(res["machine"]), fact_kind, value,
                                   now_iso())
                res["delivered_at"] = fact.measured_at
            raw = res.pop("probe_raw", None)
            if raw is not None:
                try:
                    measured = probes.probe_value(res["machine"], "ssh", *raw)
                    probes.check_probed_launcher(res["machine"], measured, res)
                    res["probe"] = probes.record_probe(ctx, res["machine"], measured)
                except (UserError, Refusal) as e:
                    res["probe_error"] = str(e)
            results[res["machine"]] = res
            if on_done is not None:
                on_done(res)
    return [results[x.name] for x in machines]


#: every machine's keys in `machine deliver --json`: one key set, null where a
#: result has none (an error has no sha256, an installed launcher no error)
RESULT_KEYS = ("machine", "address", "result", "path", "sha256", "version", "delivered_at",
               "refusal", "error", "probe", "probe_error")


def as_row(res: dict[str, Any]) -> dict[str, Any]:
    """One machine's result with every key of :data:`RESULT_KEYS`."""
    return {**{k: None for k in RESULT_KEYS}, **res}
