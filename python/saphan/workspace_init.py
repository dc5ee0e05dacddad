"""`saphan init`: all or nothing.

Everything that can fail is checked before a byte is written: the arguments,
the configuration saphan would write (through the same parser every verb
uses), the key (custody, or the fleet key given to ``--join``), and the store
(connected to and migrated). Only then are the key and config.toml written,
each under a temporary name linked into place. If anything fails, whatever
this call made is removed again, the workspace directory included when this
call created it.

On an existing workspace:

* ``--database-url URL`` changes database.url only after URL was connected to
  and migrated; the rest of config.toml is kept as written.
* A missing record key is never quietly replaced (every row signed with the
  old key would stop verifying): it is refused (``custody-key-unsafe``, the
  class of every record key that is not where custody says it must be) with
  the count of the rows it would orphan. ``--join --key-file FILE`` puts the
  fleet key back; ``--new-key`` mints a new key and says which rows it
  leaves unverifiable here.
* An existing key is never overwritten, by ``--join`` or ``--new-key``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from saphan import refusals
from saphan.errors import UserError
from saphan.workspace import KEY_LENGTH, Workspace, register_workspace

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.store import Store


class Initialised(list[str]):
    """What ``init`` created (paths, as a list), with what it has to say.

    ``notes``: lines for the operator (a changed store URL, the rows a new
    key leaves unverifiable); ``key_id``: the workspace key's id
    (records.key_id); ``changed``: anything at all was written."""

    def __init__(self, created: list[str], notes: list[str], key_id: str, changed: bool):
        super().__init__(created)
        self.notes = notes
        self.key_id = key_id
        self.changed = changed


def init(ctx: Context, database_url: str | None = None, *, key_file: str | None = None,
         join: bool = False, new_key: bool = False) -> Initialised:
    """Create the workspace, or change its store URL, or give it its key —
    only once every check has passed (see the module's text)."""
    from saphan import records

    ws = ctx.workspace
    _check_arguments(ws, database_url, key_file, join, new_key)
    exists = ws.exists()
    old_url = ctx.config.database_url if exists else None
    url = database_url if database_url is not None else (old_url or "sqlite")
    text = _config_text(ws, url, exists)
    key_present = os.path.lexists(ws.key_path)
    fleet_key = _read_fleet_key(key_file) if join and key_file is not None else None

    key: bytes | None = None
    if key_present:
        key = ws.record_key()  # custody first; a key in place is never replaced
        if new_key:
            raise UserError(
                f"{ws.key_path} exists (key {records.key_id(key)}); saphan never replaces a "
                "record key, and --new-key only mints one where the key is missing")
        if fleet_key is not None and fleet_key != key:
            raise UserError(
                f"this workspace already holds key {records.key_id(key)} (its rows are signed "
                f"with it), not the fleet key {records.key_id(fleet_key)}; saphan never "
                "replaces a record key: join from a new workspace (another SAPHAN_HOME)")

    notes: list[str] = []
    with _undo_on_failure(ws) as made:
        store = _connect(ws, url, made)
        try:
            by = _signers(store)
            if key is None:
                if fleet_key is not None:
                    key = fleet_key
                elif exists and not new_key:
                    raise _missing_key(ws, by)
                else:
                    key = os.urandom(KEY_LENGTH)
                    if exists:
                        notes.append(_orphaned(by, records.key_id(key)))
            held = records.key_id(key)
            others: dict[str | None, list[int]] = {
                k: n for k, n in by.items() if k is not None and k != held}
            if others and not (exists and new_key):
                notes.append(_other_keys_note(others, held))
        finally:
            store.close()
        created: list[str] = []
        ws.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not ws.runs_dir.exists():
            ws.runs_dir.mkdir(mode=0o700)
            made.append(ws.runs_dir)
        if not key_present:
            if not _create_exclusive(ws.key_path, key, 0o600):
                raise UserError(f"{ws.key_path} appeared while init ran; run init again")
            made.append(ws.key_path)
            created.append(str(ws.key_path))
        if not exists:
            if not _create_exclusive(ws.config_path, text.encode(), 0o600):
                raise UserError(f"{ws.config_path} appeared while init ran; run init again")
            made.append(ws.config_path)
            created.insert(0, str(ws.config_path))
        elif url != old_url:
            _replace(ws.config_path, text.encode())
            from saphan.store.postgres import redact_url

            notes.append(f"database.url changed from {redact_url(old_url or 'sqlite')} to "
                         f"{redact_url(url)} (connected and migrated first)")
        ws.record_key()  # what was written passes the custody every verb checks
    register_workspace(ws.home)
    ctx._config = None  # read again: it may have changed
    if created and url == "sqlite":
        created.append(str(ws.sqlite_path))
    return Initialised(created, notes, records.key_id(key),
                       bool(created) or url != old_url)


def _check_arguments(ws: Workspace, database_url: str | None, key_file: str | None,
                     join: bool, new_key: bool) -> None:
    if join and key_file is None:
        raise UserError("--join needs --key-file FILE (or --key-file - to read it from a pipe): "
                        "the fleet key, the record.key of a workspace already on that store")
    if key_file is not None and not join:
        raise UserError("--key-file is read only with --join (joining a fleet's store)")
    if join and new_key:
        raise UserError("--join and --new-key contradict each other: joining takes the fleet's "
                        "key, --new-key mints one no other workspace holds")
    if join and database_url is None and not ws.exists():
        raise UserError("--join needs --database-url URL: the store the fleet shares")


def _config_text(ws: Workspace, url: str, exists: bool) -> str:
    """The config.toml saphan would write, checked by the parser every verb
    uses (config.load) before anything is written."""
    import tempfile

    from saphan.config import DEFAULT_TEXT, load

    base = ws.config_path.read_text() if exists else DEFAULT_TEXT
    text = _with_url(base, url)
    with tempfile.TemporaryDirectory(prefix="saphan-init-") as tmp:
        probe = Path(tmp) / "config.toml"
        probe.write_text(text)
        try:
            got = load(probe)
        except UserError as e:
            raise UserError(str(e).replace(str(probe), f"--database-url ({ws.config_path})")
                            ) from None
    if got.database_url != url:  # pragma: no cover - _with_url always sets it
        raise UserError(f"could not set database.url in {ws.config_path}; edit it by hand")
    return text


_SECTION = re.compile(r"^\s*\[([^\]]*)\]\s*(#.*)?$")
_URL_LINE = re.compile(r"^\s*url\s*=")


def _with_url(text: str, url: str) -> str:
    """``text`` with database.url set to ``url``, every other line kept."""
    lines = text.splitlines()
    setting = f"url = {json.dumps(url)}"
    section = None
    db_at = None
    for i, line in enumerate(lines):
        m = _SECTION.match(line)
        if m:
            section = m.group(1).strip()
            if section == "database":
                db_at = i
            continue
        if section == "database" and _URL_LINE.match(line):
            lines[i] = setting
            return "\n".join(lines) + "\n"
    if db_at is None:
        lines += ["", "[database]", setting]
    else:
        lines.insert(db_at + 1, setting)
    return "\n".join(lines) + "\n"


def _read_fleet_key(key_file: str) -> bytes:
    """The fleet key: a file under the record key's custody (rust/core), or
    a pipe (``-``): 32 raw bytes, or 64 hex digits and a newline."""
    from saphan import _native

    if key_file != "-":
        try:
            return _native.read_key_file(key_file, KEY_LENGTH)
        except _native.KeyCustodyError as e:
            raise refusals.custody_key_unsafe(
                f"the fleet key {e.args[0]}",
                f"the fleet key file must be a regular file owned by you, mode 0600, exactly "
                f"{KEY_LENGTH} bytes (a copy of a fleet workspace's record.key): "
                f"`chmod 0600 {key_file}`, or pipe it in with --key-file -") from None
        except OSError as e:
            raise UserError(f"--key-file {key_file}: {e.strerror or e}") from None
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if not stat.S_ISFIFO(mode):
        raise UserError(
            "--key-file - reads the fleet key from a pipe (e.g. `ssh other cat "
            "~/.saphan/record.key | saphan init … --join --key-file -`); stdin is not one: "
            "for a file, give --key-file FILE so its custody is checked")
    raw = sys.stdin.buffer.read(2 * KEY_LENGTH + 2)
    if len(raw) == KEY_LENGTH:
        return raw
    hexed = raw.strip()
    if len(hexed) == 2 * KEY_LENGTH:
        try:
            return bytes.fromhex(hexed.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise UserError(f"--key-file -: read {len(raw)} bytes; the fleet key is exactly "
                    f"{KEY_LENGTH} raw bytes (a record.key) or {2 * KEY_LENGTH} hex digits")


def _connect(ws: Workspace, url: str, made: list[Path]) -> Store:
    """The store at ``url``, connected and migrated (what a failure here
    leaves behind is in ``made``, removed by the caller)."""
    from saphan.store import open_store, sqlite_file

    db = sqlite_file(url, ws.sqlite_path)
    if db is not None and not os.path.lexists(db):
        # a database this init creates (never the files of one that exists)
        _mkdirs(db.parent, made)
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = Path(f"{db}{suffix}")
            if not os.path.lexists(p):
                made.append(p)
    return open_store(url, ws.sqlite_path)


def _mkdirs(path: Path, made: list[Path]) -> None:
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        made.append(d)


@contextmanager
def _undo_on_failure(ws: Workspace) -> Iterator[list[Path]]:
    """Yields the list of what this init made; on failure each is removed
    (newest first), so a failed init leaves nothing behind."""
    made: list[Path] = []
    home_existed = os.path.lexists(ws.home)
    if not home_existed:
        _mkdirs(ws.home, made)
    try:
        yield made
    except BaseException:
        for p in reversed(made):
            try:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink(missing_ok=True)
            except OSError:
                pass
        raise


def _signers(store: Store) -> dict[str | None, list[int]]:
    """Signed rows in the store by the key id they name (None: written
    before key ids): ``[run records, machine fact rows]``."""
    from saphan.records import KEY_ID_FIELD, SIGNATURE_FIELD, fact_key_id

    out: dict[str | None, list[int]] = {}
    for row in store.list_runs(limit=1 << 62):
        try:
            record = json.loads(row.record_json) if row.record_json else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get(SIGNATURE_FIELD) is not None:
            signer = record.get(KEY_ID_FIELD)
            out.setdefault(signer if isinstance(signer, str) else None, [0, 0])[0] += 1
    for m in store.list_machines():
        for f in store.list_facts(m.name):
            out.setdefault(fact_key_id(f), [0, 0])[1] += 1
    return out


def _counted(by: dict[str | None, list[int]]) -> str:
    runs = sum(n[0] for n in by.values())
    facts = sum(n[1] for n in by.values())
    keys = ", ".join(f"{k or 'no key id (signed before key ids)'}: {n[0]} + {n[1]}"
                     for k, n in sorted(by.items(), key=lambda kv: kv[0] or ""))
    return (f"{runs} signed run record(s) and {facts} machine fact row(s)"
            + (f" (by key: {keys})" if keys else ""))


def _missing_key(ws: Workspace, by: dict[str | None, list[int]]) -> refusals.Refusal:
    return refusals.custody_key_unsafe(
        f"{ws.key_path} does not exist, but this workspace does, and its store holds "
        f"{_counted(by)}; a new key would leave every row signed with the old one unverifiable "
        "here, so init does not mint one",
        f"restore {ws.key_path} from backup (mode 0600); or, on a shared store, take the fleet "
        "key from another operator: `saphan init --join --key-file FILE`; or accept the loss: "
        "`saphan init --new-key` (it says which rows it leaves unverifiable)")


def _orphaned(by: dict[str | None, list[int]], new: str) -> str:
    return (f"new record key {new}: {_counted(by)} in the store were signed with another key "
            "and do not verify here any more (rows naming a key id show as foreign, older "
            "rows as invalid); re-probe this workspace's machines to sign their facts again")


def _other_keys_note(by: dict[str | None, list[int]], held: str) -> str:
    return (f"this store holds {_counted(by)} signed with other keys than this workspace's "
            f"({held}); they show as foreign here. To share them, make a workspace that holds "
            "the fleet key: `saphan init --database-url URL --join --key-file FILE` "
            "(docs/operators.md)")


def _create_exclusive(path: Path, content: bytes, mode: int) -> bool:
    from saphan.workspace import _create_exclusive as create

    return create(path, content, mode)


def _replace(path: Path, content: bytes) -> None:
    """Write ``content`` over ``path`` atomically (a new file renamed over
    it, mode 0600; never through a link)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
