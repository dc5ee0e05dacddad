"""The shape the code must keep (docs/architecture.md): no import cycle, one
writer of outcomes, one pipeline for every run shape, a thin engine."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "python" / "saphan"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the saphan modules it imports, at any depth of its code
    (function-level and TYPE_CHECKING imports count too)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    q = pkg
                    for _ in range(node.level - 1):
                        q = q.rpartition(".")[0]
                    base = q + ("." + base if base else "")
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            for n in names:
                target = resolve(n)
                if target and target != mod and target != "saphan" \
                        and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def test_the_module_import_graph_has_no_cycle() -> None:
    graph = _imports(_modules())
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(v: str, stack: list[str]) -> None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                cycles.append(" -> ".join([*stack[stack.index(w):], w]))
            elif w not in state:
                visit(w, stack)
        stack.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v, [])
    assert not cycles, "\n".join(cycles)


OUTCOME_WRITERS = ("finalize", "insert_refused_run", "mark_running", "set_record")


def _is_store(expr: ast.expr) -> bool:
    """``store``, ``x.store``, ``x.y.store``: the receiver is a Store."""
    return (isinstance(expr, ast.Name) and expr.id == "store") or (
        isinstance(expr, ast.Attribute) and expr.attr == "store")


def test_only_the_record_writer_writes_outcomes() -> None:
    """No module but run/record.py calls the store's outcome-writing methods
    (the store itself defines them)."""
    offenders = []
    for mod, path in _modules().items():
        if mod == "saphan.run.record" or mod.startswith("saphan.store"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in OUTCOME_WRITERS and _is_store(node.func.value):
                offenders.append(f"{mod}:{node.lineno} .{node.func.attr}()")
    assert not offenders, offenders


def test_every_run_shape_goes_through_one_pipeline_function() -> None:
    """Engine.run is the pipeline's only caller; the pipeline alone makes the
    sites (site/local.py, site/ssh.py) and drives them (execute)."""
    wanted = {"LocalSite": [], "SshSite": [], "execute": [], "pipeline.run": []}
    callers: dict[str, list[str]] = {k: list(v) for k, v in wanted.items()}
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (
                f"{f.value.id}.{f.attr}" if isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name) else "")
            if name in callers and mod not in callers[name]:
                callers[name].append(mod)
    assert callers == {"LocalSite": ["saphan.run.pipeline"], "SshSite": ["saphan.run.pipeline"],
                       "execute": ["saphan.run.pipeline"],
                       "pipeline.run": ["saphan.engine"]}, callers


def test_both_sites_implement_the_site_seam() -> None:
    """Every call of the Site protocol exists on each site, with its signature."""
    import inspect

    from saphan.site import Site
    from saphan.site.local import LocalSite
    from saphan.site.ssh import SshSite

    calls = [n for n, v in vars(Site).items() if callable(v) and not n.startswith("_")]
    assert set(calls) == {"inspect", "liveness", "prepare", "start", "interrupted", "settle"}
    for cls in (LocalSite, SshSite):
        for name in calls:
            want = list(inspect.signature(getattr(Site, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got == want, (cls.__name__, name, got)
        assert cls.kind in ("local", "ssh")


def test_the_engine_is_a_thin_facade() -> None:
    # 215 until issue 17 added cancel() and the store-open hook (reconcile):
    # one-line delegations each, with their lazy imports.
    lines = (PKG / "engine.py").read_text().splitlines()
    assert len(lines) <= 228, len(lines)


def test_every_module_has_its_test_module() -> None:
    """python/saphan/<dir>/<name>.py is tested by tests/<dir>/test_<name>.py,
    or by tests/integration/<tier>/test_<name>.py for the real-system tiers
    (escape batteries, sshd hosts, races)."""
    tests = PKG.parent.parent / "tests"
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(PKG)
        unit = tests / rel.parent / f"test_{rel.stem}.py"
        tiers = list((tests / "integration").glob(f"*/test_{rel.stem}.py"))
        if not unit.exists() and not tiers:
            missing.append(f"{rel} -> {unit.relative_to(tests.parent)}")
    assert not missing, missing
