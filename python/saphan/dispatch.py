"""Compose, dispatch and record a reserved local run; always finalise its row.

The row is finalised whatever happens after the reservation: a normal exit,
a refusal at composition, Ctrl-C or SIGTERM to saphan (forwarded to the
child first), or an unexpected error. Only SIGKILL leaves a live row, and the
next conflict handling on the slot recovers it (capacity.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saphan import worktrees
from saphan.confine.compose import Boundary, compose_landlock_local, compose_local
from saphan.confine.grants import derive, git_layout
from saphan.confine.policy import Policy
from saphan.refusals import Refusal
from saphan.store.rows import Slot
from saphan.timefmt import now_iso
from saphan.tools.binaries import check_pin
from saphan.transport import local

if TYPE_CHECKING:
    from saphan.engine import Engine
    from saphan.records import RunRecord
    from saphan.tools.adapter import Adapter
    from saphan.worktrees import RepoSpec

#: What each mechanism does not restrict, written into every record it enforces.
NOT_RESTRICTED = {
    "bubblewrap": (
        "not restricted by this boundary: reads (anything this user can read, except the "
        "read denials listed) and network egress (no egress policy declared)"
    ),
    "seatbelt": (
        "not restricted by this boundary: reads (except the read denials listed) and network "
        "egress (no egress policy declared)"
    ),
    "landlock": (
        "not restricted by this boundary: reads (Landlock grants reading everywhere; the "
        "read denials listed are kept by the outer bubblewrap), network egress (no egress "
        "policy declared), and metadata changes (chmod, chown, timestamps, xattrs) outside "
        "the writable set, which Landlock does not cover at any level"
    ),
}


def execute_local(
    engine: Engine,
    slot: Slot,
    base: dict[str, Any],
    argv: list[str],
    wd: str,
    *,
    stream: bool = True,
    boundary_choice: str | None = None,
    agent_sha256: str | None = None,
    repo: RepoSpec | None = None,
    keep_worktree: bool = True,
    adapter: Adapter | None = None,
) -> RunRecord:
    """``adapter`` (an agent tool) composes ``argv`` from the derived policy
    and may confine itself (tools/adapter.py); the argv guard then checks the
    final command line right before launch."""
    store = engine.store
    ws = engine.workspace
    run_id = base["id"]
    record: dict[str, Any] = {**base, "started_at": now_iso(), "enforced_by": None}
    end = RunEnd()
    was_dumpable = False
    try:
        agent = base.get("agent") or {}
        if slot.agent_sha256 is not None:
            record["agent"] = {**agent, "pinned_sha256": slot.agent_sha256}
            # Before anything is made for the run: a pinned slot runs only that binary.
            check_pin(slot.machine, slot.name, slot.agent_sha256, str(agent.get("path")),
                      str(agent.get("sha256")))
        run_dir = ws.run_dir(run_id)
        out_dir = run_dir / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        if repo is not None:
            # Outside the boundary, before it: the kernel would refuse this inside.
            branch = worktrees.create(repo, wd, run_id)
            record["worktree"] = {"repo": repo.toplevel, "path": wd, "branch": branch,
                                  "base": repo.base, "base_ref": repo.base_ref}
        else:
            layout = git_layout(wd)
            if layout is not None:
                worktrees.ignore_scratch(layout.common_dir)
        policy = derive(
            wd,
            return_path=str(out_dir),
            session_dirs=adapter.session_dirs() if adapter is not None else (),
            read_denials=(str(ws.key_path), str(ws.config_path),
                          *(adapter.read_denials() if adapter is not None else ())),
        )
        vendor = adapter.vendor_boundary(policy) if adapter is not None else None
        if vendor is not None:
            boundary = vendor
        elif boundary_choice == "landlock":
            assert agent_sha256 is not None
            boundary = _compose_landlock(engine, slot.machine, policy, agent_sha256)
        else:
            boundary = compose_local(policy, run_dir=str(run_dir))
        os.makedirs(policy.scratch_dir, exist_ok=True)
        if adapter is not None:
            argv = adapter.argv(policy)
        record.update(
            {
                "enforced_by": boundary.record(),
                "policy": policy.as_record(),
                "writable": policy.writable_set(),
                "notes": [*policy.notes, NOT_RESTRICTED.get(boundary.mechanism)
                          or boundary.extra["not_restricted"]],
                "return_path": str(out_dir),
                "boundary_argv": boundary.prefix,
            }
        )
        if adapter is not None:
            record.update({"argv": argv, **adapter.record(policy)})
            adapter.guard([*boundary.prefix, *argv])
        env = dict(os.environ)
        env["TMPDIR"] = policy.scratch_dir
        env["SAPHAN_RUN_ID"] = run_id
        env["SAPHAN_RETURN_PATH"] = str(out_dir)
        secret = None
        if adapter is not None:
            env = adapter.environment(env)
            secret = adapter.stdin_bytes()
            if secret is not None:
                # This process holds the key (and maybe the operator's export of
                # it): while the run lasts, no same-user process may read its
                # memory or environ. Restored when the run ends.
                was_dumpable = local.set_dumpable(False)
        limit = adapter.time_limit() if adapter is not None else None
        store.mark_running(run_id)
        engine.write_record_file({**record, "state": "running"})
        finished = local.run(
            [*boundary.prefix, *argv], cwd=wd, run_dir=str(run_dir), env=env,
            stream=stream, stdin_path=adapter.stdin_path if adapter is not None else None,
            stdin_bytes=secret, time_limit=limit,
        )
        end.exited(finished.exit_code)
        record["output"] = {"stdout": finished.stdout_path, "stderr": finished.stderr_path}
        if adapter is not None:
            facts = adapter.after_run(finished.stdout_path)
            record.update(facts)
            end.outcome = adapter.outcome(facts) or end.outcome
        if finished.killed_at_limit:
            end.outcome = "time-limit-killed"
            record["notes"] = [*record["notes"], (
                f"the engine killed the run at its time limit ({limit:.0f} s): the tool had "
                "not ended within its own budget")]
        if boundary.mechanism == "landlock":
            record["enforced_by"]["confirmation"] = _confirmation(finished.stderr_path)
    except BaseException as e:
        end.absorb(e, record)
        raise
    finally:
        if was_dumpable:
            local.set_dumpable(True)
        if repo is not None and "worktree" in record:
            _settle_worktree(record["worktree"], repo, wd, keep_worktree)
        finish_run(engine, record, end)
    return engine.run_record(run_id)


class RunEnd:
    """How a run's body ended, as every lane records it.

    Starts as "error" (anything unforeseen); ``exited`` records a normal end;
    ``absorb`` classifies the exception on its way out (the caller re-raises).
    """

    def __init__(self) -> None:
        self.outcome = "error"
        self.state = "ended"
        self.exit_code: int | None = None
        self.refusal_class: str | None = None

    def exited(self, code: int) -> None:
        self.exit_code = code
        self.outcome = "exited" if code == 0 else "failed"

    def absorb(
        self,
        e: BaseException,
        record: dict[str, Any],
        interrupted_note: Callable[[local.Interrupted], str] = str,
    ) -> None:
        if isinstance(e, Refusal):
            self.outcome, self.state, self.refusal_class = "refused", "refused", e.cls
            record["refusal"] = e.as_dict()
            e.run_id = record["id"]
        elif isinstance(e, local.Interrupted):
            self.outcome, self.exit_code = "interrupted", e.exit_code
            record["notes"] = [*record.get("notes", []), interrupted_note(e)]
        elif isinstance(e, KeyboardInterrupt):
            self.outcome = "interrupted"
        else:
            self.outcome = "error"
            record["error"] = f"{type(e).__name__}: {e}"


def finish_run(engine: Engine, record: dict[str, Any], end: RunEnd) -> None:
    """Finalise a run's row by id and write its record file (every lane ends here)."""
    record.update({"finished_at": now_iso(), "outcome": end.outcome,
                   "exit_code": end.exit_code, "state": end.state})
    engine.store.finalize(
        record["id"], state=end.state, outcome=end.outcome, exit_code=end.exit_code,
        refusal_class=end.refusal_class, record_json=json.dumps(record, sort_keys=True),
    )
    engine.write_record_file(record)


