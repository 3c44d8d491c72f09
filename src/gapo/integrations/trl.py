"""GAPO inside TRL's ``GRPOTrainer`` (arXiv 2609.00444; tested against trl 1.16.x).

GAPO changes one thing in the clipped surrogate of GRPO/DAPO/GSPO: the upper clip width becomes a
per-rollout value computed from the raw rewards of the rollout's group (DESIGN §1.5)::

    w_i       = clamp((R_i − mean_group R) / ((G − 1)/G · (R_max − R_min)), 0, 1)
    ε_high(i) = ε_low + (ε_high_max − ε_low) · w_i            ("linear"; "log" interpolates log(1+ε))

computed by :func:`gapo.clipping.gapo_eps_high`. Everything else is TRL's own code, unchanged:
advantages (``scale_rewards``), ``importance_sampling_level`` token/sequence, ``loss_type``
aggregation, ``beta`` KL, ``delta``, vLLM importance-sampling correction, entropy masks, metrics.

How (three small overrides; no TRL code is copied):

1. ``_calculate_rewards``: TRL gathers every process's rewards there, so each group of
   ``num_generations`` completions is whole. We form each completion's scalar reward the way TRL
   does (weighted sum over reward functions, NaN if every function returned ``None``), compute
   ε_high for the whole gathered generation batch, and keep this process's slice.
   It also keeps each completion's group success count ``c`` (rewards rescaled to [0, 1],
   summed over the group, rounded; an unscorable completion counts as a failure), for metrics.
2. ``_generate_and_score_completions``: puts that slice in the output dict as
   ``"gapo_eps_high"`` and ``"gapo_success_count"`` (B,), per-completion tensors like
   ``"advantages"``, so TRL's shuffle and split into ``steps_per_generation`` micro-batches (and
   reuse over ``num_iterations``) carry them along row by row.
3. ``_compute_loss``: runs TRL's ``_compute_loss`` with ``self.epsilon_high`` set, for the duration
   of the call, to the (B, 1) column of ε_high and ``self.epsilon_low`` to a 0-d tensor
   (``torch.clamp`` takes both bounds as numbers or both as tensors). TRL's
   ``clamp(coef_1, 1 − ε_low, 1 + ε_high)`` and its ``clip_ratio/*`` metrics then broadcast per
   row, for (B, T) token ratios and (B, 1) sequence ratios alike. With ``eps_high_max == epsilon``
   every row holds ``epsilon`` and the loss is TRL's (tested).

Unscorable completions (every reward function returned ``None``; TRL gives them zero advantage)
get ``ε_low`` and do not move their group's mean. Rewards outside ``reward_range`` raise, rather
than silently producing a wrong ε. Only the hard-clipped loss types are accepted (``grpo``,
``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``): ``cispo``, ``sapo`` and ``vespo`` have no
``1 + ε_high`` bound to adapt. ``use_liger_kernel`` is rejected (its fused GRPO loss bypasses
``_compute_loss``).

Metrics logged next to TRL's ``clip_ratio/*`` (per optimiser micro-batch, reduced over processes):
``gapo/eps_high_mean`` (all completions), ``gapo/eps_high_pos_mean`` (completions with A > 0),
``gapo/clipfrac_pos`` (share of positive-advantage response tokens — sequences at sequence
level — above ``1 + ε_high(i)``) and ``gapo/clipfrac_pos_at_eps_low`` (the share fixed symmetric
clipping at ``epsilon`` would have cut: the headroom GAPO released).

Per group-success count ``c`` (0..G), under the names gapo's own trainer logs
(:func:`gapo.metrics.clip_stats_from_counts`): ``clip/frac_high_by_c/{c}`` (share of
positive-advantage units above ``1 + ε_high(i)``), ``clip/frac_low_by_c/{c}`` (share of
negative-advantage units below ``1 − ε_low``), ``clip/ratio_dev_by_c/{c}`` (mean ``|ρ − 1|``),
``clip/eps_high_by_c/{c}`` and ``clip/eps_high_pos_by_c/{c}`` (mean ε_high of all / of
positive-advantage completions), ``clip/adv_by_c/{c}`` (mean ``|A|``) and
``clip/tokens_pos_by_c/{c}`` (how many positive-advantage units were counted). A unit is a
response token at token level and a sequence at sequence level (like TRL's ``clip_ratio/*``;
gapo's trainer counts tokens at both levels). Sparse buckets make per-micro-batch rates noisy, so
these are pooled: the raw sums are reduced over processes on every micro-batch and added up until
the next ``log``, which turns them into rates; with ``logging_steps=1`` that is one optimiser step
(all its gradient-accumulation micro-batches). A bucket with no rollouts in the window is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

try:
    import trl
    from packaging.version import Version
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("gapo.integrations.trl needs TRL: pip install 'gapo[trl]' (trl>=1.16,<1.17)") from exc

from gapo.advantages import group_success_count
from gapo.clipping import gapo_eps_high
from gapo.metrics import (clip_counts_by_c, clip_stats_from_counts, counts_from_tensor, counts_to_tensor,
                          merge_counts)

SUPPORTED_TRL = (Version("1.16"), Version("1.17"))
try:
    _trl_version = Version(Version(trl.__version__).base_version)
except Exception:  # "unknown" when the distribution metadata is missing
    _trl_version = None
if _trl_version is None or not SUPPORTED_TRL[0] <= _trl_version < SUPPORTED_TRL[1]:
    raise ImportError(
        f"gapo.integrations.trl supports trl>=1.16,<1.17 (1.16.x); found trl {trl.__version__}. "
        "It overrides private GRPOTrainer methods whose behaviour it was checked against; "
        "install the supported version: pip install 'gapo[trl]'."
    )

__all__ = ["GAPOConfig", "GAPOTrainer", "SUPPORTED_TRL", "CLIPPED_LOSS_TYPES"]

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
SCHEDULES = ("linear", "log")


@dataclass
class GAPOConfig(GRPOConfig):
    """``GRPOConfig`` plus GAPO's clip schedule. ``epsilon`` is ε_low (and the lower end of ε_high)."""

    eps_high_max: float = field(
        default=0.28,
        metadata={"help": "GAPO: largest upper clip width, given to the lone correct rollout of a hard group. "
                          "Token level: 0.28 (with epsilon=0.2); sequence level (GSPO): e.g. 5e-3 with epsilon=3e-3."},
    )
    gapo_schedule: str = field(
        default="linear",
        metadata={"help": "GAPO: 'linear' (the paper's Eq. 11) or 'log' (interpolates log(1+ε))."},
    )
    reward_range: list[float] = field(
        default_factory=lambda: [0.0, 1.0],
        metadata={"help": "GAPO: [R_min, R_max] of the per-completion reward (the weighted sum over reward "
                          "functions). Rewards outside it raise an error."},
    )

    def __post_init__(self):
        _validate(self)  # before GRPOConfig's checks, so GAPO's messages come first
        super().__post_init__()


