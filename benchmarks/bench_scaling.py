"""How gapo's and TRL's RL step time grow with the work: completion length and model size.

    python benchmarks/bench_scaling.py [--reps 2 --out docs/results/scaling.png --json FILE]

The work of ``bench_step.py`` (8 prompts × 8 generations, μ = 1, the same random weights, the
same loss, optimiser and sampling settings for both systems, stop after EOS) at these points:

- completion length 16, 64, 256 tokens at the ``5m`` shape of ``bench_trl_step.SHAPES`` (a
  5.1M-parameter Qwen2 with an 8192-token vocabulary; EOS is sampled with p ≈ 1/8192 per token,
  so completions run to the limit);
- model size ``tiny`` (1.06M, 22 tokens), ``5m`` and ``30m`` (34.2M, 32000 tokens) at 64
  completion tokens. The tiny model's random policy samples EOS with p ≈ 1/22, so its
  completions stop early (≈ 20 tokens on average) in both systems; the tokens per step are
  reported.

Each repetition runs every point as a fresh gapo process and a fresh TRL process back to back
(order alternating between repetitions); reported: the median over repetitions of each
process's median step time, and gapo/TRL. Points of a minute or more per step run 1 measured
step without a warm-up, the others 1 warm-up step and 2–3 measured steps. The plot (matplotlib,
``--out``) shows both curves with step time on a log axis and gapo/TRL on a second axis; the
last line is ``scaling ratio <shape>@<T>=<gapo/trl> …``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_step import HEADER, Work, _policy, interleaved  # noqa: E402

# (shape, completion tokens, warm-up steps, measured steps)
POINTS = [("5m", 16, 1, 3), ("5m", 64, 1, 2), ("5m", 256, 0, 1), ("tiny", 64, 1, 3), ("30m", 64, 0, 1)]
LENGTHS = [("5m", 16), ("5m", 64), ("5m", 256)]
SIZES = [("tiny", 64), ("5m", 64), ("30m", 64)]


def plot(rows: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    panels = [
        (axes[0], LENGTHS, [T for _, T in LENGTHS], "completion tokens (5.1M-parameter model)"),
        (axes[1], SIZES, [rows[p]["gapo"]["n_params"] / 1e6 for p in SIZES], "parameters, millions (64 tokens)"),
    ]
    for ax, pts, xs, xlabel in panels:
        for system, style in (("gapo", "o-"), ("trl", "s--")):
            ax.plot(xs, [rows[p][system]["step_s"] for p in pts], style, label="gapo" if system == "gapo" else "TRL")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time (s)")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:.3g}" for x in xs])
        ax.minorticks_off()
        ax2 = ax.twinx()
        ax2.plot(xs, [rows[p]["ratio"] for p in pts], "^:", color="grey", label="gapo / TRL")
        ax2.set_ylim(0, 1.2)
        ax2.set_ylabel("gapo / TRL step time")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    fig.suptitle("One RL step (8 × 8 rollouts, μ = 1, 1 thread): gapo vs TRL GRPOTrainer", fontsize=10)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "results" / "scaling.png"))
    ap.add_argument("--json", help="also write every child's result here")
    ap.add_argument("--from-json", help="no runs: report and plot the results saved by --json")
    a = ap.parse_args()
    results = json.loads(Path(a.from_json).read_text()) if a.from_json else []
    with tempfile.TemporaryDirectory() as tmp:
        print(HEADER, flush=True)
        for rep in range(0 if a.from_json else a.reps):
            for shape, T, warmup, steps in POINTS:
                results += interleaved(
                    _policy(tmp, shape),
                    Work(steps, warmup, shape, T),
                    range(rep, rep + 1),
                    [a.threads],
                    [1],
                    ["gapo", "trl"],
                    [],
                )
    if a.json and not a.from_json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    rows: dict = {}
    print(
        f"\n{'shape':>5} {'T':>4} {'params':>7} {'gapo_s':>8} {'trl_s':>8} {'ratio':>6} {'paired':>6} "
        f"{'gapo_tok':>8} {'trl_tok':>8}"
    )
    for shape, T, _, _ in POINTS:
        sel = {
            s: [r for r in results if r["system"] == s and r["shape"] == shape and r["max_tokens"] == T]
            for s in ("gapo", "trl")
        }
        med = {
            s: {
                "step_s": statistics.median(r["step_s_median"] for r in v),
                "tokens": statistics.median(r["completion_tokens_per_step"] for r in v),
                "n_params": v[0]["n_params"],
            }
            for s, v in sel.items()
        }
        pair = statistics.median(
            g["step_s_median"] / t["step_s_median"] for g in sel["gapo"] for t in sel["trl"] if g["rep"] == t["rep"]
        )
        rows[shape, T] = {**med, "ratio": med["gapo"]["step_s"] / med["trl"]["step_s"], "paired": pair}
        print(
            f"{shape:>5} {T:>4} {med['gapo']['n_params'] / 1e6:>6.2f}M {med['gapo']['step_s']:>8.3f} "
            f"{med['trl']['step_s']:>8.3f} {rows[shape, T]['ratio']:>6.3f} {pair:>6.3f} "
            f"{med['gapo']['tokens']:>8.0f} {med['trl']['tokens']:>8.0f}"
        )
    plot(rows, a.out)
    print(f"plot: {a.out}")
    print("scaling ratio " + " ".join(f"{s}@{T}={rows[s, T]['ratio']:.3f}" for s, T, _, _ in POINTS))


if __name__ == "__main__":
    main()
