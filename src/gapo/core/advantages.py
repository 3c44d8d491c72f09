"""Group-relative advantage estimators (one scalar per rollout, broadcast over its tokens).

Rewards are ``(B,)`` with ``B = prompts × G`` and each group's rows contiguous. Every entry of
``ADVANTAGES`` has the signature ``fn(rewards (B,), group_size, *, <its own keyword parameters>)
-> (B,)``; :func:`compute` is the one entry point::

    drgrpo  A_i = R_i − mean_j R_j                                   (Dr.GRPO, arXiv 2503.20783)
    grpo    A_i = (R_i − mean_j R_j) / (std_j R_j + eps)             (GRPO, arXiv 2402.03300)
            std "unbiased" (verl; eps 1e-6) or "population"; TRL uses eps 1e-4.
    rloo    A_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_j R_j) (arXiv 2402.14740)
    passk   pass@k advantage shaping for binary rewards (Chen et al., arXiv 2508.10751):
            N_neg = G − c, R̄ = 1 − C(N_neg,k)/C(G,k), σ = sqrt(R̄(1−R̄)),
            A_pos = (1 − R̄)/σ,  A_neg = (1 − R̄ − C(N_neg−1,k−1)/C(G−1,k−1))/σ
    focal   Ã_i = (1 − p̂)^γ · A_i on top of a base estimator (F-GRPO, arXiv 2602.06717),
            p̂ = the group's mean reward rescaled to [0, 1] (= c/G for binary rewards)

``reward_range`` (focal's p̂ and :func:`success_count`'s c) is ``(lo, hi)``, ``"group"`` or
``"batch"``, as in :mod:`gapo.core.clipping`: see :func:`rescaled_rewards`. Callers pass it to
:func:`compute` for every estimator alike; it reaches the estimators that declare a
``reward_range`` parameter (of the built-in ones focal) and is ignored by the rest. Any other
argument an estimator does not declare is an error naming the estimator, the argument and the
accepted ones (``grpo`` with ``k=4`` is a mistake, not a no-op).

A group whose rewards are all equal gets zero advantage under every estimator.
"""

from __future__ import annotations

import difflib
import inspect
import math

import torch

from gapo.core.checks import check_reward_range, check_rewards, reward_bounds, unknown

__all__ = [
    "compute",
    "ADVANTAGES",
    "UnknownArgument",
    "estimator_params",
    "zero_std_groups",
    "success_count",
    "rescaled_rewards",
]


