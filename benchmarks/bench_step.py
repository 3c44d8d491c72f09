"""One RL step of gapo's Trainer against TRL's GRPOTrainer, side by side on the same work.

    python benchmarks/bench_step.py [--reps 3 --steps 5 --threads 1 --mu 1 2 --big-reps 3 --configs tiny big]

Two configurations, each run interleaved: the *tiny* one below (per-call overhead dominates) and
a *compute-bound* one (``--big-*``): the Qwen2 shape ``30m`` of ``bench_trl_step.SHAPES``
(hidden 512, intermediate 1024, 8 layers, 8 heads with 2 key/value heads, tied embeddings, a
32000-token vocabulary: the character tokenizer plus single CJK/Hangul characters; 34.2M
parameters), 8 × 8 rollouts of 128 completion tokens, μ = 1, the reward the parity of the
completion's code points (≈ 50% success; digits are rare with 32000 tokens). EOS stays a normal
token in both systems (stop after EOS as in the tiny one); the random model samples it with
p ≈ 1/32000 per token, so almost every completion runs to 128 tokens (the tokens per step are
reported). Each compute-bound repetition first measures this machine's fp32 GEMM rate at the
same thread count (``gemm_rate``: 2048 × 2048 products by default (``--gemm-n``), median of 7) and reports each system's
achieved FLOP/s of the step and of its update phase as a fraction of the median rate, counted
by ``bench_trl_step.flops_per_step`` (nominal work: 2·N per prompt and generated token of
sampling, 6·N per trained token, plus attention). One compute-bound step takes about a minute
per system on one core, so by default each process runs 1 step without a warm-up (its one-off
costs are below 1% of such a step).

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
optimiser steps; each one's forward/backward runs as gapo's default ``train.micro_batch_size=auto``
chooses (the tiny size in one piece, the compute-bound one in 4 micro-batches of 16 rows, whose
float32 logits stay within 256 MiB; the same gradient up to rounding). Both compute behaviour
log-probs only where they are needed: TRL takes ``logp.detach()`` when μ = 1 and runs a separate
forward when μ > 1; gapo always reuses its first update's forward for the first mini-batch (exact:
same parameters, same rows, see ``Trainer.train_step``) and recomputes the rest (none here). gapo's
sampler and log-prob passes also compute each group's shared prompt once
(``gapo.policy.fast_lm.FastLM``); the results are the same as the model's own forward
(tests/test_sampling.py). gapo runs GAPO's adaptive schedule (``eps_schedule=linear``, ε_high_max =
0.28), so its step includes the adaptive threshold; TRL runs its fixed ε = 0.2 (the bounds do not
change the work).

Protocol: for each repetition, μ and thread count, a fresh gapo process and a fresh TRL process
(order alternating between repetitions) each run 1 warm-up step and ``--steps`` measured steps
and report their median step time (wall clock from the end of one step to the end of the next,
everything the training loop does included), median process CPU time per step, completion
tokens per second and peak RSS (``ru_maxrss`` of that process: imports, model, optimiser and
activations). Thread counts are set explicitly (``torch.set_num_threads`` and
``OMP_NUM_THREADS``). Reported: the median over repetitions of each figure, each system at its
best thread count (lowest median step time), and gapo/TRL ratios. The last line,
``ratio step_time=<gapo/trl> peak_rss=<gapo/trl> big_step_time=… big_peak_rss=… big_limit_frac=…``,
takes for the tiny size the larger (worse) step-time ratio over the μ values measured and the
larger peak-RSS ratio, then the compute-bound size's ratios and gapo's step FLOP/s as a
fraction of the GEMM rate (``nan`` for a configuration not run).
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
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_trl_step import ALPHABET, SHAPES, _prompts, flops_per_step, reward_fn  # noqa: E402  (no heavy imports)


@dataclass(frozen=True)
class Work:
    """What one process times: ``steps`` measured steps after ``warmup`` warm-up steps, on the
    policy of ``shape`` (``bench_trl_step.SHAPES``) with at most ``max_tokens`` completion tokens."""

    steps: int
    warmup: int = 1
    shape: str = "tiny"
    max_tokens: int = 16


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

    shape = "tiny"

    def score(self, problem, completion):
        return reward_fn(self.shape)(completion)

    def parse_ok(self, completion):
        return True

    def first_move(self, completion):
        return completion[:1] or None

    def demonstration(self, problem, rng):  # pragma: no cover - not used
        return "1"


class BenchParityTask(BenchTask):
    """The large-vocabulary shapes' reward (``bench_trl_step.reward_fn``), registered as ``bench_parity``."""

    name = "bench_parity"
    shape = "30m"


