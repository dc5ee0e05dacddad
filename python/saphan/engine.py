"""The engine: saphan's Python API, a thin facade. A run goes from
:meth:`Engine.run` to :func:`saphan.run.pipeline.run` (cast → reserve →
compose → dispatch → record on one screen). The CLI is a thin layer over
:class:`Engine`; below it everything works against a Context.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.context import Context
from saphan.workspace import Workspace

if TYPE_CHECKING:
    from saphan import lanes as lanes_mod
    from saphan.batch.api import Batches
    from saphan.config import Config
    from saphan.liveness import RemoteCheck
    from saphan.records import RunRecord
    from saphan.run.cancel import Cancelled
    from saphan.store import Store
    from saphan.store.rows import Machine, Slot
    from saphan.tools.instruction import Request as AgentRequest
    from saphan.transport.ssh import SSHConnection
    from saphan.workspace_init import Initialised


class Engine:
    """saphan's operations on one workspace (``home``; default $SAPHAN_HOME or ~/.saphan)."""

    def __init__(self, home: str | os.PathLike[str] | None = None, *, reconcile: bool = True):
        self.workspace = Workspace.resolve(home)  # reconcile: first use of the store finishes
        self.ctx = Context(self.workspace, on_open=_reconcile if reconcile else None)  # run/live

    # -- workspace ---------------------------------------------------------------
    def init(self, database_url: str | None = None, *, key_file: str | None = None,
             join: bool = False, new_key: bool = False) -> Initialised:
        """Create the workspace (config, record key, database), change its store URL, or
        join a fleet's store with its key: all or nothing, never overwriting a key
        (workspace_init.py). The paths created, as a list, with ``notes`` and ``key_id``."""
        from saphan import workspace_init
        return workspace_init.init(self.ctx, database_url, key_file=key_file, join=join,
                                   new_key=new_key)

    @property
    def config(self) -> Config:
        return self.ctx.config

    @property
    def store(self) -> Store:
        return self.ctx.store
    @property
    def batches(self) -> Batches:
        """Batches of tasks cast on the fleet as seats free up (batch/api.py)."""
        from saphan.batch.api import Batches
        return Batches(self.ctx)
    def close(self) -> None:
        self.ctx.close()

    def migrate(self) -> list[int]:
        return self.store.migrate()

    # -- machines and slots (fleet/) ---------------------------------------------
    def add_machine(self, name: str, *, local: bool = False, ssh: str | None = None,
                    identity: str | None = None, **ssh_options: Any) -> Machine:
        """See fleet.machines.add_machine (ssh_agent, expect_fingerprint, ...)."""
        from saphan.fleet import machines
        return machines.add_machine(self.ctx, name, local=local, ssh=ssh, identity=identity,
                                    **ssh_options)

    def machine(self, name: str) -> Machine:
        return self.ctx.machine(name)
    def machines(self) -> list[Machine]:
        return self.ctx.machines()

    def machine_facts(self, name: str) -> dict[str, Any]:
        from saphan.fleet import machines
        return machines.machine_facts(self.ctx, name)

    def remove_machine(self, name: str) -> None:
        from saphan.fleet import machines
        machines.remove_machine(self.ctx, name)

    def verified_fact(self, machine: str, kind: str) -> tuple[dict[str, Any], str] | None:
        return self.ctx.verified_fact(machine, kind)

    def probe_confinement(self, name: str) -> dict[str, Any]:
        """Measure the machine's Landlock level and write its signed row."""
        from saphan.fleet import probes
        return probes.probe_confinement(self.ctx, name)

    def probe_container(self, name: str, image: str, *,
                        expect_output: str | None = None) -> dict[str, Any]:
        """Run ``image`` (REF@sha256:DIGEST) there; write its docker-oci row."""
        from saphan.fleet import container_probe
        return container_probe.probe(self.ctx, name, image, expect_output=expect_output)

    def deliver(self, names: Sequence[str], *, all_machines: bool = False, probe: bool = False,
                on_done: Callable[[dict[str, Any]], None] | None = None,
                agent: str | None = None) -> list[dict[str, Any]]:
        """Deliver saphan-launcher (or ``agent``'s binary) to SSH machines in
        parallel (fleet/delivery.py)."""
        from saphan.fleet import delivery
        return delivery.deliver(self.ctx, names, all_machines=all_machines, probe=probe,
                                on_done=on_done, agent=agent)

    def ssh(self, m: Machine) -> SSHConnection:
        return self.ctx.ssh(m)

    def remote_liveness(self, m: Machine) -> RemoteCheck | None:
        return self.ctx.remote_liveness(m)

    def add_slot(self, machine: str, slot: str, *, tool: str, max_sessions: int | None = None,
                 agent_sha256: str | None = None, **run_defaults: Any) -> Slot:
        from saphan.fleet import slots
        return slots.add_slot(self.ctx, machine, slot, tool=tool, max_sessions=max_sessions,
                              agent_sha256=agent_sha256, **run_defaults)

    def slot(self, machine: str, slot: str) -> Slot:
        return self.ctx.slot(machine, slot)

    def slots(self, machine: str | None = None) -> list[Slot]:
        from saphan.fleet import slots
        return slots.slots(self.ctx, machine)

    def set_max_sessions(self, machine: str, slot: str, max_sessions: int | None) -> Slot:
        from saphan.fleet import slots
        return slots.set_max_sessions(self.ctx, machine, slot, max_sessions)

    def set_agent_pin(self, machine: str, slot: str, agent_sha256: str | None) -> Slot:
        from saphan.fleet import slots
        return slots.set_agent_pin(self.ctx, machine, slot, agent_sha256)

    def set_run_defaults(self, machine: str, slot: str, **changes: Any) -> Slot:
        from saphan.fleet import slots
        return slots.set_run_defaults(self.ctx, machine, slot, **changes)

    def holders(self, machine: str, slot: str) -> list[dict[str, Any]]:
        from saphan.fleet import slots
        return slots.holders(self.ctx, machine, slot)

    # -- lanes (the built-in loop's model endpoints; saphan.lanes) -----------------
    @property
    def lanes_path(self) -> Path:
        return self.ctx.lanes_path

    def add_lane(self, name: str, *, base_url: str, model: str, credential_file: str,
                 credential_env: str = "OPENAI_API_KEY", timeout: int = 120) -> lanes_mod.Lane:
        """Declare a lane; its credential file's custody is checked now."""
        from saphan import lanes
        return lanes.add(self.lanes_path, lanes.Lane(
            name=name, base_url=base_url, model=model, credential_file=credential_file,
            credential_env=credential_env, timeout=timeout))

    def lanes(self) -> list[lanes_mod.Lane]:
        from saphan import lanes
        return list(lanes.load(self.lanes_path).values())

    def check_lanes(self, name: str | None = None) -> list[lanes_mod.Lane]:
        """Re-check every lane's credential custody (or one's); nothing is sent."""
        from saphan import lanes
        return lanes.check(self.lanes_path, name)

    def remove_lane(self, name: str) -> lanes_mod.Lane:
        from saphan import lanes
        return lanes.remove(self.lanes_path, name)

    # -- runs ----------------------------------------------------------------------
    def runs(self, limit: int = 50, **filters: Any) -> list[RunRecord]:
        """The newest runs (``filters``: Store.list_runs), each verified (``.signature``)."""
        from saphan.run import live
        return live.listing(self.ctx, limit, **filters)

    def run_record(self, run_id: str, *, dial: bool = True) -> RunRecord:
        """One run's record (id, unique prefix or "last"), verified against the
        record key; check ``.signature`` ("valid" / "invalid" / "missing" / "pending").
        A live run's carries ``live``: its holder, read where it runs (``dial``: over SSH)."""
        from saphan.run import live
        return live.view(self.ctx, self.ctx.find_run(run_id), self.ctx.record_key(), dial=dial)

    def finalize(self, run_id: str, *, reason: str = "operator",
                 force: bool = False) -> RunRecord:
        """End a live run's row by hand (run/record.finalize_by_operator)."""
        from saphan.run import record
        return record.finalize_by_operator(self.ctx, run_id, reason=reason, force=force)

    def cancel(self, run_id: str, *, signal: str = "SIGTERM", grace: float = 10.0) -> Cancelled:
        """End a live run's process tree and record it cancelled (run/cancel.py)."""
        from saphan.run import cancel
        return cancel.cancel(self.ctx, run_id, sig=signal, grace=grace)

    def run(self, machine: str | None, slot: str | None, argv: Sequence[str], *,
            workdir: str | os.PathLike[str] | None = None, stream: bool = True,
            boundary: str | None = None, repo: str | os.PathLike[str] | None = None,
            base_ref: str | None = None, keep_worktree: bool = True,
            request: AgentRequest | None = None, view: bool = False,
            wait: float = 0.0, tool: str | None = None,
            labels: dict[str, str] | None = None, image: str | None = None,
            run_id: str | None = None) -> RunRecord:
        """Cast, reserve, compose, dispatch, record (run/pipeline.py): the finished
        record, or :class:`Refusal` (recorded), or :class:`UserError` (nothing
        written). The arguments are `saphan run`'s options (``slot`` None: cast
        on the fleet, docs/fleet.md); ``run_id``: a batch claim's (batch/child.py)."""
        from saphan.run import pipeline
        return pipeline.run(self.ctx, machine, slot, argv, workdir=workdir, stream=stream,
                            boundary=boundary, repo=repo, base_ref=base_ref,
                            keep_worktree=keep_worktree, request=request, view=view, wait=wait,
                            tool=tool, labels=labels, image=image, run_id=run_id)

    def measure_base(self, machine: str, slot: str, test: Sequence[str], *, base: str,
                     repo: str | os.PathLike[str] | None = None,
                     workdir: str | os.PathLike[str] | None = None, scratch: str | None = None,
                     expect: str | None = None, stream: bool = True) -> RunRecord:
        """The design document's runbook as one confined run on a command slot
        (measure/); the report is the record's ``measure`` and runs/<id>/measure.json."""
        from saphan.measure.order import make
        from saphan.run import pipeline
        return pipeline.run(self.ctx, machine, slot, (), workdir=workdir, stream=stream, repo=repo,
                            measure=make(base, test, scratch=scratch, expect=expect))


def _reconcile(ctx: Context) -> None:
    from saphan.run import live
    live.reconcile(ctx)
