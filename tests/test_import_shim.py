"""gapo 0.1's flat module paths (``gapo.clipping``, ``gapo.trainer``, …) still import: each is the
moved module itself, with a DeprecationWarning naming the new path, and importing an old path
leaves the new module's ``__spec__`` alone (a copy of the shim overwrote it, so ``importlib.reload``
of the new module silently did nothing). The shim acts only on the first import of a path, so
each path's check is that path's first import: all of them in one fresh interpreter (each old path
is imported there once, by its own check), not one interpreter per path; the same interpreter then
checks ``from gapo import <old name>`` (on a path of its own, first), every other old path, and
an unknown one."""

import json
import subprocess
import sys
import textwrap

import pytest

from gapo import _MOVED

OLD_PATHS = [
    "gapo.clipping",
    "gapo.advantages",
    "gapo._checks",
    "gapo.tasks.sandbox",
    "gapo.tasks.scoring",
    "gapo.rl.allocator",
]

SCRIPT = textwrap.dedent("""
    import importlib, json, sys, warnings

    def check(old, new):
        assert old not in sys.modules, old  # this check is the path's first import
        real = importlib.import_module(new)
        spec, loader = real.__spec__, real.__loader__
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        dep = [w for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
        out = {"same": mod is real, "in_sys_modules": sys.modules[old] is real,
               "warnings": [str(w.message) for w in dep], "filename": [w.filename for w in dep],
               "spec_is_kept": real.__spec__ is spec, "spec_name": real.__spec__.name,
               "loader_is_kept": real.__loader__ is loader, "name": real.__name__}
        # reload goes through __spec__: it must re-execute the real module, under its own name
        doc, real.__doc__ = real.__doc__, "overwritten"
        importlib.reload(real)
        out["reloaded_under"] = real.__spec__.name
        out["reload_ran_the_module"] = real.__doc__ == doc and real.__spec__.origin == spec.origin
        with warnings.catch_warnings(record=True) as again:  # a second import is a plain sys.modules hit
            warnings.simplefilter("always")
            importlib.import_module(old)
        out["second_import_warnings"] = len(again)
        return out

    def from_gapo():  # `from gapo import <old flat name>`: the first import of gapo.losses
        assert "gapo.losses" not in sys.modules
        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            try:
                from gapo import losses
            except DeprecationWarning as w:
                out["warned"] = str(w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from gapo import losses
        import gapo.core.losses
        out["same"] = losses is gapo.core.losses
        return out

    def every_path(moved):  # the old paths not checked above: each is its new module, spec kept
        bad = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            for old, new in moved.items():
                real = importlib.import_module(new)
                spec = real.__spec__
                if importlib.import_module(old) is not real or real.__spec__ is not spec:
                    bad[old] = new
        return bad

    from gapo import _MOVED
    pairs = sys.argv[1:]
    result = {"from_gapo": from_gapo()}
    result["paths"] = {old: check(old, new) for old, new in zip(pairs[::2], pairs[1::2])}
    result["every"] = every_path({o: n for o, n in _MOVED.items() if o not in sys.modules})
    result["every_checked"] = sorted(o for o in _MOVED if o in sys.modules)
    try:
        import gapo.no_such_module
    except ModuleNotFoundError as e:
        result["missing"] = e.name
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def shim_checks(tmp_path_factory):
    """``SCRIPT``'s checks in one fresh interpreter (``"paths"``: ``{old: result}`` for every path of
    ``OLD_PATHS``; ``"from_gapo"``, ``"every"``, ``"missing"``) and the script's path."""
    script = tmp_path_factory.mktemp("shim") / "importer.py"
    script.write_text(SCRIPT)
    args = [x for old in OLD_PATHS for x in (old, _MOVED[old])]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), str(script)


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_path_is_the_new_module_with_a_warning_and_its_spec_untouched(shim_checks, old):
    new = _MOVED[old]
    results, script = shim_checks
    out = results["paths"][old]
    assert out["same"] and out["in_sys_modules"]
    assert out["warnings"] == [f"{old} moved to {new}; the old path will be removed"]
    # attributed to the importing line, not to the import machinery (so default filters show it)
    assert out["filename"] == [script]
    assert out["spec_is_kept"] and out["spec_name"] == new and out["loader_is_kept"] and out["name"] == new
    assert out["reloaded_under"] == new and out["reload_ran_the_module"]
    assert out["second_import_warnings"] == 0


@pytest.mark.slow
def test_every_old_path_imports_as_its_new_module(shim_checks):
    results = shim_checks[0]
    assert results["every"] == {}
    assert results["every_checked"] == sorted(_MOVED)  # each old path was imported by one of the checks


def test_from_gapo_import_old_name_and_unknown_paths(shim_checks):
    results = shim_checks[0]
    assert results["from_gapo"] == {
        "warned": "gapo.losses moved to gapo.core.losses; the old path will be removed",
        "same": True,
    }
    assert results["missing"] == "gapo.no_such_module"
