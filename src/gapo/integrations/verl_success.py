"""GAPO's success weight ``w_i`` (and the group success count ``c``) recovered from a verl
advantage, one row at a time: what the verl losses (:mod:`gapo.integrations.verl`) clip with.

**Group success from advantages.** verl calls a policy loss with advantages, not rewards, and
its ``ppo_loss`` forwards only ``old_log_probs``, ``advantages``, ``response_mask`` and
``rollout_is_weights`` from the batch, so no reward field can be carried through. ``w_i`` is
therefore recovered *per row* (micro-batches are shuffled, so the rows of a group need not be
together) from the row's own advantage, with ``G = actor.rollout_n`` and ``Δ = R_max − R_min``:

- ``adv_estimator=grpo``, ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO): ``A = R − R̄``, so the
  centred reward is ``x = (R − R̄)/Δ = A/Δ``;
- ``adv_estimator=rloo``: ``A = G/(G−1)·(R − R̄)``, so ``x = (G−1)/G · A/Δ``;
- ``adv_estimator=grpo``, ``norm_adv_by_std_in_grpo=True``: ``A = (R − R̄)/(std_unbiased + 1e-6)``,
  binary rewards only (below);

so ``w = clamp(x·G/(G−1), 0, 1)`` exactly, for any rewards in ``[R_min, R_max]``. Std-normalised
advantages are invertible only for binary rewards: with ``p = c/G`` the correct rollouts have
``A = sqrt((G−1)/G·(1−p)/p)``, so ``c = G/(1 + A²·G/(G−1))`` and ``w = (G−c)/(G−1)``.

This is valid only when (i) the advantages are exactly those of the estimator named in
``policy_loss`` (``*_vectorized`` variants are equivalent), (ii) every group has exactly
``rollout_n`` responses, (iii) the reward summed over the response is the verifiable reward
(``algorithm.use_kl_in_reward=False``, no token-level reward shaping) and lies in
``[reward_min, reward_max]``, and (iv) the advantage is the same on every response token.
Checks made on every call (``ValueError`` naming the fix, never a silently wrong ε): (iv); the
estimator is one of the three above; ``|x| ≤ (G−1)/G`` (catches std-normalised advantages
passed as Dr.GRPO, and a too-narrow reward range, for most groups); and with
``binary_rewards=True`` (the default) that every row implies an integer number of correct
rollouts ``c`` in ``[1, G−1]`` (catches nearly every mismatch of estimator, ``G`` or range).
Not detectable: a group with fewer than ``rollout_n`` responses whose advantages happen to look
valid. The defaults (``adv_estimator="grpo"``, ``norm_adv_by_std_in_grpo=False``, rewards in
``[0, 1]``, binary) are the paper's recipe and apply when no GAPO key is set.

**Reward range "group" / "batch".** The core's ``reward_range="group"`` takes ``R_min, R_max``
from each group's own rewards (``"batch"``: the whole batch's). The loss sees neither (no group
id reaches it), so ``policy_loss.reward_range=group|batch`` is accepted only where one row's
advantage fixes ``w`` without the reward's scale: std-normalised GRPO of binary rewards (any two
values, e.g. ±1), where ``c`` and ``w = (G−c)/(G−1)`` come from ``A`` alone and equal the core's
group and batch weights (a mixed binary group spans both values). Dr.GRPO and RLOO advantages
carry the reward's scale, and non-binary groups need their own min and max: rejected at start-up
with the alternatives (a fixed ``reward_min``/``reward_max``; rewards rescaled to [0, 1] in the
reward function).
"""

from __future__ import annotations

import torch

from gapo.integrations.verl_config import reward_range_of

__all__ = ["success_from_advantages", "success_weight_from_advantages", "row_advantages"]

_COUNT_TOL = 1e-3  # |c − round(c)| allowed; fp32 advantages of G ≤ 1024 are far inside it


def success_weight_from_advantages(
    advantages: torch.Tensor,  # (B,) one outcome advantage per row
    group_size: int,
    *,
    adv_estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = False,
    reward_range: tuple[float, float] | str = (0.0, 1.0),
    binary_rewards: bool = True,
) -> torch.Tensor:  # (B,)
    """GAPO's ``w_i`` in [0, 1] alone: ``success_from_advantages(...)[0]``, same arguments."""
    return success_from_advantages(
        advantages,
        group_size,
        adv_estimator=adv_estimator,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        reward_range=reward_range,
        binary_rewards=binary_rewards,
    )[0]


