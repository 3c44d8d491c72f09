"""Rival policy losses, registered in ``gapo.core.losses.LOSSES``: SAPO, CE-GPPO, Clip-Cov, KL-Cov.

Each has the registry's signature and conventions (``gapo.core.losses``: padding is don't-care,
``weights`` multiply the per-token loss, ``params`` are the loss's own, ``gapo.core.method_params.LOSS_PARAMS``)::

    fn(logp, old_logp, advantages, response_mask, bounds, *, agg, weights, norms, **params)

with ``ρ = exp(logp − old_logp)`` (log-ratio clamped to ±20), ``A`` the advantage::

    sapo     (arXiv 2511.20347)  L = −A·(4/τ)·σ(τ(ρ − 1)),  τ = tau_pos if A > 0 else tau_neg
    cegppo   (arXiv 2509.20712)  PPO's value; on a clipped token the gradient −A·β·b·∇logp
    clip_cov (arXiv 2505.22617)  PPO's clip, and a random share of high-covariance tokens dropped
    kl_cov   (arXiv 2505.22617)  L = −A·ρ, plus coef·|log ρ| on the top-covariance tokens

Besides ``gapo.core.losses``' metrics each returns ``token/clipped`` and ``token/gate`` (its
docstring says what they are for that loss). SAPO and KL-Cov ignore the clip widths
(``method_params.USES_BOUNDS``); none takes the dual clip's ``clip_ratio_c`` (``DUAL_CLIP``).
"""

from __future__ import annotations

import torch

from gapo.core.aggregation import AggNorms, agg_loss
from gapo.core.checks import check_same_shape
from gapo.core.method_params import resolve_params
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

__all__ = ["sapo_loss", "cegppo_loss", "clip_cov_loss", "kl_cov_loss"]


def _prepare(name, logp, old_logp, advantages, response_mask, bounds, weights):
    """The checked inputs: ``(adv, eps_low, eps_high)`` as rows/tokens (``gapo.core.surrogate``)."""
    bounds = checked_bounds(f"{name}_loss", bounds)
    advantages = checked_advantages(logp, old_logp, advantages, response_mask)
    if bounds.clip_ratio_c is not None:
        raise ValueError(f"clip_ratio_c (dual clip) is not defined for {name}; pass None")
    if weights is not None:
        check_same_shape({"weights": weights, "logp": logp})
    eps_low = as_rows(bounds.eps_low, logp, "eps_low")
    eps_high = as_rows(bounds.eps_high, logp, "eps_high")
    return as_rows(advantages, logp, "advantages"), eps_low, eps_high


def _aggregate(loss_mat, weights, response_mask, agg, norms) -> torch.Tensor:
    """``agg_loss`` of ``loss_mat · weights``, the weights selected away at padding (0 · NaN is NaN)."""
    if weights is not None:
        loss_mat = loss_mat * torch.where(response_mask.bool(), weights, weights.new_zeros(()))
    return agg_loss(loss_mat, response_mask, agg, norms=norms)


