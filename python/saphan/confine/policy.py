"""The write policy of one run: a single value every renderer reads.

Renderers never decide grants; they only express this value. Paths are
absolute and already resolved (symbolic links followed) when a Policy is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: an egress run's door on the jail's own loopback (the namespace is the run's
#: alone, so one fixed port serves every run), and its socket's name in the
#: run's door directory (egress/cut.py)
DOOR_PORT = 3128
DOOR_SOCKET = "door.sock"

#: device files every run may write (SPEC.md §2)
DEVICE_LITERALS = ("/dev/null", "/dev/tty", "/dev/zero", "/dev/random", "/dev/urandom")


@dataclass(frozen=True)
class Policy:
    workdir: str
    #: directories writable with everything below them
    writable_dirs: tuple[str, ...]
    #: single files writable (devices; on macOS, not-yet-existing ref locks)
    writable_literals: tuple[str, ...] = DEVICE_LITERALS
    #: paths (directories or files) that stay read-only inside a writable
    #: directory: a main worktree's .git, a linked worktree's .git file and
    #: its git dir's commondir/gitdir, protected files (confine/protected.py)
    readonly_dirs: tuple[str, ...] = ()
    #: directories hidden whole (an empty read-only tmpfs on top) BEFORE any
    #: grant is bound: saphan's workspaces; the run's own paths under them
    #: (return path, worktree) are bound again afterwards
    hidden_dirs: tuple[str, ...] = ()
    #: files/dirs unreadable inside the jail; applied LAST by every renderer
    read_denials: tuple[str, ...] = ()
    #: "open": network egress is not restricted; "off": the renderers cut it
    #: (decided by confine/network.py: only where the run's path can);
    #: "egress": cut, and the door's socket directory (``door_dir``) is the
    #: one way out (egress/cut.py)
    network: str = "open"
    #: an egress run's door directory, bound read-only into the jail
    door_dir: str = ""
    #: TMPDIR for the tool, inside the working directory
    scratch_dir: str = ""
    #: variables the derivation sets for the run (a --repo run's own object
    #: directory: GIT_OBJECT_DIRECTORY, GIT_ALTERNATE_OBJECT_DIRECTORIES)
    setenv: tuple[tuple[str, str], ...] = ()
    #: what the derivation could not grant, in words, for the record
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def door_socket(self) -> str:
        """An egress run's door socket (empty when the run is not cut with a door)."""
        return f"{self.door_dir.rstrip('/')}/{DOOR_SOCKET}" if self.door_dir else ""

    def writable_set(self) -> list[str]:
        return [*self.writable_dirs, *self.writable_literals]

    def as_record(self) -> dict[str, Any]:
        return {
            "workdir": self.workdir,
            "writable_dirs": list(self.writable_dirs),
            "writable_literals": list(self.writable_literals),
            "readonly_within_writable": list(self.readonly_dirs),
            "read_denials": list(self.read_denials),
            "hidden": list(self.hidden_dirs),
            "setenv": dict(self.setenv),
            "network": {"open": "not restricted", "egress": "cut: egress policy (the door)"}.get(
                self.network, self.network),
            **({"door_dir": self.door_dir} if self.door_dir else {}),
            "scratch_dir": self.scratch_dir,
        }
