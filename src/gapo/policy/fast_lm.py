"""Fast forward passes for Llama/Qwen2 causal LMs: ``FastLM``, used by ``gapo.policy.sampling``
for KV-cached decoding and by ``gapo.policy.logprobs`` for log-prob recomputation (BENCHMARKS.md, section 2).

It reproduces the Hugging Face forward op for op with a preallocated KV cache and computes
each distinct prompt once; tokens and log-probs are bit-identical to ``model.forward``
(tests/policy/test_sampling.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def left_pad_positions(mask: torch.Tensor) -> torch.Tensor:
    # Left padding: the first real token is position 0 in every row.
    return (mask.cumsum(-1) - 1).clamp(min=0)


# Decoder-layer classes whose forward the fast path below reproduces op for op (transformers 5.x).
_FAST_LAYOUTS = {
    "LlamaForCausalLM": ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    "Qwen2ForCausalLM": ("Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
}


# ``hidden`` packs the completion's live positions when at most this share of them is live (a
# batch whose completions all run to the limit gains nothing from packing and skips its copies).
PACK_BELOW = 0.9


def _is_input_grad_hook(hook) -> bool:
    # transformers' ``enable_input_require_grads`` (registered by ``gradient_checkpointing_enable``)
    # only marks the embedding output as requiring grad: it changes no value, and the fast path
    # calls the embedding module, so the hook still runs
    return getattr(hook, "__qualname__", "").endswith("enable_input_require_grads.<locals>.make_inputs_require_grads")


def _has_hooks(module) -> bool:
    return any(
        m._forward_pre_hooks or any(not _is_input_grad_hook(h) for h in m._forward_hooks.values())
        for m in module.modules()
    )


class FastLM:
    """Llama/Qwen2 forward passes without the per-call machinery of ``model.forward`` (output
    capturing, mask construction, ``DynamicCache`` concatenation), which dominates a decoding
    step of a small model, and with each distinct prompt computed once (GRPO samples G
    completions per prompt, so a batch holds every prompt G times).

    It calls the model's own embedding, norm, projection, MLP and rotary modules in the order
    of the Hugging Face forward and attends with ``scaled_dot_product_attention``; rows are
    independent, so sharing a prompt's keys and values between its copies computes the same
    function (and, under autograd, the same gradient: the copies' gradients are summed into the
    shared prompt activations). tests/policy/test_sampling.py checks it against ``model.forward``.
    ``build`` returns ``None`` for any other layout (sliding windows, hooks, adapters, quantised
    or custom modules, attention dropout in training mode, gradient checkpointing); callers then
    use ``model.forward``.

    Decoding (``prefill`` / ``step`` / ``select``) keeps keys and values in preallocated
    buffers and runs without autograd; ``hidden`` (training and log-prob recomputation) is
    autograd-safe.
    """

    can_select = True  # decoding rows can always leave the preallocated cache

    @classmethod
    def build(cls, model):
        names = _FAST_LAYOUTS.get(type(model).__name__)
        base = getattr(model, "model", None)
        cfg = model.config
        if names is None or base is None or type(base.norm).__name__ != names[3] or _has_hooks(model):
            return None
        if any(lt != "full_attention" for lt in (getattr(cfg, "layer_types", None) or ())):
            return None
        if getattr(cfg, "final_logit_softcapping", None) or type(model.lm_head) is not torch.nn.Linear:
            return None
        if model.training and (
            getattr(cfg, "attention_dropout", 0.0) or getattr(model, "is_gradient_checkpointing", False)
        ):
            return None
        for layer in base.layers:
            at, mlp = layer.self_attn, layer.mlp
            if (type(layer).__name__, type(at).__name__, type(mlp).__name__) != names[:3]:
                return None
            if (
                type(layer.input_layernorm).__name__ != names[3]
                or type(layer.post_attention_layernorm).__name__ != names[3]
            ):
                return None
            if any(
                type(m) is not torch.nn.Linear
                for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            ):
                return None
        return cls(model)

    def __init__(self, model):
        base = model.model
        self.embed, self.norm, self.rotary, self.head = base.embed_tokens, base.norm, base.rotary_emb, model.lm_head
        self.layers = list(base.layers)
        at = self.layers[0].self_attn
        self.head_dim, self.scaling, self.n_rep = at.head_dim, at.scaling, at.num_key_value_groups

    # ---------------------------------------------------------------- one decoder layer, in two halves
    def _qkv(self, layer, x, cos, sin):
        """Rotated q, k and v: ``(B, heads, T, d)`` from ``x (B, T, H)``, or ``(n, heads, d)``
        from packed positions ``x (n, H)`` (``cos``/``sin`` shaped to broadcast either way)."""
        at = layer.self_attn
        h = layer.input_layernorm(x)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(h).view(shape) for proj in (at.q_proj, at.k_proj, at.v_proj))
        if x.dim() == 3:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _attend(self, q, K, V, mask):
        # grouped-query attention without copying K/V into every query head (Hugging Face's
        # repeat_kv): the same products, the same outputs bit for bit (tests/policy/test_sampling.py), and
        # no copy of the whole cache per decoding step and layer (BENCHMARKS.md, section 9)
        gqa = {"enable_gqa": True} if self.n_rep > 1 else {}
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scaling, **gqa)

    @staticmethod
    def _mlp(layer, x):
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _rest(self, layer, x, q, K, V, mask):
        o = self._attend(q, K, V, mask)
        return self._mlp(layer, x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(*x.shape[:-1], -1)))

    def _rope(self, x, pos):
        cos, sin = self.rotary(x, pos)  # (b, q, d), as the model computes it
        return cos[:, None], sin[:, None]

    @staticmethod
    def _causal(key_ok, n_past):
        # (b, 1, q, n_past + q) bool: all valid past keys, then causal over the new ones; a
        # padding query may also see itself, so that every softmax row is finite
        b, q = key_ok.shape[0], key_ok.shape[1] - n_past
        dev = key_ok.device
        new = torch.ones(q, q, dtype=torch.bool, device=dev).tril()[None] & key_ok[:, None, n_past:]
        new = new | torch.eye(q, dtype=torch.bool, device=dev)
        return torch.cat([key_ok[:, None, :n_past].expand(b, q, n_past), new], -1)[:, None]

    def _prompts(self, ids, mask):
        """Forward the distinct rows of (ids, mask); returns (inverse (B,), hidden (u, P, H), [(k, v)] per layer)."""
        u, inv = torch.unique(torch.cat([ids, mask.to(ids.dtype)], 1), dim=0, return_inverse=True)
        if u.shape[0] == ids.shape[0]:
            inv = None
        else:
            ids, mask = u[:, : ids.shape[1]], u[:, ids.shape[1] :]
        x = self.embed(ids)
        cos, sin = self._rope(x, left_pad_positions(mask))
        m = self._causal(mask.bool(), 0)
        kvs = []
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, cos, sin)
            x = self._rest(layer, x, q, k, v, m)
            kvs.append((k, v))
        return inv, x, kvs

    # ---------------------------------------------------------------- training / log-prob recomputation
    def hidden(self, input_ids, attention_mask, T):
        """Final-normed hidden states (B, T, H) of positions L-T-1 … L-2 (those that predict
        the response), as ``model.model(...).last_hidden_state[:, L-T-1 : L-1]``."""
        B, L = input_ids.shape
        P = L - T
        inv, hp, kvs = self._prompts(input_ids[:, :P], attention_mask[:, :P])
        take = (lambda t: t) if inv is None else (lambda t: t[inv])
        last = take(hp[:, -1:])
        if T == 1:
            return self.norm(last)
        ids, key_ok = input_ids[:, P : L - 1], attention_mask[:, : L - 1].bool()
        x = self.embed(ids)
        cos, sin = self._rope(x, left_pad_positions(attention_mask)[:, P : L - 1])
        m = self._causal(key_ok, P)
        idx = live_index(key_ok[:, P:])  # inputs that are response tokens, not padding after EOS
        if idx is not None:
            x = self._packed(x, cos, sin, m, kvs, take, idx)
        else:
            for layer, (pk, pv) in zip(self.layers, kvs):
                q, k, v = self._qkv(layer, x, cos, sin)
                x = self._rest(layer, x, q, torch.cat([take(pk), k], 2), torch.cat([take(pv), v], 2), m)
        return self.norm(torch.cat([last, x], 1))

    def _packed(self, x, cos, sin, m, kvs, take, idx):
        """The completion layers of ``hidden`` with every per-token operation (norms, projections,
        rotary, MLP) on the live positions ``idx`` only, packed into ``(n, H)``; attention
        scatters them back to ``(B, heads, T-1, d)`` with zeros at the padding, which the mask
        hides from every live query. Live outputs are those of the padded loop, bit for bit in
        the tests (MKL computes a row of a product the same way whatever the other rows, except
        that for a matrix of a few rows it may pick another kernel; masked keys weigh exactly
        0); padding comes back as zeros. Saves the padding's share of the decoder's products
        when completions end at different lengths (BENCHMARKS.md, section 9.4)."""
        B, Tq = x.shape[:2]
        xs, cs, ss = pack(x, idx), pack(cos[:, 0], idx)[:, None], pack(sin[:, 0], idx)[:, None]
        for layer, (pk, pv) in zip(self.layers, kvs):
            q, k, v = (unpack(t, idx, B, Tq).transpose(1, 2) for t in self._qkv(layer, xs, cs, ss))
            o = self._attend(q, torch.cat([take(pk), k], 2), torch.cat([take(pv), v], 2), m)
            xs = self._mlp(layer, xs + layer.self_attn.o_proj(pack(o.transpose(1, 2), idx).reshape(xs.shape[0], -1)))
        return unpack(xs, idx, B, Tq)

    # ---------------------------------------------------------------- decoding
    def prefill(self, ids, mask, pos, n_new):
        """Run the left-padded prompts; returns the last position's logits (B, V)."""
        B, P = ids.shape
        inv, x, kvs = self._prompts(ids, mask)
        # cos/sin for every position decoding can reach (a table lookup is bit-identical to
        # calling the rotary module per step: each entry is one product inv_freq · position)
        cos, sin = self.rotary(x, torch.arange(int(pos.max()) + n_new + 1, device=ids.device)[None])
        self.cos, self.sin = cos[0], sin[0]
        kv = kvs[0][0].shape[1]
        self.k, self.v = [], []
        for k, v in kvs:
            K = k.new_zeros(B, kv, P + n_new, self.head_dim)
            V = v.new_zeros(B, kv, P + n_new, self.head_dim)
            K[:, :, :P] = k if inv is None else k[inv]
            V[:, :, :P] = v if inv is None else v[inv]
            self.k.append(K)
            self.v.append(V)
        self.key_ok = torch.ones(B, P + n_new, dtype=torch.bool, device=ids.device)
        self.key_ok[:, :P] = mask.bool()
        self.len = P
        last = x[:, -1:] if inv is None else x[inv, -1:]
        return self.head(self.norm(last))[:, 0]

    def step(self, tok, pos):
        """Feed one token per row (b,) at positions pos (b, 1); returns logits (b, V)."""
        x = self.embed(tok[:, None])
        cos, sin = self.cos[pos][:, None].to(x.dtype), self.sin[pos][:, None].to(x.dtype)
        t = self.len
        m = self.key_ok[:, None, None, : t + 1]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            self.k[i][:, :, t] = k[:, :, 0]
            self.v[i][:, :, t] = v[:, :, 0]
            x = self._rest(layer, x, q, self.k[i][:, :, : t + 1], self.v[i][:, :, : t + 1], m)
        self.len = t + 1
        return self.head(self.norm(x))[:, 0]

    def select(self, keep):
        self.k = [k[keep] for k in self.k]
        self.v = [v[keep] for v in self.v]
        self.key_ok = self.key_ok[keep]


def live_index(live: torch.Tensor) -> torch.Tensor | None:
    """Flat indices of the ``True`` positions of ``live (B, T)`` when packing them pays (at most
    ``PACK_BELOW`` of the positions live), else ``None``."""
    if int(live.sum()) > PACK_BELOW * live.numel():
        return None
    return live.reshape(-1).nonzero()[:, 0]


def pack(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``(B, T, ...)`` -> ``(n, ...)``: the positions ``idx`` of ``live_index``."""
    return t.reshape(-1, *t.shape[2:])[idx]


def unpack(t: torch.Tensor, idx: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """``(n, ...)`` -> ``(B, T, ...)``, the inverse of ``pack`` with zeros elsewhere (differentiable)."""
    out = t.new_zeros(B * T, *t.shape[1:])
    out[idx] = t
    return out.view(B, T, *t.shape[1:])


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