def success_from_advantages(
    advantages: torch.Tensor,  # (B,) one outcome advantage per row
    group_size: int,
    *,
    adv_estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = False,
    reward_range: tuple[float, float] | str = (0.0, 1.0),
    binary_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B,) w in [0, 1]; (B,) long c, or None
    """``(w, c)``: GAPO's ``w_i`` recovered from a row's own verl advantage (module docstring; rows
    independent) and, for binary rewards, the number ``c`` of correct rollouts in the row's group.
    Raises ``ValueError`` when an advantage cannot come from the named estimator with this group
    size and reward range.

    ``c`` is ``-1`` on rows with zero advantage (an all-equal group: ``c`` is 0 or G, which the
    advantage cannot tell apart) and ``c`` is ``None`` when ``binary_rewards=False`` (a centred
    reward does not determine a count).

    ``reward_range="group"`` or ``"batch"`` (``w`` from each group's, or the batch's, own min and
    max reward, as in :func:`gapo.core.clipping.success_weight`) is accepted only with std-normalised
    GRPO advantages of binary rewards: there ``c``, and so ``w = (G−c)/(G−1)``, follow from the
    advantage whatever the two reward values are, and equal the core's ``"group"``/``"batch"``
    weights (a mixed binary group spans both values, hence the batch's range too). Other
    estimators carry the reward's scale, which one row cannot reveal: ``ValueError``.
    """
    G = group_size
    a = advantages.detach().double()
    span = _span(reward_range, adv_estimator, norm_adv_by_std_in_grpo, binary_rewards)
    if norm_adv_by_std_in_grpo and adv_estimator.startswith("grpo"):
        if not binary_rewards:
            raise ValueError("std-normalised GRPO advantages are invertible only for binary rewards")
        return _success_from_std_advantages(a, G)
    if adv_estimator.startswith("rloo"):
        x = a * ((G - 1) / G) / span
    else:
        x = a / span
    bound = (G - 1) / G
    bad = x.abs() > bound * (1 + 1e-4) + 1e-6
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise ValueError(
            f"advantage {a[i].item():.6g} is impossible for {adv_estimator} (norm_adv_by_std_in_grpo="
            f"{norm_adv_by_std_in_grpo}) with rewards in {tuple(reward_range)} and G={G}: |R − mean| "
            f"can be at most (G−1)/G·(R_max − R_min). Check that policy_loss.adv_estimator/"
            "norm_adv_by_std_in_grpo match algorithm.*, reward_min/max the reward, rollout_n the group size"
        )
    c = None
    if binary_rewards:
        implied = torch.where(x > 0, G * (1.0 - x), -G * x)
        c = _check_counts(implied, x != 0, G, f"{adv_estimator} (norm_adv_by_std_in_grpo={norm_adv_by_std_in_grpo})", a)
    return (x * (G / (G - 1))).clamp(0.0, 1.0).to(torch.float32), c


def _span(reward_range, adv_estimator: str, norm_adv_by_std_in_grpo: bool, binary_rewards: bool) -> float | None:
    """``R_max − R_min`` of a fixed reward range; ``None`` for ``"group"``/``"batch"``, which only
    std-normalised GRPO advantages of binary rewards allow (``reward_range_of`` raises otherwise)."""
    if not isinstance(reward_range, str):
        return float(reward_range[1]) - float(reward_range[0])
    std = norm_adv_by_std_in_grpo and adv_estimator.startswith("grpo")
    if reward_range not in ("group", "batch") or not (std and binary_rewards):
        reward_range_of(
            {
                "reward_range": reward_range,
                "adv_estimator": adv_estimator,
                "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
                "binary_rewards": binary_rewards,
            }
        )
    return None  # unused on the std-normalised path


def _success_from_std_advantages(a: torch.Tensor, G: int) -> tuple[torch.Tensor, torch.Tensor]:  # (B,), (B,)
    """``(w, c)`` from std-normalised GRPO advantages ``a`` (float64) of binary rewards."""
    q = a.square() * (G / (G - 1))
    # correct rows: q = (1−p)/p; incorrect rows: q = p/(1−p); p = c/G
    implied = torch.where(a > 0, G / (1.0 + q), G * q / (1.0 + q))  # c, before the whole-number check
    c = _check_counts(implied, a != 0, G, "grpo with norm_adv_by_std_in_grpo=True", a)
    w = torch.where(a > 0, (G - implied) / (G - 1), torch.zeros_like(a))
    return w.clamp(0.0, 1.0).to(torch.float32), c


def _check_counts(implied: torch.Tensor, rows: torch.Tensor, G: int, what: str, a: torch.Tensor) -> torch.Tensor:
    """Check that the ``implied`` success count is a whole number in [1, G−1] on ``rows``; return it
    rounded (long: ``c``), −1 elsewhere."""
    off = (implied - implied.round()).abs() > _COUNT_TOL
    out = (implied < 1 - _COUNT_TOL) | (implied > G - 1 + _COUNT_TOL)
    bad = rows & (off | out)
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise ValueError(
            f"advantage {a[i].item():.6g} does not come from binary rewards with {what} and G={G} "
            f"(it implies {implied[i].item():.4f} correct rollouts, not an integer in [1, {G - 1}]). Check that "
            "policy_loss.adv_estimator/norm_adv_by_std_in_grpo match algorithm.*, reward_min/max the "
            "reward values and rollout_n the group size; for non-binary rewards set binary_rewards=False"
        )
    return torch.where(rows, implied.round(), torch.full_like(implied, -1.0)).long()


def row_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B,)
    """The one advantage of each row; error if it varies over the response (GAE, token rewards).
    Padded entries are ignored, NaN and ±inf included (selected away: NaN · 0 is NaN)."""
    if advantages.ndim == 1:
        return advantages
    m = mask.bool()
    row = torch.where(m, advantages, 0.0).sum(-1) / m.sum(-1).clamp(min=1).to(advantages.dtype)
    dev = torch.where(m, (advantages - row.unsqueeze(-1)).abs(), 0.0).amax(-1) if advantages.shape[-1] else row * 0
    if (dev > 1e-5 * (1.0 + row.abs())).any():
        raise ValueError(
            "GAPO's verl adapter needs one outcome advantage per response (grpo/rloo), but the advantages "
            "vary across the tokens of a response (GAE or token-level rewards?)"
        )
    return row
