"""Peak memory of one policy update at a real vocabulary size: chunked vs full-logits log-probs.

    python benchmarks/bench_memory.py [--V 32000 --B 4 --T 256 512 1024 2048 --threads 1]

One update = per-token log-probs and entropy of the response + GAPO's clipped token loss
(token-mean) + backward, on CPU in fp32, for the project's ``tiny`` Llama preset (hidden 128,
4 layers) with a ``V``-token vocabulary (untied head: 8.2M of its 9.0M parameters are the
embedding and the head at V = 32k), ``B`` rows of a 32-token prompt and ``T`` response tokens.

- ``chunked``: ``gapo.policy.logprobs.logprobs`` as the trainer calls it (decoder once, then LM
  head + log-softmax + entropy over chunks of at most ``max_chunk_bytes`` = 48 MiB (three float32
  tensors of the chunk's logits' size); without entropy gradients, the fused head of
  ``logprobs``; the chunks' logits are kept for backward while all of them fit
  ``max_saved_bytes`` = 1 GiB, else each chunk is checkpointed and recomputed in backward).
- ``bounded``: the same with ``max_saved_bytes=0``: every chunk checkpointed, the path a batch
  beyond the 1 GiB budget takes (memory bounded by one chunk).
  The trainer passes ``entropy_grad=False`` when the loss has no entropy term (the entropy is
  then a detached diagnostic); ``chunked+ent`` adds an entropy bonus to the loss, so the
  entropy is differentiated too.
- ``naive``: what a direct implementation does: ``model(...).logits`` for the last ``T + 1``
  positions in float32, ``log_softmax`` over ``(B, T, V)``, gather, entropy from the same
  tensors, all kept for backward.

Each (path, T) runs in a fresh process; the figure is the process's peak RSS (``ru_maxrss``)
minus its RSS just before the update (after imports, model and inputs), i.e. the memory the
update itself adds. Also printed: the size of one float32 ``(B, T, V)`` tensor for reference,
and the update's wall time. Last line: ``ratio peak naive/chunked=<x> at T=<max T>``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

PATHS = ("chunked", "bounded", "chunked+ent", "naive")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(path: str, V: int, B: int, T: int, threads: int, prompt: int = 32) -> dict:
    import torch

    from gapo.core.clipping import gapo_eps_high
    from gapo.core.losses import policy_loss
    from gapo.core.surrogate import ClipBounds
    from gapo.policy.logprobs import HeadMemory, logprobs
    from gapo.policy.model import build_model

    torch.set_num_threads(threads)
    model = build_model(V, "tiny", seed=0, max_position_embeddings=prompt + T + 8).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, V, (B, prompt + T), generator=g)
    attn = torch.ones_like(ids)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    rewards = (torch.arange(B) % 2).float()
    adv = rewards - rewards.mean()
    eps = gapo_eps_high(rewards, B, eps_low=0.2, eps_high_max=0.28)
    with torch.no_grad():
        old = logprobs(model, ids, attn, T)[0]
    del g
    before = _rss_mb()
    t0 = time.perf_counter()
    if path == "chunked":  # as the trainer calls it when the loss has no entropy term
        logp, ent = logprobs(model, ids, attn, T, entropy_grad=False)
    elif path == "bounded":  # every chunk checkpointed (beyond max_saved_bytes)
        logp, ent = logprobs(model, ids, attn, T, entropy_grad=False, memory=HeadMemory(max_saved_bytes=0))
    elif path == "chunked+ent":  # entropy bonus in the loss
        logp, ent = logprobs(model, ids, attn, T)
    else:
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=T + 1).logits[:, :-1].float()
        lsm = torch.log_softmax(logits, -1)
        logp = lsm.gather(-1, ids[:, -T:, None])[..., 0]
        ent = -(lsm.exp() * lsm).sum(-1)
    loss, _ = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, eps))
    if path == "chunked+ent":
        loss = loss - 0.01 * (ent * mask).sum() / mask.sum()
    loss.backward()
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "path": path,
        "V": V,
        "B": B,
        "T": T,
        "update_peak_mb": peak - before,
        "rss_before_mb": before,
        "peak_rss_mb": peak,
        "wall_s": wall,
        "loss": float(loss.detach()),
        "entropy": float((ent.detach() * mask).sum()),
        "n_params": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--V", type=int, default=32000)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.V, a.B, a.T[0], a.threads)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    print(f"V={a.V} B={a.B} prompt=32, tiny Llama preset, fp32, {a.threads} thread(s)")
    print(
        f"{'T':>5} {'path':>11} {'update_MB':>9} {'peak_rss_MB':>11} {'(B,T,V)_f32_MB':>14} {'wall_s':>7} {'loss':>10}"
    )
    res = {}
    for T in a.T:
        for path in a.paths:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    path,
                    "--V",
                    str(a.V),
                    "--B",
                    str(a.B),
                    "--T",
                    str(T),
                    "--threads",
                    str(a.threads),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            res[path, T] = r
            print(
                f"{T:>5} {path:>11} {r['update_peak_mb']:>9.0f} {r['peak_rss_mb']:>11.0f} "
                f"{a.B * T * a.V * 4 / 2**20:>14.0f} {r['wall_s']:>7.2f} {r['loss']:>10.6f}",
                flush=True,
            )
    if {"chunked", "bounded", "naive"} <= set(a.paths):
        T = max(a.T)
        print(
            f"ratio peak naive/chunked={res['naive', T]['update_peak_mb'] / res['chunked', T]['update_peak_mb']:.2f} "
            f"naive/bounded={res['naive', T]['update_peak_mb'] / res['bounded', T]['update_peak_mb']:.2f} at T={T}"
        )


if __name__ == "__main__":
    main()
