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


def test_reserved_markers_match_the_code() -> None:
    """A class the docs call reserved is raised nowhere; every other class is raised."""
    root = DOCS.parent.parent
    # Python raises a class through its named constructor (refusals.py).
    sources = [re.sub(r"\brefusals\.([a-z_]+)\(", lambda m: '"' + m.group(1).replace("_", "-") + '"',
                      p.read_text())
               for p in (root / "python" / "saphan").rglob("*.py")
               if p.name not in ("refusal_table.py", "refusals.py")]
    # rust/core/src/refusal.rs is Rust's copy of the table (as refusals.py is
    # Python's); elsewhere Rust names a class by its `RefusalClass::Variant`.
    table = root / "rust" / "core" / "src" / "refusal.rs"
    sources += [p.read_text() for p in (root / "rust").rglob("*.rs") if p != table]
    code = "\n".join(sources)
    variants = re.findall(r"RefusalClass::([A-Z][A-Za-z]+)", code)
    code += "\n".join('"' + re.sub(r"(?<!^)([A-Z])", r"-\1", v).lower() + '"' for v in variants)
    rows = {m.group(1): m.group(0) for m in
            re.finditer(r"^\| `([a-z-]+)` \|.*$", DOCS.read_text(), flags=re.M)}
    for cls, row in rows.items():
        raised = f'"{cls}"' in code
        reserved = "in this build: reserved" in row
        assert raised != reserved, (cls, "raised" if raised else "never raised", row)


def test_each_class_has_its_named_constructor_and_nothing_else_builds_a_refusal() -> None:
    """One constructor per row of the table (refusals.workdir_unsafe, ...),
    and every refusal in the package is built by one of them (a class read
    from another program's output goes through refusals.of_class)."""
    import ast
    from pathlib import Path

    from saphan import refusals

    for cls in CLASSES:
        made = getattr(refusals, cls.replace("-", "_"))("m", "r")
        assert (made.cls, made.message, made.remediation) == (cls, "m", "r")
    with pytest.raises(ValueError):
        refusals.of_class("not-a-class", "m", "r")
    pkg = Path(refusals.__file__).parent
    direct = []
    for path in pkg.rglob("*.py"):
        if path.name in ("errors.py", "refusals.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "Refusal":
                direct.append(f"{path.relative_to(pkg)}:{node.lineno}")
    assert not direct, direct
