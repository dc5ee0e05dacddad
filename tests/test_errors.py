"""errors.py: the exceptions saphan raises, what they print, and the exit
codes the CLI gives them (docs/quickref.md's table)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from conftest import Saphan
from saphan import errors
from saphan.errors import (
    EXIT_CODE,
    REFUSAL_EXIT_CODE,
    Inexpressible,
    Interrupted,
    PlantedLink,
    Refusal,
    TransportError,
    UserError,
)
from saphan.refusal_table import CLASSES

QUICKREF = Path(__file__).resolve().parent.parent / "docs" / "quickref.md"


def test_refusal_renders_two_lines_and_a_dict() -> None:
    r = Refusal("workdir-missing", "/nope does not exist", "create it", run_id="01X")
    assert str(r) == "refused [workdir-missing]: /nope does not exist"
    assert r.render() == "refused [workdir-missing]: /nope does not exist\nfix: create it"
    assert r.as_dict() == {"class": "workdir-missing", "message": "/nope does not exist",
                           "remediation": "create it"}
    assert r.run_id == "01X"
    assert Refusal("seat-full", "m", "r").run_id is None


@pytest.mark.parametrize("cls", ["made-up", "Seat-Full", "seat_full", "", "seat-full "])
def test_the_class_table_is_closed(cls: str) -> None:
    with pytest.raises(ValueError, match="unknown refusal class"):
        Refusal(cls, "m", "r")


def test_every_class_of_the_table_can_be_raised() -> None:
    for cls in CLASSES:
        assert Refusal(cls, "m", "r").cls == cls


def test_interrupted_names_the_signal() -> None:
    e = Interrupted(signal.SIGTERM, 143)
    assert str(e) == "interrupted by SIGTERM"
    assert (e.signum, e.exit_code) == (signal.SIGTERM, 143)
    assert str(Interrupted(signal.SIGINT, None)) == "interrupted by SIGINT"


def test_transport_error_and_planted_link_carry_their_fields() -> None:
    t = TransportError("runner1", "runner1: connection refused")
    assert t.machine == "runner1" and str(t) == "runner1: connection refused"
    p = PlantedLink("/w/.git", "a symbolic link")
    assert (p.path, p.what) == ("/w/.git", "a symbolic link")
    assert str(p) == "/w/.git is a symbolic link; saphan does not follow it"
    assert issubclass(Inexpressible, ValueError)
    assert not issubclass(UserError, Refusal) and not issubclass(Refusal, UserError)


def test_exit_codes_are_the_documented_ones() -> None:
    table = dict(re.findall(r"^\| (\d+) \| (.*) \|$", QUICKREF.read_text(), flags=re.M))
    assert table[str(EXIT_CODE)].startswith("bad input")
    assert table[str(REFUSAL_EXIT_CODE)].startswith("refused")
    assert (EXIT_CODE, REFUSAL_EXIT_CODE) == (2, 3)
    from saphan import refusals

    assert refusals.EXIT_CODE == errors.REFUSAL_EXIT_CODE


def test_the_cli_exits_with_them(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    bad = s("runs", "show", "NOSUCHRUN")
    assert bad.code == EXIT_CODE and bad.err.startswith("error: no run 'NOSUCHRUN'"), bad
    cfg = s.home / "config.toml"
    cfg.write_text(cfg.read_text().replace('"engine"', '"bogus"'))
    refused = s("run", "--machine", "m", "--slot", "s", "--workdir", str(tmp_path), "--", "true")
    assert refused.code == REFUSAL_EXIT_CODE, refused
    assert refused.err.startswith("refused [confinement-setting-invalid]: ")
