"""The docs' refusal table and the code's table are the same set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from saphan.refusals import CLASSES, Refusal

DOCS = Path(__file__).resolve().parent.parent / "docs" / "refusals.md"


def test_docs_table_matches_code() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", text, flags=re.M))
    assert documented == set(CLASSES)


def test_every_documented_class_has_a_remediation_column() -> None:
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3 and all(cells), row


def test_refusal_class_is_closed() -> None:
    with pytest.raises(ValueError):
        Refusal("made-up", "m", "r")
    r = Refusal("seat-full", "slot s on m carries 1 run and may carry 1", "wait")
    assert r.render() == ("refused [seat-full]: slot s on m carries 1 run and may carry 1\n"
                          "fix: wait")
