"""Clipped policy-gradient surrogates: PPO token ratio, GSPO sequence ratio, CISPO.

All losses share one signature (``LOSSES`` registry; the rivals SAPO, CE-GPPO, Clip-Cov and
KL-Cov live in ``gapo.core.rival_losses``)::

    fn(logp (B,T), old_logp (B,T), advantages (B,) or (B,T), response_mask (B,T),
       bounds: ClipBounds, *, agg, weights, norms, **params) -> (loss (), metrics)

``params`` are the loss's own parameters (``gapo.core.method_params``: ``LOSS_PARAMS`` names and
defaults, ``check_loss_params`` validates them). ``ClipBounds(eps_low, eps_high, clip_ratio_c)``
(``gapo.core.surrogate``) holds the clip bounds (each width
a float, one per rollout (B,) as GAPO's ``ε_high(i)``, or one per token (B, T)); ``norms``
(``gapo.core.aggregation.AggNorms``, or None) are ``agg_loss``'s whole-mini-batch normalisers, passed on unchanged.

The surrogate (PPO, arXiv 1707.06347; unchanged by GAPO, arXiv 2609.00444)::

    L[i,t] = max(−A_i·ρ, −A_i·clip(ρ, 1 − ε_low, 1 + ε_high(i)))
    dual clip (arXiv 1912.09729), for A < 0 only:  L = min(L, −A·clip_ratio_c)

with ``ρ`` the token ratio ``exp(logp − old_logp)`` (``level="token"``) or the GSPO sequence
ratio (``level="sequence"``, arXiv 2507.18071)::

    s_i = exp(mean_t(logp − old_logp))  over response tokens
    s[i,t] = sg(s_i) · exp(logp[i,t] − sg(logp[i,t]))     # value s_i, gradient per token

Token log-ratios are clamped to ±20 before ``exp``; the GSPO sequence log-ratio is capped at
+10 (as verl's ``gspo``), so extreme inputs give finite losses and both match verl exactly.
Padded positions (``response_mask = 0``) are don't-care: NaN or ±inf there in ``logp``,
``old_logp``, (B, T) ``advantages`` or ``weights`` change neither the loss, nor the gradient (0
at padding), nor the metrics. They are selected away (``torch.where``) where they first meet
(the log-ratio, the advantages, ``agg_loss``), never multiplied by a 0/1 mask (NaN · 0 is NaN).
``weights`` (optional, (B, T)) multiply the per-token loss, e.g. rollout-correction IS weights.
GAPO only supplies a per-rollout ``eps_high`` (see ``gapo.core.clipping``); with a constant tensor
the computation is exactly fixed clipping.

Metrics are detached 0-d tensors: ``loss/clipfrac`` (fraction of response tokens where the
clipped branch is taken, verl's ``pg_clipfrac``), ``loss/clipfrac_high`` (ratio above
``1+ε_high`` with ``A > 0``), ``loss/clipfrac_low`` (ratio below ``1−ε_low`` with ``A < 0``),
``loss/clipfrac_dual`` (dual clip taken, verl's ``pg_clipfrac_lower``), ``loss/approx_kl``
(masked mean of ``old_logp − logp``, verl's ``ppo_kl``), ``clip/eps_high_mean`` (over rows, or over
response tokens for a (B, T) width). Two per-token entries, for the trainer's per-``c``
diagnostics, are not scalars: ``token/clipped`` ((B, T) bool, False at padding: the tokens the loss
treats as clipped) and ``token/gate`` ((B, T) float, 0 at padding: the token's policy-gradient
weight relative to the unclipped PPO gradient ``−A·∇ρ``; 1 unclipped, 0 clipped for PPO);
:func:`split_token_diagnostics` separates them from the scalars before logging. Per-``c``
statistics (mean ``|ρ−1|`` and clip fractions by group success) live in ``gapo.core.metrics``.

Implementation: ``max(−A·ρ, −A·clip(ρ)) = −|A|·min(s·ρ, s·b)`` with ``s = sign(A)`` and the
row's binding bound ``b`` (``1+ε_high`` if A > 0 else ``1−ε_low``); fixed and per-rollout ε run
the same kernel, so GAPO costs nothing over fixed clipping.
"""

from __future__ import annotations

import torch

