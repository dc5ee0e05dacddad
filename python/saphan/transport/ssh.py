"""Reach a machine over SSH (paramiko), with its host key pinned.

One :class:`SSHConnection` per machine, opened on first use and reused by
every operation of a command (delivery, probe, preflight dial, the run,
liveness reads); :meth:`SSHConnection.close` ends it.

Host keys: the key is fetched once, at ``saphan machine add --ssh``, shown as
its SHA-256 fingerprint and stored on the machine's row. Every later
connection trusts exactly that key: an unknown key (nothing pinned) or a
changed key is refused before authentication, never accepted — no
known_hosts file is read and no key is ever added automatically.

Errors: whatever paramiko or the socket layer raises is translated HERE,
once, into :class:`saphan.errors.TransportError`, whose message names the
machine, its address and the cause. Nothing above this module sees a
paramiko exception.

paramiko is imported inside the functions that need it, so that
``saphan --help`` and every local verb never load it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import select
import shlex
import socket
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.errors import Interrupted, TransportError
from saphan.store.rows import Machine
from saphan.transport.local import Finished
from saphan.transport.streams import Sink, catching, launching, tee

if TYPE_CHECKING:
    import paramiko

#: seconds to open the TCP connection and finish the SSH handshake
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds any one non-streaming command may take (a run has no such limit)
DEFAULT_COMMAND_TIMEOUT = 120.0
#: after Ctrl-C/SIGTERM: how long to wait for the far process to exit once
#: its lifeline was cut, before the channel is closed regardless
INTERRUPT_GRACE = 10.0


@dataclass(frozen=True)
class HostKey:
    """A server's public host key as pinned: ``"<type> <base64>"``."""

    line: str

    @property
    def type(self) -> str:
        return self.line.split(" ", 1)[0]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.line)


