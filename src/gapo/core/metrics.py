"""Diagnostics: unbiased pass@k, token entropy, clip statistics per group-success count.

``pass_at_k(n, n_correct, k) = 1 − C(n − n_correct, k)/C(n, k)`` (Chen et al., arXiv 2107.03374),
computed as ``1 − Π_{i=n−n_correct+1}^{n} (1 − k/i)`` so it never forms huge binomials
(``n_correct`` is a problem's correct samples; ``c`` is kept for the group success count).

Clip statistics per ``c`` (arXiv 2609.00444 reports them to explain GAPO): for the response
tokens of rollouts whose group had ``c`` successes, the fraction of positive-advantage tokens
clipped above (``ρ > 1+ε_high``), of negative-advantage tokens clipped below (``ρ < 1−ε_low``),
mean ``|ρ − 1|``, and the mean ``ε_high`` in force.

The paper's diagnostic of its premise ("rollouts from low-success groups have larger importance
ratios"): the Pearson correlation, over the last ``RATIO_ADV_WINDOW`` steps, between each ``c``'s
mean ``|ρ − 1|`` of positive-advantage tokens and the mean advantage of its positive-advantage
rollouts, one point per (step, ``c``) — ``ratio_adv_pairs`` and ``ratio_adv_corr``
(docs/design.md §2.11). It is positive when low-``c`` (high-advantage) rollouts move further.
"""

from __future__ import annotations

import math
import operator

import torch

__all__ = [
    "pass_at_k",
    "pass_at_k_curve",
    "entropy_from_logits",
    "clip_stats_by_c",
    "clip_counts_by_c",
    "merge_counts",
    "counts_to_tensor",
    "counts_from_tensor",
    "clip_stats_from_counts",
    "first_move_entropy",
    "RATIO_ADV_WINDOW",
    "ratio_adv_pairs",
    "ratio_adv_corr",
    "pearson",
]