def _compose_landlock(engine: Engine, machine: str, policy: Policy, agent_sha256: str) -> Boundary:
    """The gate, then the launcher that measured the row, then the composition."""
    from saphan import launcher
    from saphan.confine.landlock_gate import FACT_KIND, gate

    fact = engine.verified_fact(machine, FACT_KIND)
    value, measured_at = fact if fact is not None else (None, None)
    level = gate(machine, value, measured_at)
    assert value is not None
    ident = launcher.identity()
    if ident is None:
        raise Refusal(
            "confinement-unavailable",
            "saphan-launcher is not installed on this machine, so no Landlock domain can "
            "be applied",
            "reinstall saphan (ci/setup builds and packages the launcher), then "
            f"`saphan machine probe-confinement {machine}`",
        )
    if ident.sha256 != value.get("launcher_sha256"):
        raise Refusal(
            "digest-mismatch",
            f"the launcher at {ident.path} has SHA-256 {ident.sha256}, but machine {machine}'s "
            f"Landlock level was measured with {value.get('launcher_sha256')}",
            f"re-measure with the installed launcher: `saphan machine probe-confinement {machine}`",
        )
    return compose_landlock_local(
        policy, level=level, launcher_path=ident.path, launcher_version=ident.version,
        launcher_sha256=ident.sha256, agent_sha256=agent_sha256,
    )


def _settle_worktree(info: dict[str, Any], repo: RepoSpec, wd: str, keep: bool) -> None:
    """Record where the run left its branch; remove the worktree unless kept."""
    info["head_after"] = worktrees.head(wd)
    info["kept"] = keep
    if not keep:
        try:
            worktrees.remove(repo, wd)
        except RuntimeError as e:
            info["kept"] = True
            info["remove_error"] = str(e)


def _confirmation(stderr_path: str) -> str | None:
    """The launcher's own line, as printed on the far side of the exec."""
    with open(stderr_path, "rb") as f:
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("saphan-launcher: landlock "):
                return line
    return None
