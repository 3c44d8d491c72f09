"""GAPO's parameters from verl's configuration, for :mod:`gapo.integrations.verl`: the checks of
GAPO's ``policy_loss`` keys (run by ``GAPOPolicyLossConfig`` at start-up and again on every loss
call), the actor config read into ``GapoParams``, and verl's aggregation normalisers mapped onto
``gapo.core.aggregation.agg_loss``.

Plain functions of dict-like configs (a dataclass with ``get`` or an OmegaConf ``DictConfig``).
This module imports nothing of verl, so importing it first can never start verl's plugin loader
(which imports :mod:`gapo.integrations.verl`, which imports this module). The meaning of each key
is in the docstring of :mod:`gapo.integrations.verl`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gapo.core.aggregation import AggNorms
from gapo.core.checks import check_reward_range

SCHEDULES = ("linear", "log")
# estimators whose advantages we can invert; the *_vectorized ones compute the same numbers
ADV_ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized")


def check_gapo_fields(pl) -> None:
    eps_high_max = pl.get("eps_high_max", None)
    if eps_high_max is not None and not float(eps_high_max) >= 0.0:
        raise ValueError(f"policy_loss.eps_high_max must be >= 0, got {eps_high_max!r}")
    eps_schedule = pl.get("eps_schedule", "linear")
    if eps_schedule not in SCHEDULES:
        raise ValueError(f"policy_loss.eps_schedule must be one of {SCHEDULES}, got {eps_schedule!r}")
    lo, hi = float(pl.get("reward_min", 0.0)), float(pl.get("reward_max", 1.0))
    if not hi > lo:
        raise ValueError(f"policy_loss.reward_max ({hi}) must be > reward_min ({lo})")
    est = pl.get("adv_estimator", "grpo")
    if est not in ADV_ESTIMATORS:
        raise ValueError(
            f"policy_loss.adv_estimator={est!r}: GAPO's verl adapter reads group success back from "
            f"the advantage and can do so only for {ADV_ESTIMATORS}; set it (and algorithm.adv_estimator) "
            "to one of them"
        )
    std = bool(pl.get("norm_adv_by_std_in_grpo", False)) and est.startswith("grpo")
    if std and not bool(pl.get("binary_rewards", True)):
        raise ValueError(
            "std-normalised GRPO advantages (norm_adv_by_std_in_grpo=True) determine group success only "
            "for binary rewards; with binary_rewards=False use Dr.GRPO (algorithm.norm_adv_by_std_in_grpo="
            "False, and the same in policy_loss) or RLOO"
        )
    reward_range_of(pl)


def reward_range_of(pl) -> tuple[float, float] | str:
    """The reward range of a ``policy_loss`` config: ``(lo, hi)``, ``"group"`` or ``"batch"``."""
    lo, hi = float(pl.get("reward_min", 0.0)), float(pl.get("reward_max", 1.0))
    rr = pl.get("reward_range", None)
    if rr is None:
        return lo, hi
    if not isinstance(rr, str):
        try:
            rr = tuple(rr)
        except TypeError:
            pass
    try:
        rr = check_reward_range(rr)
    except ValueError as exc:
        raise ValueError(f"policy_loss.reward_range: {exc}") from None
    if isinstance(rr, tuple):
        if (lo, hi) != (0.0, 1.0) and rr != (lo, hi):
            raise ValueError(
                f"ambiguous reward range: policy_loss.reward_range={list(rr)} but reward_min/reward_max="
                f"{lo}/{hi}; set one of them"
            )
        return rr
    est = pl.get("adv_estimator", "grpo")
    std = bool(pl.get("norm_adv_by_std_in_grpo", False)) and est.startswith("grpo")
    if not (std and bool(pl.get("binary_rewards", True))):
        raise ValueError(
            f"policy_loss.reward_range={rr!r} needs each group's own reward range (batch: the batch's), "
            "but verl's policy loss is given only each row's advantage, not its group or the batch "
            "(verl's actor forwards no other per-sample field). It is exact only for std-normalised GRPO "
            "advantages of binary rewards (algorithm.adv_estimator=grpo, algorithm.norm_adv_by_std_in_grpo="
            "True, policy_loss.binary_rewards=True), whose value does not depend on the reward's scale. "
            f"Here adv_estimator={est!r}, norm_adv_by_std_in_grpo={bool(pl.get('norm_adv_by_std_in_grpo', False))}, "
            f"binary_rewards={bool(pl.get('binary_rewards', True))}: give the reward's fixed range instead "
            "(policy_loss.reward_min/reward_max, e.g. -1 and 1), or rescale the reward to [0, 1] in the "
            "reward function"
        )
    return rr


@dataclass(frozen=True)
class GapoParams:
    eps_low: float
    eps_high_max: float
    eps_schedule: str
    reward_range: tuple[float, float] | str
    adv_estimator: str
    norm_by_std: bool
    binary: bool
    group_size: int
    clip_ratio_c: float


def gapo_params(config) -> GapoParams:
    """Read GAPO's parameters from verl's ``ActorConfig`` (or a DictConfig with its keys)."""
    if config is None:
        raise ValueError("verl passed config=None to the GAPO policy loss; it needs the actor config")
    pl = config.get("policy_loss", None) or {}
    check_gapo_fields(pl)
    clip = config.get("clip_ratio", 0.2)
    eps_low = config.get("clip_ratio_low", None)
    eps_low = float(clip if eps_low is None else eps_low)
    clip_high = config.get("clip_ratio_high", None)
    clip_high = float(clip if clip_high is None else clip_high)
    eps_high_max = pl.get("eps_high_max", None)
    source = "policy_loss.eps_high_max"
    if eps_high_max is None:
        eps_high_max, source = clip_high, "actor.clip_ratio_high (eps_high_max unset)"
    elif clip_high not in (eps_low, float(eps_high_max)):
        raise ValueError(
            f"ambiguous GAPO clip range: actor.clip_ratio_high={clip_high} but policy_loss.eps_high_max="
            f"{eps_high_max}. GAPO's upper width runs from clip_ratio_low ({eps_low}) to eps_high_max; "
            "leave eps_high_max unset to use clip_ratio_high, or set clip_ratio_high to clip_ratio_low "
            "or to eps_high_max"
        )
    eps_high_max = float(eps_high_max)
    if eps_high_max < eps_low:
        raise ValueError(
            f"GAPO needs eps_high_max ({eps_high_max}, from {source}) >= clip_ratio_low "
            f"({eps_low}, actor.clip_ratio_low): GAPO's upper width runs from clip_ratio_low to "
            "eps_high_max"
        )
    group_size = config.get("rollout_n", None)
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"GAPO needs actor.rollout_n (the group size G) >= 2, got {group_size!r}; set actor_rollout_ref.rollout.n"
        )
    est = pl.get("adv_estimator", "grpo")
    return GapoParams(
        eps_low=eps_low,
        eps_high_max=eps_high_max,
        eps_schedule=pl.get("eps_schedule", "linear"),
        reward_range=reward_range_of(pl),
        adv_estimator=est,
        norm_by_std=bool(pl.get("norm_adv_by_std_in_grpo", False)) and est.startswith("grpo"),
        binary=bool(pl.get("binary_rewards", True)),
        group_size=group_size,
        clip_ratio_c=float(config.get("clip_ratio_c", 3.0)),
    )


def verl_agg_norms(loss_agg_mode: str, info: dict) -> tuple[str, AggNorms]:
    """Map verl's ``agg_loss`` normalisers (global_batch_info) onto ``gapo.core.aggregation.AggNorms``.

    verl divides by the global count and multiplies by ``dp_size`` (DDP averages gradients over
    ranks); dividing by ``count / dp_size`` is the same. verl's ``token-sum`` is a token-mean
    whose normaliser is ``1 / dp_size``.
    """
    info = info or {}
    dp = info.get("dp_size", 1) or 1
    if loss_agg_mode == "token-sum":
        return "token-mean", AggNorms(num_tokens=1.0 / dp)
    if loss_agg_mode == "token-mean":
        n = info.get("batch_num_tokens", None)
        if n is None and dp > 1:
            raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
        return loss_agg_mode, AggNorms(num_tokens=None if n is None else n / dp)
    n = info.get("global_batch_size", None)
    if n is None and dp > 1:
        raise ValueError("global_batch_size is required when dp_size > 1")
    horizon = info.get("loss_scale_factor", None) if loss_agg_mode == "seq-mean-token-sum-norm" else None
    return loss_agg_mode, AggNorms(num_seqs=None if n is None else n / dp, horizon=horizon)