def _validate(args) -> None:
    if getattr(args, "use_liger_kernel", False):
        raise ValueError(
            "GAPO does not support use_liger_kernel=True: Liger's fused GRPO loss bypasses "
            "GRPOTrainer._compute_loss, where GAPO's per-rollout ε_high is applied. Set use_liger_kernel=False."
        )
    if args.loss_type not in CLIPPED_LOSS_TYPES:
        raise ValueError(
            f"GAPO adapts the upper clip bound 1 + ε_high, so loss_type must be one of {CLIPPED_LOSS_TYPES}; "
            f"got {args.loss_type!r} (cispo/sapo/vespo have no such bound)."
        )
    if args.gapo_schedule not in SCHEDULES:
        raise ValueError(f"gapo_schedule must be one of {SCHEDULES}, got {args.gapo_schedule!r}")
    if not 0.0 <= args.epsilon < 1.0:
        raise ValueError(f"epsilon (ε_low) must be in [0, 1), got {args.epsilon!r}")
    if not args.eps_high_max >= args.epsilon:
        raise ValueError(f"eps_high_max ({args.eps_high_max!r}) must be >= epsilon ({args.epsilon!r})")
    if args.epsilon_high is not None and args.epsilon_high != args.epsilon:
        raise ValueError(
            "GAPO sets ε_high per rollout between `epsilon` and `eps_high_max`; leave `epsilon_high` unset "
            f"(got epsilon_high={args.epsilon_high!r}, epsilon={args.epsilon!r}). For fixed clip-higher, use "
            "TRL's GRPOTrainer with GRPOConfig(epsilon_high=...)."
        )
    rr = list(args.reward_range)
    if len(rr) != 2 or not float(rr[1]) > float(rr[0]):
        raise ValueError(f"reward_range must be [R_min, R_max] with R_max > R_min, got {args.reward_range!r}")


class GAPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with GAPO's per-rollout ε_high. Takes a :class:`GAPOConfig`; see the module doc."""

    def __init__(self, model, reward_funcs=None, args: GAPOConfig | None = None, *pargs, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else "model"
            args = GAPOConfig(output_dir=f"{name.rstrip('/').split('/')[-1]}-GAPO")
        if not isinstance(args, GAPOConfig):
            raise TypeError(f"GAPOTrainer needs a GAPOConfig (it carries eps_high_max etc.), got {type(args).__name__}")
        _validate(args)  # again: fields may have been changed after the config was built
        self._gapo_pending = None  # this process's (ε_high, c), from _calculate_rewards to the output dict
        self._gapo_counts = {"train": {}, "eval": {}}  # per-c clip sums since the last log, all processes
        self._gapo_in_loss = False
        self._gapo_logps = None
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)

    # -- ε_high from the group rewards -------------------------------------------------------------
    def compute_eps_high(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (N,) -> (N,)
        """ε_high per completion from scalar rewards (N,), groups of ``group_size`` contiguous.

        NaN marks an unscorable completion: it is replaced by its group's mean of the others, which
        leaves that mean unchanged and gives the row w = 0, i.e. ε_low.
        """
        args = self.args
        lo, hi = (float(v) for v in args.reward_range)
        if group_size < 2:  # eval with num_generations_eval=1: no group, no advantage, no headroom
            return torch.full_like(rewards, args.epsilon, dtype=torch.float32)
        grouped = rewards.float().view(-1, group_size)
        finite = grouped[~torch.isnan(grouped)]
        tol = 1e-6 * (hi - lo)
        if ((finite < lo - tol) | (finite > hi + tol)).any():
            raise ValueError(
                f"GAPO: rewards span [{finite.min().item():g}, {finite.max().item():g}], outside "
                f"reward_range={[lo, hi]}; set GAPOConfig.reward_range to the range of the weighted sum of "
                "your reward functions, otherwise ε_high would be wrong."
            )
        fill = torch.nanmean(grouped, dim=1, keepdim=True).nan_to_num(lo)
        grouped = torch.where(torch.isnan(grouped), fill, grouped)
        return gapo_eps_high(
            grouped.reshape(-1), group_size, eps_low=args.epsilon, eps_high_max=args.eps_high_max,
            schedule=args.gapo_schedule, reward_range=(lo, hi),
        ).float()

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # Gathered over processes: rows are the whole generation batch, groups contiguous and complete.
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's per-completion reward
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        eps_high = self.compute_eps_high(rewards, group_size)  # also checks the rewards against reward_range
        lo, hi = (float(v) for v in self.args.reward_range)
        success = group_success_count(rewards.nan_to_num(lo), group_size, reward_range=(lo, hi))
        start = self.accelerator.process_index * len(prompts)  # the slice TRL takes for advantages
        local = slice(start, start + len(prompts))
        self._gapo_pending = (eps_high[local], success[local])
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._gapo_pending = None
        output = super()._generate_and_score_completions(inputs)
        pending, self._gapo_pending = self._gapo_pending, None
        if pending is None or pending[0].shape[0] != output["advantages"].shape[0]:
            raise RuntimeError(
                "GAPO: no per-completion ε_high matching the advantages; this TRL code path did not go through "
                "_calculate_rewards as trl 1.16 does."
            )
        device = output["advantages"].device
        output["gapo_eps_high"] = pending[0].to(device)  # (B,), split with the batch
        output["gapo_success_count"] = pending[1].to(device)  # (B,) long: c of the completion's group
        return output

    # -- the loss: TRL's, with ε_high per row ------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, *pargs, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*pargs, **kwargs)
        if self._gapo_in_loss:  # keep the policy log-probs of the loss call for GAPO's metrics
            self._gapo_logps = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        eps_high = inputs["gapo_eps_high"]  # (B,)
        base = (self.epsilon_low, self.epsilon_high)
        self.epsilon_low = torch.tensor(float(base[0]), dtype=eps_high.dtype, device=eps_high.device)
        self.epsilon_high = eps_high.unsqueeze(1)  # (B, 1): broadcasts over (B, T) and (B, 1) ratios
        self._gapo_in_loss = True
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.epsilon_low, self.epsilon_high = base
            self._gapo_in_loss = False
        logps, self._gapo_logps = self._gapo_logps, None
        if logps is not None:
            self._log_gapo_metrics(inputs, logps)
        return loss

    @torch.no_grad()
    def _log_gapo_metrics(self, inputs, logps: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.float()
        old = inputs.get("old_per_token_logps")
        log_ratio = (logps - (logps if old is None else old)).float()
        if self.importance_sampling_level == "sequence":  # one ratio, one count per sequence
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
            units = torch.ones_like(log_ratio)
        else:
            units = mask
        ratio = torch.exp(log_ratio)
        adv = inputs["advantages"]
        if adv.dim() == 2:  # (B, T) advantages of a subclass: one value per row, as GAPO's ε assumes
            adv = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        eps = inputs["gapo_eps_high"].float()
        eps_low = float(self.epsilon_low)
        counts = clip_counts_by_c(ratio, adv, units, inputs["gapo_success_count"], eps_low=eps_low, eps_high=eps)
        at_eps_low = ((ratio > 1 + eps_low) * units * (adv > 0).unsqueeze(1)).sum()
        n_buckets = (self.num_generations if mode == "train" else self.num_generations_eval) + 1
        local = torch.cat([counts_to_tensor(counts, n_buckets).flatten().float(), at_eps_low.float().view(1).cpu()])
        total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu().double()
        by_c = counts_from_tensor(total[:-1].view(n_buckets, -1))
        merge_counts(self._gapo_counts[mode], by_c)

        # whole-micro-batch rates, averaged over micro-batches by TRL's log like its clip_ratio/*
        s = {k: sum(f[k] for f in by_c.values()) for k in
             ("rows", "eps_sum", "pos_rows", "pos_eps_sum", "pos_tokens", "pos_clipped")}
        m = self._metrics[mode]
        m["gapo/eps_high_mean"].append(s["eps_sum"] / max(s["rows"], 1.0))
        if s["pos_rows"] > 0:
            m["gapo/eps_high_pos_mean"].append(s["pos_eps_sum"] / s["pos_rows"])
        if s["pos_tokens"] > 0:
            m["gapo/clipfrac_pos"].append(s["pos_clipped"] / s["pos_tokens"])
            m["gapo/clipfrac_pos_at_eps_low"].append(float(total[-1]) / s["pos_tokens"])

    def gapo_clip_stats(self, mode: str = "train") -> dict[str, float]:
        """The per-``c`` clip statistics pooled since the last ``log`` (the ``clip/*_by_c/{c}`` metrics)."""
        return clip_stats_from_counts(self._gapo_counts[mode])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for key, value in self.gapo_clip_stats(mode).items():  # one pooled value: TRL's mean leaves it as is
            self._metrics[mode][key] = [value]
        self._gapo_counts[mode] = {}
        super().log(logs, start_time)
