"""Trainer-level overhead of GAPO's adaptive upper bound: GAPO against fixed clipping, whole
RL steps of gapo's Trainer, interleaved in one process.

    python benchmarks/bench_gapo_overhead.py [--steps 12 --warmup 2 --mini-batches 8 --epochs 2 --threads 1]

Two Trainers on the study's setting (configs/grid.yaml's ``low`` regime: the shipped ``low`` base
policy, 4-number Countdown, 8 prompts × 8 rollouts, lr 2e-5, ``--mini-batches`` × ``--epochs``
updates per rollout batch, fp32, CPU): fixed clipping 0.2/0.2 (``drgrpo``) and GAPO (0.2 / linear
→ 0.28), everything else identical, the same seed (their first rollout batch is the same; later
ones differ as the policies do). Their steps alternate -- fixed, GAPO, GAPO, fixed, ... (the order
flips every step) -- so both see the same machine load; this is the point on a shared machine,
where separate runs minutes apart are not comparable (RESULTS.md, claim 7).

Reported per method, over the measured steps: the median of ``time/step_s`` (rollout, scoring,
advantages, the adaptive bound, behaviour log-probs, update), of ``time/update_s`` (everything
after the rollout) and of the update time per response token (the two policies' completions
differ in length after the first step, and the update's work is proportional to the tokens);
then the GAPO/fixed ratios of those medians, and the median of the per-step-pair ratios of
update time per token, and the process CPU time per step (``time.process_time``; it moves less
with the machine's load than wall time). The last line is ``ratio step=<r> update=<r>
update_per_token=<r> step_cpu=<r>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gapo.experiments.grid_spec import cell_config, load_grid, pretrain_config  # noqa: E402
from gapo.policy.base_policy import get_base_policy  # noqa: E402
from gapo.rl.trainer import Trainer  # noqa: E402


def _grid(args) -> dict:
    return load_grid(
        {
            "name": "overhead",
            "methods": ["drgrpo", "gapo"],
            "regimes": ["low"],
            "seeds": [args.seed],
            "regime_defs": {"low": {"base": "low", "overrides": {"optim.lr": 2.0e-5}}},
            "common": {
                "train.mini_batches": args.mini_batches,
                "train.epochs": args.epochs,
                "train.prompts": 8,
                "train.group_size": 8,
                "train.steps": args.warmup + args.steps,
                "train.checkpoint_every": 0,
                "eval.problems": 0,
                "eval.every": 0,
            },
        }
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="measured steps per method")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps per method first")
    ap.add_argument("--mini-batches", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = _grid(a)
    base = get_base_policy(pretrain_config(g["_regimes"]["low"]), progress=False)
    rows: dict[str, list[dict]] = {"drgrpo": [], "gapo": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {
            m: Trainer(cell_config(g, "low", m, a.seed, base_path=str(base)), Path(tmp) / m, overwrite=True)
            for m in ("drgrpo", "gapo")
        }
        t0 = time.time()
        for i in range(a.warmup + a.steps):
            order = ("drgrpo", "gapo") if i % 2 == 0 else ("gapo", "drgrpo")
            for m in order:
                c0 = time.process_time()
                rec = trainers[m].train_step()
                cpu = time.process_time() - c0
                if i >= a.warmup:
                    toks = float(rec.get("rollout/response_len", float("nan"))) * 64
                    rows[m].append(
                        {"step_s": rec["time/step_s"], "update_s": rec["time/update_s"], "tokens": toks, "cpu_s": cpu}
                    )
        wall = time.time() - t0
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("step_s", "update_s", "cpu_s")} for m, rs in rows.items()
    }
    for m, rs in rows.items():
        med[m]["update_ms_per_token"] = statistics.median(1e3 * r["update_s"] / r["tokens"] for r in rs)
    pair = statistics.median(
        (g_["update_s"] / g_["tokens"]) / (f["update_s"] / f["tokens"]) for g_, f in zip(rows["gapo"], rows["drgrpo"])
    )
    ratio = {k: med["gapo"][k] / med["drgrpo"][k] for k in ("step_s", "update_s", "update_ms_per_token", "cpu_s")}
    print(
        f"setting: low base, 8 x 8 rollouts, {a.mini_batches} x {a.epochs} updates per batch, {a.threads} thread(s), "
        f"{a.warmup} warm-up + {a.steps} measured steps per method, interleaved; wall {wall:.0f}s"
    )
    for m in ("drgrpo", "gapo"):
        print(
            f"{m:7s} median step {med[m]['step_s']:.3f}s (CPU {med[m]['cpu_s']:.3f}s)  "
            f"update {med[m]['update_s']:.3f}s  "
            f"update/token {med[m]['update_ms_per_token']:.4f} ms"
        )
    print(f"median per-step-pair ratio of update time per token (gapo/fixed): {pair:.3f}")
    print(
        f"ratio step={ratio['step_s']:.3f} update={ratio['update_s']:.3f} "
        f"update_per_token={ratio['update_ms_per_token']:.3f} step_cpu={ratio['cpu_s']:.3f}"
    )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"medians": med, "ratio": ratio, "pair_ratio_update_per_token": pair, "args": vars(a), "wall_s": wall},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
