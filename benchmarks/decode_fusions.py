"""What fusing the decoder's operators would buy in a decoding step, and what it costs in bits.

    python benchmarks/decode_fusions.py [--shapes tiny 30m --rows 64 --prompt 8 --tokens 16 --reps 7]

``FastLM`` reproduces ``model.forward`` operator for operator, so its tokens and log-probs are
bit-identical to the model's own (tests/policy/test_sampling.py). The variants below leave that
behind, each adding to the one before; this script measures them, it changes nothing in gapo:

- ``no_module_call``: the same operators, called directly (``F.linear``, the RMSNorm and MLP
  formulas inline) instead of through ``nn.Module.__call__``: still bit-identical;
- ``rms_norm``: ``F.rms_norm`` (one fused operator) for both norms of a layer;
- ``fused_proj``: q, k and v in one product with concatenated weights, gate and up in another;
- ``manual_attention``: the one-query attention as two products and a softmax, instead of
  ``scaled_dot_product_attention``'s flash kernel for CPU;
- ``broadcast_attention`` (instead of ``manual_attention``, after ``fused_proj``): the same with
  broadcast multiplications and sums instead of the batched products.

On bench_step's policy of each shape (random weights, one thread): ``--rows`` random prompts of
``--prompt`` tokens, a prefill, then ``--tokens`` − 1 greedy decoding steps (fixed work), each
variant in turn, ``--reps`` rounds in alternating order. Reported per variant: the median time per
decoding step, its ratio to ``FastLM``'s, and the largest absolute difference of its logits from
``FastLM``'s over all steps (0 means bit-identical).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_trl_step import SHAPES, build_policy  # noqa: E402
from gapo.policy.fast_lm import FastLM, _rotate_half  # noqa: E402


def _norm(mod, x):  # Qwen2RMSNorm's formula, operator for operator
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon)
    return mod.weight * h.to(dtype)


class NoModuleCall(FastLM):
    def norm_(self, mod, x):
        return _norm(mod, x)

    def qkv_(self, layer, h):
        at = layer.self_attn
        return [F.linear(h, p.weight, p.bias) for p in (at.q_proj, at.k_proj, at.v_proj)]

    def gate_up_(self, layer, h):
        m = layer.mlp
        return F.linear(h, m.gate_proj.weight), F.linear(h, m.up_proj.weight)

    def _qkv(self, layer, x, cos, sin):
        h = self.norm_(layer.input_layernorm, x)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in self.qkv_(layer, h))
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _rest(self, layer, x, q, K, V, mask):
        o = self._attend(q, K, V, mask)
        at = layer.self_attn
        x = x + F.linear(o.transpose(1, 2).reshape(*x.shape[:-1], -1), at.o_proj.weight, at.o_proj.bias)
        g, u = self.gate_up_(layer, self.norm_(layer.post_attention_layernorm, x))
        return x + F.linear(layer.mlp.act_fn(g) * u, layer.mlp.down_proj.weight)


class RmsNorm(NoModuleCall):
    def norm_(self, mod, x):
        return F.rms_norm(x, (x.shape[-1],), mod.weight, mod.variance_epsilon)


class FusedProj(RmsNorm):
    def __init__(self, model):
        super().__init__(model)
        self.w_qkv, self.w_gu = [], []
        for layer in self.layers:
            at, m = layer.self_attn, layer.mlp
            ps = (at.q_proj, at.k_proj, at.v_proj)
            bias = None if at.q_proj.bias is None else torch.cat([p.bias for p in ps])
            self.w_qkv.append((torch.cat([p.weight for p in ps]), bias, [p.weight.shape[0] for p in ps]))
            self.w_gu.append(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        self.index = {id(layer): i for i, layer in enumerate(self.layers)}

    def qkv_(self, layer, h):
        w, b, sizes = self.w_qkv[self.index[id(layer)]]
        return F.linear(h, w, b).split(sizes, -1)

    def gate_up_(self, layer, h):
        return F.linear(h, self.w_gu[self.index[id(layer)]]).chunk(2, -1)


class ManualAttention(FusedProj):
    def _attend(self, q, K, V, mask):
        if q.shape[2] != 1:  # the prefill keeps the kernel
            return super()._attend(q, K, V, mask)
        b, heads, _, d = q.shape
        kv = K.shape[1]
        s = torch.matmul(q.view(b, kv, heads // kv, d), K.transpose(-1, -2)) * self.scaling
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        return torch.matmul(p, V).view(b, heads, 1, d)


class BroadcastAttention(FusedProj):
    def _attend(self, q, K, V, mask):
        if q.shape[2] != 1:
            return super()._attend(q, K, V, mask)
        b, heads, _, d = q.shape
        kv = K.shape[1]
        qg = q.view(b, kv, heads // kv, 1, d)
        s = (qg * K[:, :, None]).sum(-1) * self.scaling  # (b, kv, rep, t): no batched product
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        return (p[..., None] * V[:, :, None]).sum(-2).view(b, heads, 1, d)


VARIANTS = {
    "FastLM": FastLM,
    "no_module_call": NoModuleCall,
    "rms_norm": RmsNorm,
    "fused_proj": FusedProj,
    "manual_attention": ManualAttention,
    "broadcast_attention": BroadcastAttention,
}


def decode(cls, model, ids, tokens: int) -> tuple[float, torch.Tensor]:
    mask = ids.new_ones(ids.shape)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dec = cls(model)
    with torch.no_grad():
        logits = [dec.prefill(ids, mask, pos, tokens)]
        nxt, tok = pos[:, -1:] + 1, logits[0].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(tokens - 1):
            logits.append(dec.step(tok, nxt))
            nxt, tok = nxt + 1, logits[-1].argmax(-1)
        return (time.perf_counter() - t0) / (tokens - 1), torch.stack(logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "30m"], choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for shape in a.shapes:
        model, tok = build_policy(0, shape)
        model.eval()
        ids = torch.randint(4, len(tok), (a.rows, a.prompt), generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        _, ref = decode(FastLM, model, ids, a.tokens)
        diff = {}
        for rep in range(a.reps):
            for name in list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]:
                t, logits = decode(VARIANTS[name], model, ids, a.tokens)
                times[name].append(t)
                diff[name] = float((logits - ref).abs().max())
        base = statistics.median(times["FastLM"])
        print(f"\n{shape}: {a.rows} rows, prompt {a.prompt}, {a.tokens} tokens, medians of {a.reps}")
        print("| variant | ms per decoding step | / FastLM | max abs logit difference |\n|---|---|---|---|")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"| {name} | {m * 1e3:.3f} | {m / base:.3f} | {diff[name]:.2e} |")


if __name__ == "__main__":
    main()