class UnknownArgument(TypeError, ValueError):
    """An argument an estimator does not take: a TypeError, as Python raises for an unexpected
    keyword, and a ValueError, as every other bad input of the core (the CLI reports those)."""


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (P, G) float64
    check_rewards(rewards, group_size)
    return rewards.double().view(-1, group_size)


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _out(a: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    return a.reshape(-1).to(torch.float32 if not rewards.is_floating_point() else rewards.dtype)


def drgrpo(rewards, group_size) -> torch.Tensor:
    """``A_i = R_i − mean_group R`` (Dr.GRPO, arXiv 2503.20783)."""
    r = _groups(rewards, group_size)
    return _out(r - r.mean(1, keepdim=True), rewards)


def grpo(rewards, group_size, *, eps: float = 1e-6, std: str = "unbiased") -> torch.Tensor:
    """``A_i = (R_i − mean) / (std + eps)`` (GRPO, arXiv 2402.03300); ``std`` unbiased or population."""
    if std not in ("unbiased", "population"):
        raise unknown("std", std, ("unbiased", "population"))
    if not _finite_number(eps) or eps < 0:
        raise ValueError(f"grpo's eps must be a finite number >= 0, got {eps!r}")
    r = _groups(rewards, group_size)
    centred = r - r.mean(1, keepdim=True)
    sd = r.std(1, keepdim=True, correction=1 if std == "unbiased" else 0)
    # all-equal groups: centred is exactly 0, so the advantage is 0 even with eps = 0
    return _out(torch.where(centred == 0, torch.zeros_like(centred), centred / (sd + eps)), rewards)


def rloo(rewards, group_size) -> torch.Tensor:
    """Leave-one-out baseline: ``A_i = R_i − mean_{j≠i} R_j`` (arXiv 2402.14740)."""
    r = _groups(rewards, group_size)
    return _out((r - r.mean(1, keepdim=True)) * group_size / (group_size - 1), rewards)


def passk(rewards, group_size, *, k: int = 4) -> torch.Tensor:
    """Pass@k advantage shaping for binary rewards (Chen et al. 2025, arXiv 2508.10751).

    ``R̄ = 1 − C(G−c, k)/C(G, k)`` is the group's pass@k; its per-rollout contribution gives
    ``A_pos = (1−R̄)/σ`` and ``A_neg = (1 − R̄ − C(G−c−1, k−1)/C(G−1, k−1))/σ`` with
    ``σ = sqrt(R̄(1−R̄))``. Groups with ``σ = 0`` (no success, or every k-subset holds one)
    carry no pass@k signal and get 0.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= group_size:
        raise ValueError(f"k must be an int in [1, group_size={group_size}], got {k!r}")
    r = _groups(rewards, group_size)
    if not ((r == 0) | (r == 1)).all():
        raise ValueError("passk advantages need binary rewards in {0, 1}")
    G = group_size
    c = r.sum(1)  # (P,)
    a = torch.zeros_like(r)
    for p, cp in enumerate(c.tolist()):
        n_neg = G - int(cp)
        r_bar = 1.0 - math.comb(n_neg, k) / math.comb(G, k)
        sigma = math.sqrt(max(r_bar * (1.0 - r_bar), 0.0))
        if sigma == 0.0:
            continue
        a_pos = (1.0 - r_bar) / sigma
        a_neg = (1.0 - r_bar - (math.comb(n_neg - 1, k - 1) / math.comb(G - 1, k - 1) if n_neg else 0.0)) / sigma
        a[p] = torch.where(r[p] == 1, torch.tensor(a_pos, dtype=r.dtype), torch.tensor(a_neg, dtype=r.dtype))
    return _out(a, rewards)


def focal(
    rewards,
    group_size,
    *,
    gamma: float = 1.0,
    base: str = "drgrpo",
    reward_range: tuple[float, float] | str = (0.0, 1.0),
    **params,  # the registry's dispatch: the base estimator's own parameters, checked against it
) -> torch.Tensor:
    """``Ã_i = (1 − p̂)^γ · A_i`` (F-GRPO, arXiv 2602.06717): down-weights easy groups.
    ``p̂`` = the group's mean of :func:`rescaled_rewards` under ``reward_range``; ``params`` are
    the base estimator's own (anything else is an :class:`UnknownArgument` naming focal)."""
    if not _finite_number(gamma) or gamma < 0:
        raise ValueError(f"focal's gamma must be a finite number >= 0, got {gamma!r}")
    if base == "focal":
        raise ValueError("focal cannot be its own base estimator")
    if base not in ADVANTAGES:
        raise unknown("base advantage estimator of focal", base, [n for n in ADVANTAGES if n != "focal"])
    own, _, open_ = estimator_params(ADVANTAGES[base])
    if not open_:
        _reject_unknown(f"focal (base {base!r})", params, ("gamma", "base", *own))
    rr = check_reward_range(reward_range)
    a = compute(base, rewards, group_size, reward_range=rr, **params).double().view(-1, group_size)
    if isinstance(rr, tuple):
        lo, hi = rr
        u = (rewards.double().view(-1, group_size) - lo) / (hi - lo)
    else:
        u = rescaled_rewards(rewards, group_size, reward_range=rr).view(-1, group_size)
    p_hat = u.mean(1, keepdim=True).clamp(0, 1)
    return _out((1.0 - p_hat) ** gamma * a, rewards)


ADVANTAGES = {"drgrpo": drgrpo, "grpo": grpo, "rloo": rloo, "passk": passk, "focal": focal}


def estimator_params(fn) -> tuple[tuple[str, ...], bool, bool]:
    """``(own, reads_reward_range, open)`` of an estimator function: the keyword parameters it
    declares beyond ``(rewards, group_size)`` and ``reward_range``; whether it declares
    ``reward_range``; whether it takes ``**kwargs`` (then it checks its own, as focal does)."""
    ps = list(inspect.signature(fn).parameters.values())
    named = [p.name for p in ps[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return (
        tuple(n for n in named if n != "reward_range"),
        "reward_range" in named,
        any(p.kind is p.VAR_KEYWORD for p in ps),
    )


def _reject_unknown(who: str, params: dict, accepted) -> None:
    accepted = sorted(accepted)
    for k in params:
        if k not in accepted:
            close = difflib.get_close_matches(str(k), accepted, n=2)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownArgument(
                f"advantage estimator {who} takes no argument {k!r}; it accepts "
                f"{accepted or 'none'} (and reward_range, ignored unless it reads it).{hint}"
            )


def compute(
    name: str,
    rewards: torch.Tensor,
    group_size: int,
    *,
    reward_range: tuple[float, float] | str | None = None,
    **params,  # the registry's dispatch: estimator ``name``'s own parameters, checked against it
) -> torch.Tensor:  # (B,)
    """Advantages by estimator ``name`` (see the module docstring); unknown names raise.

    ``reward_range`` (checked whenever given) is passed on only to an estimator that declares it
    (focal); ``params`` must be parameters the estimator declares, else :class:`UnknownArgument`."""
    if name not in ADVANTAGES:
        raise unknown("advantage estimator", name, ADVANTAGES)
    fn = ADVANTAGES[name]
    own, reads_range, open_ = estimator_params(fn)
    if not open_:
        _reject_unknown(repr(name), params, own)
    if reward_range is not None:
        rr = check_reward_range(reward_range)
        if reads_range:
            params = {**params, "reward_range": rr}
    return fn(rewards, group_size, **params)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (P,) bool
    """Groups whose rewards are all equal: they carry no gradient (DAPO's dynamic sampling)."""
    r = _groups(rewards, group_size)
    return (r == r[:, :1]).all(1)


def rescaled_rewards(
    rewards: torch.Tensor, group_size: int, *, reward_range: tuple[float, float] | str = (0.0, 1.0)
) -> torch.Tensor:  # (B,) float64
    """Rewards rescaled to [0, 1]: ``u_i = (R_i − R_min) / (R_max − R_min)`` (clamped to [0, 1]).

    - ``(lo, hi)``: ``R_min = lo``, ``R_max = hi``;
    - ``"group"``: the group's own min and max. A constant group has no range of its own and
      is placed on the batch's scale, ``(R_i − min_B)/(max_B − min_B)`` (so a group of all-1
      rewards in a 0/1 batch gets u = 1, as under ``(0, 1)``), or u = 0 if the batch is constant;
    - ``"batch"``: the min and max over all of ``rewards``; u = 0 if they are equal.
    """
    rr = check_reward_range(reward_range)
    r = _groups(rewards, group_size)  # (P, G) float64
    lo, hi = reward_bounds(r, rr)
    span = hi - lo if isinstance(rr, tuple) else (hi - lo).expand_as(r)
    if isinstance(rr, tuple):
        return ((r - lo) / span).clamp(0, 1).reshape(-1)
    u = torch.where(span > 0, (r - lo) / span.clamp(min=torch.finfo(r.dtype).tiny), torch.zeros_like(r))
    if rr == "group":
        b_lo, b_hi = reward_bounds(r, "batch")
        on_batch = (r - b_lo) / (b_hi - b_lo) if b_hi > b_lo else torch.zeros_like(r)
        u = torch.where(span > 0, u, on_batch)
    return u.clamp(0, 1).reshape(-1)


def success_count(
    rewards: torch.Tensor, group_size: int, *, reward_range: tuple[float, float] | str = (0.0, 1.0)
) -> torch.Tensor:  # (B,) long
    """``c`` per rollout (the paper's success count): the number of successes in its group,
    ``c = round(Σ_group u_j)`` with ``u`` the rewards rescaled to [0, 1] by ``reward_range`` (:func:`rescaled_rewards`).

    Exact for binary rewards with ``(0, 1)``. Under ``"group"``, a group with two reward levels
    counts the rollouts at its max (``c = 1``: the lone best rollout, which gets ``w = 1``);
    with several levels, partial credit adds up (``[1, .5, 0, 0]`` → 1.5 → 2). For 0/1 rewards,
    ``"group"`` and ``"batch"`` give the ``(0, 1)`` count whenever the batch holds both a 0 and a 1.
    """
    rr = check_reward_range(reward_range)
    if isinstance(rr, tuple):  # the fixed-range formula, unchanged
        lo, hi = rr
        r = _groups(rewards, group_size)
        c = ((r - lo) / (hi - lo)).sum(1).round().long()
        return c.repeat_interleave(group_size)
    u = rescaled_rewards(rewards, group_size, reward_range=rr).view(-1, group_size)
    return u.sum(1).round().long().repeat_interleave(group_size)
