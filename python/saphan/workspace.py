"""The workspace: $SAPHAN_HOME (default ~/.saphan) and what lives in it.

    config.toml   closed-schema settings (saphan.config)
    record.key    32 random bytes, mode 0600, never overwritten; signs machine rows
    saphan.db     the embedded SQLite store (when database.url is "sqlite")
    runs/<id>/    one directory per run: output logs, record.json, out/ (return path)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from saphan import refusals
from saphan.errors import PlantedLink

KEY_LENGTH = 32


def registry_path() -> Path:
    """Every workspace saphan has made or used on this account, one path per
    line: each is hidden inside every run's jail, whichever workspace runs it
    (a run must not read another workspace's key or rewrite its store)."""
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "saphan" / "workspaces"


def registered_workspaces() -> list[str]:
    """The registered workspaces that still exist (real paths)."""
    from saphan.confine import nofollow

    try:
        text = nofollow.read_small(str(registry_path()), 1 << 20).decode("utf-8", "replace")
    except (OSError, PlantedLink):
        return []
    out: list[str] = []
    for line in text.splitlines():
        p = line.strip()
        if p.startswith("/") and p not in out and os.path.isdir(p):
            out.append(p)
    return out


def register_workspace(home: Path) -> None:
    """Add ``home`` to the registry once (never through a link)."""
    from saphan.confine import nofollow

    real = os.path.realpath(home)
    if real in registered_workspaces():
        return
    # The directory is resolved; the file itself never is (a link planted
    # there is refused by append_line, not followed).
    reg = Path(os.path.realpath(registry_path().parent)) / registry_path().name
    try:
        nofollow.makedirs("/", str(reg.parent).lstrip("/"), 0o700)
        nofollow.append_line(str(reg), real)
    except (OSError, ValueError, PlantedLink):
        pass  # best effort: the current workspace is hidden by every run anyway


def default_home() -> Path:
    env = os.environ.get("SAPHAN_HOME")
    if env:
        return Path(env)
    return Path.home() / ".saphan"


@dataclass(frozen=True)
class Workspace:
    home: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> Workspace:
        path = Path(home) if home is not None else default_home()
        return cls(Path(os.path.abspath(os.path.expanduser(path))))

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"

    @property
    def key_path(self) -> Path:
        return self.home / "record.key"

    @property
    def sqlite_path(self) -> Path:
        return self.home / "saphan.db"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def exists(self) -> bool:
        return self.config_path.exists()

    def init(self) -> list[str]:
        """Create what is missing; never overwrite. Returns what was created."""
        from saphan.config import DEFAULT_TEXT

        created: list[str] = []
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.runs_dir.mkdir(mode=0o700, exist_ok=True)
        if _create_exclusive(self.config_path, DEFAULT_TEXT.encode(), 0o600):
            created.append(str(self.config_path))
        if _create_exclusive(self.key_path, os.urandom(KEY_LENGTH), 0o600):
            created.append(str(self.key_path))
        register_workspace(self.home)
        return created

    def record_key(self) -> bytes:
        """The record key, read only after its custody is checked (rust/core)."""
        from saphan import _native

        try:
            return _native.read_key_file(str(self.key_path), KEY_LENGTH)
        except _native.KeyCustodyError as e:
            raise refusals.custody_key_unsafe(
                e.args[0],
                f"the key must be a regular file owned by you, mode 0600, exactly "
                f"{KEY_LENGTH} bytes: `chown $(id -u) {self.key_path} && "
                f"chmod 0600 {self.key_path}`; if it was replaced, restore it from backup "
                "(machine rows signed with another key will not verify)",
            ) from None
        except PermissionError as e:
            raise refusals.custody_key_unsafe(
                f"{self.key_path} cannot be opened by uid {os.geteuid()} ({e.strerror}); "
                "the record key must belong to the account that runs saphan",
                f"run saphan as the key's owner, or `chown $(id -u) {self.key_path}`",
            ) from None
        except FileNotFoundError:
            raise refusals.custody_key_unsafe(
                f"{self.key_path} does not exist",
                "a new workspace: run `saphan init`; an existing one: restore the key from "
                "backup, or take the fleet key back (`saphan init --join --key-file FILE`), "
                "or `saphan init --new-key`, which says which signed rows stop verifying here "
                "(docs/operators.md)",
            ) from None


def _create_exclusive(path: Path, content: bytes, mode: int) -> bool:
    """Write ``content`` to a new file at ``path``; False if it already exists.

    The file is written under a temporary name and linked into place, so a
    crash never leaves a half-written key or config behind.
    """
    if path.exists() or path.is_symlink():
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)
