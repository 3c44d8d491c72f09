"""Docs that cannot drift: every repository path, module path and "§" reference written in the
README, docs/*.md, BENCHMARKS.md and RESULTS.md exists, and the version has one source.

- A repository path is any token starting with a top-level folder of the repository
  (``tests/…``, ``src/…``, ``configs/…``, ``benchmarks/…``, ``docs/…``, ``results/…``,
  ``requirements/…``) or ``gapo/…`` (read as ``src/gapo/…``); ``{a,b}`` expands, ``*`` globs,
  ``tests/x.py::name`` also needs ``def name`` in that file. Relative markdown links resolve from
  the linking file's folder.
- A module path is ``gapo.a.b…``: the longest importable prefix, then attributes of it.
- ``§N.M`` must be a heading of docs/design.md (design §8.6: references move with renumbering).
- The README and docs/*.md quote no test counts ("86 tests", "51 collected"): every new test makes
  them stale. BENCHMARKS.md and RESULTS.md may, beside the commit they measured.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import itertools
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("tests", "src", "configs", "benchmarks", "docs", "results", "requirements")

# a path token: starts at a word boundary that is not inside another path or identifier
# (``gapo/x.py`` is src-relative; ``gapo/eps_high_mean`` is a metric name, so only ``.py`` counts there)
PATH = re.compile(r"(?<![\w/.~$-])((?:" + "|".join(TOP) + r")/[\w./*{},<>-]*[\w*}](?:::\w+)?|gapo/[\w/]+\.py)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
MODULE = re.compile(r"(?<![\w/.-])gapo(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"\bfrom (gapo(?:\.\w+)*) import ([\w, ]+)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
# a count a test run changes: "86 tests", "44 parity tests", "1,427 tests", "51 collected", "12 passed"
TEST_COUNT = re.compile(
    r"(?<![\w.§,])\d[\d,]*(?:\s+[a-z-]+)?\s+(?:tests?|test cases|collected|passed|skipped|deselected)\b", re.I
)
UNDATED_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # no commit beside a number


def _docs_text():
    for f in DOCS:
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            yield f, i, line


def _where(f: Path, i: int) -> str:
    return f"{f.relative_to(ROOT)}:{i}"


def _expand(p: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (nested braces are not used in the docs)."""
    parts = re.split(r"\{([^{}]*)\}", p)
    fixed, options = parts[0::2], [o.split(",") for o in parts[1::2]]
    return [
        "".join(x for pair in itertools.zip_longest(fixed, combo, fillvalue="") for x in pair)
        for combo in itertools.product(*options)
    ]


def _path_exists(token: str) -> str | None:
    """None when ``token`` names something in the repository, else why not."""
    token, _, func = token.partition("::")
    token = token.rstrip(".,;:")
    if "<" in token:  # a placeholder (``results/<grid>/…``): check the part before it
        token = token.split("<", 1)[0].rsplit("/", 1)[0]
    if token.startswith("gapo/"):
        token = "src/" + token
    for p in _expand(token):
        hits = list(ROOT.glob(p)) if "*" in p else ([ROOT / p] if (ROOT / p).exists() else [])
        if not hits:
            return f"{p} does not exist"
        if func and not re.search(
            rf"^\s*(?:async\s+)?def {re.escape(func)}\b|^class {re.escape(func)}\b",
            hits[0].read_text(encoding="utf-8"),
            flags=re.M,
        ):
            return f"{p} has no test {func}"
    return None


def test_repository_paths_exist():
    bad = []
    for f, i, line in _docs_text():
        for tok in PATH.findall(line):
            why = _path_exists(tok)
            if why:
                bad.append(f"{_where(f, i)}: {why}")
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (f.parent / target).exists():
                bad.append(f"{_where(f, i)}: link target {target} does not exist")
    assert not bad, "documentation names paths that do not exist:\n" + "\n".join(bad)


