"""The package's layers import downward only: no import cycle between first-level
packages, the library never imports the tools, the engine is handed its algorithm selector instead of
importing the tuning package, and the tuning package is framework-free and below the engine.

Imports are read from the source (module level and inside functions alike), not executed."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
TOOLS = {"cluster", "bench", "sim", "cli", "benchmarking", "busbw_plot"}


def _imports() -> dict[str, set[str]]:
    """Every module of ringlet (dotted name) and the dotted names it imports."""
    out: dict[str, set[str]] = {}
    for path in (SRC / "ringlet").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found = out.setdefault(".".join(parts), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found.add(target)
                if not node.module:
                    found.update(f"{target}.{a.name}" for a in node.names)
    return out


def _unit(name: str) -> str:
    """The first-level package (or top-level module) of a dotted name inside ringlet."""
    return ".".join(name.split(".")[:2])


def test_no_cycle_between_first_level_packages():
    edges: dict[str, set[str]] = {}
    for mod, targets in _imports().items():
        edges.setdefault(_unit(mod), set()).update(
            _unit(t) for t in targets if t.startswith("ringlet.") and _unit(t) != _unit(mod))
    edges.pop("ringlet", None)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(edges.get(u, ())):
            assert state.get(v) != 1, "import cycle: " + " -> ".join(path[path.index(v):] + [v])
            if v not in state:
                visit(v, path + [v])
        state[u] = 2

    for u in sorted(edges):
        if u not in state:
            visit(u, [u])


def test_the_library_never_imports_the_tools():
    bad = [f"{mod} imports {t}" for mod, targets in _imports().items() if mod.split(".")[1:2] and
           mod.split(".")[1] not in TOOLS for t in targets
           if t.startswith("ringlet.") and t.split(".")[1] in TOOLS]
    assert bad == []


def test_tuning_is_framework_free_and_below_the_engine():
    imports = _imports()
    for mod, targets in imports.items():
        if mod.startswith("ringlet.tuning"):
            assert not any(t == "torch" or t.startswith("torch.") for t in targets), mod
            assert not any(_unit(t) in ("ringlet.engine", "ringlet.runtime", "ringlet.collectives")
                           for t in targets), mod
        if mod.startswith("ringlet.engine"):
            assert not any(_unit(t) == "ringlet.tuning" for t in targets), mod
