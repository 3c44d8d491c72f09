"""The clip kernel the policy losses share (``gapo.core.losses``, ``gapo.core.rival_losses``).

``ClipBounds`` (the widths ``ε_low``, ``ε_high``: a float, (B,) per rollout or (B, T) per token;
the dual clip's ``clip_ratio_c``), the log-ratio (token, or GSPO's sequence ratio, arXiv 2507.18071),
the input checks, the signed-bound identity ``max(−A·ρ, −A·clip(ρ)) = −|A|·min(s·ρ, s·b)``, the
metrics (each loss's own parameters: ``gapo.core.method_params``). The conventions
(padding is don't-care, metrics) are documented in ``gapo.core.losses``; GAPO is arXiv 2609.00444.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gapo.core.checks import check_eps, check_same_shape, unknown

__all__ = [
    "ClipBounds",
    "LOG_RATIO_CLAMP",
    "log_ratio",
    "checked_bounds",
    "checked_advantages",
    "as_rows",
    "signed_bounds",
    "clip_metrics",
    "split_token_diagnostics",
]

LOG_RATIO_CLAMP = 20.0  # token level, ±


SEQ_LOG_RATIO_MAX = 10.0  # sequence level, upper cap only (verl's gspo)


LEVELS = ("token", "sequence")


@dataclass(frozen=True, eq=False)  # eq=False: eps_high may be a tensor (no elementwise ==)
class ClipBounds:
    """The clip bounds of a surrogate: the ratio is clipped to ``[1 − eps_low, 1 + eps_high]``.

    - ``eps_low``: ``ε_low`` in [0, 1), the lower clip width: a float, or a finite tensor of
      shape ``(B,)`` (one per rollout) or ``(B, T)`` (one per token, e.g. DCPO's bounds);
    - ``eps_high``: ``ε_high``, a float >= 0, or a finite ``(B,)`` tensor >= 0 with one upper
      width per rollout (GAPO's ``ε_high(i)``, ``gapo.core.clipping``), or a ``(B, T)`` tensor with
      one per token; a constant is exactly fixed clipping;
    - ``clip_ratio_c``: ``None`` (no dual clip), or the dual-clip constant ``> 1`` (arXiv
      1912.09729): for ``A < 0`` the token loss is capped at ``−A·clip_ratio_c``. CISPO takes none.

    An invalid value is a ``ValueError`` naming the field, raised when the bounds are built.
    """

    eps_low: float | torch.Tensor
    eps_high: float | torch.Tensor
    clip_ratio_c: float | None = None

    def __post_init__(self):
        check_eps(self.eps_low, self.eps_high)
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(
                f"clip_ratio_c must be > 1 for dual clipping, got {self.clip_ratio_c!r} (None: no dual clip)"
            )


def checked_bounds(fn: str, bounds: ClipBounds) -> ClipBounds:
    """``bounds`` when it is a ``ClipBounds`` (its values were checked when it was built)."""
    if not isinstance(bounds, ClipBounds):
        got = "none" if bounds is None else type(bounds).__name__
        raise TypeError(f"{fn}(): bounds must be a gapo.core.surrogate.ClipBounds(eps_low, eps_high), got {got}")
    return bounds


def as_rows(x: float | torch.Tensor, like: torch.Tensor, name: str) -> float | torch.Tensor:
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


def checked_advantages(logp, old_logp, advantages, response_mask) -> torch.Tensor:  # (B,) or (B, T)
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


def signed_bounds(adv, eps_low, eps_high):
    """Per-row sign ``s`` and signed bound ``s·b`` with ``b = 1+ε_high`` for A > 0, ``1−ε_low`` else.

    ``max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)) = −|A| · min(s·ρ, s·b)``: for A > 0 it is
    ``−A·min(ρ, 1+ε_high)``, for A < 0 ``−A·max(ρ, 1−ε_low)``, for A = 0 zero. The identity
    lets fixed and per-rollout ε run the very same kernel, with the bound computed per row.
    """
    sign = torch.sign(adv)
    upper, lower = 1.0 + eps_high, 1.0 - eps_low
    bound = torch.where(
        adv > 0,
        upper if isinstance(upper, torch.Tensor) else adv.new_tensor(upper),
        lower if isinstance(lower, torch.Tensor) else adv.new_tensor(lower),
    )
    return sign, sign * bound


def _eps_high_mean(eps_high, mask: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """The mean upper width: the float, the mean over rows of a (B, 1) tensor, or the mean over
    response tokens of a (B, T) one."""
    if not isinstance(eps_high, torch.Tensor):
        return torch.tensor(float(eps_high))
    if eps_high.shape[-1] == 1 or eps_high.shape != mask.shape:
        return eps_high.detach().float().mean()
    return (torch.where(mask.bool(), eps_high.detach(), 0.0).sum() / n_tokens).float()


def split_token_diagnostics(metrics: dict) -> tuple[dict, dict]:
    """``(scalars, tokens)``: a loss's metrics split into the 0-d ones, for logging, and the
    per-token ``token/*`` entries (``token/clipped``, ``token/gate``), for the per-``c`` diagnostics."""
    scalars = {k: v for k, v in metrics.items() if not k.startswith("token/")}
    tokens = {k: v for k, v in metrics.items() if k.startswith("token/")}
    return scalars, tokens


@torch.no_grad()
def clip_metrics(neg_log_r, adv, mask, n_tokens, clipped, dual, eps_high) -> dict:
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
        "clip/eps_high_mean": _eps_high_mean(eps_high, mask, n_tokens),
        "token/clipped": clipped.bool() & mask.bool(),
    }
