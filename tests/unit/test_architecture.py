"""The package's shape: layered imports without cycles, small modules, no side effects on import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp

from envbuild._compat import tomllib

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "envbuild"
MAX_LINES = 400


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("envbuild", include_external_packages=False)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    # grimp reads every import statement, the ones inside functions too: a cycle hidden behind a
    # local import is still a cycle.
    graph = _graph()
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_has_a_place_in_the_layers() -> None:
    """A new module must be placed in pyproject's layers contract, or import-linter would not judge it."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    top_level = {".".join(m.split(".")[:2]) for m in _graph().modules if m != "envbuild"}
    assert top_level - placed == set()


def test_no_module_over_400_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_importing_any_module_leaves_the_environment_unchanged() -> None:
    # Every uv and docker subprocess inherits envbuild's environment: an import that sets a
    # variable (the smoke code once set CUBLAS_WORKSPACE_CONFIG) changes what they do.
    code = (
        "import importlib, json, os, pkgutil, sys\n"
        "import envbuild\n"
        "before = dict(os.environ)\n"
        "names = [m.name for m in pkgutil.walk_packages(envbuild.__path__, 'envbuild.')\n"
        "         if not m.name.endswith('__main__')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "after = dict(os.environ)\n"
        "changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))\n"
        "print(json.dumps({'imported': len(names), 'changed': changed}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout)
    assert result["imported"] > 40
    assert result["changed"] == []


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout
