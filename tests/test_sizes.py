"""The package stays readable (docs/design.md §8.4, §3.2): no module over 600 lines, no function
over 60, and no import cycle between two of gapo's modules, a lazy import inside a function
included (one placed there to dodge a cycle is still a cycle). Read from the source with ``ast``."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gapo"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _module_name(path: Path, root: Path = SRC) -> str:
    parts = ("gapo", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[str, int, int]]:
    """``(name, line, length)`` of every function or method longer than ``limit`` lines."""
    return [
        (n.name, n.lineno, n.end_lineno - n.lineno + 1)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit
    ]


def _imported_modules(tree: ast.AST, here: str, known: set[str]) -> set[str]:
    """gapo modules ``here`` imports anywhere in its source (``from pkg import module`` included)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("gapo"):
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known
            out |= submodules or {node.module} & known
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & known
    return out - {here}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _import_graph(root: Path) -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    known = {_module_name(p, root) for p in paths}
    return {
        _module_name(p, root): _imported_modules(ast.parse(p.read_text()), _module_name(p, root), known) for p in paths
    }


def test_no_module_is_too_long():
    long = [
        f"{p.relative_to(SRC)}: {n} lines"
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "split along a concern a reader can name:\n" + "\n".join(long)


def test_no_function_is_too_long():
    long = [
        f"{p.relative_to(SRC)}:{line} {name}: {n} lines"
        for p in sorted(SRC.rglob("*.py"))
        for name, line, n in _long_functions(ast.parse(p.read_text()), MAX_FUNCTION_LINES)
    ]
    assert not long, "split along the steps it performs:\n" + "\n".join(long)


def test_no_import_cycle_between_modules():
    cycles = _cycles(_import_graph(SRC))
    assert not cycles, "import one way:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_a_violation(tmp_path):
    pkg = tmp_path / "gapo"
    (pkg / "experiments").mkdir(parents=True)
    (pkg / "experiments" / "grid.py").write_text(
        "from gapo.experiments import report\n\n\ndef load():\n    from gapo.experiments.dose import spec\n"
    )
    (pkg / "experiments" / "dose.py").write_text("from gapo.experiments.grid import load\n")
    (pkg / "experiments" / "report.py").write_text("x = 1\n")
    graph = _import_graph(pkg)
    assert graph["gapo.experiments.grid"] == {"gapo.experiments.dose", "gapo.experiments.report"}
    assert _cycles(graph) == [["gapo.experiments.dose", "gapo.experiments.grid"]]  # through the lazy import
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert _long_functions(ast.parse(f"def f():\n{body}\n"), 60) == [("f", 1, 62)]
    assert _long_functions(ast.parse("def g():\n    return 1\n"), 60) == []