@torch.no_grad()
def _token_metrics(logp, old_logp, adv, response_mask, clipped, eps_high, gate) -> dict:
    """``gapo.core.losses``' metrics for ``clipped`` tokens, with ``token/gate`` (0 at padding)."""
    n_tokens = response_mask.sum().clamp(min=1)
    clipped = clipped & response_mask.bool()
    neg_log_r = (old_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics = clip_metrics(neg_log_r, adv, response_mask, n_tokens, clipped, None, eps_high)
    metrics["token/gate"] = torch.where(response_mask.bool(), gate.to(logp.dtype), 0.0)
    return metrics


def sapo_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # widths ignored; clip_ratio_c must be None
    *,
    agg: str = "token-mean",  # the paper and verl use seq-mean-token-mean
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights
    norms: AggNorms | None = None,
    **params,  # tau_pos (1.0), tau_neg (1.05): the paper's, verl's and TRL's defaults
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (arXiv 2511.20347): a soft sigmoid gate in place of the hard clip.

    ``L[i,t] = −A·(4/τ)·σ(τ(ρ − 1))`` with ``τ = tau_pos`` where ``A > 0``, ``tau_neg`` elsewhere
    (as verl's ``compute_policy_loss_sapo`` and TRL's ``loss_type="sapo"``). Its gradient is
    ``−A·4σ(1−σ)·∇ρ``: ``token/gate = 4σ(1−σ)`` (1 at ``ρ = 1``, decaying off-policy). SAPO has no
    hard clip: the widths of ``bounds`` are ignored and no token is clipped (``token/clipped`` all
    False, the clip fractions 0, as verl reports); ``loss/gate_mean`` is the mean gate.
    """
    p = resolve_params("sapo", params)
    adv, _, eps_high = _prepare("sapo", logp, old_logp, advantages, response_mask, bounds, weights)
    ratio = torch.exp(log_ratio(logp, old_logp, response_mask, "token"))
    tau = torch.where(adv > 0, adv.new_tensor(p["tau_pos"]), adv.new_tensor(p["tau_neg"]))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    gates = sig * (4.0 / tau)
    loss = _aggregate(-gates * adv, weights, response_mask, agg, norms)
    with torch.no_grad():
        gate = 4.0 * sig * (1.0 - sig)
        none = torch.zeros_like(response_mask, dtype=torch.bool)
        metrics = _token_metrics(logp, old_logp, adv, response_mask, none, eps_high, gate)
        metrics["loss/gate_mean"] = metrics["token/gate"].sum() / response_mask.sum().clamp(min=1)
    return loss, metrics


def _ppo_kernel(logp, old_logp, adv, response_mask, eps_low, eps_high):
    """PPO's token loss ``−|A|·min(s·ρ, s·b)`` (``gapo.core.surrogate``), the clipped tokens and ``b``."""
    ratio = torch.exp(log_ratio(logp, old_logp, response_mask, "token"))
    sign, signed_bound = signed_bounds(adv, eps_low, eps_high)
    signed_ratio = sign * ratio
    loss_mat = -adv.abs() * torch.minimum(signed_ratio, signed_bound)
    clipped = (signed_ratio > signed_bound) & response_mask.bool()
    return loss_mat, clipped, sign * signed_bound, ratio


def cegppo_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # ε_low, ε_high (float, (B,) or (B, T)); clip_ratio_c must be None
    *,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights
    norms: AggNorms | None = None,
    **params,  # beta_low (0.75), beta_high (1.0)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CE-GPPO (arXiv 2509.20712): PPO's clipped value, with the clipped tokens' gradient kept, scaled.

    Off the clip the token is PPO's. On it (``ρ < 1−ε_low`` with ``A < 0``, or ``ρ > 1+ε_high``
    with ``A > 0``; these are ``token/clipped``) the value stays PPO's ``−A·b`` (``b`` the bound)
    and the stop-gradient term ``−A·β·b·(exp(log ρ − sg(log ρ)) − 1)`` (value 0) gives the gradient
    ``−A·β·b/sg(ρ)·∇ρ = −A·β·b·∇logp``, ``β = beta_low`` below, ``beta_high`` above:
    ``token/gate = β·b/ρ`` there, 1 elsewhere. ``beta_low = beta_high = 0`` is PPO exactly.

    Defaults ``beta_low = 0.75``, ``beta_high = 1.0``: the authors' reference code
    (github.com/Kwai-Klear/CE-GPPO, ``gppo_loss_beta1=0.75``, ``gppo_loss_beta2=1.0``). Their code's
    forward value on a clipped token is ``−A·β·b`` rather than ``−A·b``; the gradient is the same,
    and the value here is PPO's, so that the logged loss compares with PPO's.
    """
    p = resolve_params("cegppo", params)
    adv, eps_low, eps_high = _prepare("cegppo", logp, old_logp, advantages, response_mask, bounds, weights)
    loss_mat, clipped, bound, ratio = _ppo_kernel(logp, old_logp, adv, response_mask, eps_low, eps_high)
    beta = torch.where(adv > 0, adv.new_tensor(p["beta_high"]), adv.new_tensor(p["beta_low"]))
    # unclamped log-ratio: the kept gradient is ∇logp even past the ±20 clamp; where, not · mask
    diff = torch.where(response_mask.bool(), logp - old_logp, logp.new_zeros(()))
    preserved = -adv * beta * bound * (torch.exp(diff - diff.detach()) - 1.0)
    loss_mat = loss_mat + torch.where(clipped, preserved, logp.new_zeros(()))
    loss = _aggregate(loss_mat, weights, response_mask, agg, norms)
    with torch.no_grad():
        gate = torch.where(clipped, beta * bound / ratio.detach(), 1.0)
        metrics = _token_metrics(logp, old_logp, adv, response_mask, clipped, eps_high, gate)
    return loss, metrics


@torch.no_grad()
def _covariance(logp, adv, response_mask) -> torch.Tensor:  # (B, T)
    """``(A − mean A)·(logp − mean logp)``, means over response tokens (verl's ``masked_mean``)."""
    m = response_mask.bool()
    n = response_mask.to(logp.dtype).sum() + 1e-8
    lp = logp.detach()
    mean_a = torch.where(m, adv, 0.0).sum() / n
    mean_lp = torch.where(m, lp, 0.0).sum() / n
    return (adv - mean_a) * (lp - mean_lp)


def clip_cov_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # ε_low, ε_high (float, (B,) or (B, T)); clip_ratio_c must be None
    *,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights
    norms: AggNorms | None = None,
    **params,  # ratio (2e-4), lb (1.0), ub (5.0); generator: torch.Generator | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (arXiv 2505.22617, Cui et al.): PPO's clip, and the gradient of a few
    high-covariance tokens dropped.

    ``cov = (A − mean A)·(logp − mean logp)`` over response tokens; of the tokens PPO does not clip
    with ``lb < cov < ub``, ``max(⌊ratio·N⌋, 1)`` drawn at random (``torch.randperm`` with
    ``generator``, None: torch's global CPU stream, as verl) lose their loss, value and gradient
    (verl's ``compute_policy_loss_clip_cov``; defaults verl's ``clip_cov_ratio``, ``clip_cov_lb``,
    ``clip_cov_ub``). ``token/clipped`` marks both PPO-clipped and dropped tokens (gate 0, else 1);
    ``loss/clipfrac*`` count PPO's clip, ``loss/clipfrac_cov`` the dropped tokens (verl's
    ``pg_clipfrac``).
    """
    generator = params.pop("generator", None)
    p = resolve_params("clip_cov", params)
    adv, eps_low, eps_high = _prepare("clip_cov", logp, old_logp, advantages, response_mask, bounds, weights)
    loss_mat, clipped, _, _ = _ppo_kernel(logp, old_logp, adv, response_mask, eps_low, eps_high)
    with torch.no_grad():
        cov = _covariance(logp, adv.expand_as(logp), response_mask)
        cand = torch.nonzero(response_mask.bool() & ~clipped & (cov > p["lb"]) & (cov < p["ub"]))
        n_drop = max(int(p["ratio"] * response_mask.sum().item()), 1)
        device = generator.device if generator is not None else "cpu"
        perm = torch.randperm(len(cand), generator=generator, device=device)
        chosen = cand[perm[:n_drop].to(cand.device)]
        dropped = torch.zeros_like(response_mask, dtype=torch.bool)
        dropped[chosen[:, 0], chosen[:, 1]] = True
    loss = _aggregate(torch.where(dropped, logp.new_zeros(()), loss_mat), weights, response_mask, agg, norms)
    with torch.no_grad():
        metrics = _token_metrics(logp, old_logp, adv, response_mask, clipped, eps_high, ~(clipped | dropped))
        metrics["token/clipped"] = clipped | dropped
        metrics["loss/clipfrac_cov"] = dropped.to(logp.dtype).sum() / response_mask.sum().clamp(min=1)
    return loss, metrics


def kl_cov_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # widths ignored; clip_ratio_c must be None
    *,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,  # (B, T) per-token loss weights
    norms: AggNorms | None = None,
    **params,  # ratio (2e-4), coef (1.0)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (arXiv 2505.22617, Cui et al.): no clip; a KL penalty on the top-covariance tokens.

    ``L = −A·ρ`` on every token, ``+ coef·|log ρ|`` on the ``max(⌊ratio·N⌋, 1)`` response tokens
    of largest ``cov = (A − mean A)·(logp − mean logp)`` (plain means over response tokens; verl's
    ``compute_policy_loss_kl_cov``, its ``kl_cov_ratio`` and ``ppo_kl_coef`` defaults). The widths
    of ``bounds`` are ignored. ``token/clipped`` marks the penalised tokens (``loss/clipfrac_*``
    count them by advantage sign); ``token/gate`` is 1: the policy-gradient term is never cut,
    the penalty's gradient ``coef·sign(log ρ)·∇logp`` is a separate term, not a multiple of it.
    """
    p = resolve_params("kl_cov", params)
    adv, _, eps_high = _prepare("kl_cov", logp, old_logp, advantages, response_mask, bounds, weights)
    log_r = log_ratio(logp, old_logp, response_mask, "token")
    pg = -adv * torch.exp(log_r)
    with torch.no_grad():
        m = response_mask.bool()
        a, lp = adv.expand_as(logp)[m], logp.detach()[m]
        penalised = torch.zeros_like(m)
        if a.numel():
            cov = (a - a.mean()) * (lp - lp.mean())
            top = torch.topk(cov, max(1, int(a.numel() * p["ratio"]))).indices
            penalised.view(-1)[torch.nonzero(m.reshape(-1)).squeeze(-1)[top]] = True
    loss_mat = torch.where(penalised, pg + p["coef"] * log_r.abs(), pg)
    loss = _aggregate(loss_mat, weights, response_mask, agg, norms)
    metrics = _token_metrics(logp, old_logp, adv, response_mask, penalised, eps_high, torch.ones_like(logp))
    return loss, metrics
