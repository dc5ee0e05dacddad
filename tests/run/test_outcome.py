"""run/outcome.py: `saphan run`'s exit status (--exit-code) and its --json
stdout (through the CLI: tests/test_cli_verbs.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from saphan.errors import Refusal
from saphan.run import outcome


def test_exit_status() -> None:
    assert [outcome.exit_status(c, own=False) for c in (0, 1, 7, -15, None)] == [0, 1, 1, 1, 1]
    assert [outcome.exit_status(c, own=True) for c in (0, 1, 7, -15, -9, None, 300)] == [
        0, 1, 7, 143, 137, 1, 1]


def test_json_stdout_moves_output_to_stderr_and_prints_a_refusal(capsys: Any) -> None:
    class Engine:
        ctx = None

    with outcome.json_stdout(Engine(), True):  # type: ignore[arg-type]
        print("from the run")
    got = capsys.readouterr()
    assert got.out == "" and got.err == "from the run\n"
    with pytest.raises(Refusal), outcome.json_stdout(Engine(), True):  # type: ignore[arg-type]
        raise Refusal("seat-full", "full", "wait")
    doc = json.loads(capsys.readouterr().out)
    assert doc["refusal"]["class"] == "seat-full" and doc["refusal"]["run"] is None
    assert sys.stdout is not sys.stderr
