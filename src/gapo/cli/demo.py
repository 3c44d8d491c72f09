"""``gapo demo``: fixed clipping vs GAPO from the embedded base policy, with a report."""

from __future__ import annotations

import time
from pathlib import Path

from gapo.cli.common import int_at_least

HELP = "fixed clipping vs GAPO from the embedded base policy, with a report"
EXAMPLES = "examples:\n  gapo demo\n  gapo demo --steps 30 --eval-samples 8 --out runs/demo-short"

# The demo: the same base policy and seed, fixed clipping vs GAPO, everything else equal.
# The update regime is the grid's calibrated one (RESULTS.md): 8 mini-batches × 2 epochs at lr 5e-5,
# where fixed clipping binds on a few percent of positive-advantage tokens, so the clip bound matters.
DEMO_COMMON = [
    "model.base_preset=low",
    "train.prompts=16",
    "train.group_size=8",
    "train.mini_batches=8",
    "train.epochs=2",
    "optim.lr=5e-5",
    "algo.advantage=drgrpo",
    "algo.eps_low=0.2",
    "eval.problems=64",
    "eval.samples=16",
    "train.checkpoint_every=0",
]
DEMO_METHODS = {
    "fixed": ["algo.eps_schedule=fixed", "algo.eps_high_max=0.2"],
    "gapo": ["algo.eps_schedule=linear", "algo.eps_high_max=0.28"],
}
# the default demo (2 runs x 60 steps, 4 evaluations of 64 problems x 16 samples each) measured 99 s
# on 2 quiet cores (BENCHMARKS.md section 7, f863976); the estimate scales it by the work asked for
DEMO_MEASURED_S, DEMO_DEFAULT_WORK = 99.0, (60, 4 * 64 * 16)


def add_arguments(p) -> None:
    p.add_argument("--out", default="runs/demo", help="folder of the two runs (OUT/fixed, OUT/gapo) and OUT/report")
    p.add_argument("--steps", type=int_at_least(1), default=60, help="RL steps of each run")
    p.add_argument(
        "--eval-every",
        type=int_at_least(0),
        default=20,
        help="held-out evaluation every N steps (0: only before and after)",
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, help="train.seed of both runs")
    p.add_argument("--eval-problems", type=int_at_least(1), default=64, help="held-out problems per evaluation")
    p.add_argument(
        "--eval-samples",
        type=int_at_least(1),
        default=16,
        help="samples per held-out problem (pass@k for k up to this)",
    )


def run(args) -> int:
    import torch

    from gapo.policy.base_policy import get_base_policy

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    out = Path(args.out)
    print(demo_estimate(args.steps, args.eval_every, args.eval_problems, args.eval_samples), flush=True)
    print("[1/3] base policy (cached after the first run; preset 'low')", flush=True)
    get_base_policy("low")
    print(f"      ready after {time.perf_counter() - t0:.0f}s", flush=True)
    runs = _train_both(args, out)
    print("[3/3] report", flush=True)
    md = _report(args, out, runs)
    print(f"report: {md}   (total {time.perf_counter() - t0:.0f}s)")
    return 0


def _train_both(args, out: Path) -> list[dict]:
    """The two runs, ``OUT/fixed`` and ``OUT/gapo``, one after the other; their loaded records."""
    from gapo.rl.config import load_config
    from gapo.rl.run_records import load_run
    from gapo.rl.trainer import Trainer, with_policy

    runs = []
    for i, (name, extra) in enumerate(DEMO_METHODS.items()):
        print(f"[2/3] RL run {i + 1}/{len(DEMO_METHODS)}: {name}", flush=True)
        cfg = load_config(
            None,
            DEMO_COMMON
            + extra
            + [
                f"train.steps={args.steps}",
                f"eval.every={args.eval_every}",
                f"train.seed={args.seed}",
                f"eval.problems={args.eval_problems}",
                f"eval.samples={args.eval_samples}",
            ],
        )
        cfg, policy_path = with_policy(cfg)  # built in step 1: the cache's
        Trainer(cfg, out / name, policy_path=policy_path, overwrite=True).fit()
        runs.append(load_run(out / name))
    return runs


def _report(args, out: Path, runs: list[dict]) -> Path:
    """``OUT/report/report.md`` with its figures, and the summary table printed."""
    from gapo.experiments.report import format_table, summarise, write_report

    notes = (
        f"Embedded base policy (preset `low`, 4-number Countdown), {args.steps} RL steps of 16 prompts × 8 "
        f"rollouts, 8 mini-batches × 2 epochs at lr 5e-5, seed {args.seed}; held-out pass@k from "
        f"{args.eval_samples} samples on {args.eval_problems} problems. One seed: differences between the "
        "two runs of a few points are within seed-to-seed noise; RESULTS.md has the multi-seed comparison."
    )
    md = write_report(
        runs, out / "report", title="gapo demo: fixed clipping vs GAPO (Countdown, low regime)", notes=notes
    )
    keys = [
        "before/pass@1",
        "after/pass@1",
        "before/pass@8",
        "after/pass@8",
        "after/pass@16",
        "after/coverage",
        "train/clip/frac_high_pos",
        "train/time/step_s",
    ]
    print(format_table([summarise(r) for r in runs], keys))
    return md


def demo_estimate(steps: int, eval_every: int, problems: int, samples: int) -> str:
    """The line the demo prints before it starts: the measured default scaled by RL steps and by
    evaluation samples (each about half of the default demo's time)."""
    n_evals = 2 + (max(steps - 1, 0) // eval_every if eval_every else 0)  # step 0, every N, the last
    work = 0.5 * steps / DEMO_DEFAULT_WORK[0] + 0.5 * n_evals * problems * samples / DEMO_DEFAULT_WORK[1]
    s = 10.0 + (DEMO_MEASURED_S - 10.0) * work  # about 10 s of it is start-up (imports, the base policy)
    est = f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"
    return (
        f"estimate: about {est} on 2 quiet CPU cores for 2 runs x {steps} steps and {n_evals} evaluations "
        f"of {problems} x {samples} samples each (the default demo measured {DEMO_MEASURED_S:.0f} s there; "
        "a busy machine takes 3-5 times longer; the progress bars show the live ETA)"
    )
