"""The layers hold (docs/design.md §3.2): imports point one way, and no module imports another
module's private (underscore) name. Read from the source with ``ast``, so a lazy import inside a
function counts too."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gapo"
ORDER = ["core", "exec", "tasks", "policy", "machine", "rl", "experiments"]  # each may import the ones before it


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gapo"):
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gapo"):
                    yield node.lineno, a.name, []


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER + ["integrations"] else None


def test_imports_point_down_only():
    bad = []
    for path in SRC.rglob("*.py"):
        here = path.relative_to(SRC).parts[0]
        if here not in ORDER:
            continue
        for line, module, names in _imports(path):
            targets = [module] + [f"{module}.{n}" for n in names] if module == "gapo" else [module]
            for target in targets:
                there = _package(target)
                if (
                    there is not None
                    and there != here
                    and (there not in ORDER or ORDER.index(there) > ORDER.index(here))
                ):
                    bad.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {target} ({there})")
    assert not bad, "\n".join(bad)


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{path.relative_to(SRC)}:{line}: from {module} import {name}"
        for path in SRC.rglob("*.py")
        for line, module, names in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "\n".join(bad)


def test_the_checks_see_a_violation(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from gapo.tasks.math import _qkey\n    from gapo.rl import trainer\n")
    assert [(m, n) for _, m, n in _imports(bad)] == [("gapo.tasks.math", ["_qkey"]), ("gapo.rl", ["trainer"])]
    assert _package("gapo.rl.trainer") == "rl" and ORDER.index("rl") > ORDER.index("exec")