from gapo.core.aggregation import AggNorms, agg_loss
from gapo.core.checks import check_same_shape, unknown
from gapo.core.method_params import resolve_params
from gapo.core.rival_losses import cegppo_loss, clip_cov_loss, kl_cov_loss, sapo_loss
from gapo.core.surrogate import (
    LOG_RATIO_CLAMP,
    ClipBounds,
    as_rows,
    checked_advantages,
    checked_bounds,
    clip_metrics,
    log_ratio,
    signed_bounds,
)

__all__ = ["policy_loss", "cispo_loss", "LOSSES", "RATIO_LEVEL", "KL_ESTIMATORS", "kl_estimate"]


def _clip(ratio: torch.Tensor, eps_low, eps_high) -> torch.Tensor:
    """``clip(ρ, 1 − ε_low, 1 + ε_high)`` with each width a float or a (B, 1) or (B, T) tensor."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        # torch.clamp takes two numbers or two tensors, not one of each
        as_t = ratio.new_tensor
        return torch.clamp(
            ratio,
            min=lo if isinstance(lo, torch.Tensor) else as_t(lo),
            max=hi if isinstance(hi, torch.Tensor) else as_t(hi),
        )
    return torch.clamp(ratio, min=lo, max=hi)


def policy_loss(  # noqa: PLR0913 - the registry's 8 (LOSSES) and the ratio level, no group of them related
    logp: torch.Tensor,  # (B, T) current policy
    old_logp: torch.Tensor,  # (B, T) behaviour policy
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # ε_low, ε_high (float or (B,) per rollout: GAPO), clip_ratio_c
    *,
    level: str = "token",
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights, e.g. rollout IS correction
    norms: AggNorms | None = None,  # agg_loss's whole-mini-batch normalisers; None: this batch's own
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate ``max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))`` (arXiv 1707.06347, 2507.18071).

    ``bounds`` (:class:`ClipBounds`) holds ``ε_low``, ``ε_high`` and the dual-clip constant
    ``clip_ratio_c`` (> 1: dual clipping for ``A < 0``)::

        policy_loss(logp, old_logp, adv, mask, ClipBounds(0.2, eps_high))

    ``level="token"`` uses the token ratio, ``"sequence"`` GSPO's sequence ratio with the
    GSPO-token gradient. ``norms`` (``AggNorms(num_tokens, num_seqs, horizon)``) passes mini-batch
    normalisers to ``agg_loss``. Returns ``(loss, metrics)``; see the module docstring for the metrics.
    """
    bounds = checked_bounds("policy_loss", bounds)
    advantages = checked_advantages(logp, old_logp, advantages, response_mask)
    clip_ratio_c = bounds.clip_ratio_c
    eps_low = as_rows(bounds.eps_low, logp, "eps_low")
    eps_high = as_rows(bounds.eps_high, logp, "eps_high")
    adv = as_rows(advantages, logp, "advantages")

    log_r = log_ratio(logp, old_logp, response_mask, level)
    ratio = torch.exp(log_r)
    sign, signed_bound = signed_bounds(adv, eps_low, eps_high)
    signed_ratio = sign * ratio
    loss_mat = -adv.abs() * torch.minimum(signed_ratio, signed_bound)
    dual = None
    if clip_ratio_c is not None:
        pg3 = -adv * clip_ratio_c
        dual = (loss_mat > pg3) & (adv < 0)
        loss_mat = torch.where(dual, pg3, loss_mat)
    if weights is not None:
        check_same_shape({"weights": weights, "logp": logp})
        loss_mat = loss_mat * weights
    loss = agg_loss(loss_mat, response_mask, agg, norms=norms)

    with torch.no_grad():
        n_tokens = response_mask.sum().clamp(min=1)
        clipped = (signed_ratio > signed_bound) & response_mask.bool()
        neg_log_r = (
            (old_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if level == "token" else (old_logp - logp)
        )
        metrics = clip_metrics(neg_log_r, adv, response_mask, n_tokens, clipped, dual, eps_high)
        # the gradient is −A·∇ρ off the clip, 0 on it (and on the dual clip's cap)
        unclipped = ~clipped if dual is None else ~(clipped | dual)
        metrics["token/gate"] = (unclipped & response_mask.bool()).to(logp.dtype)
    return loss, metrics


def cispo_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # ε_low, ε_high; clip_ratio_c must be None
    *,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights
    norms: AggNorms | None = None,  # agg_loss's whole-mini-batch normalisers; None: this batch's own
    **params,  # none: CISPO has no parameters of its own (LOSS_PARAMS["cispo"])
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the IS *weight*, never drop a token's gradient.

    ``L[i,t] = −sg(clip(ρ, 1−ε_low, 1+ε_high)) · A_i · logp[i,t]``. The bounds are passed as in
    :func:`policy_loss`; their ``clip_ratio_c`` must be None (CISPO has no dual clip). A token is
    clipped when its weight is (``ρ`` beyond the bound on its advantage's side); its gate is
    ``clip(ρ)/ρ`` (the gradient ``−A·clip(ρ)·∇logp`` against PPO's ``−A·ρ·∇logp``).
    """
    resolve_params("cispo", params)
    bounds = checked_bounds("cispo_loss", bounds)
    advantages = checked_advantages(logp, old_logp, advantages, response_mask)
    if bounds.clip_ratio_c is not None:
        raise ValueError("clip_ratio_c (dual clip) is not defined for CISPO; pass None")
    eps_low = as_rows(bounds.eps_low, logp, "eps_low")
    eps_high = as_rows(bounds.eps_high, logp, "eps_high")
    adv = as_rows(advantages, logp, "advantages")
    log_r = log_ratio(logp, old_logp, response_mask, "token")
    ratio = torch.exp(log_r.detach())
    weight = _clip(ratio, eps_low, eps_high)
    loss_mat = -adv * weight * logp
    if weights is not None:
        check_same_shape({"weights": weights, "logp": logp})
        # where: logp itself carries the gradient here, and 0 · NaN weight at padding is NaN
        loss_mat = loss_mat * torch.where(response_mask.bool(), weights, weights.new_zeros(()))
    loss = agg_loss(loss_mat, response_mask, agg, norms=norms)
    with torch.no_grad():
        n_tokens = response_mask.sum().clamp(min=1)
        sign, signed_bound = signed_bounds(adv, eps_low, eps_high)
        clipped = (sign * ratio > signed_bound) & response_mask.bool()
        metrics = clip_metrics(-log_r.detach(), adv, response_mask, n_tokens, clipped, None, eps_high)
        metrics["token/gate"] = torch.where(response_mask.bool(), weight / ratio, 0.0)
    return loss, metrics


def _at_level(name: str, level: str):
    """:func:`policy_loss` at one ratio ``level``, with the registry's signature (its arguments,
    less ``level``, plus the loss's own parameters: none)."""

    def loss(
        logp,
        old_logp,
        advantages,
        response_mask,
        bounds: ClipBounds,
        *,
        agg="token-mean",
        weights=None,
        norms=None,
        **params,
    ):
        resolve_params(name, params)
        return policy_loss(
            logp, old_logp, advantages, response_mask, bounds, level=level, agg=agg, weights=weights, norms=norms
        )

    loss.__name__ = f"{name}_loss"
    return loss


# name -> loss with the shared signature. "ppo" is the token-ratio surrogate of GRPO/DAPO/GAPO,
# "gspo" the sequence-ratio surrogate of GSPO and GAPO-seq; the rivals are gapo.core.rival_losses'.
# Each loss's own parameters and defaults: LOSS_PARAMS (gapo.core.method_params).
LOSSES = {
    "ppo": _at_level("ppo", "token"),
    "gspo": _at_level("gspo", "sequence"),
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "cegppo": cegppo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
# the ratio each loss clips (for diagnostics computed outside the loss, e.g. clip counts per c)
RATIO_LEVEL = {
    "ppo": "token",
    "gspo": "sequence",
    **dict.fromkeys(("cispo", "sapo", "cegppo", "clip_cov", "kl_cov"), "token"),
}
KL_ESTIMATORS = ("k1", "k3")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:  # (B, T)
    """Per-token estimate of KL(π‖π_ref) from samples of π (Schulman's estimators, as in verl's
    ``kl_penalty``): with ``d = log π_ref − log π``, ``k1 = −d`` (unbiased, can be negative) and
    ``k3 = exp(d) − d − 1`` (unbiased, >= 0, lower variance)."""
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    raise unknown("kl estimator", estimator, KL_ESTIMATORS)