def fingerprint(key_line: str) -> str:
    """OpenSSH's SHA256 fingerprint of a ``"<type> <base64>"`` key line."""
    blob = base64.b64decode(key_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


#: where every far script's own tools come from (sh())
FAR_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: what every far script starts with: the far user's shell start-up files
#: (bash reads ~/.bashrc for an ssh command) may have put anything on PATH —
#: a relative entry, a directory a run can write — and a preload; the
#: script's own tools come from the system's directories only. The far
#: user's PATH is kept in UP (not exported) for what needs it: resolving a
#: command slot's argv[0], and the PATH a run keeps (its relative entries
#: dropped: site/ssh.run_script).
_PROLOGUE = ("UP=${PATH:-}; PATH=" + FAR_SYSTEM_PATH + "; export PATH; "
             "unset LD_PRELOAD LD_LIBRARY_PATH LD_AUDIT CDPATH\n")


def sh(script: str) -> str:
    """The command string that runs ``script`` under /bin/sh on the far side,
    whatever the far user's login shell quotes differently, after
    :data:`_PROLOGUE`."""
    return "/bin/sh -c " + shlex.quote(_PROLOGUE + script)


def _paramiko() -> Any:
    """paramiko, imported on first use; its transport thread's log records
    are dropped (every failure reaches the caller as a TransportError here,
    instead of as a traceback on the operator's terminal)."""
    import logging

    import paramiko

    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False
    return paramiko


def _hostkey_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _describe(e: BaseException) -> str:
    """One line of cause, from a paramiko or socket exception."""
    paramiko = _paramiko()
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        errs = {str(getattr(err, "strerror", None) or err).strip() for err in e.errors.values()}
        return "connection failed: " + "; ".join(sorted(errs))
    if isinstance(e, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is sshd listening on that port?)"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip()
    return text or type(e).__name__


def fetch_host_key(name: str, host: str, port: int, *, timeout: float,
                   via: Jump | None = None) -> HostKey:
    """The key the server presents now (to be pinned at ``machine add``).

    Only the key exchange runs; nothing is authenticated and nothing is
    trusted here — the caller shows the fingerprint to the operator (and
    holds it against ``--expect-fingerprint`` / ``--known-hosts``). ``via``:
    reach it through that jump host (whose own key is pinned already).
    """
    paramiko = _paramiko()

    where = f"{host}:{port}"
    jump_client = None
    try:
        if via is not None:
            jump_client = via.connect(timeout=timeout)
            sock: Any = _jump_channel(jump_client, host, port, timeout=timeout)
        else:
            sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise TransportError(
            name, f"machine {name} ({where}) is unreachable: {_describe(e)}"
        ) from None
    except paramiko.SSHException as e:
        raise TransportError(
            name, f"machine {name} ({where}) is unreachable through {via}: {_describe(e)}"
        ) from None
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return HostKey(f"{key.get_name()} {key.get_base64()}")
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise TransportError(
            name, f"machine {name} ({where}): the SSH handshake failed: {_describe(e)}"
        ) from None
    finally:
        transport.close()
        sock.close()
        if jump_client is not None:
            jump_client.close()


@dataclass(frozen=True)
class Jump:
    """A jump host (ProxyJump), with its own pinned key: ``user@host:port``
    and the ``"<type> <base64>"`` line, as the machine's row stores them."""

    user: str
    host: str
    port: int
    host_key: str
    identity_file: str | None = None
    agent: bool = False

    @classmethod
    def parse(cls, text: str, *, identity_file: str | None, agent: bool) -> Jump:
        target, _, key = text.partition(" ")
        user, _, hostport = target.rpartition("@")
        host, _, port = hostport.rpartition(":")
        return cls(user, host.strip("[]"), int(port), key.strip(), identity_file, agent)

    def row(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{self.port} {self.host_key}"

    def __str__(self) -> str:
        return f"jump host {self.user}@{self.host}:{self.port}"

    def connect(self, *, timeout: float, passphrase: str | None = None) -> Any:
        """An authenticated client to the jump host, trusting exactly its pinned key."""
        return _client(self.host, self.port, self.user, self.host_key, self.identity_file,
                       self.agent, timeout=timeout, passphrase=passphrase)


def _jump_channel(jump_client: Any, host: str, port: int, *, timeout: float) -> Any:
    t = jump_client.get_transport()
    return t.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)


class _IdentityUnusable(Exception):
    """The identity file cannot be read or is not a private key."""


def _load_identity(paramiko: Any, path: str, passphrase: str | None) -> Any:
    try:
        secret = passphrase.encode() if passphrase is not None else None
        return paramiko.PKey.from_path(path, secret)
    except paramiko.PasswordRequiredException:
        raise
    except OSError as e:
        raise _IdentityUnusable(f"it cannot be read ({e.strerror or e})") from None
    except TypeError as e:  # cryptography's word for an encrypted OpenSSH-format key
        if "password" in str(e).lower():
            raise paramiko.PasswordRequiredException(str(e)) from None
        raise _IdentityUnusable(f"it is not a private key saphan can use ({e})") from None
    except (paramiko.SSHException, ValueError) as e:
        if passphrase is not None:
            raise paramiko.PasswordRequiredException(f"the passphrase does not open it ({e})") \
                from None
        raise _IdentityUnusable(f"it is not a private key saphan can use ({e})") from None


def _client(host: str, port: int, user: str, host_key: str, identity: str | None,
            agent: bool, *, timeout: float, sock: Any = None,
            passphrase: str | None = None) -> Any:
    """An authenticated paramiko client trusting exactly ``host_key``; its
    exceptions are left to the caller (who names the machine)."""
    paramiko = _paramiko()
    pinned = HostKey(host_key)
    client = paramiko.SSHClient()
    # Only the pinned key: no system or user known_hosts is loaded, and
    # an absent key is rejected by the policy rather than added.
    client.set_missing_host_key_policy(_reject_unpinned())
    key = paramiko.PKey.from_type_string(pinned.type, base64.b64decode(pinned.line.split()[1]))
    client.get_host_keys().add(_hostkey_name(host, port), pinned.type, key)
    try:
        # The identity is loaded here, once: an encrypted one raises
        # PasswordRequiredException, an unreadable one names itself (handing
        # paramiko the file name would surface its last key-type guess instead).
        pkey = _load_identity(paramiko, identity, passphrase) if identity else None
        client.connect(
            host, port=port, username=user, pkey=pkey, timeout=timeout,
            banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            allow_agent=agent, look_for_keys=False, sock=sock,
        )
    except BaseException:
        client.close()
        raise
    return client


@dataclass(frozen=True)
class Completed:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace").strip()


class SSHConnection:
    """One authenticated SSH connection to one machine, opened lazily."""

    def __init__(
        self,
        machine: Machine,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ):
        if machine.transport != "ssh" or not machine.ssh_host or not machine.ssh_user:
            raise ValueError(f"machine {machine.name} is not an SSH machine")
        self.machine = machine
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None
        self._passphrase: str | None = None

    @property
    def name(self) -> str:
        return self.machine.name

    @property
    def where(self) -> str:
        m = self.machine
        host = f"[{m.ssh_host}]" if m.ssh_host and ":" in m.ssh_host else m.ssh_host
        return f"{m.ssh_user}@{host}:{m.ssh_port or 22}"

    def _fail(self, what: str) -> TransportError:
        return TransportError(self.name, f"machine {self.name} ({self.where}): {what}")

    # -- connecting ------------------------------------------------------------
    def connect(self) -> None:
        if self._client is not None and self._alive():
            return
        self.close()
        paramiko = _paramiko()
        m = self.machine
        if m.ssh_host is None:
            raise self._fail("it has no SSH address")
        port = m.ssh_port or 22
        if not m.host_key:
            raise self._fail(
                "no host key is pinned for it, and an unpinned key is never accepted; "
                f"re-register it: `saphan machine remove {m.name}` then `saphan machine add "
                f"{m.name} --ssh {m.ssh_user}@{m.ssh_host}:{port} --identity FILE`"
            )
        pinned = HostKey(m.host_key)
        try:
            _ = pinned.fingerprint
        except (ValueError, IndexError) as e:
            raise self._fail(f"the pinned host key cannot be read ({e}); re-add the machine") \
                from None
        jump = (Jump.parse(m.proxy_jump, identity_file=m.identity_file, agent=m.ssh_agent)
                if m.proxy_jump else None)
        while True:
            try:
                self._connect_once(m, port, jump)
                return
            except paramiko.PasswordRequiredException:
                self._passphrase = self._ask_passphrase(m)
            except paramiko.BadHostKeyException as e:
                shown = fingerprint(e.key.get_name() + " " + e.key.get_base64())
                raise refusals.host_key_mismatch(
                    f"machine {m.name} ({self.where}): {e.hostname} presents host key "
                    f"{e.key.get_name()} {shown}, but {self._pinned_for(e.hostname, jump)} was "
                    "pinned at `saphan machine add`: this may be a different machine or an "
                    "interception; nothing was sent to it",
                    "confirm the new fingerprint with the machine's owner out of band, then "
                    f"`saphan machine remove {m.name}` and `saphan machine add {m.name} --ssh "
                    "… --expect-fingerprint SHA256:…`",
                ) from None
            except paramiko.AuthenticationException as e:
                how = ("the ssh-agent's keys" if m.ssh_agent and not m.identity_file
                       else f"identity {m.identity_file}"
                       + (" and the ssh-agent" if m.ssh_agent else ""))
                raise self._fail(
                    f"authentication failed for user {m.ssh_user} with {how} ({_describe(e)}); "
                    "check the public key is in that user's authorized_keys"
                ) from None
            except _IdentityUnusable as e:
                raise self._fail(f"the identity file {m.identity_file}: {e}") from None
            except paramiko.SSHException as e:
                if "no authentication methods" not in str(e).lower():
                    raise self._fail(f"unreachable: {_describe(e)}") from None
                raise self._fail(
                    f"authentication failed for user {m.ssh_user}: saphan had no key to offer "
                    "(no identity file, and the ssh-agent offered none — is SSH_AUTH_SOCK set "
                    "to an agent holding the key?)") from None
            except (OSError, EOFError) as e:
                raise self._fail(f"unreachable: {_describe(e)}") from None

    def _connect_once(self, m: Machine, port: int, jump: Jump | None) -> None:
        if m.ssh_host is None or m.ssh_user is None or m.host_key is None:
            raise self._fail("its SSH address is incomplete; re-add the machine")
        sock = None
        jump_client = None
        if jump is not None:
            jump_client = jump.connect(timeout=self.connect_timeout, passphrase=self._passphrase)
            sock = _jump_channel(jump_client, m.ssh_host, port, timeout=self.connect_timeout)
        try:
            client = _client(m.ssh_host, port, m.ssh_user, m.host_key, m.identity_file,
                             m.ssh_agent, timeout=self.connect_timeout, sock=sock,
                             passphrase=self._passphrase)
        except BaseException:
            if jump_client is not None:
                jump_client.close()
            raise
        _keep_alive(client)
        self._client = client
        self._jump_client = jump_client

    def _pinned_for(self, at: str, jump: Jump | None) -> str:
        """The pinned key that ``at`` (paramiko's name of the host that
        answered) was held against: the jump host's or the machine's."""
        host = self.machine.ssh_host or ""
        if jump is not None and jump.host in at and host not in at:
            return f"{HostKey(jump.host_key).fingerprint} (the {jump})"
        return HostKey(self.machine.host_key or "").fingerprint

    def _ask_passphrase(self, m: Machine) -> str:
        """An encrypted identity: asked for on a terminal, never stored."""
        if self._passphrase is not None or not (sys.stdin.isatty() and sys.stderr.isatty()):
            why = ("the passphrase given was wrong" if self._passphrase is not None else
                   "there is no terminal to ask for its passphrase on")
            raise self._fail(
                f"the identity file {m.identity_file} is encrypted and {why}; use a key "
                "without a passphrase dedicated to saphan, or load it into your ssh-agent and "
                f"re-add the machine with --ssh-agent"
            )
        import getpass

        return getpass.getpass(f"passphrase for {m.identity_file} (machine {m.name}): ")

    def _alive(self) -> bool:
        t = self._client.get_transport() if self._client is not None else None
        return t is not None and t.is_active()

    def _transport(self) -> paramiko.Transport:
        self.connect()
        assert self._client is not None
        t = self._client.get_transport()
        if t is None or not t.is_active():
            raise self._fail("the connection was lost")
        return t

    def close(self) -> None:
        for client in (self._client, self._jump_client):
            if client is not None:
                with suppress(Exception):
                    client.close()
        self._client = self._jump_client = None

    def __enter__(self) -> SSHConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- one command, collected --------------------------------------------------
    def run(self, script: str, *, stdin: bytes | None = None,
            timeout: float | None = None) -> Completed:
        """Run ``script`` under /bin/sh on the far side and collect its output.

        ``stdin`` (if given) is sent and then closed. The whole command must
        finish within ``timeout`` (default: the connection's command timeout).
        """
        paramiko = _paramiko()

        limit = self.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            chan = self._transport().open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._fail(f"cannot open a channel: {_describe(e)}") from None
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.settimeout(max(0.1, deadline - time.monotonic()))
            chan.exec_command(sh(script))
            if stdin is not None:
                view = memoryview(stdin)
                while view:
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    sent = chan.send(bytes(view[:32768]))
                    if sent == 0:
                        break
                    view = view[sent:]
            chan.shutdown_write()
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError
                _drain(chan, out, err)
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    _drain(chan, out, err)
                    break
                select.select([chan], [], [], min(0.5, max(0.0, deadline - time.monotonic())))
            code = chan.recv_exit_status()
        except TimeoutError:
            raise self._fail(
                f"a command did not finish within {limit:g} s; the channel was closed"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._fail(f"the connection failed during a command: {_describe(e)}") from None
        finally:
            chan.close()
        return Completed(code, b"".join(out), b"".join(err))

    # -- one command, streamed (a run) -------------------------------------------
    def stream(
        self,
        script: str,
        *,
        run_dir: str,
        stream: bool = True,
        on_stderr_line: Callable[[bytes], bool] | None = None,
        on_started: Callable[[], None] | None = None,
        stdin: bytes | None = None,
        time_limit: float | None = None,
        term_out: Sink | None = None,
        term_err: Sink | None = None,
    ) -> Finished:
        """Run ``script``, writing its output to ``stdout.log``/``stderr.log``
        in ``run_dir`` (and this terminal when ``stream``) as it arrives.

        The channel's stdin is the far side's lifeline: on Ctrl-C/SIGTERM
        here (or when ``on_started`` fails) :data:`STOP` is written to it and
        it is closed, which the far script answers by hanging up the run. A
        lifeline that merely ends (this process died, the connection was
        lost) stops nothing there: the run goes on, its holder keeps the seat.
        ``on_started`` is called once, right after the command started (the
        site reads the far holder over another channel). ``on_stderr_line``
        sees each complete stderr line and returns False to keep it off the
        terminal (it still goes to the log); it is never asked to interpret
        it. ``stdin``: bytes written first on the channel (the launcher's
        frame, site/far.frame), before the lifeline. ``time_limit``: seconds
        after which the run is hung up as on Ctrl-C (``killed_at_limit``);
        none: a run takes what it takes. A channel that closes without an
        exit status is a lost connection (TransportError), never an exit
        code.
        """
        paramiko = _paramiko()

        out_path = os.path.join(run_dir, "stdout.log")
        err_path = os.path.join(run_dir, "stderr.log")
        try:
            chan = self._transport().open_session(timeout=self.connect_timeout)
            launching()  # a signal before this: the far command is not started
            chan.exec_command(sh(script))
            if stdin is not None:
                chan.sendall(stdin)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._fail(f"cannot start the run: {_describe(e)}") from None
        deadline = None if time_limit is None else time.monotonic() + time_limit
        limited = False
        got: list[int] = []
        code: int | None = None
        partial = b""
        # a view or escaping sinks (run/view.py) stand in for a terminal
        shown_out = (sys.stdout.buffer if term_out is None else term_out) if stream else None
        shown_err = (sys.stderr.buffer if term_err is None else term_err) if stream else None
        try:
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f, \
                    _note_signals(got):
                grace_until: float | None = None
                if on_started is not None:
                    try:
                        on_started()
                    except TransportError as e:
                        _stop(chan)
                        # the far script may have said why it ended (its own
                        # lines, before anything of the run started)
                        said = _far_said(chan)
                        if said:
                            raise TransportError(self.name, f"{e}; the far side said: "
                                                 f"{said}") from None
                        raise
                    except BaseException:
                        _stop(chan)
                        raise
                while True:
                    if deadline is not None and not limited and time.monotonic() > deadline:
                        limited = True
                        _stop(chan)  # hung up as on Ctrl-C; its end is still collected
                    if got and grace_until is None:
                        # Cut the lifeline here, not in the signal handler: the
                        # handler may run while this thread holds the channel's lock.
                        _stop(chan)
                        grace_until = time.monotonic() + INTERRUPT_GRACE
                    if grace_until is not None and time.monotonic() > grace_until:
                        break
                    moved = False
                    while chan.recv_ready():
                        chunk = chan.recv(65536)
                        if not chunk:
                            break
                        moved = True
                        tee(out_f, shown_out, chunk)
                    while chan.recv_stderr_ready():
                        chunk = chan.recv_stderr(65536)
                        if not chunk:
                            break
                        moved = True
                        err_f.write(chunk)
                        err_f.flush()
                        partial += chunk
                        *lines, partial = partial.split(b"\n")
                        for line in lines:
                            show = on_stderr_line(line) if on_stderr_line else True
                            if show and shown_err is not None:
                                shown_err.write(line + b"\n")
                                shown_err.flush()
                    if chan.exit_status_ready() and not chan.recv_ready() \
                            and not chan.recv_stderr_ready():
                        # paramiko answers -1 for a channel that closed without
                        # an exit status: the connection, not the run, ended.
                        status = chan.recv_exit_status()
                        code = status if status >= 0 else None
                        break
                    if chan.closed and not moved:
                        break
                    if not moved:
                        with suppress(InterruptedError):
                            select.select([chan], [], [], 0.2)
                if partial:
                    show = on_stderr_line(partial) if on_stderr_line else True
                    if show and shown_err is not None:
                        shown_err.write(partial)
                        shown_err.flush()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._fail(f"the connection failed during the run: {_describe(e)}") from None
        finally:
            chan.close()
        if got:
            raise Interrupted(got[0], code)
        if code is None:
            raise self._fail("the run's channel closed without an exit status (connection lost)")
        return Finished(code, out_path, err_path, killed_at_limit=limited)


#: a keepalive is sent this often (seconds) on an idle connection ...
KEEPALIVE_INTERVAL = 5
#: ... and the kernel gives the connection up when sent data stays unacknowledged
#: this long (TCP_USER_TIMEOUT): a silently dropped peer is noticed within
#: about KEEPALIVE_INTERVAL + DEAD_AFTER seconds, as a lost connection
DEAD_AFTER = 15


def _keep_alive(client: Any) -> None:
    """Keepalives on the connection, so a peer that vanished without a word
    (a cut link, a host that died) ends a run's wait as a lost connection
    instead of hanging it forever."""
    import socket

    t = client.get_transport()
    if t is None:
        return
    t.set_keepalive(KEEPALIVE_INTERVAL)
    sock = getattr(t, "sock", None)
    if isinstance(sock, socket.socket):
        with suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_INTERVAL)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_AFTER * 1000)


