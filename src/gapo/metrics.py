"""Diagnostics: unbiased pass@k, token entropy, clip statistics per group-success count.

``pass_at_k(n, c, k) = 1 − C(n−c, k)/C(n, k)`` (Chen et al., arXiv 2107.03374), computed as
``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` so it never forms huge binomials.

Clip statistics per ``c`` (arXiv 2609.00444 reports them to explain GAPO): for the response
tokens of rollouts whose group had ``c`` successes, the fraction of positive-advantage tokens
clipped above (``ρ > 1+ε_high``), of negative-advantage tokens clipped below (``ρ < 1−ε_low``),
mean ``|ρ − 1|``, and the mean ``ε_high`` in force.
"""

from __future__ import annotations

import math

import torch

__all__ = ["pass_at_k", "pass_at_k_curve", "entropy_from_logits", "clip_stats_by_c", "first_move_entropy"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (arXiv 2107.03374)."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) and not (hasattr(v, "__index__")):
            raise ValueError(f"{name} must be an int, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n={n}, got k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_curve(n: int, correct: list[int], ks: list[int] | None = None) -> dict[int, float]:
    """Mean unbiased pass@k over problems, ``correct[j]`` successes out of ``n`` for problem j;
    ``ks`` defaults to powers of two up to ``n``."""
    ks = ks or [2**i for i in range(int(math.log2(n)) + 1)]
    return {k: sum(pass_at_k(n, c, k) for c in correct) / max(len(correct), 1) for k in ks}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:  # (..., V) -> (...)
    """Entropy of ``softmax(logits)``: ``logsumexp(z) − Σ softmax(z)·z``."""
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


@torch.no_grad()
def clip_stats_by_c(
    ratio: torch.Tensor,  # (B, T) importance ratio (token or sequence level)
    advantages: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    success_count: torch.Tensor,  # (B,) c of each rollout's group
    *,
    eps_low: float,
    eps_high: float | torch.Tensor,  # float or (B,)
) -> dict[str, float]:
    """``clip/frac_high_by_c/{c}``, ``clip/frac_low_by_c/{c}``, ``clip/ratio_dev_by_c/{c}``,
    ``clip/eps_high_by_c/{c}``, ``clip/adv_by_c/{c}`` and the counts behind them."""
    m = response_mask.bool()
    eh = eps_high if isinstance(eps_high, torch.Tensor) else torch.full_like(advantages, float(eps_high))
    eh = eh.to(ratio.dtype)
    out: dict[str, float] = {}
    above = ratio > 1.0 + eh.unsqueeze(-1)
    below = ratio < 1.0 - eps_low
    dev = (ratio - 1.0).abs()
    pos = (advantages > 0).unsqueeze(-1) & m
    neg = (advantages < 0).unsqueeze(-1) & m
    for c in torch.unique(success_count).tolist():
        rows = success_count == c
        mc, pc, nc = m[rows], pos[rows], neg[rows]
        n_tok = int(mc.sum())
        if n_tok == 0:
            continue
        out[f"clip/ratio_dev_by_c/{c}"] = float(dev[rows][mc].mean())
        out[f"clip/eps_high_by_c/{c}"] = float(eh[rows].mean())
        out[f"clip/adv_by_c/{c}"] = float(advantages[rows].abs().mean())
        out[f"clip/tokens_pos_by_c/{c}"] = float(pc.sum())
        if pc.any():
            out[f"clip/frac_high_by_c/{c}"] = float(above[rows][pc].float().mean())
        if nc.any():
            out[f"clip/frac_low_by_c/{c}"] = float(below[rows][nc].float().mean())
    return out


def first_move_entropy(moves: list) -> float:
    """Shannon entropy (nats) of the empirical distribution of first moves (``None`` ignored)."""
    counts: dict = {}
    for mv in moves:
        if mv is not None:
            counts[mv] = counts.get(mv, 0) + 1
    total = sum(counts.values())
    return -sum(v / total * math.log(v / total) for v in counts.values()) if total else 0.0
