"""refusal_table.py: the closed table of refusal classes. tests/test_refusals.py
holds the set against docs/refusals.md and tests/test_refusal_classes_rust.py
against Rust's; here: the shape of each entry, and that the docs describe
each class in the same place and say the one exit code."""

from __future__ import annotations

import re
from pathlib import Path

from saphan import refusals
from saphan.refusal_table import CLASSES

DOCS = Path(__file__).resolve().parent.parent / "docs" / "refusals.md"


def _doc_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_every_class_is_kebab_case_with_a_when_text() -> None:
    assert CLASSES
    for cls, when in CLASSES.items():
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", cls), cls
        assert isinstance(when, str) and when.strip() == when and len(when) > 10, (cls, when)


def test_the_docs_list_each_class_once() -> None:
    """(The sets themselves: tests/test_refusals.py, tests/test_refusal_classes_rust.py.)"""
    rows = re.findall(r"^\| `([^`]+)` \|", DOCS.read_text(), flags=re.M)
    assert len(rows) == len(set(rows)) == len(CLASSES), rows


def test_the_docs_table_is_in_the_tables_order() -> None:
    """A reader comparing the two tables reads them row by row."""
    assert list(_doc_rows()) == list(CLASSES)


def test_each_documented_when_and_fix_is_non_empty() -> None:
    for cls, (when, fix) in _doc_rows().items():
        assert when and fix, cls


def test_the_module_re_exports_the_same_table() -> None:
    assert refusals.CLASSES is CLASSES
    assert "exits **3**" in DOCS.read_text() and refusals.EXIT_CODE == 3
