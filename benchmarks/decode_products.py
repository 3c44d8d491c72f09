"""How near the GEMM rate a decoding step's products can run: the ceiling of sampling's share.

    python benchmarks/decode_products.py [--shape 30m --rows 64 --prompt 8 --tokens 32 --reps 20]

On bench_step's policy of ``--shape`` (``bench_trl_step.SHAPES``, random weights, one thread),
with glibc's allocator set as the Trainer sets it, three timings (medians over ``--reps``):

- the decoder layers' products of one decoding step alone: every layer's q, k, v, o, gate, up
  and down projection, each once, on ``--rows`` random rows (the model's own weights, in the
  step's order, nothing else in between);
- the LM head's product alone, ``(rows, H) · (H, V)``;
- a whole decoding step, ``FastLM.step`` (``decode_fusions.decode``: the mean over ``--tokens`` − 1
  steps after a prefill of ``--prompt`` random tokens; greedy tokens, so the work is fixed).

Each as nominal FLOP/s (2 per weight and row) against the fp32 GEMM rate measured in the same
process (``bench_step.gemm_rate``): the products alone are the most a decoding step can reach
with these kernels at this row count, whatever is cut around them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_step import gemm_rate  # noqa: E402
from bench_trl_step import SHAPES, build_policy  # noqa: E402


def _median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _projections(model):
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        yield from (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def _step_time(model, rows: int, prompt: int, tokens: int, reps: int) -> float:
    """Median time of one ``FastLM.step`` (``decode_fusions.decode``'s greedy loop, after a warm-up)."""
    import torch

    from decode_fusions import decode
    from gapo.policy.fast_lm import FastLM

    ids = torch.randint(4, model.config.vocab_size, (rows, prompt), generator=torch.Generator().manual_seed(0))
    decode(FastLM, model, ids, tokens)
    return statistics.median(decode(FastLM, model, ids, tokens)[0] for _ in range(max(1, reps // 4)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="30m", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch

    from gapo.machine.allocator import tune_malloc

    tune_malloc()
    torch.set_num_threads(1)
    model, _ = build_policy(0, a.shape)
    model.eval()
    rate = gemm_rate(1)["flops_per_s"]
    projections = list(_projections(model))
    inputs = {p: torch.randn(a.rows, 1, p.in_features) for p in projections}
    h = torch.randn(a.rows, 1, model.lm_head.in_features)
    with torch.no_grad():
        layers = _median_time(lambda: [p(inputs[p]) for p in projections], a.reps)
        head = _median_time(lambda: model.lm_head(h), a.reps)
        step = _step_time(model, a.rows, a.prompt, a.tokens, a.reps)
    f_layers = 2 * a.rows * sum(p.weight.numel() for p in projections)
    f_head = 2 * a.rows * model.lm_head.weight.numel()
    print(f"shape {a.shape}, {a.rows} rows, 1 thread; fp32 GEMM rate (2048^2): {rate / 1e9:.1f} GFLOP/s")
    for name, t, flops in (
        ("layers' products alone", layers, f_layers),
        ("head's product alone", head, f_head),
        ("FastLM.step", step, f_layers + f_head),
    ):
        f = flops / t
        print(f"{name:>24}: {t * 1e3:8.2f} ms per token, {f / 1e9:6.1f} GFLOP/s, {f / rate:6.1%} of the GEMM rate")
    print(f"products alone are {(layers + head) / step:.1%} of the decoding step's time")


if __name__ == "__main__":
    main()