def pass_at_k(n: int, n_correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``n_correct`` correct (arXiv 2107.03374)."""
    for name, v in (("n", n), ("n_correct", n_correct), ("k", k)):
        if isinstance(v, bool) or not hasattr(v, "__index__"):  # ints, numpy ints, 0-d int tensors
            raise ValueError(f"{name} must be an int, got {v!r}")
    n, n_correct, k = operator.index(n), operator.index(n_correct), operator.index(k)
    if n < 1 or not 0 <= n_correct <= n:
        raise ValueError(f"need n >= 1 and 0 <= n_correct <= n, got n={n}, n_correct={n_correct}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n={n}, got k={k}")
    if n - n_correct < k:
        return 1.0
    prod = 1.0
    for i in range(n - n_correct + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_curve(n: int, correct: list[int], ks: list[int] | None = None) -> dict[int, float]:
    """Mean unbiased pass@k over problems, ``correct[j]`` successes out of ``n`` for problem j;
    ``ks`` defaults to powers of two up to ``n``."""
    ks = ks or [2**i for i in range(int(math.log2(n)) + 1)]
    return {k: sum(pass_at_k(n, n_correct, k) for n_correct in correct) / max(len(correct), 1) for k in ks}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:  # (..., V) -> (...)
    """Entropy of ``softmax(logits)``: ``logsumexp(z) − Σ softmax(z)·z``."""
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


_COUNT_FIELDS = (
    "tokens",
    "dev_sum",
    "pos_tokens",
    "pos_clipped",
    "neg_tokens",
    "neg_clipped",
    "rows",
    "eps_sum",
    "adv_abs_sum",
    "pos_rows",
    "pos_eps_sum",
    "pos_dev_sum",
    "pos_adv_sum",
    "pos_gate_sum",
)


def _per_token(eps: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # (B, T) or broadcastable
    """A width as a tensor that broadcasts over ``like`` (B, T): a float, (B,) rows or (B, T) tokens."""
    if not isinstance(eps, torch.Tensor):
        return like.new_tensor(float(eps))
    eps = eps.to(like.dtype)
    return eps.unsqueeze(-1) if eps.ndim == 1 else eps


def _row_width(eps: torch.Tensor, m: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:  # (B,)
    """Each row's ``ε_high``: its own, or its response tokens' mean for per-token widths."""
    if eps.ndim == 2 and eps.shape[-1] > 1:
        return torch.where(m, eps, 0.0).sum(-1) / m.sum(-1).clamp(min=1)
    return eps.reshape(-1).expand(advantages.shape[0]) if eps.numel() == 1 else eps.reshape(-1)


@torch.no_grad()
def clip_counts_by_c(
    ratio: torch.Tensor,  # (B, T) importance ratio (token or sequence level)
    advantages: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    c: torch.Tensor,  # (B,) the success count of each rollout's group
    *,
    eps_low: float | torch.Tensor,  # float, (B,) or (B, T)
    eps_high: float | torch.Tensor,  # float, (B,) or (B, T)
    clipped: torch.Tensor | None = None,  # (B, T) bool: the loss's own clipped tokens
    gate: torch.Tensor | None = None,  # (B, T): the loss's gradient weight per token
) -> dict[int, dict[str, float]]:
    """Raw sums per ``c`` (tokens, Σ|ρ−1|, positive/negative-advantage tokens and how many of
    them are clipped, rows, Σε_high, Σ|A|, and over positive-advantage tokens / rollouts Σ|ρ−1|,
    ΣA and Σ gate); add them across mini-batches with
    ``merge_counts`` and turn them into rates with ``clip_stats_from_counts``.

    A token is clipped when its ratio is outside ``[1 − ε_low, 1 + ε_high]`` on its advantage's
    side, unless the loss says which tokens it clipped (``clipped``: a covariance-selected token,
    a soft gate's none); per-token widths (DCPO) count per token, and a row's ``ε_high`` is its
    tokens' mean. ``gate`` is each token's policy-gradient weight relative to the unclipped
    surrogate (1 unclipped, 0 clipped, a soft gate's derivative); without it the weight is
    1 − clipped."""
    m = response_mask.bool()
    eps_high = _per_token(eps_high, ratio)
    above = (ratio > 1.0 + eps_high) & m
    below = (ratio < 1.0 - _per_token(eps_low, ratio)) & m
    if clipped is not None:
        above = below = clipped.bool() & m
    gate = (~(above | below)).to(ratio.dtype) if gate is None else gate.to(ratio.dtype)
    dev = torch.where(m, (ratio - 1.0).abs(), 0.0)  # not · m: a padded ratio may be NaN
    pos, neg = advantages > 0, advantages < 0
    tokens = m.sum(-1)
    per_row = torch.stack(
        [tokens.to(ratio.dtype), dev.sum(-1), tokens * pos, above.sum(-1) * pos, tokens * neg, below.sum(-1) * neg],
        dim=-1,
    ).double()  # (B, 6)
    pos_gate = (torch.where(m, gate, 0.0).sum(-1) * pos).double()
    return _by_c(c, per_row, advantages, _row_width(eps_high, m, advantages), (dev.sum(-1) * pos).double(), pos_gate)


def _by_c(c, per_row, advantages, eps_high, pos_dev, pos_gate) -> dict[int, dict[str, float]]:
    """``clip_counts_by_c``'s per-row sums, added up per success count ``c``."""
    out: dict[int, dict[str, float]] = {}
    pos = advantages > 0
    for bucket in torch.unique(c).tolist():
        rows = c == bucket
        prow = rows & pos
        rest = [
            float(rows.sum()),
            float(eps_high[rows].double().sum()),
            float(advantages[rows].double().abs().sum()),
            float(prow.sum()),
            float(eps_high[prow].double().sum()),
            float(pos_dev[rows].sum()),
            float(advantages[prow].double().sum()),
            float(pos_gate[rows].sum()),
        ]
        out[int(bucket)] = dict(zip(_COUNT_FIELDS, per_row[rows].sum(0).tolist() + rest))
    return out


def merge_counts(total: dict, new: dict) -> dict:
    """Add the per-``c`` sums of ``new`` into ``total`` (in place) and return it."""
    for c, fields in new.items():
        acc = total.setdefault(c, dict.fromkeys(_COUNT_FIELDS, 0.0))
        for k, v in fields.items():
            acc[k] += v
    return total


def counts_to_tensor(counts: dict, n_buckets: int) -> torch.Tensor:  # (n_buckets, F) float64
    """The per-``c`` sums as a dense tensor, row ``c`` for ``c = 0 .. n_buckets−1`` (zeros where
    absent): one fixed shape on every process, so it can be summed across them (all-reduce).
    ``counts_from_tensor`` turns it back into ``merge_counts``' form."""
    out = torch.zeros(n_buckets, len(_COUNT_FIELDS), dtype=torch.float64)
    for c, fields in counts.items():
        if not 0 <= c < n_buckets:
            raise ValueError(f"success count c={c} outside 0..{n_buckets - 1}")
        out[c] = torch.tensor([fields[k] for k in _COUNT_FIELDS], dtype=torch.float64)
    return out


def counts_from_tensor(t: torch.Tensor) -> dict[int, dict[str, float]]:
    """Inverse of ``counts_to_tensor``; buckets without rollouts are left out."""
    rows = _COUNT_FIELDS.index("rows")
    return {c: dict(zip(_COUNT_FIELDS, r)) for c, r in enumerate(t.double().cpu().tolist()) if r[rows] > 0}


def clip_stats_from_counts(counts: dict) -> dict[str, float]:
    """``clip/frac_high_by_c/{c}`` (share of positive-advantage tokens above ``1+ε_high``),
    ``clip/frac_low_by_c/{c}``, ``clip/ratio_dev_by_c/{c}`` (mean ``|ρ−1|``),
    ``clip/eps_high_by_c/{c}`` (all rollouts), ``clip/eps_high_pos_by_c/{c}`` (positive-advantage
    rollouts: the bound that can bind), ``clip/adv_by_c/{c}`` (mean ``|A|``), ``clip/tokens_pos_by_c/{c}``,
    ``clip/ratio_dev_pos_by_c/{c}`` (mean ``|ρ−1|`` of positive-advantage tokens, before clipping),
    ``clip/adv_pos_by_c/{c}`` (mean ``A`` of positive-advantage rollouts) and ``clip/gate_by_c/{c}``
    (the mean gradient weight of positive-advantage tokens: 1 − the clipped share for a hard clip,
    a soft gate's mean weight)."""
    out: dict[str, float] = {}
    for c in sorted(counts):
        f = counts[c]
        if f["tokens"] == 0:
            continue
        out[f"clip/ratio_dev_by_c/{c}"] = f["dev_sum"] / f["tokens"]
        out[f"clip/eps_high_by_c/{c}"] = f["eps_sum"] / f["rows"]
        out[f"clip/adv_by_c/{c}"] = f["adv_abs_sum"] / f["rows"]
        out[f"clip/tokens_pos_by_c/{c}"] = f["pos_tokens"]
        if f["pos_rows"]:
            out[f"clip/eps_high_pos_by_c/{c}"] = f["pos_eps_sum"] / f["pos_rows"]
            out[f"clip/adv_pos_by_c/{c}"] = f["pos_adv_sum"] / f["pos_rows"]
        if f["pos_tokens"]:
            out[f"clip/frac_high_by_c/{c}"] = f["pos_clipped"] / f["pos_tokens"]
            out[f"clip/gate_by_c/{c}"] = f.get("pos_gate_sum", 0.0) / f["pos_tokens"]
            out[f"clip/ratio_dev_pos_by_c/{c}"] = f["pos_dev_sum"] / f["pos_tokens"]
        if f["neg_tokens"]:
            out[f"clip/frac_low_by_c/{c}"] = f["neg_clipped"] / f["neg_tokens"]
    return out


def clip_stats_by_c(ratio, advantages, response_mask, c, **widths) -> dict[str, float]:
    """Clip statistics per group-success count ``c`` for one batch (see ``clip_stats_from_counts``);
    ``widths``: ``clip_counts_by_c``'s keywords (``eps_low``, ``eps_high``, ``clipped``, ``gate``)."""
    return clip_stats_from_counts(clip_counts_by_c(ratio, advantages, response_mask, c, **widths))


def first_move_entropy(moves: list) -> float:
    """Shannon entropy (nats) of the empirical distribution of first moves (``None`` ignored)."""
    counts: dict = {}
    for mv in moves:
        if mv is not None:
            counts[mv] = counts.get(mv, 0) + 1
    total = sum(counts.values())
    return -sum(v / total * math.log(v / total) for v in counts.values()) if total else 0.0


# Steps in the window of ``ratio_adv_corr``: 8 steps × up to G−1 buckets gives ~40 points, enough
# for a stable r, while still following the run's changes (docs/design.md §2.11).
RATIO_ADV_WINDOW = 8


def ratio_adv_pairs(stats: dict) -> list[tuple[float, float]]:
    """One step's ``(mean |ρ−1|, mean A)`` of positive-advantage tokens, one pair per ``c``, read
    from the keys of ``clip_stats_from_counts`` (gapo's trainer and the TRL adapter log them)."""
    pre = "clip/ratio_dev_pos_by_c/"
    return [
        (float(v), float(stats[f"clip/adv_pos_by_c/{k[len(pre) :]}"]))
        for k, v in stats.items()
        if k.startswith(pre) and f"clip/adv_pos_by_c/{k[len(pre) :]}" in stats
    ]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r; ``None`` with fewer than 3 points or no spread in either variable."""
    n = len(xs)
    if n < 3 or n != len(ys):
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-24 or syy <= 1e-24:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def ratio_adv_corr(window) -> dict[str, float]:
    """``{"clip/ratio_adv_corr": r}``: Pearson's r between ``|ρ−1|`` and ``A`` over every
    (step, ``c``) pair of ``window`` (a sequence of ``ratio_adv_pairs`` results, the last
    ``RATIO_ADV_WINDOW`` steps); empty when r is undefined (module docstring)."""
    pts = [p for step in window for p in step]
    r = pearson([p[0] for p in pts], [p[1] for p in pts])
    return {} if r is None else {"clip/ratio_adv_corr": r}
