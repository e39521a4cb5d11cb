"""The layers hold: no import cycle among the project's modules, and each layer imports only those before it
(search_spaces -> cost_model -> autotune -> benchmarks, as the README says). An AST scan, so it sees the imports
inside functions too (the lazy ones that hide a cycle from Python's import order)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("search_spaces", "cost_model", "autotune", "benchmarks")  # each may import only those before it
PACKAGES = LAYERS


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """Project modules `name` imports, anywhere in its source, with the first line that does."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        # The deepest project module the dotted name names (`pkg.mod.func` -> `pkg.mod`).
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for alias in node.names:
                add(f"{src}.{alias.name}", node.lineno)
    return found


def _graph() -> dict[str, dict[str, int]]:
    """Module -> the project modules it names in an import. `import a.b.c` also runs a/__init__ and a/b/__init__,
    but that is no edge here: a package's __init__ that imports its own submodules would otherwise form a cycle
    with each of them. A submodule that imports a name from its package's __init__ is an edge, and with an
    __init__ that imports it back a cycle: imported first, it would meet a half-initialised package."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_scan_sees_the_project():
    graph = _graph()
    assert "autotune.tuner" in graph and "search_spaces.embedding_bag.torch_op" in graph
    # Relative and function-level imports resolve: torch_op imports its workload.
    assert "search_spaces.embedding_bag.workload" in graph["search_spaces.embedding_bag.torch_op"]


def test_no_import_cycles():
    graph = _graph()
    cycles = _cycles(graph)
    lines = []
    for comp in cycles:
        members = set(comp)
        edges = [f"    {a} -> {b} (line {graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in members]
        lines.append(" <-> ".join(comp) + "\n" + "\n".join(edges))
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def test_each_layer_imports_only_the_layers_before_it():
    graph = _graph()
    assert any(a.startswith("benchmarks.") for a in graph)  # the top layer is scanned too
    up = [f"{a} -> {b} (line {line})" for a, deps in sorted(graph.items()) for b, line in sorted(deps.items())
          if LAYERS.index(b.split(".")[0]) > LAYERS.index(a.split(".")[0])]
    assert not up, "imports up the layers (" + " -> ".join(LAYERS) + "):\n" + "\n".join(up)


def test_operators_build_on_each_other_one_way():
    """An operator built on another (qmatmul_requant on qmatmul and quantize_rows, batched_embedding_bag on
    embedding_bag) imports it; the other imports nothing of it, in any of its modules. Module cycles miss this:
    qmatmul's graph rule importing qmatmul_requant's workload, which imports qmatmul's, is no module cycle."""
    packages = {f"search_spaces.{d.name}" for d in (ROOT / "search_spaces").iterdir() if (d / "__init__.py").is_file()}

    def operator(module: str) -> str | None:  # search_spaces.qmatmul.graph -> search_spaces.qmatmul
        op = ".".join(module.split(".")[:2])
        return op if op in packages else None

    ops: dict[str, dict[str, int]] = {op: {} for op in packages}
    for a, deps in _graph().items():
        if (op := operator(a)) is not None:
            for b, line in deps.items():
                if (dep := operator(b)) not in (None, op):
                    ops[op].setdefault(dep, line)
    assert "search_spaces.qmatmul" in ops["search_spaces.qmatmul_requant"]  # the scan sees one op build on another
    cycles = _cycles(ops)
    assert not cycles, "operators that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)
