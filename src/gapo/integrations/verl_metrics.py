"""The per-``c`` metrics of GAPO's verl losses, and gapo's rates from a logged verl step.

**Metrics.** verl's keys ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, plus
``actor/gapo_eps_high_mean``, ``actor/gapo_success_weight_mean``, ``actor/gapo_clipfrac_high``,
``actor/gapo_clipfrac_low`` (rates over this micro-batch's response tokens). With binary rewards,
per group-success count ``c = 1 .. G−1`` (``c`` recovered from the advantage,
:mod:`gapo.integrations.verl_success`; rows with zero advantage, whose group is all-correct or
all-wrong, have no bucket), sums over this
micro-batch's response tokens, counted by :func:`gapo.core.metrics.clip_counts_by_c`:
``actor/gapo_tokens_by_c/{c}``, ``actor/gapo_ratio_dev_sum_by_c/{c}`` (Σ ``|ρ−1|``),
``actor/gapo_tokens_pos_by_c/{c}`` (tokens of correct rollouts), ``actor/gapo_clipped_high_by_c/{c}``
(of those, ``ρ > 1+ε_high(i)``), ``actor/gapo_ratio_dev_pos_sum_by_c/{c}`` (their Σ ``|ρ−1|``),
``actor/gapo_rows_pos_by_c/{c}`` and ``actor/gapo_adv_pos_sum_by_c/{c}`` (how many correct rollouts,
and the sum of their advantages), and ``actor/gapo_eps_high_pos_by_c/{c}`` (ε_high of a correct
rollout of such a group, from the schedule). ``clip_stats_from_verl`` turns one logged step into
gapo's ``clip/*_by_c/{c}`` rates, from which ``gapo.core.metrics.ratio_adv_corr`` gives the
paper's windowed ratio-advantage correlation (docs/design.md §2.11). verl 0.9.1 wraps every key a policy loss returns in
a mean-aggregated ``Metric``, averages it over micro-batches and data-parallel ranks, and raises
when a key has a different number of values on two ranks; so every key is returned on every call
(0 for a bucket the micro-batch lacks) and the logged values are mean sums per rank micro-batch,
whose ratios are pooled rates: ``gapo_clipped_high_by_c/c ÷ gapo_tokens_pos_by_c/c`` is the clip
fraction above ``1+ε_high`` and ``gapo_ratio_dev_sum_by_c/c ÷ gapo_tokens_by_c/c`` the mean
``|ρ−1|`` of bucket ``c`` over the whole update (docs/scale-out.md). With
``binary_rewards=False`` the per-``c`` keys are absent.
"""

from __future__ import annotations

import torch

from gapo.core.clipping import eps_high_from_weight
from gapo.core.metrics import clip_counts_by_c
from gapo.core.surrogate import log_ratio
from gapo.integrations.verl_config import GapoParams

__all__ = ["metrics_by_c", "clip_stats_from_verl"]

# verl key -> field of gapo.core.metrics.clip_counts_by_c; summed over this micro-batch's tokens
_BY_C_SUMS = (
    ("actor/gapo_tokens_by_c", "tokens"),
    ("actor/gapo_ratio_dev_sum_by_c", "dev_sum"),
    ("actor/gapo_tokens_pos_by_c", "pos_tokens"),
    ("actor/gapo_clipped_high_by_c", "pos_clipped"),
    ("actor/gapo_ratio_dev_pos_sum_by_c", "pos_dev_sum"),
    ("actor/gapo_rows_pos_by_c", "pos_rows"),
    ("actor/gapo_adv_pos_sum_by_c", "pos_adv_sum"),
)


def clip_stats_from_verl(metrics: dict) -> dict[str, float]:
    """gapo's per-``c`` rates (``clip/frac_high_by_c/{c}``, ``clip/ratio_dev_by_c/{c}``,
    ``clip/ratio_dev_pos_by_c/{c}``, ``clip/adv_pos_by_c/{c}``, ``clip/eps_high_pos_by_c/{c}``)
    from one logged verl step's per-``c`` sums (module docstring, "Metrics"): the ratios of
    verl's means are the pooled rates, so ``gapo.core.metrics.ratio_adv_pairs`` and
    ``ratio_adv_corr`` apply to verl runs as they do to gapo's. Buckets with no tokens are left out."""
    fields: dict[int, dict[str, float]] = {}
    for key, field in _BY_C_SUMS:
        for k, v in metrics.items():
            if k.startswith(key + "/"):
                fields.setdefault(int(k[len(key) + 1 :]), {})[field] = float(v)
    out: dict[str, float] = {}
    for c, f in sorted(fields.items()):
        if f.get("tokens", 0) > 0:
            out[f"clip/ratio_dev_by_c/{c}"] = f["dev_sum"] / f["tokens"]
        if f.get("pos_tokens", 0) > 0:
            out[f"clip/frac_high_by_c/{c}"] = f["pos_clipped"] / f["pos_tokens"]
            if "pos_dev_sum" in f:
                out[f"clip/ratio_dev_pos_by_c/{c}"] = f["pos_dev_sum"] / f["pos_tokens"]
        if f.get("pos_rows", 0) > 0:
            out[f"clip/adv_pos_by_c/{c}"] = f["pos_adv_sum"] / f["pos_rows"]
        if f.get("pos_tokens", 0) > 0 and f"actor/gapo_eps_high_pos_by_c/{c}" in metrics:
            out[f"clip/eps_high_pos_by_c/{c}"] = float(metrics[f"actor/gapo_eps_high_pos_by_c/{c}"])
    return out


@torch.no_grad()
def metrics_by_c(level, old_log_prob, log_prob, a_row, response_mask, c, eps_high, p: GapoParams) -> dict:
    """Per-``c`` sums for ``c = 1 .. G−1``, every key on every call (module docstring, "Metrics").

    verl (``Metric.aggregate_dp``) fails when a key has a different number of values on two
    ranks, so a bucket missing from a micro-batch is logged as 0 rather than left out; sums, not
    rates, so that verl's plain mean over micro-batches and ranks keeps their ratios exact.
    """
    G = p.group_size
    known = c >= 0  # zero-advantage rows: all-equal group, c is 0 or G
    ratio = torch.exp(log_ratio(log_prob.detach(), old_log_prob, response_mask, level))
    counts = clip_counts_by_c(
        ratio[known], a_row[known], response_mask[known], c[known], eps_low=p.eps_low, eps_high=eps_high[known]
    )
    w_pos = (G - torch.arange(1, G, dtype=torch.float64)) / (G - 1)  # correct rollout of a group with c
    eps_pos = eps_high_from_weight(w_pos, eps_low=p.eps_low, eps_high_max=p.eps_high_max, eps_schedule=p.eps_schedule)
    out: dict[str, float] = {}
    for bucket in range(1, G):
        fields = counts.get(bucket)
        for key, field in _BY_C_SUMS:
            out[f"{key}/{bucket}"] = float(fields[field]) if fields else 0.0
        out[f"actor/gapo_eps_high_pos_by_c/{bucket}"] = eps_pos[bucket - 1].item()
    return out
