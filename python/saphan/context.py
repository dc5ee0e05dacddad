"""What every step of a run and every operator verb works against: the
workspace, its configuration, the store, signed facts and connections.

Handed down to the lower modules (run/, fleet/, dispatch, tools/) — never
the Engine itself, which is only the facade over them (engine.py). Opening
the store or reading the configuration happens on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.workspace import Workspace

if TYPE_CHECKING:
    from saphan import liveness
    from saphan.config import Config
    from saphan.records import RunRecord
    from saphan.store import Store
    from saphan.store.rows import Machine, RunRow, Slot
    from saphan.transport.ssh import SSHConnection


class Context:
    def __init__(self, workspace: Workspace,
                 on_open: Callable[[Context], object] | None = None):
        self.workspace = workspace
        self._config: Config | None = None
        self._store: Store | None = None
        self._ssh: dict[str, SSHConnection] = {}
        #: called once, when the store is first opened (the Engine passes
        #: run/live.reconcile: what the store missed is finished then)
        self.on_open = on_open
        #: the verb this context serves (``saphan runs list``), for the notes
        #: it writes; None under the Python API
        self.verb: str | None = None

    # -- workspace, configuration, store ---------------------------------------
    @property
    def config(self) -> Config:
        if self._config is None:
            from saphan.config import load

            if not self.workspace.exists():
                raise UserError(
                    f"no saphan workspace at {self.workspace.home}; run `saphan init` "
                    "(or set SAPHAN_HOME)"
                )
            self._config = load(self.workspace.config_path)
        return self._config

    @property
    def store(self) -> Store:
        if self._store is None:
            from saphan.store import open_store

            self._store = store = open_store(self.config.database_url,
                                             self.workspace.sqlite_path)
            hook, self.on_open = self.on_open, None
            if hook is not None:
                hook(self)
            return store
        return self._store

    def record_key(self) -> bytes:
        return self.workspace.record_key()

    def close(self) -> None:
        for conn in self._ssh.values():
            conn.close()
        self._ssh.clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def lanes_path(self) -> Path:
        self.config  # noqa: B018 - a missing workspace is the error `saphan init` fixes
        from saphan import lanes

        return lanes.path(self.workspace.home)

    # -- machines, slots, signed facts ------------------------------------------
    def machine(self, name: str) -> Machine:
        m = self.store.get_machine(name)
        if m is None:
            raise UserError(f"no machine named {name!r}; see `saphan machine list`")
        return m

    def machines(self) -> list[Machine]:
        return self.store.list_machines()

    def slot(self, machine: str, slot: str) -> Slot:
        self.machine(machine)
        s = self.store.get_slot(machine, slot)
        if s is None:
            raise UserError(
                f"no slot {slot!r} on machine {machine!r}; see `saphan slot list` or "
                f"`saphan slot add {machine} {slot} --tool command`"
            )
        return s

    def verified_fact(self, machine: str, kind: str) -> tuple[dict[str, Any], str] | None:
        """A machine fact and when it was measured, after its signature, its
        binding to the machine and its freshness verify (fleet/facts.py)."""
        from saphan.fleet import facts

        return facts.read(self.store, self.record_key(), self.workspace.home,
                          self.machine(machine), kind)

    # -- SSH machines ------------------------------------------------------------
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
        from saphan.errors import TransportError
        from saphan.liveness import Holder, Liveness
        from saphan.site import far as remote

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

    def holder_liveness(self, row: RunRow) -> liveness.Liveness | None:
        """A live row's holder, judged where it runs (None: no holder recorded)."""
        from saphan.liveness import Holder, check

        if row.holder_host is None or row.holder_pid is None:
            return None
        holder = Holder(row.holder_host, row.holder_pid, row.holder_start_ticks,
                        row.holder_boot_id)
        try:
            m = self.machine(row.machine)
        except UserError:
            return check(holder)
        return check(holder, self.remote_liveness(m))

    # -- runs ----------------------------------------------------------------------
    def find_run(self, run_id: str) -> RunRow:
        """A run's row by id, unique prefix or "last"."""
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

    def run_record(self, run_id: str) -> RunRecord:
        """One run's record, verified against the record key."""
        from saphan.records import RunRecord

        return RunRecord.from_row(self.find_run(run_id), self.record_key())
