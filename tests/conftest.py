import functools
import json
import os
import re
from pathlib import Path

import pytest

TASK = dict(n_numbers=2, num_range=(1, 10))
# an easy supervised base: 2-number Countdown over 1-10, 150 SFT steps of a micro Llama (~5 s);
# measured base pass@1 ≈ 0.35 on held-out instances (a gapo.policy.pretrain.PretrainConfig)
EASY = dict(
    name="test-easy",
    sft_mix=((TASK, 1.0),),
    rl_task=TASK,
    model_preset="micro",
    pool_size=300,
    batch_size=32,
    max_steps=150,
    time_budget_s=None,
    lr=1e-2,
    warmup_steps=10,
)


def pytest_configure(config):
    # the xdist controller runs no test: it need not pay for torch and transformers (seconds of CPU);
    # gapo is imported in the fixtures for the same reason
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch

    # One thread was measured faster than two on the 2-core machines this project is built on.
    torch.set_num_threads(int(os.environ.get("GAPO_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def easy_policy(tmp_path_factory):
    """A small Countdown policy built once per session (in a private GAPO_CACHE)."""
    from gapo.policy.base_policy import get_base_policy
    from gapo.policy.pretrain import PretrainConfig

    os.environ["GAPO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return str(get_base_policy(PretrainConfig(**EASY), progress=False))


@pytest.fixture(scope="session")
def finished_run(easy_policy, tmp_path_factory):
    """A finished 2-step run of ``easy_policy`` (tests/checkpoints.py's ``train_run``), trained once per
    session for the tests that read it (tests/rl/test_run_dir.py and test_run_lock.py copy it first)."""
    from checkpoints import train_run

    run = tmp_path_factory.mktemp("runs") / "done"
    assert train_run(run, easy_policy, "train.steps=2") == 0
    return run


# ---------------------------------------------------------------- parallel runs (pytest-xdist)
# `./run test` runs the suite on one worker per CPU (`-n N --dist loadgroup`). Two rules keep that
# both correct and worth it:
# - a module-scoped fixture is built once per worker that runs a test using it, so a test file that
#   defines one (or a class- or package-scoped one) runs whole on one worker, rather than building
#   it twice. The unit is decided from the file's text, identically in the controller (which
#   schedules, from node ids alone) and in the workers (which order the tests): xdist's own
#   ``xdist_group`` marks do not reach the scheduler under pytest 9.2 (xdist 3.8 renames node ids
#   through an attribute that pytest no longer reads);
# - the expensive units start first: the suite ends when its last test does, and a minute-long test
#   started last leaves the other worker idle meanwhile. Expensive = marked ``slow``, then the
#   durations of the previous run (kept in pytest's cache, when there is one), longest first. A
#   fresh clone has no cache: it falls back on tests/durations.json, the durations of the tests that
#   took over half a second in a reference run (rewritten by ``./run test --write-durations``; a
#   stale or missing entry only changes the order, never what runs).
DURATIONS_KEY = "gapo/test-durations"
DURATIONS_FILE = Path(__file__).with_name("durations.json")
DURATIONS_MIN_S = 0.5
_WIDE_FIXTURE = re.compile(r"""scope\s*=\s*["'](?:class|module|package)["']""")


@functools.cache
def _whole_file(rootdir: str, path: str) -> bool:
    try:
        return bool(_WIDE_FIXTURE.search((Path(rootdir) / path).read_text(encoding="utf-8")))
    except OSError:
        return False


def _unit(rootdir, nodeid: str) -> str:
    """The scheduling unit of a test: its file if the file has a module-scoped fixture, else itself."""
    path = nodeid.split("::", 1)[0]
    return path if _whole_file(str(rootdir), path) else nodeid


@pytest.hookimpl(tryfirst=True)  # before xdist's own scheduler for --dist loadgroup
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTest(LoadScopeScheduling):
        """LoadScope's dynamic hand-out (a worker gets the next unit when it has two tests left),
        with :func:`_unit` as the unit and the workers' collection order kept."""

        def _split_scope(self, nodeid):
            return _unit(config.rootpath, nodeid)

    config.option.loadscopereorder = False  # the order of the collection (below) is the order wanted
    return FileOrTest(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only xdist's workers collect for the scheduler
        return
    cache = getattr(config, "cache", None)
    last = {**_committed_durations(), **(cache.get(DURATIONS_KEY, {}) if cache is not None else {})}
    # a unit runs whole, from the place of its first test: rank it by (any test marked slow, total)
    slow: dict[str, bool] = {}
    total: dict[str, float] = {}
    for item in items:
        key = _unit(config.rootpath, item.nodeid)
        total[key] = total.get(key, 0.0) + float(last.get(item.nodeid, 0.0))
        slow[key] = slow.get(key, False) or item.get_closest_marker("slow") is not None

    def rank(item):
        key = _unit(config.rootpath, item.nodeid)
        return not slow[key], -total[key]

    items.sort(key=rank)  # stable: without marks or durations, the collection order stands


def pytest_addoption(parser):
    parser.addoption(
        "--write-durations",
        action="store_true",
        help=f"write the durations of this run's tests that took over {DURATIONS_MIN_S} s to tests/durations.json "
        "(the order a fresh clone schedules the suite in)",
    )


def _committed_durations() -> dict[str, float]:
    try:
        return dict(json.loads(DURATIONS_FILE.read_text(encoding="utf-8"))["durations"])
    except (OSError, ValueError, KeyError, TypeError):  # missing or malformed: collection order stands
        return {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown") and not report.skipped:
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


_durations: dict[str, float] = {}


def pytest_sessionfinish(session):
    # the controller (or a run without workers) sees every test's report; workers keep nothing
    cache = getattr(session.config, "cache", None)
    if hasattr(session.config, "workerinput") or cache is None or not _durations:
        return
    kept = cache.get(DURATIONS_KEY, {})
    kept.update({k: round(v, 3) for k, v in _durations.items()})
    cache.set(DURATIONS_KEY, kept)
    if session.config.getoption("write_durations"):
        long = {k: round(v, 1) for k, v in sorted(_durations.items()) if v > DURATIONS_MIN_S}
        about = "seconds per test (setup + call + teardown) of one ./run test; only the order of a fresh clone's run"
        DURATIONS_FILE.write_text(json.dumps({"about": about, "durations": long}, indent=0) + "\n", encoding="utf-8")
