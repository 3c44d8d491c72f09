"""Per-token log-probabilities and entropies of given completions, memory-bounded.

``logprobs`` recomputes, for the response columns of ``prompt ++ response``, the quantity
``sample`` returns as ``logp`` (``gapo.policy.sampling``'s module docstring):

    logp[b, t] = log_softmax(logits[b, t] / temperature)[y_t]
    entropy[b, t] = −Σ_v p_v log p_v,   p = softmax(logits[b, t] / temperature)

The decoder runs once; the LM head, log-softmax and entropy run over chunks of positions
(``HeadMemory``), so the ``(B, T, V)`` float32 logits are never built whole for a large
vocabulary, and are checkpointed beyond a memory bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from gapo.core.checks import as_int
from gapo.policy.fast_lm import FastLM, left_pad_positions, live_index, pack, unpack

__all__ = ["HeadMemory", "logprobs"]


@dataclass(frozen=True)
class HeadMemory:
    """``logprobs``' memory bounds for the LM head (see there).

    - ``chunk_size``: positions per chunk of the head, log-softmax and entropy; ``None``: as many
      as fit ``max_chunk_bytes``;
    - ``max_chunk_bytes``: the bytes of one chunk's three float32 ``(rows, V)`` tensors (logits,
      softmax, their product) when ``chunk_size`` is ``None``;
    - ``max_saved_bytes``: the most logits bytes kept for the backward pass; beyond it each chunk
      is checkpointed (recomputed in backward).
    """

    chunk_size: int | None = None
    max_chunk_bytes: int = 48 * 2**20
    max_saved_bytes: int = 2**30

    def __post_init__(self):
        size = self.chunk_size
        if size is not None:
            if as_int(size) is None or size < 1:
                raise ValueError(f"chunk_size must be an int >= 1 or None, got {size!r}")
            object.__setattr__(self, "chunk_size", as_int(size))
        for name in ("max_chunk_bytes", "max_saved_bytes"):
            v = as_int(getattr(self, name))
            if v is None or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)


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


def _full_head_stats(model, input_ids, attention_mask, pos, targets, temperature: float):
    # logp, entropy (B, T) through model.forward's own head: the (B, T, V) logits are built whole
    T = targets.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, logits_to_keep=T + 1).logits
    logits = logits[:, :-1].float() / temperature
    lse = torch.logsumexp(logits, -1)
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logits.gather(-1, targets[..., None])[..., 0] - lse, ent


def logprobs(
    model,
    input_ids: torch.Tensor,  # (B, L) = left-padded prompt ++ right-padded response
    attention_mask: torch.Tensor,  # (B, L)
    response_len: int,  # T: the last T columns are the response
    *,
    temperature: float = 1.0,
    memory: HeadMemory | None = None,
    fast: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``logp (B, T)`` and ``entropy (B, T)`` of the response under
    ``softmax(logits / temperature)`` (``temperature <= 0`` is treated as 1).

    Memory-bounded (``memory``, a ``HeadMemory``): the decoder runs once, then the LM head,
    log-softmax and entropy run over chunks of ``memory.chunk_size`` positions (by default as many
    as fit ``max_chunk_bytes`` of float32 logits), so the ``(B, T, V)`` float32 tensor is never
    built whole for large ``V``. Under autograd the chunks' logits are kept for the backward pass
    while all of them together fit ``max_saved_bytes`` (float32; counted twice with
    ``entropy_grad``, whose backward also keeps the softmax); beyond that each chunk is
    checkpointed, so the backward pass recomputes the chunk's logits instead of storing them (the
    same values: a quarter more LM-head work for memory bounded by one chunk; BENCHMARKS.md). When completions end at
    different lengths (at most ``fast_lm.PACK_BELOW`` of the response positions live in
    ``attention_mask``), the decoder's per-token work and the head run on the live positions
    only, and the padding after EOS comes back as 0 (else as meaningless values): multiply by the
    response mask.
    ``fast`` runs the decoder of Llama/Qwen2 models with ``FastLM``, which computes each
    distinct prompt once (rows of a GRPO group share it); ``fast=False`` uses ``model.model``.
    ``entropy_grad=False`` returns the entropy detached (pass it when the loss has no entropy
    term: it keeps the memory of a checkpointed backward bounded, see ``_chunk_stats``).
    """
    memory = HeadMemory() if memory is None else memory
    if not isinstance(memory, HeadMemory):
        raise TypeError(f"logprobs(): memory must be a HeadMemory, got {type(memory).__name__}")
    B, L = input_ids.shape
    T = int(response_len)
    if not 0 < T < L:
        raise ValueError(f"response_len must be in [1, {L - 1}], got {T}")
    temperature = 1.0 if temperature <= 0 else float(temperature)
    pos = left_pad_positions(attention_mask)
    targets = input_ids[:, L - T :]
    head, dec = _head_and_decoder(model)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if head is None:  # unknown layout: fall back to the model's own head on the last T+1 positions
        return _full_head_stats(model, input_ids, attention_mask, pos, targets, temperature)
    hidden = _response_hidden(model, dec, input_ids, attention_mask, pos, T, fast)
    V = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
    idx = live_index(attention_mask[:, L - T :].bool())  # response tokens, not the padding after EOS
    if idx is None:
        return _head_stats(hidden, targets, head, V, temperature, softcap, entropy_grad, memory)
    # the head, log-softmax and entropy on the live positions only, packed into one row: the
    # same values there (each position's logits depend on its hidden state alone), zeros at the padding
    lp, ent = _head_stats(
        pack(hidden, idx)[None], pack(targets, idx)[None], head, V, temperature, softcap, entropy_grad, memory
    )
    return unpack(lp[0], idx, B, T), unpack(ent[0], idx, B, T)


