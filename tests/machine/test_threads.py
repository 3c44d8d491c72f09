"""The CPU thread default (gapo.machine.threads): overrides, the probe, the per-machine cache."""

import json

import pytest
import torch

from gapo.machine import threads


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("GAPO_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("GAPO_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "_cores", lambda: 4)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    return tmp_path


def test_environment_overrides(clean_env, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    monkeypatch.setenv("GAPO_THREADS", "2")  # gapo's own variable first
    assert threads.default_threads() == 2
    monkeypatch.setenv("GAPO_THREADS", "0")
    with pytest.raises(ValueError, match="GAPO_THREADS"):
        threads.default_threads()
    assert not (clean_env / "threads.json").exists()  # no probe, nothing cached


def test_probe_restores_threads_and_picks_a_candidate():
    before = torch.get_num_threads()
    # the fewest real runs (a warm-up and one timed run per count): on a busy machine each run at
    # 2 threads costs ~30x its 1-thread CPU (the second thread spin-waits for a core)
    res = threads.probe([1, 2], rounds=1, repeats=1)
    assert torch.get_num_threads() == before
    assert res["threads"] in (1, 2) and set(res["seconds"]) == {1, 2}


def test_more_threads_only_when_clearly_faster_in_every_round(monkeypatch):
    class Clock:  # perf_counter advancing by what the fake workload "took"
        t = 0.0

    def workload(times):
        it = iter(times)

        def run():
            Clock.t += next(it)

        return run

    monkeypatch.setattr(threads.time, "perf_counter", lambda: Clock.t)
    # round 1: 2 threads 30% faster; round 2: only 10% faster -> stay at 1
    seq = [1.0] * 2 + [0.7] * 2 + [1.0] * 2 + [0.9] * 2  # (warm-up + 1 repeat) per count and round
    monkeypatch.setattr(threads, "_workload", lambda reps=4: workload(seq))
    assert threads.probe([1, 2], rounds=2, repeats=1)["threads"] == 1
    seq = [1.0] * 2 + [0.7] * 2 + [1.0] * 2 + [0.6] * 2
    monkeypatch.setattr(threads, "_workload", lambda reps=4: workload(seq))
    assert threads.probe([1, 2], rounds=2, repeats=1)["threads"] == 2


def test_probe_result_cached_per_machine(clean_env, monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "probe", lambda: calls.append(1) or {"threads": 2, "seconds": {1: [1.0], 2: [0.5]}})
    assert threads.default_threads() == 2
    assert threads.default_threads() == 2
    assert len(calls) == 1
    table = json.loads((clean_env / "threads.json").read_text())
    ((key, entry),) = table.items()
    assert key == threads._key() and entry["threads"] == 2
    monkeypatch.setattr(threads, "_cores", lambda: 1)  # one usable core: no probe at all
    assert threads.default_threads() == 1 and len(calls) == 1


def test_cached_count_capped_by_idle_cores(clean_env, monkeypatch):
    monkeypatch.setattr(threads, "probe", lambda: {"threads": 4, "seconds": {1: [1.0], 4: [0.3]}})
    assert threads.default_threads() == 4
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.2, 0.0, 0.0))  # 1.8 cores idle
    assert threads.default_threads() == 2
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (6.0, 0.0, 0.0))  # overloaded: one thread
    assert threads.default_threads() == 1
    assert json.loads((clean_env / "threads.json").read_text())[threads._key()]["threads"] == 4  # cache unchanged


def test_probe_leaves_the_global_random_stream_alone():
    state = torch.get_rng_state()
    threads.probe([1], rounds=1, repeats=1)
    assert torch.equal(torch.get_rng_state(), state)
