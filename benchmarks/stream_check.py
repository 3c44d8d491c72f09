"""Whether a change that alters the random stream leaves learning alone (issue 37, item 3).

    python benchmarks/stream_check.py --before OLD/src [--seeds 0 1 2 3 4 5 6 7 --steps 30 --workers 2]

A faster kernel or a cheaper draw can change the numbers a seed produces, so the regression's
golden records (``benchmarks/regression.py``) must be re-recorded; this is the check that goes
with it: ``gapo demo`` (fixed clipping and GAPO on the shipped ``low`` base) for the same seeds
with two source trees, ``before`` (``--before``: another checkout's ``src/``, first on
``PYTHONPATH``) and ``after`` (the gapo this interpreter imports), each run in its own process
with one thread. Per run and method: the final held-out pass@1 and pass@8, and the training
reward averaged over the run. The same seed gives unrelated streams before and after, so the
comparison is between two samples of seeds, not paired: per method and figure, the seed means
before and after, their difference with a Welch 95% interval, and the interval's half-width for
scale. "Within noise" means every interval holds 0. The mean training-reward curves (± 1 standard
error over seeds) go to ``OUT/curves.png``; every run's records stay under ``OUT``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gapo.experiments.stats import t975

METHODS = ("fixed", "gapo")
FIGURES = ("eval/pass@1", "eval/pass@8", "train reward")


def run_demo(out: Path, seed: int, steps: int, before: str | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GAPO_THREADS": "1"}
    if before:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [before, os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "gapo.cli", "demo", "--out", str(out), "--steps", str(steps), "--seed", str(seed)]
    cmd += ["--eval-every", "0", "--eval-problems", "64", "--eval-samples", "8"]
    if not (out / "gapo" / "metrics.jsonl").exists():
        subprocess.run(cmd, env=env, check=True, capture_output=True)


def read_run(d: Path) -> dict:
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in recs if r.get("kind") == "eval"]
    train = [r for r in recs if r.get("kind") == "train"]
    curve = [r["reward/mean"] for r in train]
    last = max(evals, key=lambda r: r["step"])
    return {
        "eval/pass@1": last["eval/pass@1"],
        "eval/pass@8": last["eval/pass@8"],
        "train reward": statistics.fmean(curve),
        "curve": curve,
    }


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """``mean(b) − mean(a)`` and the half-width of its Welch 95% interval."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    return statistics.fmean(b) - statistics.fmean(a), t975(max(1, int(df))) * se


def plot(runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METHODS), figsize=(10, 3.6), sharey=True)
    for ax, method in zip(axes, METHODS):
        for tree, color in (("before", "tab:gray"), ("after", "tab:blue")):
            curves = [r["curve"] for (t, m, _), r in runs.items() if t == tree and m == method]
            steps = range(min(len(c) for c in curves))
            mean = [statistics.fmean(c[i] for c in curves) for i in steps]
            se = [statistics.stdev(c[i] for c in curves) / math.sqrt(len(curves)) for i in steps]
            ax.plot(steps, mean, color=color, label=f"{tree} ({len(curves)} seeds)")
            ax.fill_between(
                steps, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], color=color, alpha=0.2
            )
        ax.set(title=method, xlabel="step", ylabel="training reward (mean over seeds)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the src/ folder of the checkout before the change")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/stream-check"))
    a = ap.parse_args()
    jobs = [(tree, s) for s in a.seeds for tree in ("before", "after")]
    src = str(Path(a.before).resolve())
    with ThreadPoolExecutor(a.workers) as pool:
        futures = [
            pool.submit(run_demo, a.out / f"{tree}-{s}", s, a.steps, src if tree == "before" else None)
            for tree, s in jobs
        ]
        for f in futures:  # a failing run raises here
            f.result()
    runs = {(tree, m, s): read_run(a.out / f"{tree}-{s}" / m) for tree, s in jobs for m in METHODS}
    print(f"`gapo demo --steps {a.steps}`, seeds {a.seeds}: seed means before → after, after − before [Welch 95%]")
    print("| method | figure | before | after | after − before |\n|---|---|---|---|---|")
    for method in METHODS:
        for fig in FIGURES:
            xs = {t: [runs[t, method, s][fig] for s in a.seeds] for t in ("before", "after")}
            d, h = welch(xs["before"], xs["after"])
            print(
                f"| {method} | {fig} | {statistics.fmean(xs['before']):.4f} | {statistics.fmean(xs['after']):.4f} | "
                f"{d:+.4f} [{d - h:+.4f}, {d + h:+.4f}] |"
            )
    plot(runs, a.out)
    print(f"curves: {a.out / 'curves.png'}")


if __name__ == "__main__":
    main()
