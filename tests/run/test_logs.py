"""run/logs.py: a run's logs copied byte for byte, escaped for a terminal,
never through a link, followed until the row ends (the verb itself:
tests/test_cli_verbs.py)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from saphan.run import logs


class _Row:
    def __init__(self, run_id: str, live: bool = False):
        self.id, self.live = run_id, live


class _Ctx:
    def __init__(self, home: Path, rows: list[Any]):
        self.workspace = self
        self.store = self
        self.home, self.rows = home, rows

    def run_dir(self, run_id: str) -> Path:
        return self.home / run_id

    def get_run(self, run_id: str) -> Any:
        return self.rows.pop(0) if self.rows else _Row(run_id)


def test_escaped_keeps_newline_and_tab_only() -> None:
    assert logs.escaped(b"a\tb\n") == b"a\tb\n"
    assert logs.escaped(b"\x1b[31mx\x07\x7f") == b"\\x1b[31mx\\x07\\x7f"
    assert logs.escaped("é".encode()) == "é".encode()


def test_copy_each_stream_and_never_through_a_link(tmp_path: Path) -> None:
    d = tmp_path / "R1"
    d.mkdir()
    (d / "stdout.log").write_bytes(b"out\x1b\n")
    secret = tmp_path / "secret"
    secret.write_text("not a log")
    os.symlink(secret, d / "stderr.log")
    out, err = io.BytesIO(), io.BytesIO()
    logs.copy(_Ctx(tmp_path, []), _Row("R1"), out, err)  # type: ignore[arg-type]
    assert out.getvalue() == b"out\x1b\n" and err.getvalue() == b""
    out = io.BytesIO()
    logs.copy(_Ctx(tmp_path, []), _Row("R1"), out, err, escape_out=True)  # type: ignore[arg-type]
    assert out.getvalue() == b"out\\x1b\n"
    # a refused run has no files: nothing, no error
    logs.copy(_Ctx(tmp_path, []), _Row("NONE"), out, err)  # type: ignore[arg-type]


def test_follow_reads_until_the_row_ends(tmp_path: Path, monkeypatch: Any) -> None:
    d = tmp_path / "R2"
    d.mkdir()
    log = d / "stdout.log"
    log.write_bytes(b"a\n")
    monkeypatch.setattr(logs, "POLL_SECONDS", 0.01)
    reads = iter([b"b\n", b"c\n"])

    class Ctx(_Ctx):
        def get_run(self, run_id: str) -> Any:
            with open(log, "ab") as f:  # the run writes between two reads
                f.write(next(reads, b""))
            return super().get_run(run_id)

    out = io.BytesIO()
    ended = logs.copy(Ctx(tmp_path, [_Row("R2", live=True)]), _Row("R2", live=True),  # type: ignore[arg-type]
                      out, io.BytesIO(), follow=True)
    assert out.getvalue() == b"a\nb\nc\n" and not ended.live
