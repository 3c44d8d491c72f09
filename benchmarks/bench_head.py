"""The fused LM head of ``logprobs`` alone: keeping the logits for the backward against recomputing them.

    python benchmarks/bench_head.py [--rows 8192 --hidden 512 --vocab 32000 --chunk 131 --reps 4]

``logprobs``' head (``gapo.policy.logprobs._HeadLogProb``, used when the entropy is a detached
diagnostic) either keeps the float32 ``(rows, vocab)`` logits for the backward pass (while they fit
``HeadMemory.max_saved_bytes``) or recomputes each chunk there (one more head product, no
``(rows, vocab)`` buffer). The defaults are bench_step's compute-bound update: 64 × 128 completion
positions, hidden 512, a 32000-token vocabulary, chunks of 131 rows (48 MiB / 3 per chunk). Each
(mode, repetition) is a fresh process with one thread, the order alternating; reported per mode:
the medians of forward and backward wall time, system CPU time, minor page faults and peak RSS.
Each process sets glibc's allocator as the Trainer does (``gapo.machine.allocator.tune_malloc``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def one(a, keep: bool) -> dict:
    import torch

    from gapo.machine.allocator import tune_malloc
    from gapo.policy.logprobs import _HeadLogProb

    tune_malloc()  # as the Trainer does

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.rows, a.hidden, generator=g).requires_grad_()
    w = (torch.randn(a.vocab, a.hidden, generator=g) / a.hidden**0.5).requires_grad_()
    y = torch.randint(0, a.vocab, (a.rows,), generator=g)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    lp, _ = _HeadLogProb.apply(h, w, y, 1.0, a.chunk, keep)
    t1 = time.perf_counter()
    lp.sum().backward()
    t2, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "faults": r1.ru_minflt - r0.ru_minflt,
        "peak_rss_mb": r1.ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--chunk", type=int, default=131)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument(
        "--one", choices=["keep", "recompute"], help="run one mode in this process and print its JSON (a child's work)"
    )
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a, a.one == "keep")))
        return
    args = [f"--rows={a.rows}", f"--hidden={a.hidden}", f"--vocab={a.vocab}", f"--chunk={a.chunk}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res: dict[str, list[dict]] = {"keep": [], "recompute": []}
    for rep in range(a.reps):
        for mode in ("keep", "recompute") if rep % 2 == 0 else ("recompute", "keep"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, *args], env=env, capture_output=True, text=True, check=True
            )
            res[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(rep, mode, res[mode][-1], flush=True)
    for mode, rs in res.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"{mode}: forward {med['forward_s']:.2f} s, backward {med['backward_s']:.2f} s, "
            f"system {med['sys_s']:.2f} s, {med['faults']:.0f} faults, "
            f"peak RSS {med['peak_rss_mb']:.0f} MB (medians of {len(rs)})"
        )


if __name__ == "__main__":
    main()