def make_policy(path: str, seed: int = 0, shape: str = "tiny") -> None:
    """Save the benchmark's Qwen2 + character tokenizer (``bench_trl_step.build_policy``)."""
    from bench_trl_step import build_policy
    from gapo.policy.model import save_policy

    save_policy(*build_policy(seed, shape), path)


def gemm_rate(threads: int, n: int = 2048, reps: int = 7) -> dict:
    """This machine's fp32 matrix-multiply rate at ``threads``: median FLOP/s of ``reps`` products of
    two (n, n) matrices (after one warm-up), 2·n³ FLOPs each."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        ts.append(time.perf_counter() - t0)
    return {
        "engine": "gemm",
        "threads": threads,
        "n": n,
        "flops_per_s": 2 * n**3 / statistics.median(ts),
        "best_flops_per_s": 2 * n**3 / min(ts),
    }


def run_gapo(policy: str, work: Work, threads: int, mu: int, *, seed: int = 0, extra: list[str] | None = None) -> dict:
    """Time ``work.steps`` gapo steps (after ``work.warmup``) on the benchmark's work; returns a dict."""
    n_steps, warmup, shape, max_tokens = work.steps, work.warmup, work.shape, work.max_tokens
    if n_steps < 1 or warmup < 0:
        raise ValueError(f"need n_steps >= 1 and warmup >= 0, got n_steps={n_steps}, warmup={warmup}")
    from gapo import tasks

    tasks.register("bench", f"{BenchTask.__module__}:BenchTask")
    tasks.register("bench_parity", f"{BenchTask.__module__}:BenchParityTask")
    task = "bench" if shape == "tiny" else "bench_parity"
    from gapo.rl.config import load_config
    from gapo.rl.trainer import Trainer

    cfg = load_config(
        None,
        [
            f"model.path={policy}",
            f"model.threads={threads}",
            f"task.name={task}",
            "task.train_size=64",
            "train.prompts=8",
            "train.group_size=8",
            "train.mini_batches=1",
            f"train.epochs={mu}",
            f"train.seed={seed}",
            "train.progress=false",
            "train.checkpoint_every=0",
            "eval.problems=0",
            f"sampling.max_new_tokens={max_tokens}",
            "sampling.temperature=1.0",
            "algo.loss=ppo",
            "algo.advantage=grpo",
            "algo.eps_schedule=linear",
            "algo.eps_low=0.2",
            "algo.eps_high_max=0.28",
            "algo.agg=token-mean",
            "algo.kl_coef=0",
            "optim.lr=1e-5",
            "optim.grad_clip=1.0",
            *(extra or []),
        ],
    )
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, Path(tmp) / "run")
        import torch

        n_params = sum(p.numel() for p in tr.model.parameters())
        recs, ends, cpus = [], [time.perf_counter()], [time.process_time()]
        t_start = time.perf_counter()
        for _ in range(warmup + n_steps):
            rec = tr.train_step()
            tr.folder.append_metrics(rec)  # as fit() logs a step (no tracker is on here)
            recs.append(rec)
            ends.append(time.perf_counter())
            cpus.append(time.process_time())
        wall = time.perf_counter() - t_start
    step_s = [ends[i + 1] - ends[i] for i in range(warmup, warmup + n_steps)]
    cpu_s = [cpus[i + 1] - cpus[i] for i in range(warmup, warmup + n_steps)]
    toks = [r["rollout/response_len"] * 64 for r in recs[warmup:]]
    parts = {
        k: statistics.median(r[k] for r in recs[warmup:]) for k in ("time/sample_s", "time/score_s", "time/update_s")
    }
    return {
        "engine": "gapo",
        "threads": threads,
        "num_iterations": mu,
        "n_steps": n_steps,
        "n_params": n_params,
        "shape": shape,
        "max_tokens": max_tokens,
        "torch_threads": torch.get_num_threads(),
        "step_s_median": statistics.median(step_s),
        "step_s": step_s,
        "cpu_s_median": statistics.median(cpu_s),
        "gen_s_median": parts["time/sample_s"],
        "score_s_median": parts["time/score_s"],
        "update_s_median": parts["time/update_s"],
        "completion_tokens_per_step": statistics.median(toks),
        "completion_tokens_per_s": statistics.median(t / s for t, s in zip(toks, step_s)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": wall,
    }


PROMPT_LEN = 7  # <bos> + "ab+cd=": every prompt of bench_trl_step._prompts


BEFORE_ENV = "GAPO_BENCH_BEFORE_SRC"


def _child(
    system: str,
    policy: str,
    work: Work,
    threads: int,
    mu: int,
    extra: list[str],
    *,
    gemm_n: int = 2048,
) -> dict:
    # "before": gapo from another checkout's src/ (``--before``, passed on in BEFORE_ENV), for a
    # before/after comparison in one interleaved run
    cmd = [
        sys.executable,
        __file__,
        "--one",
        "gapo" if system == "before" else system,
        "--policy",
        policy,
        "--steps",
        str(work.steps),
        "--threads",
        str(threads),
        "--mu",
        str(mu),
        "--shape",
        work.shape,
        "--max-tokens",
        str(work.max_tokens),
        "--warmup",
        str(work.warmup),
        "--gemm-n",
        str(gemm_n),
    ] + [f"--extra={e}" for e in extra]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if system == "before":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ[BEFORE_ENV], os.environ.get("PYTHONPATH")]))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{system} child failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if system != "gemm":
        r.update(flops_per_step(work.shape, r["n_params"], PROMPT_LEN, r["completion_tokens_per_step"], mu=mu))
    return r


