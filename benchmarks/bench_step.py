"""One RL step of gapo's Trainer against TRL's GRPOTrainer, side by side on the same work.

    python benchmarks/bench_step.py [--reps 3 --steps 5 --threads 1 2 --mu 1 2]

Same work for both systems (the setup of ``bench_trl_step.py``): a 1.06M-parameter Qwen2
(hidden 128, intermediate 512, 4 layers, 4 heads, untied head), the same random weights
(``torch.manual_seed(0)``), the 22-token character tokenizer, the 64 prompts ``a+b=`` of
``bench_trl_step._prompts`` (8 drawn per step, each with ``<bos>``), 8 prompts × 8 generations,
temperature 1, at most 16 completion tokens, stop after the first EOS (which is a response
token, as in TRL), reward ``"1" in completion``, group-normalised (GRPO) advantages,
token-level clipped loss (ε = 0.2) with token-mean aggregation, no KL, AdamW lr 1e-5, grad
clip 1.0, fp32.

Optimiser steps per rollout batch (``--mu``). TRL: ``num_iterations = μ`` with
``per_device_train_batch_size = 64``, ``steps_per_generation = 1`` and
``gradient_accumulation_steps = 1``, i.e. μ optimiser steps, each on the whole batch of 64
completions. gapo: ``train.mini_batches = 1``, ``train.epochs = μ`` — the same μ full-batch
optimiser steps. Both compute behaviour log-probs only where they are needed: TRL takes
``logp.detach()`` when μ = 1 and runs a separate forward when μ > 1; gapo always reuses its
first update's forward for the first mini-batch (exact: same parameters, same rows, see
``Trainer.train_step``) and recomputes the rest (none here). gapo's sampler and log-prob
passes also compute each group's shared prompt once (``gapo.policy.fast_lm._FastLM``); the
results are the same as the model's own forward (tests/test_sampling.py). gapo runs GAPO's adaptive schedule
(``eps_schedule=linear``, ε_high_max = 0.28), so its step includes the adaptive threshold;
TRL runs its fixed ε = 0.2 (the bounds do not change the work).

Protocol: for each repetition, μ and thread count, a fresh gapo process and a fresh TRL process
(order alternating between repetitions) each run 1 warm-up step and ``--steps`` measured steps
and report their median step time (wall clock from the end of one step to the end of the next,
everything the training loop does included), median process CPU time per step, completion
tokens per second and peak RSS (``ru_maxrss`` of that process: imports, model, optimiser and
activations). Thread counts are set explicitly (``torch.set_num_threads`` and
``OMP_NUM_THREADS``). Reported: the median over repetitions of each figure, each system at its
best thread count (lowest median step time), and gapo/TRL ratios. The last line,
``ratio step_time=<gapo/trl> peak_rss=<gapo/trl>``, takes the larger (worse) step-time ratio
over the μ values measured and the larger peak-RSS ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_trl_step import ALPHABET, _prompts  # noqa: E402  (no heavy imports at module level)


class BenchTask:
    """The TRL benchmark's prompts and reward as a gapo task (registered as ``bench``)."""

    name = "bench"
    alphabet = ALPHABET
    max_completion_len = 15

    def __init__(self, **_):
        from gapo.tasks.base import Problem

        self._problems = [Problem(d["prompt"], None) for d in _prompts(64)]

    def generate(self, split, n, seed):
        return [self._problems[i % len(self._problems)] for i in range(n)]

    def score(self, problem, completion):
        return float("1" in completion)

    def parse_ok(self, completion):
        return True

    def first_move(self, completion):
        return completion[:1] or None

    def demonstration(self, problem, rng):  # pragma: no cover - not used
        return "1"


def make_policy(path: str, seed: int = 0) -> None:
    """Save the benchmark's Qwen2 + character tokenizer (``bench_trl_step.build_policy``)."""
    from bench_trl_step import build_policy

    from gapo.policy.model import save_policy

    save_policy(*build_policy(seed), path)


