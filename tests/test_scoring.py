"""score_batch / ScoringPool / submit_batch: pool == serial, timeouts, crashes, bad rewards."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from gapo.scoring import ScoringPool, VerifierTimeout, run_with_timeout, score_batch, submit_batch
from gapo.tasks.base import Problem

FIX = Path(__file__).parent / "fixtures"


class ToyTask:
    """Reward = float(completion) if it is a number; special completions misbehave.

    Module-level so that spawn workers can unpickle it (pytest puts tests/ on sys.path).
    """

    name = "toy"

    def parse_ok(self, completion):
        try:
            float(completion)
            return True
        except ValueError:
            return completion in ("sleep", "block", "crash", "raise")

    def score(self, problem, completion):
        if completion == "sleep":  # interruptible: the soft alarm catches it
            time.sleep(30)
        if completion == "block":  # immune to SIGALRM: only the parent's hard kill stops it
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(30)
        if completion == "crash":
            os._exit(3)
        if completion == "raise":
            raise KeyError("boom")
        try:
            return float(completion)
        except ValueError:
            return 0.0


P = Problem(prompt="toy prompt", answer=None)


@pytest.fixture(scope="module")
def pool():
    with ScoringPool(2, timeout_s=5.0) as p:
        yield p


def test_serial_stats_and_unparsable():
    rewards, stats = score_batch(ToyTask(), [P] * 4, ["1", "0", "zzz", "0.5"])
    assert rewards == [1.0, 0.0, 0.0, 0.5]
    assert stats["reward/n"] == 4 and stats["reward/mean"] == pytest.approx(0.375)
    assert stats["reward/n_unparsable"] == 1 and stats["reward/unparsable_frac"] == 0.25
    assert stats["reward/timeout_frac"] == 0.0 and stats["time/score_s"] >= 0.0


def test_nan_inf_rewards_name_task_and_problem(pool):
    with pytest.raises(ValueError, match=r"task 'toy' returned reward nan for problem 1 \(prompt 'toy prompt'\)"):
        score_batch(ToyTask(), [P] * 2, ["1", "nan"])
    with pytest.raises(ValueError, match="reward inf for problem 0"):
        pool.score(ToyTask(), [P], ["inf"])


def test_task_exception_propagates_with_context(pool):
    with pytest.raises(RuntimeError, match="task 'toy' raised KeyError while scoring problem 1"):
        score_batch(ToyTask(), [P] * 2, ["1", "raise"])
    with pytest.raises(RuntimeError, match="task 'toy' raised KeyError while scoring problem 0"):
        pool.score(ToyTask(), [P], ["raise"])


def test_length_mismatch():
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        score_batch(ToyTask(), [P, P], ["1"])
    with pytest.raises(ValueError, match="workers"):
        score_batch(ToyTask(), [P], ["1"], workers=-1)


def test_serial_timeout_main_thread():
    t0 = time.perf_counter()
    rewards, stats = score_batch(ToyTask(), [P] * 3, ["1", "sleep", "1"], timeout_s=0.3)
    assert rewards == [1.0, 0.0, 1.0] and stats["reward/n_timeout"] == 1
    assert time.perf_counter() - t0 < 3.0


def test_pool_soft_timeout_hard_kill_and_crash(pool):
    t0 = time.perf_counter()
    comps = ["1", "sleep", "block", "crash", "0.25", "1"]
    rewards, stats = pool.score(ToyTask(), [P] * len(comps), comps, timeout_s=0.5)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.25, 1.0]
    assert stats["reward/n_timeout"] == 2 and stats["reward/n_error"] == 1
    assert time.perf_counter() - t0 < 20.0  # two replacements (spawn) on a loaded machine
    # replaced workers keep serving
    assert pool.score(ToyTask(), [P] * 3, ["1", "0", "1"])[0] == [1.0, 0.0, 1.0]


def test_run_with_timeout_modes():
    assert run_with_timeout(sum, [1, 2], timeout_s=1.0) == 3
    with pytest.raises(VerifierTimeout):
        run_with_timeout(time.sleep, 5, timeout_s=0.2, mode="signal")
    # nested guards: the inner, shorter one fires and the outer stays armed
    with pytest.raises(VerifierTimeout):
        run_with_timeout(lambda: run_with_timeout(time.sleep, 5, timeout_s=0.2), timeout_s=5.0)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with pytest.raises(ValueError, match="mode"):
        run_with_timeout(sum, [1], timeout_s=1.0, mode="threads")


@pytest.fixture(scope="module")
def math_batch():
    pytest.importorskip("math_verify")
    from gapo.tasks.math import MathTask

    task = MathTask(FIX / "math_competition.jsonl", eval_frac=0.0, timeout_s=2.0)
    problems = task.generate("train", 6, 0)
    comps = []
    for i, p in enumerate(problems):
        comps += [task.demonstration(p), "\\boxed{0.5}", "no answer here", f"<answer>{i}</answer>"]
    return task, [p for p in problems for _ in range(4)], comps


def test_pool_equals_serial_math(pool, math_batch):
    task, problems, comps = math_batch
    serial, s_stats = score_batch(task, problems, comps)
    pooled, p_stats = pool.score(task, problems, comps)
    assert pooled == serial
    assert score_batch(task, problems, comps, workers=1)[0] == serial  # the shared pool
    assert serial.count(1.0) == 6 + 1  # six demonstrations and 0.5 == \frac{1}{2}
    for key in ("reward/mean", "reward/n_unparsable", "reward/n_timeout"):
        assert p_stats[key] == s_stats[key]
    assert s_stats["reward/n_unparsable"] == 6


def test_async_forms(pool, math_batch):
    task, problems, comps = math_batch
    serial, _ = score_batch(task, problems, comps)
    fut = pool.submit(task, problems, comps)
    fut_serial = submit_batch(task, problems, comps)  # background thread: task guards itself
    assert fut.result(timeout=60)[0] == serial
    assert fut_serial.result(timeout=60)[0] == serial
    assert threading.current_thread() is threading.main_thread()