#: what the far lifeline watcher reads before it hangs up a run
STOP = b"stop\n"


def _stop(chan: Any) -> None:
    """Tell the far side to hang up the run, then close the lifeline."""
    with suppress(Exception):
        chan.sendall(STOP)
    with suppress(Exception):
        chan.shutdown_write()


def _far_said(chan: Any, wait: float = 1.0) -> str:
    """What the far script wrote on stderr before it ended (``saphan-far:``
    lines), escaped, at most 500 characters; empty when nothing."""
    from saphan.terminal import terminal_safe

    err = b""
    deadline = time.monotonic() + wait
    with suppress(Exception):
        while time.monotonic() < deadline and len(err) < 4096:
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(4096)
            elif chan.exit_status_ready():
                break
            else:
                time.sleep(0.02)
    lines = [ln for ln in err.decode(errors="replace").splitlines()
             if ln.startswith("saphan-far:")]
    return terminal_safe(" ".join(lines))[:500]


def _drain(chan: Any, out: list[bytes], err: list[bytes]) -> None:
    while chan.recv_ready():
        chunk = chan.recv(65536)
        if not chunk:
            break
        out.append(chunk)
    while chan.recv_stderr_ready():
        chunk = chan.recv_stderr(65536)
        if not chunk:
            break
        err.append(chunk)


def _note_signals(got: list[int]) -> AbstractContextManager[None]:
    """SIGINT/SIGTERM are noted; the streaming loop then closes the channel's
    stdin. The far script sees EOF on its lifeline and hangs up the far
    process (SIGHUP); its exit status still comes back, so the run is
    finalised with what really happened there."""

    def handler(signum: int, _frame: object) -> None:
        got.append(signum)

    return catching(handler)


def _reject_unpinned() -> Any:
    """A paramiko policy that refuses any key it is asked about: only the
    pinned key (added to the client's own table) is ever trusted."""
    import paramiko

    class RejectUnpinned(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise paramiko.SSHException(
                f"host key {key.get_name()} {fingerprint(key.get_name() + ' ' + key.get_base64())}"
                f" of {hostname} is not the pinned key; refused"
            )

    return RejectUnpinned()
