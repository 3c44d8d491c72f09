"""The aten operators of one decoding step or one update, by their own CPU time (``torch.profiler``).

    python benchmarks/profile_ops.py [--part decode update --shape tiny --rows 64 --prompt 8 --tokens 16]

``profile_step.py`` says which part of a step costs what; this says which operators inside a part
do. On bench_step's policy of ``--shape`` (``bench_trl_step.SHAPES``, random weights, one thread):

- ``decode``: ``FastLM.prefill`` of ``--rows`` random prompts of ``--prompt`` tokens, then
  ``--tokens`` − 1 calls of ``FastLM.step`` (greedy tokens, so the work is fixed), profiled;
- ``update``: ``logprobs`` (decoder, fused head; no entropy gradient) and its backward on the
  same rows with ``--tokens`` completion tokens, twice unprofiled, then three times profiled.

Prints the profiler's table of the 20 operators with the most self CPU time, per part.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_trl_step import SHAPES, build_policy  # noqa: E402


def decode(model, ids, tokens: int):
    from gapo.policy.fast_lm import FastLM, left_pad_positions

    mask = ids.new_ones(ids.shape)
    pos = left_pad_positions(mask)
    dec = FastLM(model)
    logits = dec.prefill(ids, mask, pos, tokens)
    nxt = pos[:, -1:] + 1
    for _ in range(tokens - 1):
        logits = dec.step(logits.argmax(-1), nxt)
        nxt = nxt + 1


def update(model, ids, tokens: int):
    from gapo.policy.logprobs import logprobs

    lp, _ = logprobs(model, ids, ids.new_ones(ids.shape), tokens, entropy_grad=False)
    lp.sum().backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", nargs="+", default=["decode", "update"], choices=["decode", "update"])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    model, tok = build_policy(0, a.shape)
    g = torch.Generator().manual_seed(0)
    for part in a.part:
        if part == "decode":
            model.eval()
            ids = torch.randint(4, len(tok), (a.rows, a.prompt), generator=g)
            with torch.no_grad():
                decode(model, ids, a.tokens)  # warm-up
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    decode(model, ids, a.tokens)
        else:
            model.train()
            ids = torch.randint(4, len(tok), (a.rows, a.prompt + a.tokens), generator=g)
            for _ in range(2):
                update(model, ids, a.tokens)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    update(model, ids, a.tokens)
        print(f"\n{part}, shape {a.shape}, {a.rows} rows, prompt {a.prompt}, {a.tokens} tokens")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