def _policies(tmp: str, shapes: list[str]) -> dict[str, str]:
    """Save the policy of each shape under ``tmp``, all in one fresh process (each policy is seeded
    by itself, so building them together gives the same weights as one process per shape, for one
    interpreter's imports of torch and transformers instead of one per shape)."""
    paths = {shape: str(Path(tmp) / f"policy-{shape}") for shape in dict.fromkeys(shapes)}
    todo = [f"{shape}:{path}" for shape, path in paths.items() if not Path(path).exists()]
    if todo:
        subprocess.run(
            [sys.executable, __file__, "--make-policy", *todo],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    return paths


def _policy(tmp: str, shape: str) -> str:
    """The policy of one shape under ``tmp`` (built on first use; ``_policies``)."""
    return _policies(tmp, [shape])[shape]


HEADER = (
    f"{'rep':>3} {'system':>6} {'shape':>5} {'T':>4} {'mu':>2} {'thr':>3} {'step_s':>7} {'cpu_s':>7} "
    f"{'gen_s':>7} {'tok/step':>8} {'tok/s':>6} {'rss_MB':>6}"
)


def _row(r: dict) -> str:
    return (
        f"{r['rep']:>3} {r['system']:>6} {r['shape']:>5} {r['max_tokens']:>4} {r['num_iterations']:>2} "
        f"{r['threads']:>3} {r['step_s_median']:>7.3f} {r['cpu_s_median']:>7.3f} {r['gen_s_median']:>7.3f} "
        f"{r['completion_tokens_per_step']:>8.0f} {r['completion_tokens_per_s']:>6.0f} {r['peak_rss_mb']:>6.0f}"
    )


def interleaved(
    policy: str,
    work: Work,
    reps: range,
    threads: list[int],
    mus: list[int],
    systems: list[str],
    extra: list[str],
    *,
    gemm_n: int | None = None,
) -> list[dict]:
    """A fresh process per system (order alternating) for each repetition number in ``reps``, μ and
    thread count; with ``gemm_n`` each repetition first measures the GEMM rate of (gemm_n, gemm_n)
    products (``gemm_rate``)."""
    results = []
    for rep in reps:
        for mu in mus:
            for th in threads:
                if gemm_n is not None:
                    g = _child("gemm", "", Work(steps=1), th, 1, [], gemm_n=gemm_n)
                    g.update(system="gemm", rep=rep)
                    results.append(g)
                    print(f"{rep:>3}   gemm {th} thr: {g['flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
                order = systems if rep % 2 == 0 else systems[::-1]
                for system in order:
                    r = _child(system, policy, work, th, mu, extra)
                    r.update(system=system, rep=rep)
                    results.append(r)
                    print(_row(r), flush=True)
    return results


KEYS = (
    "step_s_median",
    "cpu_s_median",
    "gen_s_median",
    "update_s_median",
    "completion_tokens_per_s",
    "completion_tokens_per_step",
    "peak_rss_mb",
    "step_flops",
    "update_flops",
    "sample_flops",
)


def summary(results: list[dict], system: str, mu: int, th: int) -> dict:
    rs = [r for r in results if r["system"] == system and r.get("num_iterations") == mu and r["threads"] == th]
    out = {k: statistics.median(r[k] for r in rs) for k in KEYS if k in rs[0]}
    if "update_s_median" not in out:  # TRL: everything after generation and scoring
        out["update_s_median"] = statistics.median(r["step_s_median"] - r["gen_s_median"] for r in rs)
    return out


def paired(results: list[dict], mu: int, tg: int, tt: int, key: str = "step_s_median") -> float:
    """Median over repetitions of gapo/TRL within a repetition (the processes ran back to back)."""
    return statistics.median(
        x[key] / y[key]
        for x in results
        if x["system"] == "gapo" and x["num_iterations"] == mu and x["threads"] == tg
        for y in results
        if y["system"] == "trl" and y["num_iterations"] == mu and y["threads"] == tt and y["rep"] == x["rep"]
    )


def report(
    results: list[dict], mus: list[int], threads: list[int], systems: list[str], title: str, gemm: float | None = None
) -> dict:
    """Print the medians and gapo/TRL ratios; returns the worse ratios over μ (and limit fractions)."""
    print(f"\n{title}: medians over repetitions")
    print(
        f"{'system':>6} {'mu':>2} {'thr':>3} {'step_s':>7} {'cpu_s':>7} {'gen_s':>7} {'upd_s':>7} {'tok/s':>6} "
        f"{'rss_MB':>6}" + (f" {'step%lim':>8} {'upd%lim':>8}" if gemm else "")
    )
    best: dict = {}
    for mu in mus:
        for system in systems:
            for th in threads:
                s = summary(results, system, mu, th)
                lim = (
                    (
                        f" {s['step_flops'] / s['step_s_median'] / gemm:>8.1%} "
                        f"{s['update_flops'] / s['update_s_median'] / gemm:>8.1%}"
                    )
                    if gemm
                    else ""
                )
                print(
                    f"{system:>6} {mu:>2} {th:>3} {s['step_s_median']:>7.3f} {s['cpu_s_median']:>7.3f} "
                    f"{s['gen_s_median']:>7.3f} {s['update_s_median']:>7.3f} {s['completion_tokens_per_s']:>6.0f} "
                    f"{s['peak_rss_mb']:>6.0f}" + lim
                )
                if (system, mu) not in best or s["step_s_median"] < best[system, mu][1]["step_s_median"]:
                    best[system, mu] = (th, s)
    for mu in mus:
        if "before" in systems and "gapo" in systems:
            (_, g), (_, b) = best["gapo", mu], best["before", mu]
            print(
                f"mu={mu}: gapo / before: step_time {g['step_s_median'] / b['step_s_median']:.3f} "
                f"(sampling {g['gen_s_median'] / b['gen_s_median']:.3f}, update "
                f"{g['update_s_median'] / b['update_s_median']:.3f}) peak_rss {g['peak_rss_mb'] / b['peak_rss_mb']:.3f}"
            )
    if not {"gapo", "trl"} <= set(systems):  # no ratio without both systems
        return {"step_time": float("nan"), "peak_rss": float("nan"), "limit_frac": None, "update_limit_frac": None}
    out = {"step_time": 0.0, "peak_rss": 0.0, "limit_frac": None, "update_limit_frac": None}
    print(f"{title}: each system at its best thread count")
    for mu in mus:
        (tg, g), (tt, t) = best["gapo", mu], best["trl", mu]
        rt, rr = g["step_s_median"] / t["step_s_median"], g["peak_rss_mb"] / t["peak_rss_mb"]
        rc = g["cpu_s_median"] / t["cpu_s_median"]
        print(
            f"mu={mu}: gapo {g['step_s_median']:.3f} s/step ({tg} thr, {g['completion_tokens_per_s']:.0f} tok/s, "
            f"{g['peak_rss_mb']:.0f} MB) | trl {t['step_s_median']:.3f} s/step ({tt} thr, "
            f"{t['completion_tokens_per_s']:.0f} tok/s, {t['peak_rss_mb']:.0f} MB) | step_time {rt:.3f} "
            f"(paired median {paired(results, mu, tg, tt):.3f}, cpu {rc:.3f}) peak_rss {rr:.3f}"
        )
        if gemm:
            fr = {
                k: (x["step_flops"] / x["step_s_median"] / gemm, x["update_flops"] / x["update_s_median"] / gemm)
                for k, x in (("gapo", g), ("trl", t))
            }
            print(
                f"mu={mu}: nominal {g['step_flops'] / 1e12:.2f} TFLOP/step ({g['update_flops'] / 1e12:.2f} in the "
                f"update); GEMM {gemm / 1e9:.1f} GFLOP/s; achieved step / update: gapo {fr['gapo'][0]:.1%} / "
                f"{fr['gapo'][1]:.1%}, trl {fr['trl'][0]:.1%} / {fr['trl'][1]:.1%} of the GEMM rate"
            )
            out["limit_frac"], out["update_limit_frac"] = fr["gapo"]
        out["step_time"], out["peak_rss"] = max(out["step_time"], rt), max(out["peak_rss"], rr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="fresh process pairs per configuration (tiny)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per process (after 1 warm-up; tiny)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--mu", type=int, nargs="+", default=[1, 2], help="optimiser steps per rollout batch (tiny)")
    ap.add_argument("--big-reps", type=int, default=3, help="fresh process pairs (compute-bound size)")
    ap.add_argument("--big-steps", type=int, default=1, help="measured steps per process (compute-bound size)")
    ap.add_argument("--big-warmup", type=int, default=0, help="warm-up steps per process (compute-bound size)")
    ap.add_argument("--big-shape", default="30m", choices=sorted(SHAPES))
    ap.add_argument("--big-tokens", type=int, default=128, help="completion tokens (compute-bound size)")
    ap.add_argument(
        "--gemm-n", type=int, default=2048, help="matrix size of the GEMM rate measurement (compute-bound size)"
    )
    ap.add_argument("--configs", nargs="+", default=["tiny", "big"], choices=["tiny", "big"])
    ap.add_argument("--systems", nargs="+", default=["gapo", "trl"], choices=["gapo", "trl"])
    ap.add_argument("--extra", action="append", default=[], help="extra gapo config override (repeatable)")
    ap.add_argument("--json", help="also write every child's result here")
    ap.add_argument(
        "--before", metavar="SRC", help="also run gapo from this src/ folder (another checkout) as system 'before'"
    )
    ap.add_argument("--one", choices=["gapo", "trl", "gemm"], help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--make-policy", nargs="+", metavar="SHAPE:PATH", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--trl-no-gc", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_policy:
        for item in a.make_policy:
            shape, path = item.split(":", 1)
            make_policy(path, shape=shape)
        return
    if a.one:
        th, mu = a.threads[0], a.mu[0]
        if a.one == "gemm":
            r = gemm_rate(th, a.gemm_n)
        elif a.one == "gapo":
            r = run_gapo(a.policy, Work(a.steps, a.warmup, a.shape, a.max_tokens), th, mu, extra=a.extra)
        else:
            from bench_trl_step import run_trl

            r = run_trl(
                a.steps,
                th,
                mu,
                shape=a.shape,
                max_tokens=a.max_tokens,
                warmup=a.warmup,
                gradient_checkpointing=False if a.trl_no_gc else None,
            )
        print(json.dumps(r))
        return

    systems = a.systems + (["before"] if a.before else [])
    if a.before:
        os.environ[BEFORE_ENV] = str(Path(a.before).resolve())
    results: list[dict] = []
    tiny = big = {"step_time": float("nan"), "peak_rss": float("nan"), "limit_frac": float("nan")}
    with tempfile.TemporaryDirectory() as tmp:
        policies = _policies(tmp, [{"tiny": "tiny", "big": a.big_shape}[c] for c in a.configs])
        print(HEADER, flush=True)
        if "tiny" in a.configs:
            res = interleaved(policies["tiny"], Work(a.steps), range(a.reps), a.threads, a.mu, systems, a.extra)
            results += res
        if "big" in a.configs:
            bres = interleaved(
                policies[a.big_shape],
                Work(a.big_steps, a.big_warmup, a.big_shape, a.big_tokens),
                range(a.big_reps),
                a.threads,
                [1],
                systems,
                a.extra,
                gemm_n=a.gemm_n,
            )
            results += bres
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if "tiny" in a.configs:
        tiny = report(res, a.mu, a.threads, systems, "tiny (1.06M, <= 16 tokens)")
    if "big" in a.configs:
        gemm = statistics.median(r["flops_per_s"] for r in bres if r["system"] == "gemm")
        print(
            f"\nGEMM fp32 {a.gemm_n}x{a.gemm_n}, {a.threads} thread(s): median {gemm / 1e9:.1f} GFLOP/s over "
            f"{sum(r['system'] == 'gemm' for r in bres)} measurements (each the median of 7 products)"
        )
        big = report(bres, [1], a.threads, systems, f"compute-bound ({a.big_shape}, {a.big_tokens} tokens)", gemm)
    print(
        f"ratio step_time={tiny['step_time']:.3f} peak_rss={tiny['peak_rss']:.3f} big_step_time={big['step_time']:.3f} "
        f"big_peak_rss={big['peak_rss']:.3f} big_limit_frac={big['limit_frac'] or float('nan'):.3f}"
    )


if __name__ == "__main__":
    main()