def _resolve_module_path(dotted: str) -> str | None:
    """None when ``gapo.a.b.c`` is an importable module followed by attributes of it."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            found = importlib.util.find_spec(name) is not None
            obj = importlib.import_module(name) if found else None
        except ImportError:
            found = False
        if not found:
            continue
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return f"{name} has no attribute {attr!r} (in {dotted})"
            obj = getattr(obj, attr)
        return None
    return f"no module {parts[0]}"


def _module_refs(line: str) -> list[str]:
    refs = [m.rstrip(".") for m in MODULE.findall(line)]
    for mod, names in FROM_IMPORT.findall(line):  # from gapo.tasks import sandbox, code
        refs += [f"{mod}.{n.strip()}" for n in names.split(",") if n.strip()]
    return [r for r in refs if not r.endswith((".py", ".md", ".yaml", ".json", ".jsonl"))]  # files: paths


def test_module_paths_resolve():
    seen: dict[str, str] = {}
    for f, i, line in _docs_text():
        for dotted in _module_refs(line):
            seen.setdefault(dotted, _where(f, i))
    bad = []
    for dotted, where in sorted(seen.items()):
        why = _resolve_module_path(dotted)
        if why:
            bad.append(f"{where}: {why}")
    assert not bad, "documentation names module paths that do not resolve:\n" + "\n".join(bad)


def _design_sections() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#+\s*§(\d+(?:\.\d+)*)\s", text, flags=re.M))


def test_section_references_are_headings_of_design():
    sections = _design_sections()
    assert {"2.5", "5.1", "10"} <= sections  # the pattern reads the headings at all
    sources = [*DOCS, *sorted((ROOT / "src").rglob("*.py"))]
    bad = []
    for f in sources:
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for ref in SECTION.findall(line):
                if ref not in sections:
                    bad.append(f"{_where(f, i)}: §{ref} is no heading of docs/design.md")
    assert not bad, "\n".join(bad)


def test_docs_quote_no_test_counts():
    bad = [
        f"{_where(f, i)}: {m.group(0)!r}"
        for f in UNDATED_DOCS
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        for m in TEST_COUNT.finditer(line)
    ]
    assert not bad, "test counts go stale with every new test; name the test files instead:\n" + "\n".join(bad)


def test_version_has_one_source():
    import gapo

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert "version" not in project, "pyproject.toml states a version; it must come from gapo.__version__"
    assert "version" in project.get("dynamic", [])
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gapo.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?", gapo.__version__)
    try:  # the installed metadata, where this checkout is what is installed (pip install -e .)
        installed = importlib.metadata.version("gapo")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None and Path(gapo.__file__).resolve().is_relative_to(ROOT / "src"):
        assert installed == gapo.__version__, (
            f"installed metadata says {installed}, gapo.__version__ {gapo.__version__}: reinstall (pip install -e .)"
        )
    # CHANGELOG.md's newest "## X.Y.Z" heading (the first) is this version's
    heads = re.findall(r"^## (\d+\.\d+\.\d+\S*)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), flags=re.M)
    assert heads and heads[0] == gapo.__version__, f"CHANGELOG.md's newest heading {heads[:1]} != {gapo.__version__}"
    assert heads == sorted(heads, key=lambda v: tuple(map(int, re.findall(r"\d+", v))), reverse=True), heads


def test_the_checks_catch_drift():
    # the checkers themselves must fail on drifted text, or the tests above prove nothing
    assert _path_exists("tests/test_verl.py")  # moved to tests/integrations/
    assert _path_exists("tests/integrations/test_verl.py::no_such_test")
    assert _path_exists("src/gapo/{core,nope}/")
    assert _path_exists("tests/integrations/test_verl.py") is None
    assert _path_exists("src/gapo/{core,rl}/") is None
    assert PATH.findall("TRL logs gapo/eps_high_mean; see gapo/core/losses.py") == ["gapo/core/losses.py"]
    assert PATH.findall("see `tests/core/test_losses.py`, and docs/design.md.") == [
        "tests/core/test_losses.py",
        "docs/design.md",
    ]
    assert _resolve_module_path("gapo.core.clipping.gapo_eps_high") is None
    assert _resolve_module_path("gapo.core.clipping.no_such_name")
    assert _resolve_module_path("gapo.no_such_module")
    assert _module_refs("from gapo import sandbox") == ["gapo.sandbox"]
    assert _resolve_module_path("gapo.sandbox.run")  # 0.1's flat path: gone in 0.3 (CHANGELOG.md)
    assert SECTION.findall("docs/design.md §2.5 and §10") == ["2.5", "10"]
    for stale in ("test_verl.py, 86 tests,", "35 tests for start-up", "44 parity tests", "85 and 51 collected"):
        assert TEST_COUNT.search(stale), stale
    for fine in ("### §8.5 Tests", "two tests", "G = 8 rollouts", "tests/core/test_losses.py", "1.5 passed"):
        assert not TEST_COUNT.search(fine), fine
    assert "99.1" not in _design_sections()