def run_gapo(policy: str, n_steps: int, threads: int, mu: int, *, warmup: int = 1, seed: int = 0,
             extra: list[str] | None = None) -> dict:
    """Time ``n_steps`` gapo steps (after ``warmup``) on the benchmark's work; returns a dict."""
    if n_steps < 1 or warmup < 0:
        raise ValueError(f"need n_steps >= 1 and warmup >= 0, got n_steps={n_steps}, warmup={warmup}")
    from gapo import tasks

    tasks.register("bench", f"{BenchTask.__module__}:BenchTask")
    from gapo.rl.config import load_config
    from gapo.rl.trainer import Trainer

    cfg = load_config(None, [
        f"model.path={policy}", f"model.threads={threads}", "task.name=bench", "task.train_size=64",
        "train.prompts=8", "train.group_size=8", "train.mini_batches=1", f"train.epochs={mu}",
        f"train.seed={seed}", "train.progress=false", "train.checkpoint_every=0", "eval.problems=0",
        "sampling.max_new_tokens=16", "sampling.temperature=1.0", "algo.loss=ppo", "algo.advantage=grpo",
        "algo.eps_schedule=linear", "algo.eps_low=0.2", "algo.eps_high_max=0.28", "algo.agg=token-mean",
        "algo.kl_coef=0", "optim.lr=1e-5", "optim.grad_clip=1.0", *(extra or []),
    ])
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, Path(tmp) / "run")
        import torch
        n_params = sum(p.numel() for p in tr.model.parameters())
        recs, ends, cpus = [], [time.perf_counter()], [time.process_time()]
        t_start = time.perf_counter()
        for _ in range(warmup + n_steps):
            rec = tr.train_step()
            tr.log(rec)
            recs.append(rec)
            ends.append(time.perf_counter())
            cpus.append(time.process_time())
        wall = time.perf_counter() - t_start
    step_s = [ends[i + 1] - ends[i] for i in range(warmup, warmup + n_steps)]
    cpu_s = [cpus[i + 1] - cpus[i] for i in range(warmup, warmup + n_steps)]
    toks = [r["rollout/response_len"] * 64 for r in recs[warmup:]]
    parts = {k: statistics.median(r[k] for r in recs[warmup:])
             for k in ("time/sample_s", "time/score_s", "time/update_s")}
    return {
        "engine": "gapo", "threads": threads, "num_iterations": mu, "n_steps": n_steps, "n_params": n_params,
        "torch_threads": torch.get_num_threads(),
        "step_s_median": statistics.median(step_s), "step_s": step_s, "cpu_s_median": statistics.median(cpu_s),
        "gen_s_median": parts["time/sample_s"], "score_s_median": parts["time/score_s"],
        "update_s_median": parts["time/update_s"],
        "completion_tokens_per_step": statistics.median(toks),
        "completion_tokens_per_s": statistics.median(t / s for t, s in zip(toks, step_s)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": wall,
    }


def _child(system: str, policy: str, steps: int, threads: int, mu: int, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--one", system, "--policy", policy, "--steps", str(steps),
           "--threads", str(threads), "--mu", str(mu)] + [f"--extra={e}" for e in extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{system} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="fresh process pairs per configuration")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per process (after 1 warm-up)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mu", type=int, nargs="+", default=[1, 2], help="optimiser steps per rollout batch")
    ap.add_argument("--systems", nargs="+", default=["gapo", "trl"], choices=["gapo", "trl"])
    ap.add_argument("--extra", action="append", default=[], help="extra gapo config override (repeatable)")
    ap.add_argument("--json", help="also write every child's result here")
    ap.add_argument("--one", choices=["gapo", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--make-policy", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_policy:
        make_policy(a.make_policy)
        return
    if a.one:
        th, mu = a.threads[0], a.mu[0]
        if a.one == "gapo":
            r = run_gapo(a.policy, a.steps, th, mu, extra=a.extra)
        else:
            from bench_trl_step import run_trl
            r = run_trl(a.steps, th, mu)
        print(json.dumps(r))
        return

    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        policy = str(Path(tmp) / "policy")
        subprocess.run([sys.executable, __file__, "--make-policy", policy], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(f"{'rep':>3} {'system':>6} {'mu':>2} {'thr':>3} {'step_s':>7} {'cpu_s':>6} {'gen_s':>6} "
              f"{'tok/step':>8} {'tok/s':>6} {'rss_MB':>6}", flush=True)
        for rep in range(a.reps):
            for mu in a.mu:
                for th in a.threads:
                    order = a.systems if rep % 2 == 0 else a.systems[::-1]
                    for system in order:
                        r = _child(system, policy, a.steps, th, mu, a.extra)
                        r.update(system=system, rep=rep)
                        results.append(r)
                        print(f"{rep:>3} {system:>6} {mu:>2} {th:>3} {r['step_s_median']:>7.3f} "
                              f"{r['cpu_s_median']:>6.3f} {r['gen_s_median']:>6.3f} "
                              f"{r['completion_tokens_per_step']:>8.0f} {r['completion_tokens_per_s']:>6.0f} "
                              f"{r['peak_rss_mb']:>6.0f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))

    med = statistics.median

    def summary(system, mu, th):
        rs = [r for r in results if r["system"] == system and r["num_iterations"] == mu and r["threads"] == th]
        return {k: med(r[k] for r in rs) for k in ("step_s_median", "cpu_s_median", "gen_s_median",
                                                   "completion_tokens_per_s", "peak_rss_mb")}

    print("\nmedians over repetitions")
    print(f"{'system':>6} {'mu':>2} {'thr':>3} {'step_s':>7} {'cpu_s':>6} {'gen_s':>6} {'tok/s':>6} {'rss_MB':>6}")
    best: dict = {}
    for mu in a.mu:
        for system in a.systems:
            for th in a.threads:
                s = summary(system, mu, th)
                print(f"{system:>6} {mu:>2} {th:>3} {s['step_s_median']:>7.3f} {s['cpu_s_median']:>6.3f} "
                      f"{s['gen_s_median']:>6.3f} {s['completion_tokens_per_s']:>6.0f} {s['peak_rss_mb']:>6.0f}")
                if (system, mu) not in best or s["step_s_median"] < best[system, mu][1]["step_s_median"]:
                    best[system, mu] = (th, s)
    if set(a.systems) != {"gapo", "trl"}:
        return
    print("\neach system at its best thread count")
    worst_t = worst_r = 0.0
    for mu in a.mu:
        (tg, g), (tt, t) = best["gapo", mu], best["trl", mu]
        rt, rr = g["step_s_median"] / t["step_s_median"], g["peak_rss_mb"] / t["peak_rss_mb"]
        # paired: the same repetition's processes ran back to back
        paired = med(
            x["step_s_median"] / y["step_s_median"]
            for x in results if x["system"] == "gapo" and x["num_iterations"] == mu and x["threads"] == tg
            for y in results if y["system"] == "trl" and y["num_iterations"] == mu and y["threads"] == tt
            and y["rep"] == x["rep"])
        rc = g["cpu_s_median"] / t["cpu_s_median"]
        print(f"mu={mu}: gapo {g['step_s_median']:.3f} s/step ({tg} thr, {g['completion_tokens_per_s']:.0f} tok/s, "
              f"{g['peak_rss_mb']:.0f} MB) | trl {t['step_s_median']:.3f} s/step ({tt} thr, "
              f"{t['completion_tokens_per_s']:.0f} tok/s, {t['peak_rss_mb']:.0f} MB) | step_time {rt:.3f} "
              f"(paired median {paired:.3f}, cpu {rc:.3f}) peak_rss {rr:.3f}")
        worst_t, worst_r = max(worst_t, rt), max(worst_r, rr)
    print(f"ratio step_time={worst_t:.3f} peak_rss={worst_r:.3f}")


if __name__ == "__main__":
    main()
