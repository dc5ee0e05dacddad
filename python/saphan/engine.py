"""The engine: the five steps of a run, and the operations around them.

    cast      -> the named machine and slot, if eligible
    reserve   -> one of the slot's ordinals, in the database (capacity.py)
    compose   -> the OS boundary from one Policy (confine/)
    dispatch  -> start the tool inside it (transport/)
    record    -> what enforced, what ran, how it ended (records.py)

The CLI is a thin layer over :class:`Engine`; programs embed it directly.
Every "cannot" is raised as :class:`saphan.refusals.Refusal`, after it has
been recorded on the run's row.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan import __version__
from saphan.config import Config, confinement_mode
from saphan.config import load as load_config
from saphan.errors import UserError
from saphan.ids import new_run_id
from saphan.records import RunRecord
from saphan.refusals import Refusal
from saphan.store import Store, open_store
from saphan.store.rows import Machine, RunRow, Slot
from saphan.timefmt import now_iso
from saphan.tools import AGENT_TOOLS, DISPATCHABLE, TOOLS

if TYPE_CHECKING:
    from saphan import lanes as lanes_mod
    from saphan import liveness, worktrees
    from saphan.tools import permission_class
    from saphan.tools.launch import Request as AgentRequest
    from saphan.transport.ssh import SSHConnection
from saphan.workspace import Workspace

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SSH = re.compile(
    r"^(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9._-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d+))?$"
)


def _check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
        raise UserError(
            f"{kind} name {name!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Engine:
    """saphan's operations on one workspace (``home``; default $SAPHAN_HOME or ~/.saphan)."""

    def __init__(self, home: str | os.PathLike[str] | None = None):
        self.workspace = Workspace.resolve(home)
        self._config: Config | None = None
        self._store: Store | None = None
        self._ssh: dict[str, SSHConnection] = {}

    # -- workspace -------------------------------------------------------------
    def init(self, database_url: str | None = None) -> list[str]:
        """Create the workspace (config, record key, database). Never overwrites."""
        created = self.workspace.init()
        if database_url is not None and str(self.workspace.config_path) in created:
            text = self.workspace.config_path.read_text().replace(
                'url = "sqlite"', f"url = {json.dumps(database_url)}"
            )
            self.workspace.config_path.write_text(text)
        self.workspace.record_key()  # custody check now, not on first run
        store = self.store
        if created and self.config.database_url == "sqlite":
            created.append(str(self.workspace.sqlite_path))
        del store
        return created

    @property
    def config(self) -> Config:
        if self._config is None:
            if not self.workspace.exists():
                raise UserError(
                    f"no saphan workspace at {self.workspace.home}; run `saphan init` "
                    "(or set SAPHAN_HOME)"
                )
            self._config = load_config(self.workspace.config_path)
        return self._config

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.config.database_url, self.workspace.sqlite_path)
        return self._store

    def close(self) -> None:
        for conn in self._ssh.values():
            conn.close()
        self._ssh.clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    def migrate(self) -> list[int]:
        return self.store.migrate()

    # -- machines and slots ----------------------------------------------------
    def add_machine(
        self,
        name: str,
        *,
        local: bool = False,
        ssh: str | None = None,
        identity: str | None = None,
    ) -> Machine:
        _check_name("machine", name)
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
            if self.store.get_machine(name) is not None:
                raise UserError(
                    f"machine {name!r} already exists; pick another name or "
                    f"`saphan machine remove {name}` first"
                )
            from saphan.transport.ssh import fetch_host_key

            host = m.group("host").strip("[]")
            # Pinned now, shown as a fingerprint; every later connection trusts
            # exactly this key and refuses any other (transport/ssh.py).
            key = fetch_host_key(name, host, port, timeout=self.config.ssh_connect_timeout)
            machine = Machine(
                name, "ssh", ssh_user=m.group("user"), ssh_host=host, ssh_port=port,
                identity_file=ident, host_key=key.line, created_at=now_iso(),
            )
        if not self.store.add_machine(machine):
            raise UserError(
                f"machine {name!r} already exists; pick another name or "
                f"`saphan machine remove {name}` first"
            )
        return machine

    def machine(self, name: str) -> Machine:
        m = self.store.get_machine(name)
        if m is None:
            raise UserError(f"no machine named {name!r}; see `saphan machine list`")
        return m

    def machines(self) -> list[Machine]:
        return self.store.list_machines()

    def machine_facts(self, name: str) -> dict[str, Any]:
        from saphan.records import verify_fact

        key = self.workspace.record_key()
        return {
            f.kind: {"value": verify_fact(key, f), "measured_at": f.measured_at}
            for f in self.store.list_facts(name)
        }

    def verified_fact(self, machine: str, kind: str) -> tuple[dict[str, Any], str] | None:
        """A machine fact and when it was measured, after its signature verifies."""
        from saphan.records import verify_fact

        fact = self.store.get_fact(machine, kind)
        if fact is None:
            return None
        return verify_fact(self.workspace.record_key(), fact), fact.measured_at

    def probe_confinement(self, name: str) -> dict[str, Any]:
        """Measure the machine's Landlock level with saphan-launcher and write
        it onto the machine's signed row. The only writer of that fact; there
        is no way to type a level in. On an SSH machine the delivered launcher
        measures, on that machine, over its pinned connection."""
        m = self.machine(name)
        if m.transport == "ssh":
            from saphan import remote

            delivered = self._delivered_launcher(name)
            out, err, code = remote.probe(self.ssh(m), delivered["path"])
            value = _probe_value(name, m.transport, out, err, code)
            _check_probed_launcher(name, value, delivered)
            return self._record_probe(name, value)
        import subprocess

        from saphan import launcher

        path = launcher.path()
        if path is None:
            raise UserError("saphan-launcher not found; run ci/setup (it builds and packages it)")
        done = subprocess.run([path, "probe"], capture_output=True, text=True, timeout=60,
                              check=False)
        return self._record_probe(
            name, _probe_value(name, m.transport, done.stdout, done.stderr, done.returncode)
        )

    def _record_probe(self, name: str, value: dict[str, Any]) -> dict[str, Any]:
        from saphan.confine.landlock_gate import FACT_KIND
        from saphan.records import sign_fact

        fact = sign_fact(self.workspace.record_key(), name, FACT_KIND, value, now_iso())
        self.store.put_fact(fact)
        return {"machine": name, "measured_at": fact.measured_at, **value}

    def _delivered_launcher(self, name: str) -> dict[str, Any]:
        from saphan.remote import FACT_KIND

        fact = self.verified_fact(name, FACT_KIND)
        if fact is None:
            raise UserError(
                f"no saphan-launcher has been delivered to {name}; deliver it first: "
                f"`saphan machine deliver {name}`"
            )
        return fact[0]

    # -- SSH machines ----------------------------------------------------------
    def ssh(self, m: Machine) -> SSHConnection:
        """The machine's connection, opened on first use and reused by every
        operation until :meth:`close`."""
        from saphan.transport.ssh import SSHConnection

        conn = self._ssh.get(m.name)
        if conn is None or conn.machine != m:
            conn = SSHConnection(
                m, connect_timeout=self.config.ssh_connect_timeout,
                command_timeout=self.config.ssh_command_timeout,
            )
            self._ssh[m.name] = conn
        conn.connect()
        return conn

    def remote_liveness(self, m: Machine) -> liveness.RemoteCheck | None:
        """Reads holders of runs on SSH machine ``m`` over its transport."""
        if m.transport != "ssh":
            return None
        from saphan import remote
        from saphan.errors import TransportError
        from saphan.liveness import Holder, Liveness

        tag = remote.holder_host(m)

        def check(holder: Holder) -> Liveness | None:
            if holder.host != tag:
                return None
            try:
                conn = self.ssh(m)
            except TransportError as e:
                return Liveness("unknown", str(e))
            return remote.holder_liveness(conn, holder)

        return check

    def deliver(
        self,
        names: Sequence[str],
        *,
        all_machines: bool = False,
        probe: bool = False,
        on_done: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Deliver saphan-launcher to SSH machines, in parallel (one thread and
        one connection per machine); with ``probe``, measure each machine's
        Landlock level with the launcher just installed. Every signed row is
        written here, on the calling thread. Returns one result per machine
        (``result``: installed / refused / error), in the order given."""
        import subprocess
        from concurrent.futures import ThreadPoolExecutor, as_completed

        from saphan import launcher, remote
        from saphan.errors import TransportError
        from saphan.records import sign_fact
        from saphan.transport.ssh import SSHConnection

        if all_machines == bool(names):
            raise UserError("name the machines to deliver to, or give --all (not both)")
        machines = ([x for x in self.machines() if x.transport == "ssh"] if all_machines
                    else [self.machine(n) for n in dict.fromkeys(names)])
        for x in machines:
            if x.transport != "ssh":
                raise UserError(
                    f"machine {x.name!r} is local: its launcher ships inside the saphan package; "
                    "deliver only to --ssh machines"
                )
        if not machines:
            raise UserError("there are no --ssh machines to deliver to; add one first")
        path = launcher.path()
        if path is None:
            raise UserError("saphan-launcher not found; run ci/setup (it builds and packages it)")
        from saphan import _native

        with open(path, "rb") as f:
            data = f.read()
        sha = _native.sha256_file(path)
        import hashlib

        if hashlib.sha256(data).hexdigest() != sha:
            raise UserError(f"{path} changed while it was read; deliver again")
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout.strip()
        key = self.workspace.record_key()
        previous: dict[str, str | None] = {}
        for x in machines:
            try:
                prev = self.verified_fact(x.name, remote.FACT_KIND)
            except Refusal:
                prev = None
            previous[x.name] = prev[0].get("sha256") if prev else None

        def work(x: Machine) -> dict[str, Any]:
            out: dict[str, Any] = {"machine": x.name, "address": x.address()}
            try:
                with SSHConnection(x, connect_timeout=self.config.ssh_connect_timeout,
                                   command_timeout=self.config.ssh_command_timeout) as conn:
                    got = remote.deliver(conn, data, sha256=sha, version=version,
                                         previous=previous[x.name])
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
                    fact = sign_fact(key, res["machine"], remote.FACT_KIND, value, now_iso())
                    self.store.put_fact(fact)
                    res["delivered_at"] = fact.measured_at
                raw = res.pop("probe_raw", None)
                if raw is not None:
                    try:
                        measured = _probe_value(res["machine"], "ssh", *raw)
                        _check_probed_launcher(res["machine"], measured, res)
                        res["probe"] = self._record_probe(res["machine"], measured)
                    except (UserError, Refusal) as e:
                        res["probe_error"] = str(e)
                results[res["machine"]] = res
                if on_done is not None:
                    on_done(res)
        return [results[x.name] for x in machines]

    def remove_machine(self, name: str) -> None:
        self.machine(name)
        live = [r for s in self.store.list_slots(name) for r in self.store.live_runs(name, s.name)]
        if live:
            raise UserError(
                f"machine {name!r} has {len(live)} live run(s) ({', '.join(r.id for r in live)}); "
                "let them finish or `saphan runs finalize ID` first"
            )
        self.store.remove_machine(name)

    def add_slot(
        self, machine: str, slot: str, *, tool: str, max_sessions: int | None = None,
        agent_sha256: str | None = None,
    ) -> Slot:
        from saphan.tools.binaries import check_pin_format

        _check_name("slot", slot)
        self.machine(machine)
        if tool not in TOOLS:
            raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
        if max_sessions is not None and max_sessions < 1:
            raise UserError(
                f"--max-sessions {max_sessions} is below 1; give N >= 1, or omit it for one seat"
            )
        if agent_sha256 is not None:
            check_pin_format(agent_sha256)
        s = Slot(machine, slot, tool, max_sessions, now_iso(), agent_sha256)
        if not self.store.add_slot(s):
            raise UserError(f"slot {slot!r} already exists on machine {machine!r}; pick another name")
        return s

    def slot(self, machine: str, slot: str) -> Slot:
        self.machine(machine)
        s = self.store.get_slot(machine, slot)
        if s is None:
            raise UserError(
                f"no slot {slot!r} on machine {machine!r}; see `saphan slot list` or "
                f"`saphan slot add {machine} {slot} --tool command`"
            )
        return s

    def slots(self, machine: str | None = None) -> list[Slot]:
        if machine is not None:
            self.machine(machine)
        return self.store.list_slots(machine)

    def set_max_sessions(self, machine: str, slot: str, max_sessions: int | None) -> Slot:
        """Lowering never evicts a live run; raising takes effect at once."""
        if max_sessions is not None and max_sessions < 1:
            raise UserError(f"--max-sessions {max_sessions} is below 1; give N >= 1")
        self.slot(machine, slot)
        self.store.set_max_sessions(machine, slot, max_sessions)
        return self.slot(machine, slot)

    def set_agent_pin(self, machine: str, slot: str, agent_sha256: str | None) -> Slot:
        """Pin the SHA-256 of the slot's agent binary (None: unpin). Checked before launch."""
        from saphan.tools.binaries import check_pin_format

        if agent_sha256 is not None:
            check_pin_format(agent_sha256)
        self.slot(machine, slot)
        self.store.set_agent_pin(machine, slot, agent_sha256)
        return self.slot(machine, slot)

    def holders(self, machine: str, slot: str) -> list[dict[str, Any]]:
        from saphan.capacity import holder_liveness

        self.slot(machine, slot)
        far = self.remote_liveness(self.machine(machine))
        out = []
        for run in self.store.live_runs(machine, slot):
            life = holder_liveness(run, far)
            out.append(
                {
                    "ordinal": run.session_ordinal,
                    "run": run.id,
                    "pid": run.holder_pid,
                    "host": run.holder_host,
                    "since": run.started_at,
                    "liveness": life.state,
                    "evidence": life.evidence,
                }
            )
        return out

    # -- lanes (the built-in loop's model endpoints; saphan.lanes) ---------------
    @property
    def lanes_path(self) -> Path:
        self.config  # noqa: B018 - a missing workspace is the error `saphan init` fixes
        from saphan import lanes

        return lanes.path(self.workspace.home)

    def add_lane(
        self, name: str, *, base_url: str, model: str, credential_file: str,
        credential_env: str = "OPENAI_API_KEY", timeout: int = 120,
    ) -> lanes_mod.Lane:
        """Declare a lane; its credential file's custody is checked now."""
        from saphan import lanes

        return lanes.add(self.lanes_path, lanes.Lane(
            name=name, base_url=base_url, model=model, credential_file=credential_file,
            credential_env=credential_env, timeout=timeout))

    def lanes(self) -> list[lanes_mod.Lane]:
        from saphan import lanes

        return list(lanes.load(self.lanes_path).values())

    def check_lanes(self, name: str | None = None) -> list[lanes_mod.Lane]:
        """Re-check the custody of every lane's credential file (or one lane's);
        raises the first :class:`Refusal`. Nothing is sent to any endpoint."""
        from saphan import lanes

        chosen = [lanes.get(self.lanes_path, name)] if name else self.lanes()
        for lane in chosen:
            lanes.read_credential(lane)
        return chosen

    def remove_lane(self, name: str) -> lanes_mod.Lane:
        from saphan import lanes

        return lanes.remove(self.lanes_path, name)

    # -- runs ------------------------------------------------------------------
    def runs(self, limit: int = 50) -> list[RunRecord]:
        """The newest runs, each verified against the record key: a record
        that does not verify is returned flagged (``RunRecord.signature``)."""
        rows = self.store.list_runs(limit)
        if not rows:
            return []  # no key read, no hashing: an empty list stays cheap
        key = self.workspace.record_key()
        return [RunRecord.from_row(r, key) for r in rows]

    def run_record(self, run_id: str) -> RunRecord:
        """One run's record (id, unique prefix or "last"), verified against the
        record key; check ``.signature`` ("valid" / "invalid" / "missing" / "pending")."""
        row = self._find_run(run_id)
        return RunRecord.from_row(row, self.workspace.record_key())

    def signed_record_json(self, record: dict[str, Any]) -> str:
        """``record`` signed with the workspace record key, as the store keeps it.

        Every writer of a run's record_json goes through here. Should the key
        fail its custody check (a run checks it before it starts, so only a
        key changed mid-run), the record is still written — the row must be
        finished — unsigned, with a note naming why: it reads back flagged
        "missing", never as valid.
        """
        from saphan.records import signed_record_json

        try:
            return signed_record_json(self.workspace.record_key(), record)
        except Refusal as e:
            record["notes"] = [*(record.get("notes") or []),
                               f"this record is not signed: the record key failed its custody "
                               f"check when it was written ({e.message})"]
            record.pop("record_signature", None)
            return json.dumps(record, sort_keys=True)

    def _find_run(self, run_id: str) -> RunRow:
        if run_id == "last":
            row = self.store.last_run()
            if row is None:
                raise UserError("there are no runs yet")
            return row
        row = self.store.get_run(run_id)
        if row is not None:
            return row
        found = self.store.find_runs(run_id.upper())
        if len(found) == 1:
            return found[0]
        if not found:
            raise UserError(f"no run {run_id!r}; see `saphan runs list`")
        raise UserError(f"run id prefix {run_id!r} is ambiguous; give more characters")

    def finalize(self, run_id: str, *, reason: str = "operator") -> RunRecord:
        """Operator escape hatch: end a live run's row, recorded as such."""
        row = self._find_run(run_id)
        if not row.live:
            raise UserError(f"run {row.id} already finished at {row.finished_at}")
        from saphan.records import finalised_record_json

        now = now_iso()
        record_json = finalised_record_json(
            self.workspace.record_key(), row, outcome="finalized-by-operator", finished_at=now,
            note=f"finalised by `saphan runs finalize` at {now} (uid {os.getuid()}): {reason}",
        )
        self.store.finalize(
            row.id, state="ended", outcome="finalized-by-operator", record_json=record_json,
            finished_at=now,
        )
        return self.run_record(row.id)

    def run(
        self,
        machine: str,
        slot: str,
        argv: Sequence[str],
        *,
        workdir: str | os.PathLike[str] | None = None,
        stream: bool = True,
        boundary: str | None = None,
        repo: str | os.PathLike[str] | None = None,
        base_ref: str | None = None,
        keep_worktree: bool = True,
        request: AgentRequest | None = None,
    ) -> RunRecord:
        """Cast, reserve, compose, dispatch, record. Returns the finished record.

        Raises :class:`Refusal` (recorded on the run's row) when the run
        cannot be given its boundary, and :class:`UserError` on bad input
        (nothing written). ``boundary`` chooses the mechanism on a local
        machine: None for the platform's own (bubblewrap / Seatbelt), or
        "landlock" for saphan-launcher behind the Landlock gate. ``repo``
        runs in a new linked worktree of that repository on branch
        ``saphan/<run-id>`` (from ``base_ref``, default HEAD), kept afterwards
        unless ``keep_worktree`` is False. ``request`` is the task for an
        agent slot (claude, codex, loop): prompt, model, permission class,
        resume; for a loop slot the lane and the turn/time budgets.
        """
        from saphan.dispatch import execute_local

        command = list(argv)
        if not command and request is None:
            raise UserError("nothing to run: give the command after `--`")
        from saphan.liveness import current_holder

        config = self.config
        holder = current_holder()
        run_id = new_run_id()
        if repo is not None and workdir is not None:
            raise UserError("give --repo or --workdir, not both (--repo makes the working directory)")
        if repo is None and base_ref is not None:
            raise UserError("--base needs --repo")
        if repo is not None:
            wd = str(self.workspace.home / "worktrees" / run_id)
        else:
            wd = os.path.abspath(workdir if workdir is not None else os.getcwd())
        base: dict[str, Any] = {
            "id": run_id, "machine": machine, "slot": slot, "argv": command, "workdir": wd,
            "saphan_version": __version__, "requested_at": now_iso(),
        }
        # run.confinement is checked before any other branch of any run.
        try:
            mode = confinement_mode(config)
        except Refusal as refusal:
            self._record_refused(base, "unknown", holder, refusal)
            raise
        s = self.slot(machine, slot)  # cast: the named slot (UserError if unknown)
        m = self.machine(machine)
        base["tool"] = s.tool
        base["confinement_setting"] = mode
        try:
            # Custody now: a run whose record could not be signed does not start.
            self.workspace.record_key()
        except Refusal as refusal:
            self._record_refused(base, s.tool, holder, refusal)
            raise
        if s.tool not in DISPATCHABLE:
            raise UserError(
                f"slot {slot!r} runs tool {s.tool!r}, which this build of saphan cannot dispatch "
                f"yet (it dispatches: {', '.join(DISPATCHABLE)}); use a --tool command slot"
            )
        if boundary not in (None, "landlock"):
            raise UserError(f"--boundary {boundary!r} is unknown; omit it or use `landlock`")
        _check_request_fits(s, m, command, request, boundary)
        if m.transport == "ssh":
            from saphan.dispatch_remote import run_remote

            if request is not None and request.permission_class is not None:
                _check_command_class(request.permission_class, command[0])
            return run_remote(self, s, m, base, command, workdir=workdir, repo=repo,
                              holder=holder, boundary=boundary, stream=stream)
        from saphan import worktrees

        spec = worktrees.resolve_repo(os.fspath(repo), base_ref) if repo is not None else None
        if spec is None and not os.path.isdir(wd):
            missing = Refusal(
                "workdir-missing",
                f"the working directory {wd} does not exist on {machine}",
                f"create it (`mkdir -p {wd}`) or pass an existing --workdir",
            )
            self._record_refused(base, s.tool, holder, missing)
            raise missing
        self._check_workdir_apart(wd)
        if request is not None and s.tool in AGENT_TOOLS:
            return self._run_agent(s, base, wd, holder, request, mode, stream=stream,
                                   boundary=boundary, spec=spec, keep_worktree=keep_worktree)
        command_class = None
        if request is not None and request.permission_class is not None:
            command_class = _check_command_class(request.permission_class, command[0])
        resolved = shutil.which(command[0], path=os.environ.get("PATH"))
        if resolved is None:
            raise UserError(f"command {command[0]!r} not found on PATH; give its absolute path")
        from saphan import _native

        command[0] = os.path.abspath(resolved)
        base["agent"] = {"path": command[0], "sha256": _native.sha256_file(command[0])}
        base["argv"] = command
        from saphan.capacity import reserve_seat

        try:
            ordinal = reserve_seat(
                self.store, s, run_id=run_id, tool=s.tool, workdir=wd, holder=holder,
                record_key=self.workspace.record_key,
            )
        except Refusal as refusal:
            self._record_refused(base, s.tool, holder, refusal)
            raise
        base["session_ordinal"] = ordinal
        return execute_local(
            self, s, base, command, wd, stream=stream, boundary_choice=boundary,
            agent_sha256=base["agent"]["sha256"], repo=spec, keep_worktree=keep_worktree,
            command_class=command_class,
        )

    def _run_agent(
        self, s: Slot, base: dict[str, Any], wd: str, holder: liveness.Holder,
        request: AgentRequest, mode: str, *, stream: bool, boundary: str | None,
        spec: worktrees.RepoSpec | None, keep_worktree: bool,
    ) -> RunRecord:
        """An agent slot: the adapter composes the command line (tools/)."""
        from saphan.capacity import reserve_seat
        from saphan.dispatch import execute_local
        from saphan.tools.launch import prepare

        try:
            adapter = prepare(self, s.tool, request, workdir=wd, run_id=base["id"],
                              confinement=mode, run_dir=self.workspace.run_dir(base["id"]))
        except Refusal as refusal:
            self._record_refused(base, s.tool, holder, refusal)
            raise
        base["agent"] = adapter.binary.as_record()
        try:
            ordinal = reserve_seat(
                self.store, s, run_id=base["id"], tool=s.tool, workdir=wd, holder=holder,
                record_key=self.workspace.record_key,
            )
        except Refusal as refusal:
            self._record_refused(base, s.tool, holder, refusal)
            raise
        base["session_ordinal"] = ordinal
        return execute_local(
            self, s, base, [], wd, stream=stream, boundary_choice=boundary,
            agent_sha256=adapter.binary.sha256, repo=spec, keep_worktree=keep_worktree,
            adapter=adapter,
        )

    def _check_workdir_apart(self, wd: str) -> None:
        """A run's writable tree must not hold the workspace (store, key, records).

        Were it so, the run could rewrite saphan's own database and records;
        the boundary would still hold, but it would guard the wrong things.
        """
        from saphan.workspace import register_workspace, registered_workspaces

        real_wd = os.path.realpath(wd)
        home = os.path.realpath(self.workspace.home)
        register_workspace(self.workspace.home)  # workspaces made before the registry
        for other in (os.path.realpath(os.path.expanduser("~/.saphan")), *registered_workspaces()):
            if other != home and _within(real_wd, other):
                raise UserError(
                    f"the working directory {real_wd} lies inside the saphan workspace {other}; "
                    "a run there could read its key and rewrite its store and records: use a "
                    "directory outside it")
        # Per-run worktrees live in $SAPHAN_HOME/worktrees/, apart from the store.
        if _within(real_wd, os.path.join(home, "worktrees")) and real_wd != os.path.join(
            home, "worktrees"
        ):
            return
        if _within(home, real_wd) or _within(real_wd, home):
            raise UserError(
                f"the working directory {real_wd} overlaps the saphan workspace {home}; a run "
                "there could rewrite saphan's own store and records: use a directory outside it"
            )

    def _record_refused(
        self, base: dict[str, Any], tool: str, holder: liveness.Holder, refusal: Refusal
    ) -> None:
        # Every column the row will carry is in the signed record (records.py
        # holds them against each other when the record is read).
        record = {
            **base, "tool": tool, "state": "refused", "outcome": "refused", "exit_code": None,
            "session_ordinal": None, "refusal": refusal.as_dict(), "enforced_by": None,
            "finished_at": now_iso(),
        }
        self.store.insert_refused_run(
            run_id=base["id"], machine=base["machine"], slot=base["slot"], tool=tool,
            workdir=base.get("workdir"), holder=holder.as_tuple(),
            refusal_class=refusal.cls, record_json=self.signed_record_json(record),
            at=record["finished_at"],
        )
        refusal.run_id = base["id"]

    def write_record_file(self, record: dict[str, Any]) -> Path:
        """runs/<id>/record.json, signed like the store's copy (the same
        ``record_signature`` when it is the same record; unsigned, as in
        :meth:`signed_record_json`, only if the key fails its custody check)."""
        run_dir = self.workspace.run_dir(record["id"])
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "record.json"
        tmp = path.with_suffix(".json.tmp")
        signed = json.loads(self.signed_record_json(dict(record)))
        tmp.write_text(json.dumps(signed, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path


def _check_request_fits(
    s: Slot, m: Machine, command: list[str], request: AgentRequest | None, boundary: str | None
) -> None:
    """An agent slot takes a task, never a command line; a command slot the reverse."""
    loop_flags = [] if request is None else [
        flag for flag, value in (("--lane", request.lane), ("--max-turns", request.max_turns),
                                 ("--max-seconds", request.max_seconds)) if value is not None]
    if s.tool in AGENT_TOOLS:
        if command:
            raise UserError(
                f"slot {s.name!r} runs {s.tool}, whose command line saphan composes: give the "
                "task with --prompt TEXT or --prompt-file FILE, not a command after `--`"
            )
        if request is None:
            raise UserError(f"slot {s.name!r} runs {s.tool}: give the task with --prompt TEXT "
                            "or --prompt-file FILE")
        if m.transport == "ssh":
            raise UserError(f"{s.tool} runs on --local machines in this build; machine "
                            f"{m.name!r} is reached over SSH")
        if s.tool == "codex" and boundary is not None:
            raise UserError("Codex confines itself (the engine's boundary cannot nest around "
                            "its sandbox); drop --boundary for a codex slot")
        if s.tool == "loop":
            if request.model is not None:
                raise UserError("a loop slot runs the model its lane names; drop --model "
                                "(see `saphan lane list`, or choose another lane with --lane)")
            if request.resume is not None:
                raise UserError("the built-in loop keeps no sessions, so there is nothing to "
                                "--resume; start a new run with the task")
            for flag, value in (("--max-turns", request.max_turns),
                                ("--max-seconds", request.max_seconds)):
                if value is not None and value < 1:
                    raise UserError(f"{flag} {value} is below 1")
        elif loop_flags:
            raise UserError(f"{', '.join(loop_flags)}: only for loop slots; slot {s.name!r} "
                            f"runs {s.tool}")
        return
    if request is not None and (request.prompt is not None or request.prompt_file is not None
                                or request.model is not None or request.resume is not None
                                or loop_flags):
        raise UserError(f"slot {s.name!r} runs tool {s.tool!r}: --prompt, --prompt-file, "
                        "--model, --resume, --lane and --max-* are for agent slots "
                        "(claude, codex, loop)")
    if not command:
        raise UserError("nothing to run: give the command after `--`")


def _check_command_class(path: str, argv0: str) -> permission_class.PermissionClass:
    """A command slot's permission class: the command's base name, exact token."""
    from saphan.tools import permission_class

    pc = permission_class.load(path)
    if not pc.allows(argv0):
        raise UserError(
            f"permission class {pc.source} allows the commands "
            f"{', '.join(pc.commands) or '(none)'} (exact base name); "
            f"{os.path.basename(argv0)!r} is not one of them"
        )
    return pc


def _probe_value(name: str, transport: str, stdout: str, stderr: str, code: int) -> dict[str, Any]:
    """The Landlock row's value from the launcher's ``probe`` JSON line — the
    same shape whether the launcher ran here or on a far machine."""
    try:
        measured = json.loads(stdout.strip().splitlines()[-1])
        return {
            "level": int(measured["landlock_abi"]),
            "reason": str(measured["landlock_reason"]),
            "kernel_release": str(measured["kernel_release"]),
            "launcher_version": str(measured["launcher_version"]),
            "launcher_sha256": str(measured["launcher_sha256"]),
            "floor": int(measured["floor"]),
            "highest_known": int(measured["highest_known"]),
            "transport": transport,
        }
    except (ValueError, KeyError, IndexError, TypeError):
        raise UserError(
            f"the launcher's probe on {name} did not answer with its JSON line "
            f"(exit {code}): {(stderr or stdout).strip()[:300]}"
        ) from None


def _check_probed_launcher(name: str, value: dict[str, Any], delivered: dict[str, Any]) -> None:
    """The launcher that measured must be the one delivered."""
    if value["launcher_sha256"] != delivered["sha256"]:
        raise Refusal(
            "digest-mismatch",
            f"the launcher that probed {name} reports sha256 {value['launcher_sha256']}, but "
            f"sha256 {delivered['sha256']} was delivered to {delivered['path']}; no level was "
            "recorded",
            f"deliver it again: `saphan machine deliver {name} --probe`",
        )
