"""Forward + backward of the clipped surrogate: GAPO vs fixed clipping (vs verl's vanilla).

    python benchmarks/bench_loss.py [--B 512 --T 1024 --reps 15 --threads 1]

All contenders run interleaved (A B C A B C …) on the same inputs so machine drift hits them
alike; we report medians and the per-repetition ratio's median. GAPO's time includes computing
its per-rollout ε_high from the group rewards. Last line: ``ratio gapo/fixed=<x>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gapo.core.advantages import compute
from gapo.core.clipping import gapo_eps_high
from gapo.core.losses import policy_loss
from gapo.core.surrogate import ClipBounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=512)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clip-ratio-c", type=float, default=3.0, help="dual clip (verl always applies it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    B, T = args.B, args.T
    old = -torch.rand(B, T, generator=g) * 3
    logp0 = old + 0.2 * torch.randn(B, T, generator=g)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    rewards = (torch.rand(B, generator=g) < 0.3).float()
    adv = compute("drgrpo", rewards, args.G)

    def fixed():
        logp = logp0.clone().requires_grad_(True)
        loss, m = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, 0.28, clip_ratio_c=args.clip_ratio_c))
        loss.backward()
        return loss

    def gapo():
        logp = logp0.clone().requires_grad_(True)
        eps = gapo_eps_high(rewards, args.G, eps_low=0.2, eps_high_max=0.28)
        loss, m = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, eps, clip_ratio_c=args.clip_ratio_c))
        loss.backward()
        return loss

    contenders = {"fixed": fixed, "gapo": gapo}
    try:
        from omegaconf import OmegaConf  # noqa: F401
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config import ActorConfig

        cfg = ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=args.clip_ratio_c,
        )
        vanilla_fn = get_policy_loss_fn("vanilla")
        adv_bt = adv[:, None].expand(B, T)

        def verl_vanilla():
            logp = logp0.clone().requires_grad_(True)
            loss, m = vanilla_fn(old, logp, adv_bt, mask, "token-mean", cfg)
            loss.backward()
            return loss

        contenders["verl_vanilla"] = verl_vanilla
    except Exception as e:  # noqa: BLE001 - verl is an optional extra, and importing it may fail in any way
        print(f"verl not available ({type(e).__name__}: {e}); comparing gapo and fixed only")

    times: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():  # warm-up
        fn()
    for _ in range(args.reps):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"B={B} T={T} tokens={int(mask.sum())} threads={args.threads} reps={args.reps} torch={torch.__version__}")
    for name, ts in times.items():
        print(
            f"{name:>13}: median {statistics.median(ts) * 1e3:8.1f} ms  "
            f"(min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})"
        )
    ratio = statistics.median(a / b for a, b in zip(times["gapo"], times["fixed"]))
    if "verl_vanilla" in times:
        rv = statistics.median(a / b for a, b in zip(times["gapo"], times["verl_vanilla"]))
        print(f"ratio gapo/verl_vanilla={rv:.3f}")
    print(f"ratio gapo/fixed={ratio:.3f}")


if __name__ == "__main__":
    main()
