import os

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


# ---------------------------------------------------------------- parallel runs (pytest-xdist)
# `./run test` runs the suite on one worker per CPU (`-n N --dist loadgroup`). Two rules keep that
# both correct and worth it:
# - a module-scoped fixture is built once per worker that runs a test using it, so the tests that use
#   one are kept on one worker (an ``xdist_group`` per module), rather than building it twice;
# - the expensive tests start first: the suite ends when its last test does, and a minute-long test
#   started last leaves the other worker idle meanwhile. Expensive = marked ``slow``, then the
#   durations of the previous run (kept in pytest's cache, when there is one), longest first.
DURATIONS_KEY = "gapo/test-durations"


def _xdist_active(config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no"


def _group(item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        if defs and defs[-1].scope in ("class", "module", "package"):
            return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    if not _xdist_active(config):
        return
    for item in items:
        if (g := _group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(g))
    cache = getattr(config, "cache", None)
    last = cache.get(DURATIONS_KEY, {}) if cache is not None else {}
    # a group runs as one unit, from the place of its first test: rank it by its total
    cost: dict[str, float] = {}
    for item in items:
        key = _group(item) or item.nodeid
        cost[key] = cost.get(key, 0.0) + float(last.get(item.nodeid, 0.0))
        if item.get_closest_marker("slow") is not None:
            cost[key] += 1e6
    # stable: without marks or durations, the collection order stands
    items.sort(key=lambda it: -cost[_group(it) or it.nodeid])


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown") and not report.skipped:
        nodeid, at, group = report.nodeid.rpartition("@")  # xdist appends "@<group>" to a grouped test's id
        nodeid = nodeid if at and group.endswith(".py") else report.nodeid
        _durations[nodeid] = _durations.get(nodeid, 0.0) + report.duration


_durations: dict[str, float] = {}


def pytest_sessionfinish(session):
    # the controller (or a run without workers) sees every test's report; workers keep nothing
    cache = getattr(session.config, "cache", None)
    if hasattr(session.config, "workerinput") or cache is None or not _durations:
        return
    kept = cache.get(DURATIONS_KEY, {})
    kept.update({k: round(v, 3) for k, v in _durations.items()})
    cache.set(DURATIONS_KEY, kept)
