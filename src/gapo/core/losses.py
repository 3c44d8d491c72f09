"""Clipped policy-gradient surrogates: PPO token ratio, GSPO sequence ratio, CISPO.

All losses share one signature (``LOSSES`` registry)::

    fn(logp (B,T), old_logp (B,T), advantages (B,) or (B,T), response_mask (B,T),
       bounds: ClipBounds, *, agg, norms) -> (loss (), metrics)

``ClipBounds(eps_low, eps_high, clip_ratio_c)`` holds the clip bounds (``eps_high`` a float or
one width per rollout, GAPO's ``ε_high(i)``); ``norms`` (``gapo.core.aggregation.AggNorms``, or
None) are ``agg_loss``'s whole-mini-batch normalisers, passed on unchanged.

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
(masked mean of ``old_logp − logp``, verl's ``ppo_kl``), ``clip/eps_high_mean``. Per-``c``
statistics (mean ``|ρ−1|`` and clip fractions by group success) live in ``gapo.core.metrics``.

Implementation: ``max(−A·ρ, −A·clip(ρ)) = −|A|·min(s·ρ, s·b)`` with ``s = sign(A)`` and the
row's binding bound ``b`` (``1+ε_high`` if A > 0 else ``1−ε_low``); fixed and per-rollout ε run
the same kernel, so GAPO costs nothing over fixed clipping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gapo.core.aggregation import AggNorms, agg_loss
from gapo.core.checks import check_eps, check_same_shape, unknown

__all__ = ["ClipBounds", "policy_loss", "cispo_loss", "LOSSES", "LOG_RATIO_CLAMP", "log_ratio"]

LOG_RATIO_CLAMP = 20.0  # token level, ±
SEQ_LOG_RATIO_MAX = 10.0  # sequence level, upper cap only (verl's gspo)
LEVELS = ("token", "sequence")


@dataclass(frozen=True, eq=False)  # eq=False: eps_high may be a tensor (no elementwise ==)
class ClipBounds:
    """The clip bounds of a surrogate: the ratio is clipped to ``[1 − eps_low, 1 + eps_high]``.

    - ``eps_low``: ``ε_low`` in [0, 1), the lower clip width (the same for every rollout);
    - ``eps_high``: ``ε_high``, a float >= 0, or a finite ``(B,)`` tensor >= 0 with one upper
      width per rollout (GAPO's ``ε_high(i)``, ``gapo.core.clipping``); a constant is exactly
      fixed clipping;
    - ``clip_ratio_c``: ``None`` (no dual clip), or the dual-clip constant ``> 1`` (arXiv
      1912.09729): for ``A < 0`` the token loss is capped at ``−A·clip_ratio_c``. CISPO takes none.

    An invalid value is a ``ValueError`` naming the field, raised when the bounds are built.
    """

    eps_low: float
    eps_high: float | torch.Tensor
    clip_ratio_c: float | None = None

    def __post_init__(self):
        check_eps(self.eps_low, self.eps_high)
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(
                f"clip_ratio_c must be > 1 for dual clipping, got {self.clip_ratio_c!r} (None: no dual clip)"
            )


def _checked_bounds(fn: str, bounds: ClipBounds) -> ClipBounds:
    """``bounds`` when it is a ``ClipBounds`` (its values were checked when it was built)."""
    if not isinstance(bounds, ClipBounds):
        got = "none" if bounds is None else type(bounds).__name__
        raise TypeError(f"{fn}(): bounds must be a gapo.core.losses.ClipBounds(eps_low, eps_high), got {got}")
    return bounds


def _as_rows(x: float | torch.Tensor, like: torch.Tensor, name: str) -> float | torch.Tensor:
    """A float stays a float; a (B,) tensor becomes (B, 1) to broadcast over tokens."""
    if not isinstance(x, torch.Tensor):
        return float(x)
    if x.ndim == 1:
        if x.shape[0] != like.shape[0]:
            raise ValueError(f"{name} has {x.shape[0]} rows, expected B={like.shape[0]}")
        return x.to(like.dtype).unsqueeze(-1)
    if x.shape != like.shape:
        raise ValueError(f"{name} must have shape (B,) or {tuple(like.shape)}, got {tuple(x.shape)}")
    return x.to(like.dtype)


def _clip(ratio: torch.Tensor, eps_low: float, eps_high: float | torch.Tensor) -> torch.Tensor:
    """``clip(ρ, 1 − ε_low, 1 + ε_high)`` with ``ε_high`` a float or a (B, 1) tensor."""
    if isinstance(eps_high, torch.Tensor):
        return torch.clamp(ratio, min=ratio.new_tensor(1.0 - eps_low), max=1.0 + eps_high)
    return torch.clamp(ratio, min=1.0 - eps_low, max=1.0 + eps_high)


def log_ratio(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    level: str = "token",
) -> torch.Tensor:  # (B, T) log ρ, with the GSPO-token gradient at sequence level
    """``log ρ``: token ``logp − old_logp``, or GSPO's ``sg(log s_i) + logp − sg(logp)``; 0 (ρ = 1,
    no gradient) at padded positions, whatever ``logp`` and ``old_logp`` hold there."""
    if level not in LEVELS:
        raise unknown("ratio level", level, LEVELS)
    # where, not · mask: padded log-probs may be NaN or ±inf, and NaN · 0 is NaN (in the gradient too)
    diff = torch.where(response_mask.bool(), logp - old_logp, logp.new_zeros(()))
    if level == "token":
        return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # as verl's gspo: no per-token clamp inside the mean, the combined log-ratio capped at +10;
    # diff − sg(diff) is 0 with logp's gradient, as logp − sg(logp) is, but 0 at padding
    seq = diff.sum(-1) / response_mask.to(logp.dtype).sum(-1).clamp(min=1.0)  # (B,) log s_i
    return (seq.detach().unsqueeze(-1) + (diff - diff.detach())).clamp(max=SEQ_LOG_RATIO_MAX)


def _checked_advantages(logp, old_logp, advantages, response_mask) -> torch.Tensor:  # (B,) or (B, T)
    """The advantages after the input checks: (B,) ones finite, (B, T) ones finite on response
    tokens and set to 0 at padding (NaN there would otherwise reach the gradient: 0 · NaN)."""
    check_same_shape({"logp": logp, "old_logp": old_logp, "response_mask": response_mask})
    if logp.ndim != 2:
        raise ValueError(f"logp must have shape (B, T), got {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages must have shape (B,) or (B, T), got {tuple(advantages.shape)} for logp {tuple(logp.shape)}"
        )
    if advantages.shape == logp.shape:
        advantages = torch.where(response_mask.bool(), advantages, advantages.new_zeros(()))
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages contain NaN/inf (on response tokens)")
    return advantages


def _bounds(adv, eps_low, eps_high):
    """Per-row sign ``s`` and signed bound ``s·b`` with ``b = 1+ε_high`` for A > 0, ``1−ε_low`` else.

    ``max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)) = −|A| · min(s·ρ, s·b)``: for A > 0 it is
    ``−A·min(ρ, 1+ε_high)``, for A < 0 ``−A·max(ρ, 1−ε_low)``, for A = 0 zero. The identity
    lets fixed and per-rollout ε run the very same kernel, with the bound computed per row.
    """
    sign = torch.sign(adv)
    upper = 1.0 + eps_high
    bound = torch.where(
        adv > 0, upper if isinstance(upper, torch.Tensor) else adv.new_tensor(upper), adv.new_tensor(1.0 - eps_low)
    )
    return sign, sign * bound


@torch.no_grad()
def _metrics(neg_log_r, adv, mask, n_tokens, clipped, dual, eps_high) -> dict:
    """Token fractions over response tokens; ``clipped`` already excludes masked tokens."""
    m = mask.to(neg_log_r.dtype)
    clipped = clipped.to(neg_log_r.dtype)
    pos, neg = (adv > 0).to(clipped.dtype), (adv < 0).to(clipped.dtype)
    if adv.shape[-1] == 1:  # per-rollout advantages: reduce rows first, then split by sign
        per_row = clipped.sum(-1, keepdim=True)
        high, low = (per_row * pos).sum(), (per_row * neg).sum()
    else:
        high, low = (clipped * pos).sum(), (clipped * neg).sum()
    return {
        "loss/clipfrac": (high + low) / n_tokens,
        "loss/clipfrac_high": high / n_tokens,
        "loss/clipfrac_low": low / n_tokens,
        "loss/clipfrac_dual": (dual.to(m.dtype) * m).sum() / n_tokens if dual is not None else torch.zeros(()),
        "loss/approx_kl": torch.where(mask.bool(), neg_log_r, 0.0).sum() / n_tokens,
        "clip/eps_high_mean": (
            eps_high.detach().float().mean() if isinstance(eps_high, torch.Tensor) else torch.tensor(float(eps_high))
        ),
    }


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
    bounds = _checked_bounds("policy_loss", bounds)
    advantages = _checked_advantages(logp, old_logp, advantages, response_mask)
    eps_low, clip_ratio_c = bounds.eps_low, bounds.clip_ratio_c
    eps_high = _as_rows(bounds.eps_high, logp, "eps_high")
    adv = _as_rows(advantages, logp, "advantages")

    log_r = log_ratio(logp, old_logp, response_mask, level)
    ratio = torch.exp(log_r)
    sign, signed_bound = _bounds(adv, eps_low, eps_high)
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
        metrics = _metrics(neg_log_r, adv, response_mask, n_tokens, clipped, dual, eps_high)
    return loss, metrics


def cispo_loss(
    logp: torch.Tensor,  # (B, T)
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    bounds: ClipBounds,  # ε_low, ε_high; clip_ratio_c must be None
    *,
    agg: str = "token-mean",
    norms: AggNorms | None = None,  # agg_loss's whole-mini-batch normalisers; None: this batch's own
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the IS *weight*, never drop a token's gradient.

    ``L[i,t] = −sg(clip(ρ, 1−ε_low, 1+ε_high)) · A_i · logp[i,t]``. The bounds are passed as in
    :func:`policy_loss`; their ``clip_ratio_c`` must be None (CISPO has no dual clip).
    """
    bounds = _checked_bounds("cispo_loss", bounds)
    advantages = _checked_advantages(logp, old_logp, advantages, response_mask)
    if bounds.clip_ratio_c is not None:
        raise ValueError("clip_ratio_c (dual clip) is not defined for CISPO; pass None")
    eps_low = bounds.eps_low
    eps_high = _as_rows(bounds.eps_high, logp, "eps_high")
    adv = _as_rows(advantages, logp, "advantages")
    log_r = log_ratio(logp, old_logp, response_mask, "token")
    ratio = torch.exp(log_r.detach())
    weight = _clip(ratio, eps_low, eps_high)
    loss_mat = -adv * weight * logp
    loss = agg_loss(loss_mat, response_mask, agg, norms=norms)
    with torch.no_grad():
        n_tokens = response_mask.sum().clamp(min=1)
        sign, signed_bound = _bounds(adv, eps_low, eps_high)
        clipped = (sign * ratio > signed_bound) & response_mask.bool()
        metrics = _metrics(-log_r.detach(), adv, response_mask, n_tokens, clipped, None, eps_high)
    return loss, metrics


def _ppo(logp, old_logp, advantages, response_mask, bounds: ClipBounds, *, agg="token-mean", weights=None, norms=None):
    """:func:`policy_loss` on the token ratio (its arguments, less ``level``)."""
    return policy_loss(
        logp, old_logp, advantages, response_mask, bounds, level="token", agg=agg, weights=weights, norms=norms
    )


def _gspo(logp, old_logp, advantages, response_mask, bounds: ClipBounds, *, agg="token-mean", weights=None, norms=None):
    """:func:`policy_loss` on GSPO's sequence ratio (its arguments, less ``level``)."""
    return policy_loss(
        logp, old_logp, advantages, response_mask, bounds, level="sequence", agg=agg, weights=weights, norms=norms
    )


# name -> loss with the shared signature. "ppo" is the token-ratio surrogate of GRPO/DAPO/GAPO,
# "gspo" the sequence-ratio surrogate of GSPO and GAPO-seq.
LOSSES = {"ppo": _ppo, "gspo": _gspo, "cispo": cispo_loss}
# the ratio each loss clips (for diagnostics computed outside the loss, e.g. clip counts per c)
RATIO_LEVEL = {"ppo": "token", "gspo": "sequence", "cispo": "token"}
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
