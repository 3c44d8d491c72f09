"""Clip bounds adapted to the batch: BAPO (arXiv 2510.18927) and DCPO (arXiv 2509.02333).

GAPO's ``EPS_SCHEDULES`` (``gapo.core.clipping``) map rewards to one ``ε_high`` per rollout. The
two schedules here need other inputs: BAPO the batch's ratios and advantages, DCPO the old token
probabilities. They share one signature (``BOUND_SCHEDULES``)::

    fn(ratio (B,T) detached, old_logp (B,T), advantages (B,) or (B,T), response_mask (B,T),
       *, eps_low, eps_high, **params) -> (eps_low, eps_high)

with the defaults of ``params`` in ``BOUND_PARAMS`` and their check in :func:`check_bound_params`.
The surrogate then clips the ratio to ``[1 − eps_low, 1 + eps_high]`` (``gapo.core.losses``).
Padded positions (``response_mask = 0``) are don't-care: NaN or ±inf there change nothing.

**BAPO** (Xi et al., arXiv 2510.18927, Algorithm 1). Clip bounds ``c_low``, ``c_high`` as ratio
values (``eps_low = 1 − c_low``, ``eps_high = c_high − 1``, two floats), chosen for each call,
i.e. for each loss call's micro-batch, from the positive tokens' share of the gradient::

    S+ = Σ_{A_t > 0, r_t ≤ c_high} r_t·|A_t|        S− = Σ_{A_t < 0, r_t ≥ c_low} r_t·|A_t|
    ρ  = S+ / (S+ + S−)                             (ρ = 1 when S− = 0)

    c_low ← a−, c_high ← a+
    while ρ < ρ0 and a bound can still move:
        if c_high < b+:  c_high ← min(c_high + δ1, b+)
        else:            c_low  ← min(c_low + δ2, b−)

Defaults: ρ0 = 0.5, [a−, b−] = [0.6, 0.9], [a+, b+] = [1.2, 3.0] (the paper's, as the authors'
README states them), δ1 = δ2 = 0.05 (the authors' verl recipe config). How the open points were
settled:

- *Where the ranges start*: ``a− = 1 − eps_low`` and ``a+ = 1 + eps_high``, the given widths (the
  authors' verl recipe does the same when its ``ratio_lower_start``/``ratio_upper_start`` are
  unset); the paper's starts are ``eps_low = 0.4, eps_high = 0.2``. ``params`` hold the ends and
  steps: ``rho_0`` (ρ0), ``b_minus`` (b−), ``b_plus`` (b+), ``delta_1`` (δ1), ``delta_2`` (δ2).
- *The contribution*: counts only tokens whose ratio is inside their bound, those whose gradient
  the clip leaves, as the paper argues the loop (raising ``c_high`` lets more low-probability
  positive tokens in, raising ``c_low`` filters low-probability negative tokens out; the
  authors' README says the same). So ρ never decreases along the loop. The authors' open-source
  verl recipe instead compares ``Σ A·min(r, c_high)`` with ``Σ |A|·max(r, c_low)`` over all
  tokens, clipped ones included, under which raising ``c_low`` *lowers* the share; that recipe
  is not followed. Each token counts once (a plain sum over response tokens, whatever the loss
  aggregation).
- *Loop order*: ``c_high`` first, then ``c_low`` (Algorithm 1, read as quoted in public code: the
  paper's PDF was not at hand; the verl recipe raises ``c_low`` first). A last step shorter than
  δ lands exactly on the range's end (as the recipe's ``min(c + δ, b)``); the paper's loop guard
  ``c_low + δ2 ≤ b−`` is read as "a bound can still move", which also lets ``c_high`` move when
  ``a− = b−``.
- *ρ0 unreachable*: the loop ends with both bounds at their upper ends ``(b−, b+)``.

The loop runs over the precomputed path of bounds at once: one sort, cumulative sums and one
host sync per call, whatever the number of steps.

**DCPO** (Yang et al., arXiv 2509.02333, dynamic-adaptive clipping, as in the authors' verl
code): bounds per token from the old probability ``q = exp(old_logp)``, the ratios ``r`` with
``q·r·|r − 1| = ε`` (the new probability times the ratio's change stays within ε)::

    lower = 0.5 + 0.5·sqrt(max(1 − 4ε_low/q, 0))
    upper = min(0.5 + 0.5·sqrt(1 + 4ε_high/q), r_max)

returned as ``(B, T)`` tensors ``eps_low = 1 − lower ∈ [0, 0.5]`` and ``eps_high = upper − 1 ≥ 0``.
The paper's widths are ``eps_low = 0.16, eps_high = 0.2``; ``r_max = 10`` (param ``r_max``) is the
authors' code's cap (``max(clip_ratio_c, 10)`` there). As ``q → 1`` the bounds tend to
``0.5 ± 0.5·sqrt(1 ∓ 4ε)``, not ``1 ∓ ε``: 0.8 and ≈ 1.171 with the paper's widths; as ``q → 0``,
lower → 0.5 and upper → ``r_max``. ``old_logp`` is floored at −80 (``q ≈ 1.8e−35``): ``4ε/q`` stays
finite in float32 (the authors' code sets ``lower = 1`` at ``q = 0`` exactly; here the ``q → 0``
limit holds there too). Padding gets the ``q = 1`` bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from gapo.core.checks import check_same_shape, is_real
from gapo.core.method_params import resolve_bound_params

__all__ = [
    "BOUND_SCHEDULES",
    "bapo_path",
    "bapo_shares",
    "bapo_bounds",
    "dcpo_bounds",
]

BAPO_MAX_STEPS = 10_000  # a path longer than this is a misconfigured step (δ far below the range)
DCPO_LOGP_FLOOR = -80.0  # exp(80) and 4ε·exp(80) stay finite in float32


def bapo_path(
    *, eps_low: float, eps_high: float, b_minus: float, b_plus: float, delta_1: float, delta_2: float
) -> tuple[list[float], list[float]]:
    """The bounds ``(c_low, c_high)`` BAPO's loop visits, in order (module docstring): from
    ``(1 − eps_low, 1 + eps_high)``, ``c_high`` up in steps of δ1 to ``b_plus``, then ``c_low`` up
    in steps of δ2 to ``b_minus``; the last step of each is shortened to land on the end."""
    a_minus, a_plus = 1.0 - eps_low, 1.0 + eps_high
    if not 0.0 < a_minus <= b_minus:
        raise ValueError(
            f"BAPO's lower range [1 - eps_low, b_minus] = [{a_minus!r}, {b_minus!r}] is empty or not in (0, 1]: "
            "eps_low must be < 1 and >= 1 - b_minus"
        )
    if not 1.0 <= a_plus <= b_plus:
        raise ValueError(
            f"BAPO's upper range [1 + eps_high, b_plus] = [{a_plus!r}, {b_plus!r}] is empty: "
            "eps_high must be <= b_plus - 1"
        )
    n_high, n_low = _steps(b_plus - a_plus, delta_1), _steps(b_minus - a_minus, delta_2)
    if n_high + n_low > BAPO_MAX_STEPS:
        raise ValueError(
            f"BAPO's path has {n_high + n_low} steps (> {BAPO_MAX_STEPS}): delta_1={delta_1!r} or "
            f"delta_2={delta_2!r} is too small for its range"
        )
    c_high = [a_plus] + [min(a_plus + k * delta_1, b_plus) for k in range(1, n_high + 1)]
    c_low = [a_minus] * len(c_high) + [min(a_minus + k * delta_2, b_minus) for k in range(1, n_low + 1)]
    return c_low, c_high + [b_plus] * n_low


def _steps(span: float, delta: float) -> int:
    """Steps of ``delta`` to cover ``span``; rounding first so 1.8/0.05 (35.99999…) counts 36."""
    return max(0, math.ceil(round(span / delta, 9)))


def bapo_shares(
    ratio: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    c_low: list[float],  # (J,) candidate lower bounds (ratio values)
    c_high: list[float],  # (J,) candidate upper bounds
) -> torch.Tensor:  # (J,) float64
    """BAPO's positive share ``ρ = S+/(S+ + S−)`` at each candidate ``(c_low[j], c_high[j])``
    (module docstring: ``S+`` sums ``r·|A|`` over A > 0 tokens with ``r ≤ c_high``, ``S−`` over
    A < 0 tokens with ``r ≥ c_low``); 1 where ``S− = 0``. Sorted once, for any number of candidates."""
    w, r, adv = _bapo_weights(ratio, advantages, response_mask)
    lo = torch.tensor(c_low, dtype=torch.float64, device=r.device)
    hi = torch.tensor(c_high, dtype=torch.float64, device=r.device)
    s_pos = _sum_below(r[adv > 0], w[adv > 0], hi)
    s_neg = _sum_from(r[adv < 0], w[adv < 0], lo)
    # S− > 0 makes the sum positive; where S− = 0 the 0/0 of the other branch is never selected
    return torch.where(s_neg > 0, s_pos / (s_pos + s_neg), 1.0)


def _bapo_weights(ratio, advantages, response_mask):
    """``(r·|A|, r, A)`` over the response tokens only, float64, checked finite."""
    check_same_shape({"ratio": ratio, "response_mask": response_mask})
    if ratio.ndim != 2 or advantages.shape not in (ratio.shape[:1], ratio.shape):
        raise ValueError(
            f"ratio must be (B, T) and advantages (B,) or (B, T), "
            f"got {tuple(ratio.shape)} and {tuple(advantages.shape)}"
        )
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    keep = response_mask.bool()
    # boolean indexing drops padding before any arithmetic: NaN/inf there never enter a sum
    r = ratio.detach().double()[keep]
    adv = adv.detach().double().expand_as(ratio)[keep]
    w = r * adv.abs()
    if not torch.isfinite(w).all():
        raise ValueError("ratio and advantages must be finite on response tokens")
    return w, r, adv


def _sum_below(r: torch.Tensor, w: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``Σ w[r ≤ b]`` for each ``b`` of ``bounds``."""
    r_sorted, order = torch.sort(r)
    cum = torch.cat([w.new_zeros(1), torch.cumsum(w[order], 0)])
    return cum[torch.searchsorted(r_sorted, bounds, right=True)]