def _response_hidden(model, dec, input_ids, attention_mask, pos, T: int, fast: bool) -> torch.Tensor:
    """The decoder's hidden states ``(B, T, H)`` at the positions that predict the response."""
    decoder = FastLM.build(model) if fast else None
    if decoder is not None:  # the same hidden states, each distinct prompt computed once
        return decoder.hidden(input_ids, attention_mask, T)
    L = input_ids.shape[1]
    hidden = dec(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).last_hidden_state
    return hidden[:, L - T - 1 : L - 1]  # position j predicts token j + 1


def _head_stats(hidden, targets, head, V, temperature, softcap, entropy_grad, budget: HeadMemory):
    """``logprobs``' head over ``hidden (B, T, H)`` in chunks of positions (see there)."""
    chunk_size, max_chunk_bytes, max_saved_bytes = budget.chunk_size, budget.max_chunk_bytes, budget.max_saved_bytes
    B, T = targets.shape
    weight = getattr(head, "weight", None)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or getattr(weight, "requires_grad", False))
    if _fusable(hidden, head, softcap, entropy_grad and grad):
        rows = B * chunk_size if chunk_size else max(1, max_chunk_bytes // (4 * V * 3))
        keep = grad and 4 * B * T * V <= max_saved_bytes
        lp, ent = _HeadLogProb.apply(
            hidden.reshape(B * T, -1), head.weight, targets.reshape(-1), temperature, rows, keep
        )
        return lp.view(B, T), ent.view(B, T)
    if chunk_size is None:
        chunk_size = max(1, max_chunk_bytes // (4 * B * V * 3))  # logits, probs, product
    if chunk_size >= T:
        return _chunk_stats(hidden, targets, head, temperature, softcap, entropy_grad)
    # what backward keeps per kept chunk: its float32 logits, and with entropy gradients about as
    # much again (the softmax; bench_memory.py: +0.8x of the logits at T = 2048)
    saved = 4 * B * T * V * (2 if entropy_grad else 1)
    use_ckpt = torch.is_grad_enabled() and hidden.requires_grad and saved > max_saved_bytes
    lps, ents = [], []
    for s in range(0, T, chunk_size):
        h, y = hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if use_ckpt:
            lp, en = checkpoint(_chunk_stats, h, y, head, temperature, softcap, entropy_grad, use_reentrant=False)
        else:
            lp, en = _chunk_stats(h, y, head, temperature, softcap, entropy_grad)
        lps.append(lp)
        ents.append(en)
    return torch.cat(lps, 1), torch.cat(ents, 1)


def _fusable(hidden, head, softcap, entropy_grad: bool) -> bool:
    # the fused head covers a plain bias-free linear head outside autocast, with the entropy a
    # detached diagnostic (its gradient, and autocast's casts, are left to autograd)
    return (
        not entropy_grad
        and not softcap
        and type(head) is torch.nn.Linear
        and head.bias is None
        and not torch.is_autocast_enabled(hidden.device.type)
    )


class _HeadLogProb(torch.autograd.Function):
    """``logp (N,) = log_softmax(h Wᵀ / τ)[y]`` and ``entropy (N,)`` (no gradient) over row chunks
    of ``h (N, H)``, with a backward that writes the logits' gradient in place of the saved logits:

        ∂logp_i/∂z_iv = (1[v = y_i] − softmax(z_i)_v) / τ,   z = h Wᵀ

    Autograd's chain (logsumexp, gather, division, linear) computes the same values but allocates
    four (rows, V) tensors per chunk in the backward and a (V, H) weight gradient per chunk, and
    at a 32000-token vocabulary those are fresh pages every time (BENCHMARKS.md, section 13.1).
    The forward and the backward run the chain's own operations in its order, so kept float32
    logits (whose products run over all rows at once) give autograd's values bit for bit at any
    chunk size, recomputed ones within rounding (tests/policy/test_fused_head.py). ``keep``: save
    the (N, V) float32 logits for the backward, else recompute each chunk there."""

    @staticmethod
    def forward(ctx, h, weight, targets, temperature: float, rows: int, keep: bool):
        N, V = h.shape[0], weight.shape[0]
        logits = torch.empty((N, V), dtype=torch.float32, device=h.device) if keep else None
        lp, lse, ent = (torch.empty(N, dtype=torch.float32, device=h.device) for _ in range(3))
        whole = _whole_products(logits, h, weight)
        if whole:  # one product over all rows: a larger product runs nearer the GEMM rate
            _scaled_logits(h, weight, temperature, logits)
        for s in range(0, N, rows):
            c = slice(s, s + rows)
            out = None if logits is None else logits[c]
            z = out if whole else _scaled_logits(h[c], weight, temperature, out)
            lse[c] = torch.logsumexp(z, -1)
            lp[c] = z.gather(-1, targets[c, None])[:, 0] - lse[c]
            ent[c] = lse[c] - (torch.softmax(z, -1) * z).sum(-1)
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.logits, ctx.temperature, ctx.rows = logits, temperature, rows
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp, _grad_ent):
        h, weight, targets, lse = ctx.saved_tensors
        logits, temperature, rows = ctx.logits, ctx.temperature, ctx.rows
        ctx.logits = None  # overwritten below: a second backward (retain_graph) recomputes them
        want_h, want_w = ctx.needs_input_grad[:2]
        whole = _whole_products(logits, h, weight)
        grad_h = torch.empty_like(h) if want_h and not whole else None
        grad_w = None
        for s in range(0, h.shape[0], rows):
            c = slice(s, s + rows)
            hs, g = h[c], grad_lp[c, None]
            z = logits[c] if logits is not None else _scaled_logits(hs, weight, temperature, None)
            # logsumexp's backward, (−g)·exp(z − lse), then gather's, + g at the target
            gz = z.sub_(lse[c, None]).exp_().mul_(-g).scatter_add_(1, targets[c, None], g)
            if temperature != 1.0:
                gz.div_(temperature)
            if whole:
                continue  # the products below take every row at once
            gz = gz.to(weight.dtype)
            if want_h:
                torch.mm(gz, weight, out=grad_h[c])
            if want_w:
                grad_w = gz.t().mm(hs) if grad_w is None else grad_w.addmm_(gz.t(), hs)
        if whole:  # the logits now hold their gradient: one product each, as autograd's chain
            grad_h = torch.mm(logits, weight) if want_h else None
            grad_w = logits.t().mm(h) if want_w else None
        return grad_h, grad_w, None, None, None, None


def _whole_products(logits, h, weight) -> bool:
    # with the (N, V) logits kept in float32 and float32 operands, the head's products run over
    # all N rows at once, in place: per chunk, the weight gradient's (V, rows) · (rows, H) product
    # has a short inner dimension and runs far below the GEMM rate (BENCHMARKS.md, section 13.3)
    return logits is not None and h.dtype == weight.dtype == torch.float32


def _scaled_logits(h, weight, temperature: float, out):
    # float32 (rows, V) logits / τ, written into ``out`` when given (the same values as head(h).float() / τ)
    if out is not None and h.dtype == torch.float32:
        z = torch.mm(h, weight.t(), out=out)
    else:
        z = torch.mm(h, weight.t()).float()
        z = z if out is None else out.copy_(z)
    return z.div_(temperature) if temperature != 1.0 else z
