"""ε schedules for the clipped surrogate: fixed, clip-higher and GAPO (arXiv 2609.00444).

PPO clips the importance ratio to ``[1 − ε_low, 1 + ε_high]``. Fixed clipping uses constants
(GRPO 0.2/0.2; DAPO "clip-higher" 0.2/0.28, arXiv 2503.14476). GAPO changes only ``ε_high``,
per rollout, as a function of the group's success (docs/design.md §2.5, the paper's Eq. 11)::

    w_i       = clamp((R_i − mean_j R_j) / ((G − 1)/G · (R_max − R_min)), 0, 1)
    linear:   ε_high(i) = ε_low + (ε_high_max − ε_low) · w_i
    log:      log(1 + ε_high(i)) = log(1 + ε_low) + w_i · (log(1 + ε_high_max) − log(1 + ε_low))

Why (docs/design.md §2.6): maximising ``E_π[A]`` under a reverse-KL trust region gives
``π* ∝ π_old·exp(A/λ)``, so the target ratio is ``exp(A_i/λ)/Z``: rollouts with larger advantage
deserve more headroom.
"linear" is the first-order form; "log" interpolates ``log(1+ε)``, i.e. geometrically, which is
the exact form. By weighted AM–GM the log schedule lies *below* the linear one for 0 < w < 1;
both meet at the endpoints.

For binary rewards and a correct rollout, ``w_i = (G − c)/(G − 1)``: the single correct rollout
of a hard group (``c = 1``) gets ``ε_high_max``, a correct rollout of an all-correct group gets
``ε_low``; incorrect rollouts (``A ≤ 0``) get ``ε_low`` (their upper bound never binds).
``w`` is computed from the *raw* rewards, so GAPO composes with every advantage estimator.

``reward_range`` says where ``R_min`` and ``R_max`` come from:

- ``(lo, hi)``: a fixed range, the range of the reward (the default ``(0, 1)``; a verifiable
  0/1 reward). Rewards are not checked against it here (callers that know better do).
- ``"group"``: each group's own ``R_min = min_j R_j`` and ``R_max = max_j R_j``::

      w_i = clamp((R_i − mean_g R) / ((G − 1)/G · (max_g R − min_g R)), 0, 1)

  For reward models and shaped rewards of any scale: ``w`` is unchanged when a group's rewards
  are shifted or scaled. Every group with a spread is treated like a binary group whose best
  reward is a success and worst a failure: the lone best rollout of a group whose other
  rollouts tie at the group's minimum gets ``w = 1`` (``ε_high_max``), however small the
  spread (as GRPO's std scaling amplifies it); a group that mixes several reward levels gives
  its best rollout ``w < 1``. A constant group (no spread) has ``w = 0``: ``ε_low`` for all.
  With 0/1 rewards it gives exactly the ``(0, 1)`` widths (a mixed group spans [0, 1]; a
  constant one has ``w = 0`` either way).
- ``"batch"``: ``R_min``, ``R_max`` = the min and max over every reward passed in (the whole
  batch: pass the whole generation batch, not a micro-batch). Keeps the scale of groups
  relative to each other (a group whose rewards span less than the batch's gets less
  headroom); one outlier reward compresses every ``w`` towards 0. A constant batch has ``w = 0``.

Every entry of ``EPS_SCHEDULES`` has one signature::

    fn(rewards (B,), group_size, *, eps_low, eps_high_max, reward_range) -> eps_high per rollout (B,)

where ``eps_high_max`` is the constant upper width for "fixed" and GAPO's ``ε_high_max`` otherwise, and
``reward_range`` is ``(lo, hi)``, ``"group"`` or ``"batch"``.
"""

from __future__ import annotations

import math

import torch

from gapo.core.checks import check_reward_range, check_rewards, reward_bounds, unknown

__all__ = ["success_weight", "gapo_eps_high", "eps_high_from_weight", "eps_high_for", "EPS_SCHEDULES"]


def success_weight(
    rewards: torch.Tensor,  # (B,), rows of a group contiguous
    group_size: int,
    *,
    reward_range: tuple[float, float] | str = (0.0, 1.0),
) -> torch.Tensor:  # (B,) in [0, 1]
    """``w_i = clamp((R_i − mean_group R) / ((G−1)/G · (R_max − R_min)), 0, 1)`` (arXiv 2609.00444).

    The denominator is the largest centred reward a rollout can have (one success among G
    failures), so ``w = 1`` exactly for the lone correct rollout of a binary group.
    ``reward_range``: ``(lo, hi)`` fixes ``R_min, R_max``; ``"group"`` takes each group's own
    min and max, ``"batch"`` the min and max of all of ``rewards``; where that range is empty
    (a constant group or batch) ``w = 0`` (see the module docstring).
    """
    check_rewards(rewards, group_size)
    rr = check_reward_range(reward_range)
    r = rewards.view(-1, group_size).float()  # (P, G)
    if isinstance(rr, tuple):
        lo, hi = rr
        scale = group_size / ((group_size - 1) * (hi - lo))
        return (r - r.mean(dim=1, keepdim=True)).mul_(scale).clamp_(0.0, 1.0).view(-1)
    # each reward's place in its own range first, in float64: the same w, but a tiny range (down
    # to float32's subnormals) no longer loses the lone success's w = 1 to rounding
    r64 = r.double()
    lo, hi = reward_bounds(r64, rr)  # (P, 1) for "group", 0-d for "batch"
    span = (hi - lo).expand_as(r64)
    z = (r64 - lo) / span.clamp(min=torch.finfo(torch.float64).tiny)
    w = (z - z.mean(dim=1, keepdim=True)) * (group_size / (group_size - 1))
    return torch.where(span > 0, w, torch.zeros_like(w)).clamp_(0.0, 1.0).float().view(-1)