def _sum_from(r: torch.Tensor, w: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``Σ w[r ≥ b]`` for each ``b`` of ``bounds`` (suffix sums: no cancellation)."""
    r_sorted, order = torch.sort(r)
    suffix = torch.cat([torch.flip(torch.cumsum(torch.flip(w[order], (0,)), 0), (0,)), w.new_zeros(1)])
    return suffix[torch.searchsorted(r_sorted, bounds, right=False)]


def bapo_bounds(
    ratio: torch.Tensor,  # (B, T), detached
    old_logp: torch.Tensor,  # (B, T), unused: the registry's signature
    advantages: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    *,
    eps_low: float,  # a− = 1 − eps_low
    eps_high: float,  # a+ = 1 + eps_high
    **params: float,  # rho_0, b_minus, b_plus, delta_1, delta_2 (BOUND_PARAMS["bapo"])
) -> tuple[float, float]:
    """BAPO's clip widths for this micro-batch (arXiv 2510.18927, Algorithm 1; module docstring):
    the first bounds on :func:`bapo_path` where ``ρ ≥ ρ0``, else ``(b−, b+)``; returns
    ``(1 − c_low, c_high − 1)``."""
    p = resolve_bound_params("bapo", params)
    _check_widths(eps_low, eps_high)
    c_low, c_high = bapo_path(
        eps_low=eps_low,
        eps_high=eps_high,
        b_minus=p["b_minus"],
        b_plus=p["b_plus"],
        delta_1=p["delta_1"],
        delta_2=p["delta_2"],
    )
    met = bapo_shares(ratio, advantages, response_mask, c_low, c_high) >= p["rho_0"]
    steps = torch.arange(len(c_low), device=met.device)
    j = min(int(torch.where(met, steps, len(c_low)).min().item()), len(c_low) - 1)
    return 1.0 - c_low[j], c_high[j] - 1.0


def dcpo_bounds(
    ratio: torch.Tensor,  # (B, T), unused: the registry's signature
    old_logp: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,) or (B, T), unused
    response_mask: torch.Tensor,  # (B, T)
    *,
    eps_low: float,  # DCPO's ε_low (paper 0.16)
    eps_high: float,  # DCPO's ε_high (paper 0.2)
    **params: float,  # r_max (BOUND_PARAMS["dcpo"])
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T) float32 each
    """DCPO's per-token widths (arXiv 2509.02333) from ``q = exp(old_logp)``::

        eps_low  = 0.5 − 0.5·sqrt(max(1 − 4ε_low/q, 0))
        eps_high = min(0.5·sqrt(1 + 4ε_high/q) − 0.5, r_max − 1)

    finite everywhere: padding takes ``q = 1``, ``old_logp`` is floored at −80 (module docstring).
    A NaN ``old_logp`` on a response token stays NaN (an upstream fault, left visible)."""
    r_max = resolve_bound_params("dcpo", params)["r_max"]
    _check_widths(eps_low, eps_high)
    check_same_shape({"old_logp": old_logp, "response_mask": response_mask})
    # where, not · mask: padded log-probs may be NaN or ±inf
    logp = torch.where(response_mask.bool(), old_logp.detach().float(), 0.0)
    inv_q = torch.exp(-logp.clamp(min=DCPO_LOGP_FLOOR, max=0.0))  # 1/q in [1, e^80]
    lower = 0.5 + 0.5 * torch.sqrt((1.0 - 4.0 * eps_low * inv_q).clamp(min=0.0))
    upper = (0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high * inv_q)).clamp(max=r_max)
    return 1.0 - lower, upper - 1.0


def _check_widths(eps_low: float, eps_high: float) -> None:
    for name, v in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not (is_real(v) and math.isfinite(v) and v >= 0.0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


BoundSchedule = Callable[..., tuple]

BOUND_SCHEDULES: dict[str, BoundSchedule] = {"bapo": bapo_bounds, "dcpo": dcpo_bounds}
