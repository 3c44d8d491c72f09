"""Batched KV-cached sampling with per-token log-probs, and chunked log-prob recomputation.

Works with any Hugging Face causal LM (the embedded policy or a real checkpoint).

Log-prob semantics (the same as verl's and TRL's ``old_logp``): for a sampled token ``y_t``

    logp[b, t] = log_softmax(logits[b, t] / temperature)[y_t]

i.e. the log-probability under the *temperature-scaled, unfiltered* policy. ``logprobs`` with the
same ``temperature`` recomputes exactly this quantity (up to float error), so the ratio
``exp(logp − old_logp)`` is 1 on the first mini-batch. Top-p only decides which tokens may be
drawn; it does not renormalise ``logp`` (as in verl/TRL, where the trainer recomputes log-probs
without the filter). With ``top_p < 1`` the behaviour policy is therefore slightly off-policy
with respect to ``logp``; keep ``top_p = 1`` for exact on-policy ratios. ``temperature = 0``
means greedy decoding, and its ``logp`` are taken at temperature 1.

Layout: prompts are left-padded (``prompt_ids (B, P)``, ``prompt_mask (B, P)``), completions are
right-padded (``completion_ids (B, T)``, ``response_mask (B, T)``); ``Rollout.input_ids`` is their
concatenation, whose last ``T`` columns are the response — what ``logprobs`` expects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P) 1 on prompt tokens
    completion_ids: torch.Tensor  # (B, T) right-padded with pad_token_id
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens, EOS included
    logp: torch.Tensor  # (B, T) float32, 0 where response_mask is 0

    @property
    def input_ids(self) -> torch.Tensor:  # (B, P + T)
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # (B, P + T)
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def lengths(self) -> torch.Tensor:  # (B,)
        return self.response_mask.sum(dim=1)

    def texts(self, tokenizer, *, skip_special_tokens: bool = True) -> list[str]:
        """Decoded completions (response tokens only)."""
        out = []
        for ids, m in zip(self.completion_ids.tolist(), self.response_mask.tolist()):
            out.append(tokenizer.decode([i for i, k in zip(ids, m) if k], skip_special_tokens=skip_special_tokens))
        return out


def left_pad(prompt_ids, prompt_mask=None, *, pad_token_id: int = 0, device=None):
    """``(ids (B, P), mask (B, P))`` from a list of token-id lists or a tensor (+ mask)."""
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids.to(device=device, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        mask = torch.ones_like(ids) if prompt_mask is None else prompt_mask.to(device=device, dtype=torch.long)
        if mask.shape != ids.shape:
            raise ValueError(f"prompt_mask shape {tuple(mask.shape)} != prompt_ids shape {tuple(ids.shape)}")
        if ids.shape[1] and (mask[:, -1] == 0).any():
            raise ValueError("prompts must be left-padded (the last column of prompt_mask must be 1)")
        return ids, mask
    seqs = [list(s) for s in prompt_ids]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, P - len(s) :] = 1
    return ids.to(device), mask.to(device)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    # Left padding: the first real token is position 0 in every row.
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator):
    """Next token (B,) and its log-prob (B,) under log_softmax(logits / temperature)."""
    logits = logits.float()
    if temperature <= 0:
        tok = logits.argmax(-1)
        lp = torch.log_softmax(logits, -1)
        return tok, lp.gather(-1, tok[:, None])[:, 0]
    lp = torch.log_softmax(logits / temperature, -1)
    probs = lp.exp()
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop = (sp.cumsum(-1) - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        choice = torch.multinomial(sp, 1, generator=generator)
        tok = si.gather(-1, choice)[:, 0]
    else:
        tok = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tok, lp.gather(-1, tok[:, None])[:, 0]


# Decoder-layer classes whose forward the fast path below reproduces op for op (transformers 5.x).
_FAST_LAYOUTS = {
    "LlamaForCausalLM": ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    "Qwen2ForCausalLM": ("Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
}


def _has_hooks(module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


class _FastLM:
    """Llama/Qwen2 forward passes without the per-call machinery of ``model.forward`` (output
    capturing, mask construction, ``DynamicCache`` concatenation), which dominates a decoding
    step of a small model, and with each distinct prompt computed once (GRPO samples G
    completions per prompt, so a batch holds every prompt G times).

    It calls the model's own embedding, norm, projection, MLP and rotary modules in the order
    of the Hugging Face forward and attends with ``scaled_dot_product_attention``; rows are
    independent, so sharing a prompt's keys and values between its copies computes the same
    function (and, under autograd, the same gradient: the copies' gradients are summed into the
    shared prompt activations). tests/test_sampling.py checks it against ``model.forward``.
    ``build`` returns ``None`` for any other layout (sliding windows, hooks, adapters, quantised
    or custom modules, attention dropout in training mode, gradient checkpointing); callers then
    use ``model.forward``.

    Decoding (``prefill`` / ``step`` / ``select``) keeps keys and values in preallocated
    buffers and runs without autograd; ``hidden`` (training and log-prob recomputation) is
    autograd-safe.
    """

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
        if model.training and (getattr(cfg, "attention_dropout", 0.0) or getattr(model, "is_gradient_checkpointing", False)):
            return None
        for layer in base.layers:
            at, mlp = layer.self_attn, layer.mlp
            if (type(layer).__name__, type(at).__name__, type(mlp).__name__) != names[:3]:
                return None
            if type(layer.input_layernorm).__name__ != names[3] or type(layer.post_attention_layernorm).__name__ != names[3]:
                return None
            if any(type(m) is not torch.nn.Linear for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj,
                                                             mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
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
        at = layer.self_attn
        h = layer.input_layernorm(x)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = at.q_proj(h).view(shape).transpose(1, 2)
        k = at.k_proj(h).view(shape).transpose(1, 2)
        v = at.v_proj(h).view(shape).transpose(1, 2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _rest(self, layer, x, q, K, V, mask):
        if self.n_rep > 1:
            K, V = _repeat_kv(K, self.n_rep), _repeat_kv(V, self.n_rep)
        o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scaling)
        x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(*x.shape[:-1], -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

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
        cos, sin = self._rope(x, _positions(mask))
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
        cos, sin = self._rope(x, _positions(attention_mask)[:, P : L - 1])
        m = self._causal(key_ok, P)
        for layer, (pk, pv) in zip(self.layers, kvs):
            q, k, v = self._qkv(layer, x, cos, sin)
            x = self._rest(layer, x, q, torch.cat([take(pk), k], 2), torch.cat([take(pv), v], 2), m)
        return self.norm(torch.cat([last, x], 1))

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


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _repeat_kv(x, n_rep):
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


@torch.no_grad()
def sample(
    model,
    prompt_ids,
    prompt_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
    compact: bool = True,
    fast: bool = True,
) -> Rollout:
    """Sample one completion per prompt with a KV cache; see the module docstring for ``logp``.

    ``prompt_ids`` is a list of token-id lists, or a left-padded ``(B, P)`` tensor with
    ``prompt_mask``. Each row stops after its first ``eos_token_id`` (included in the response
    mask, nothing after it) or after ``max_new_tokens``; ``eos_token_id=None`` never stops early. The returned width ``T`` is the longest
    completion. ``generator`` (on the model's device) makes sampling reproducible. With
    ``compact`` finished rows are dropped from the KV cache as the batch thins out (it changes
    which random numbers a row draws, never the distribution). ``fast`` decodes Llama/Qwen2
    models with ``_FastLM`` (same numbers, less per-token overhead, each distinct prompt prefilled once); other models, and
    ``fast=False``, go through ``model.forward``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = eos_token_id if eos_token_id is not None else 0
    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, prompt_mask, pad_token_id=pad_token_id, device=device)
    B, P = ids.shape
    N = max_new_tokens
    was_training = model.training
    model.eval()
    try:
        out_tok = torch.full((B, N), pad_token_id, dtype=torch.long, device=device)
        out_lp = torch.zeros((B, N), dtype=torch.float32, device=device)
        out_len = torch.full((B,), N, dtype=torch.long, device=device)  # length incl. EOS

        attn = torch.cat([mask, mask.new_ones((B, N))], dim=1)
        pos = _positions(mask)
        dec = _FastLM.build(model) if fast else None
        if dec is not None:
            cache = None
            logits = dec.prefill(ids, mask, pos, N)
        else:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            logits = out.logits[:, -1]
        next_pos = pos[:, -1:] + 1  # (b, 1)
        rows = torch.arange(B, device=device)  # original row of each active row
        done = torch.zeros(B, dtype=torch.bool, device=device)
        # A host sync per token is free on CPU but stalls an accelerator; check less often there.
        check_every = 1 if device.type == "cpu" else 8
        for t in range(N):
            tok, lp = _pick(logits, temperature, top_p, generator)
            tok = tok.masked_fill(done, pad_token_id)
            out_tok[rows, t] = tok
            out_lp[rows, t] = lp.masked_fill(done, 0.0)
            if eos_token_id is not None:
                newly = (tok == eos_token_id) & ~done
                out_len[rows] = torch.where(newly, t + 1, out_len[rows])
                done = done | newly
            if t == N - 1:
                break
            if eos_token_id is not None and (t + 1) % check_every == 0:
                n_done = int(done.sum())
                if n_done == done.numel():
                    break
                can_select = dec is not None or hasattr(cache, "batch_select_indices")
                if compact and can_select and n_done * 4 >= done.numel() and done.numel() > 1:
                    keep = (~done).nonzero()[:, 0]
                    if dec is not None:
                        dec.select(keep)
                    else:
                        cache.batch_select_indices(keep)
                    rows, tok, done = rows[keep], tok[keep], done[keep]
                    attn, next_pos = attn[keep], next_pos[keep]
            if dec is not None:
                logits = dec.step(tok, next_pos)
            else:
                out = model(
                    input_ids=tok[:, None],
                    attention_mask=attn[:, : P + t + 1],
                    position_ids=next_pos,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                logits = out.logits[:, -1]
            next_pos = next_pos + 1
        T = int(out_len.max())
        resp = (torch.arange(N, device=device)[None] < out_len[:, None]).long()[:, :T]
        completion = out_tok[:, :T].masked_fill(resp == 0, pad_token_id)
        logp = out_lp[:, :T] * resp
    finally:
        model.train(was_training)
    return Rollout(ids, mask, completion, resp, logp)


def _head_and_decoder(model):
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or dec is None or dec is model:
        return None, None
    return head, dec


def _chunk_stats(h, targets, head, temperature: float, softcap, entropy_grad: bool = True):
    # h (B, C, H), targets (B, C) -> logp (B, C), entropy (B, C); float32 math on a chunk only.
    logits = head(h).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    logp = logits.gather(-1, targets[..., None])[..., 0] - lse
    # Without entropy_grad the entropy is a detached diagnostic: nothing is saved for its
    # backward. This matters beyond speed: in a checkpointed chunk, tensors recomputed for a
    # branch whose backward never runs stay alive until the whole backward ends, so a loss
    # without an entropy term would keep every chunk's (B, C, V) softmax and logits.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, ent


def logprobs(
    model,
    input_ids: torch.Tensor,  # (B, L) = left-padded prompt ++ right-padded response
    attention_mask: torch.Tensor,  # (B, L)
    response_len: int,  # T: the last T columns are the response
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_chunk_bytes: int = 256 * 2**20,
    fast: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``logp (B, T)`` and ``entropy (B, T)`` of the response under
    ``softmax(logits / temperature)`` (``temperature <= 0`` is treated as 1).

    Memory-bounded: the decoder runs once, then the LM head, log-softmax and entropy run over
    chunks of ``chunk_size`` positions (by default as many as fit ``max_chunk_bytes`` of float32
    logits), so the ``(B, T, V)`` float32 tensor is never built for large ``V``. Under autograd
    each chunk is checkpointed, so the backward pass recomputes the chunk's logits instead of
    storing them. Masked positions hold meaningless values; multiply by the response mask.
    ``fast`` runs the decoder of Llama/Qwen2 models with ``_FastLM``, which computes each
    distinct prompt once (rows of a GRPO group share it); ``fast=False`` uses ``model.model``.
    ``entropy_grad=False`` returns the entropy detached (pass it when the loss has no entropy
    term: it keeps the memory of a checkpointed backward bounded, see ``_chunk_stats``).
    """
    B, L = input_ids.shape
    T = int(response_len)
    if not 0 < T < L:
        raise ValueError(f"response_len must be in [1, {L - 1}], got {T}")
    temperature = 1.0 if temperature <= 0 else float(temperature)
    pos = _positions(attention_mask)
    targets = input_ids[:, L - T :]
    head, dec = _head_and_decoder(model)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if head is None:  # unknown layout: fall back to the model's own head on the last T+1 positions
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, logits_to_keep=T + 1).logits
        logits = logits[:, :-1].float() / temperature
        lse = torch.logsumexp(logits, -1)
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
        return logits.gather(-1, targets[..., None])[..., 0] - lse, ent
    fast_lm = _FastLM.build(model) if fast else None
    if fast_lm is not None:  # the same hidden states, each distinct prompt computed once
        hidden = fast_lm.hidden(input_ids, attention_mask, T)
    else:
        hidden = dec(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).last_hidden_state
        hidden = hidden[:, L - T - 1 : L - 1]  # position j predicts token j + 1
    V = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
    if chunk_size is None:
        chunk_size = max(1, max_chunk_bytes // (4 * B * V * 3))  # logits, probs, product
    if chunk_size >= T:
        return _chunk_stats(hidden, targets, head, temperature, softcap, entropy_grad)
    use_ckpt = torch.is_grad_enabled() and hidden.requires_grad
    lps, ents = [], []
    for s in range(0, T, chunk_size):
        h, y = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if use_ckpt:
            from torch.utils.checkpoint import checkpoint

            lp, en = checkpoint(_chunk_stats, h, y, head, temperature, softcap, entropy_grad, use_reentrant=False)
        else:
            lp, en = _chunk_stats(h, y, head, temperature, softcap, entropy_grad)
        lps.append(lp)
        ents.append(en)
    return torch.cat(lps, 1), torch.cat(ents, 1)