def gapo_eps_high(
    rewards: torch.Tensor,  # (B,)
    group_size: int,
    *,
    eps_low: float,
    eps_high_max: float,
    eps_schedule: str = "linear",
    reward_range: tuple[float, float] | str = (0.0, 1.0),
) -> torch.Tensor:  # (B,)
    """Per-rollout upper clip width of GAPO (arXiv 2609.00444, Eq. 11 for ``eps_schedule="linear"``).

    ``linear``: ``ε_low + (ε_high_max − ε_low)·w``; ``log``: ``(1+ε_low)·((1+ε_high_max)/(1+ε_low))^w − 1``.
    """
    return eps_high_from_weight(
        success_weight(rewards, group_size, reward_range=reward_range),
        eps_low=eps_low,
        eps_high_max=eps_high_max,
        eps_schedule=eps_schedule,
    )


def eps_high_from_weight(
    w: torch.Tensor,  # (B,) success weights in [0, 1]
    *,
    eps_low: float,
    eps_high_max: float,
    eps_schedule: str = "linear",
) -> torch.Tensor:  # (B,)
    """GAPO's schedule applied to given success weights ``w`` (for adapters that recover ``w``
    from advantages rather than rewards, e.g. verl's); widths as :func:`_check_widths` says."""
    _check_widths(eps_low, eps_high_max)
    if not eps_high_max >= eps_low:
        raise ValueError(f"eps_high_max ({eps_high_max!r}) must be >= eps_low ({eps_low!r})")
    w = w.float().clone()
    if eps_schedule == "linear":
        return w.mul_(eps_high_max - eps_low).add_(eps_low)
    if eps_schedule == "log":
        log_lo, log_hi = math.log1p(eps_low), math.log1p(eps_high_max)
        return w.mul_(log_hi - log_lo).add_(log_lo).expm1_()
    raise unknown("GAPO eps_schedule", eps_schedule, ("linear", "log"))


def _check_widths(eps_low: float, eps_high_max: float) -> None:
    """Every schedule's widths are finite and >= 0. ``eps_low`` may be 1 or more: a width used only
    as a cap ``1 + ε`` (TRL's cispo, whose IS weight has no lower clip) needs none of
    ``1 − ε_low > 0``, which ``ClipBounds`` checks where a clipped surrogate uses the bound."""
    for name, v in (("eps_low", eps_low), ("eps_high_max", eps_high_max)):
        if not (math.isfinite(v) and v >= 0.0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")


def _fixed(rewards, group_size, *, eps_low, eps_high_max, reward_range=(0.0, 1.0)):
    """Constant ``ε_high`` for every rollout (GRPO, DAPO clip-higher)."""
    check_rewards(rewards, group_size)
    _check_widths(eps_low, eps_high_max)
    check_reward_range(reward_range)
    return torch.full(rewards.shape, float(eps_high_max), dtype=torch.float32, device=rewards.device)


def _gapo_linear(rewards, group_size, *, eps_low, eps_high_max, reward_range=(0.0, 1.0)):
    return gapo_eps_high(
        rewards,
        group_size,
        eps_low=eps_low,
        eps_high_max=eps_high_max,
        eps_schedule="linear",
        reward_range=reward_range,
    )


def _gapo_log(rewards, group_size, *, eps_low, eps_high_max, reward_range=(0.0, 1.0)):
    return gapo_eps_high(
        rewards, group_size, eps_low=eps_low, eps_high_max=eps_high_max, eps_schedule="log", reward_range=reward_range
    )


EPS_SCHEDULES = {"fixed": _fixed, "linear": _gapo_linear, "log": _gapo_log}


def eps_high_for(
    eps_schedule: str,
    rewards: torch.Tensor,
    group_size: int,
    *,
    eps_low: float,
    eps_high_max: float,
    reward_range: tuple[float, float] | str = (0.0, 1.0),
) -> torch.Tensor:  # (B,)
    """Dispatch to ``EPS_SCHEDULES[eps_schedule]``; unknown names raise ``ValueError``.
    ``reward_range`` is ``(lo, hi)``, ``"group"`` or ``"batch"`` (module docstring)."""
    if eps_schedule not in EPS_SCHEDULES:
        raise unknown("eps_schedule", eps_schedule, EPS_SCHEDULES)
    return EPS_SCHEDULES[eps_schedule](
        rewards, group_size, eps_low=eps_low, eps_high_max=eps_high_max, reward_range=reward_range
    )
