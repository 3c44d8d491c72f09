"""GAPO inside TRL's ``GRPOTrainer`` (arXiv 2609.00444; tested against trl 1.16.x).

GAPO changes one thing in the clipped surrogate of GRPO/DAPO/GSPO: the upper clip width becomes a
per-rollout value computed from the raw rewards of the rollout's group (docs/design.md §2.5)::

    w_i       = clamp((R_i − mean_group R) / ((G − 1)/G · (R_max − R_min)), 0, 1)
    ε_high(i) = ε_low + (ε_high_max − ε_low) · w_i            ("linear"; "log" interpolates log(1+ε))

computed by :func:`gapo.core.clipping.gapo_eps_high`. ``R_min, R_max`` come from ``reward_range``:
``"group"`` (the default: each group's own min and max, so reward models and shaped rewards of any
scale work, and 0/1 rewards get exactly the widths of a fixed [0, 1]), ``"batch"`` (the min and
max of the whole generation batch, gathered over processes) or ``[R_min, R_max]`` (a fixed range;
rewards outside it raise). Everything else is TRL's own code, unchanged:
advantages (``scale_rewards``), ``importance_sampling_level`` token/sequence, ``loss_type``
aggregation, ``beta`` KL, ``delta``, vLLM importance-sampling correction, entropy masks, metrics.

How (three small overrides; no TRL code is copied):

1. ``_calculate_rewards``: TRL gathers every process's rewards there, so each group of
   ``num_generations`` completions is whole. We form each completion's scalar reward the way TRL
   does (weighted sum over reward functions, NaN if every function returned ``None``), compute
   ε_high for the whole gathered generation batch, and keep this process's slice.
   It also keeps each completion's group success count ``c`` (rewards rescaled to [0, 1] by
   ``reward_range``, summed over the group, rounded: :meth:`GAPOTrainer.success_count`;
   an unscorable completion counts as a failure), for metrics. An eval group of one completion
   (``num_generations_eval=1``) has no group: ε_low, ``c = 0``, and no per-``c`` metrics.
2. ``_generate_and_score_completions``: puts that slice in the output dict as
   ``"gapo_eps_high"`` and ``"gapo_success_count"`` (B,; ``c``: the columns carry a ``gapo_``
   prefix so as not to collide with TRL's own or a dataset's), per-completion tensors like
   ``"advantages"``, so TRL's shuffle and split into ``steps_per_generation`` micro-batches (and
   reuse over ``num_iterations``) carry them along row by row.
3. ``_compute_loss``: runs TRL's ``_compute_loss`` with ``self.epsilon_high`` set, for the duration
   of the call, to the (B, 1) column of ε_high and ``self.epsilon_low`` to a 0-d tensor
   (``torch.clamp`` takes both bounds as numbers or both as tensors). TRL's
   ``clamp(coef_1, 1 − ε_low, 1 + ε_high)`` and its ``clip_ratio/*`` metrics then broadcast per
   row, for (B, T) token ratios and (B, 1) sequence ratios alike. With ``eps_high_max == epsilon``
   every row holds ``epsilon`` and the loss is TRL's (tested). For ``loss_type="cispo"``, whose
   TRL weight is ``sg(min(ρ, epsilon_high))``, ``self.epsilon_high`` is the column ``1 + ε_high(i)``:
   each completion's IS weight is capped at ``1 + ε_high(i)`` (as in :func:`gapo.core.losses.cispo_loss`,
   which also clips below; TRL's cispo does not).

**The cispo cap, exactly.** TRL caps every completion's IS weight at one ``epsilon_high`` (ScaleRL's
5.0). GAPO caps completion ``i`` at ``1 + ε_high(i)``: ``1 + epsilon`` for every completion with
``A ≤ 0`` (failures, all-correct and all-wrong groups, unscorable ones: ``w = 0``),
``1 + epsilon + (eps_high_max − epsilon)·w_i`` for ``A > 0`` ("linear"), ``1 + eps_high_max`` for
the lone success of a hard group (``w = 1``). TRL's ``epsilon_high=E`` is therefore
``epsilon = eps_high_max = E − 1`` (every cap ``E``: TRL's cispo loss, tested), and GAPO on top of
it keeps ``epsilon = E − 1`` and raises ``eps_high_max``. ``eps_high_max = E − 1`` alone matches TRL
only on lone-success rows and caps the others lower. TRL's cispo has no lower clip, so with
``loss_type="cispo"`` ``epsilon`` may be 1 or more (it is only the cap's lower end).

Unscorable completions (every reward function returned ``None``; TRL gives them zero advantage)
get ``ε_low`` and do not move their group's mean. Accepted loss types: the hard-clipped ``grpo``,
``bnpo``, ``dr_grpo``, ``dapo``, ``luspo`` and ``cispo`` (per-rollout cap of the IS weight);
``sapo`` (a soft sigmoid gate) and ``vespo`` (gamma weights) have no bound to adapt and are
rejected. ``use_liger_kernel=True`` works: in trl 1.16 it applies Liger's layer kernels only
(TRL forces ``fused_linear_cross_entropy=False``), and the loss still goes through
``_compute_loss``.

Checked at construction: ε widths against ``importance_sampling_level`` (a sequence-level
``epsilon`` with a token-level ``eps_high_max`` is an error; consistent widths of the other level
a :class:`GAPOWarning`; the paper's widths are 0.2/0.28 at token level and 3e-3/5e-3 at sequence
level), and a :class:`GAPOWarning` when every importance ratio is exactly 1 (``num_iterations=1``
and ``steps_per_generation <= gradient_accumulation_steps``: each completion is used once, by the
policy that generated it, so no clip bound binds and GAPO is GRPO).

Metrics logged next to TRL's ``clip_ratio/*`` (per optimiser micro-batch, reduced over processes):
``gapo/eps_high_mean`` (all completions), ``gapo/eps_high_pos_mean`` (completions with A > 0),
``gapo/clipfrac_pos`` (share of positive-advantage response tokens — sequences at sequence
level — above ``1 + ε_high(i)``) and ``gapo/clipfrac_pos_at_eps_low`` (the share fixed symmetric
clipping at ``epsilon`` would have cut: the headroom GAPO released).

Per group-success count ``c`` (0..G), under the names gapo's own trainer logs
(:func:`gapo.core.metrics.clip_stats_from_counts`): ``clip/frac_high_by_c/{c}`` (share of
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

import math
import warnings
from dataclasses import dataclass, field

import torch

try:
    import trl
    from packaging.version import InvalidVersion, Version
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("gapo.integrations.trl needs TRL: pip install 'gapo[trl]' (trl>=1.16,<1.17)") from exc

from gapo.core import advantages
from gapo.core.checks import check_reward_range
from gapo.core.clipping import gapo_eps_high
from gapo.core.metrics import (
    clip_counts_by_c,
    clip_stats_from_counts,
    counts_from_tensor,
    counts_to_tensor,
    merge_counts,
)

SUPPORTED_TRL = (Version("1.16"), Version("1.17"))
try:
    _trl_version = Version(Version(trl.__version__).base_version)
except (InvalidVersion, TypeError):  # "unknown" when the distribution metadata is missing
    _trl_version = None
if _trl_version is None or not SUPPORTED_TRL[0] <= _trl_version < SUPPORTED_TRL[1]:
    raise ImportError(
        f"gapo.integrations.trl supports trl>=1.16,<1.17 (1.16.x); found trl {trl.__version__}. "
        "It overrides private GRPOTrainer methods whose behaviour it was checked against; "
        "install the supported version: pip install 'gapo[trl]'."
    )

__all__ = [
    "GAPOConfig",
    "GAPOTrainer",
    "GAPOWarning",
    "SUPPORTED_TRL",
    "CLIPPED_LOSS_TYPES",
    "SUPPORTED_LOSS_TYPES",
    "PAPER_WIDTHS",
]

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # clamp(ρ, 1 − ε_low, 1 + ε_high(i))
SUPPORTED_LOSS_TYPES = CLIPPED_LOSS_TYPES + ("cispo",)  # cispo: IS weight min(ρ, 1 + ε_high(i)), detached
SCHEDULES = ("linear", "log")
RENAMED = {"gapo_schedule": "eps_schedule"}  # gapo 0.3: one spelling of the ε schedule, as algo.eps_schedule


@dataclass
class GAPOConfig(GRPOConfig):
    """``GRPOConfig`` plus GAPO's clip schedule. ``epsilon`` is ε_low (and the lower end of ε_high)."""

    eps_high_max: float = field(
        default=0.28,
        metadata={
            "help": "GAPO: largest upper clip width, given to the lone correct rollout of a hard group. "
            "Token level: 0.28 (with epsilon=0.2); sequence level (GSPO): e.g. 5e-3 with epsilon=3e-3. "
            "loss_type='cispo': completion i's IS weight is capped at 1 + ε_high(i), 1 + epsilon where A ≤ 0; "
            "TRL's epsilon_high=5.0 (every row) is epsilon=4.0, eps_high_max=4.0."
        },
    )
    eps_schedule: str = field(
        default="linear",
        metadata={"help": "GAPO: 'linear' (the paper's Eq. 11) or 'log' (interpolates log(1+ε))."},
    )
    reward_range: list[str] | str = field(
        default_factory=lambda: "group",  # a factory, so that HfArgumentParser's list field keeps the default
        metadata={
            "help": "GAPO: where R_min, R_max of w_i = clamp((R_i − mean)/((G−1)/G·(R_max − R_min)), 0, 1) "
            "come from. 'group' (default): each group's own min and max, for rewards of any scale "
            "(reward models, shaped rewards; identical to [0, 1] for 0/1 rewards); 'batch': the min "
            "and max of the whole generation batch; or [R_min, R_max], a fixed range of the weighted "
            "reward sum (rewards outside it raise an error)."
        },
    )

    def __new__(cls, *args, **kwargs):  # TRL's GRPOConfig fields, left to the dataclass __init__
        # a renamed field is an error naming the new one (dataclass __init__ would only name the old)
        renamed = [f"GAPOConfig.{k} is now {RENAMED[k]}" for k in kwargs if k in RENAMED]
        if renamed:
            raise TypeError("; ".join(renamed))
        return super().__new__(cls)

    def __post_init__(self):
        _validate(self)  # before GRPOConfig's checks, so GAPO's messages come first
        super().__post_init__()


# Clip widths of the two ratio levels: token ratios move by tens of percent, a GSPO sequence ratio
# (the geometric mean of the token ratios) by tenths of a percent. The paper's widths (ε_low, ε_high_max):
PAPER_WIDTHS = {"token": (0.2, 0.28), "sequence": (3e-3, 5e-3)}
_TOKEN_SCALE = 0.05  # a width at or above this is a token-level width, below it a sequence-level one


def _paper_widths() -> str:
    (tl, th), (sl, sh) = PAPER_WIDTHS["token"], PAPER_WIDTHS["sequence"]
    return (
        f"the paper's widths are epsilon={tl:g}, eps_high_max={th:g} at importance_sampling_level='token' "
        f"and epsilon={sl:g}, eps_high_max={sh:g} at importance_sampling_level='sequence' (GSPO)"
    )


def _reward_range(args) -> tuple[float, float] | str:
    """``args.reward_range`` as the core API takes it: ``"group"``, ``"batch"`` or ``(R_min, R_max)``.
    Accepts the command-line form too (``--reward_range group`` → ``["group"]``, ``0 1`` → ``["0", "1"]``)."""
    rr = args.reward_range
    if isinstance(rr, (list, tuple)) and len(rr) == 1 and isinstance(rr[0], str):
        rr = rr[0]
    try:
        return check_reward_range(rr)
    except ValueError as exc:
        raise ValueError(f"GAPOConfig.{exc}") from None


def _cispo_translation(cap: float) -> str:
    """TRL's cispo ``epsilon_high`` (one cap of every IS weight) in GAPOConfig's terms."""
    head = (
        "for loss_type='cispo', TRL's epsilon_high caps every completion's IS weight; GAPO caps completion i "
        "at 1 + ε_high(i): 1 + epsilon where A ≤ 0, rising to 1 + eps_high_max for a group's lone success. "
    )
    if cap < 1.0:
        return head + f"TRL's cap {cap:g} < 1 has no GAPO equivalent (epsilon >= 0)"
    e = cap - 1.0
    return head + (
        f"TRL's epsilon_high={cap:g} is epsilon={e:g}, eps_high_max={e:g} (every cap {cap:g}); GAPO on top of "
        f"it keeps epsilon={e:g} and sets eps_high_max > {e:g}"
    )


def _validate(args) -> None:
    if args.loss_type not in SUPPORTED_LOSS_TYPES:
        why = {
            "sapo": "sapo replaces the clip by a soft sigmoid gate of ρ − 1, with no bound to widen",
            "vespo": "vespo weights by a gamma function of the sequence ratio, with no clip bound",
        }
        raise ValueError(
            f"GAPO adapts the upper clip bound of the importance ratio, so loss_type must be one of "
            f"{SUPPORTED_LOSS_TYPES}; got {args.loss_type!r} ({why.get(args.loss_type, 'unknown to GAPO')})."
        )
    if args.eps_schedule not in SCHEDULES:
        raise ValueError(f"eps_schedule must be one of {SCHEDULES}, got {args.eps_schedule!r}")
    if args.loss_type == "cispo":  # only caps 1 + ε: no lower bound 1 − ε that must stay > 0
        if not (math.isfinite(args.epsilon) and args.epsilon >= 0.0):
            raise ValueError(f"epsilon must be finite and >= 0 (the cap 1 + epsilon), got {args.epsilon!r}")
    elif not 0.0 <= args.epsilon < 1.0:
        raise ValueError(
            f"epsilon (ε_low) must be in [0, 1), got {args.epsilon!r} (only loss_type='cispo' takes epsilon >= 1)"
        )
    if not args.eps_high_max >= args.epsilon:
        raise ValueError(f"eps_high_max ({args.eps_high_max!r}) must be >= epsilon ({args.epsilon!r})")
    if args.epsilon_high is not None and args.epsilon_high != args.epsilon:
        cispo = f" ({_cispo_translation(args.epsilon_high)})" if args.loss_type == "cispo" else ""
        raise ValueError(
            "GAPO sets ε_high per rollout between `epsilon` and `eps_high_max`; leave `epsilon_high` unset "
            f"(got epsilon_high={args.epsilon_high!r}, epsilon={args.epsilon!r}){cispo}. For fixed clip-higher, use "
            "TRL's GRPOTrainer with GRPOConfig(epsilon_high=...)."
        )
    if args.epsilon < _TOKEN_SCALE <= args.eps_high_max:
        raise ValueError(
            f"GAPO: epsilon={args.epsilon:g} is a sequence-level width but eps_high_max={args.eps_high_max:g} a "
            f"token-level one (importance_sampling_level={args.importance_sampling_level!r}): ε_high would jump "
            f"{args.eps_high_max / max(args.epsilon, 1e-12):.0f}-fold between a group's rollouts. Set both for the "
            f"same level: {_paper_widths()}."
        )
    rr = _reward_range(args)
    args.reward_range = rr if isinstance(rr, str) else list(rr)


def _width_warnings(args) -> list[str]:
    """Configurations that run but in which GAPO's clip cannot do what it is for."""
    out = []
    level = args.importance_sampling_level
    if level == "sequence" and args.epsilon >= _TOKEN_SCALE:
        out.append(
            f"GAPO: importance_sampling_level='sequence' with token-level widths epsilon={args.epsilon:g}, "
            f"eps_high_max={args.eps_high_max:g}: a sequence ratio (the geometric mean of the token ratios) "
            f"rarely leaves [1 − {args.epsilon:g}, 1 + {args.eps_high_max:g}], so neither bound binds and GAPO "
            f"does nothing; {_paper_widths()}."
        )
    if level == "token" and args.eps_high_max < _TOKEN_SCALE and args.loss_type != "cispo":
        out.append(
            f"GAPO: importance_sampling_level='token' with sequence-level widths epsilon={args.epsilon:g}, "
            f"eps_high_max={args.eps_high_max:g}: almost every token ratio falls outside the clip range, so "
            f"almost every token of a reused batch loses its gradient; {_paper_widths()}."
        )
    if (
        args.eps_high_max != args.epsilon
        and args.num_iterations == 1
        and args.steps_per_generation <= args.gradient_accumulation_steps
    ):
        out.append(
            f"GAPO: with num_iterations=1 and steps_per_generation ({args.steps_per_generation}) <= "
            f"gradient_accumulation_steps ({args.gradient_accumulation_steps}) every completion is used once, "
            "by the policy that generated it, so every importance ratio is exactly 1 and no clip bound ever "
            "binds: this run is GRPO and GAPO's ε_high has no effect. Clipping matters when a generation batch "
            "is reused: num_iterations > 1 (e.g. 2), or steps_per_generation > gradient_accumulation_steps "
            "(e.g. steps_per_generation = 4 × gradient_accumulation_steps: four optimiser steps per generation "
            "batch, as in the paper's recipe)."
        )
    return out


class GAPOWarning(UserWarning):
    """A GAPOTrainer configuration that runs but in which GAPO's clip has little or no effect."""


class GAPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with GAPO's per-rollout ε_high. Takes a :class:`GAPOConfig`; see the module doc."""

    def __init__(self, model, reward_funcs=None, args: GAPOConfig | None = None, *pargs, **kwargs):  # GRPOTrainer's
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
        if self.accelerator.is_main_process:
            for message in _width_warnings(self.args):  # steps_per_generation is final only now
                warnings.warn(message, GAPOWarning, stacklevel=2)

    # -- ε_high from the group rewards -------------------------------------------------------------
    def compute_eps_high(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (N,) -> (N,)
        """ε_high per completion from scalar rewards (N,), groups of ``group_size`` contiguous, under
        ``args.reward_range`` (``"group"``, ``"batch"`` or ``[R_min, R_max]``, see the module doc).

        NaN marks an unscorable completion: it is replaced by its group's mean of the others, which
        leaves that mean (and the group's min and max) unchanged and gives the row w = 0, i.e. ε_low.
        An eval group of one completion (``num_generations_eval=1``) has no group: ε_low.
        """
        args = self.args
        rr = _reward_range(args)
        if group_size < 2:  # eval with num_generations_eval=1: no group, no advantage, no headroom
            return torch.full_like(rewards, args.epsilon, dtype=torch.float32)
        grouped = rewards.float().view(-1, group_size)
        finite = grouped[~torch.isnan(grouped)]
        if isinstance(rr, tuple):
            lo, hi = rr
            tol = 1e-6 * (hi - lo)
            if ((finite < lo - tol) | (finite > hi + tol)).any():
                raise ValueError(
                    f"GAPO: rewards span [{finite.min().item():g}, {finite.max().item():g}], outside "
                    f"reward_range={[lo, hi]}; set GAPOConfig.reward_range to the range of the weighted sum of "
                    "your reward functions, or to 'group' (each group's own min and max), otherwise ε_high "
                    "would be wrong."
                )
            empty = lo  # an all-unscorable group: a constant group, w = 0
        else:  # a constant group inside the batch's range: w = 0, and the batch's min and max stay put
            empty = finite.mean().item() if finite.numel() else 0.0
        fill = torch.nanmean(grouped, dim=1, keepdim=True).nan_to_num(empty)
        grouped = torch.where(torch.isnan(grouped), fill, grouped)
        return gapo_eps_high(
            grouped.reshape(-1),
            group_size,
            eps_low=args.epsilon,
            eps_high_max=args.eps_high_max,
            eps_schedule=args.eps_schedule,
            reward_range=rr,
        ).float()

    def success_count(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (N,) long
        """``c`` per completion (:func:`gapo.core.advantages.success_count` under ``args.reward_range``);
        an unscorable (NaN) completion counts as a failure: R_min under a fixed range, its group's lowest
        reward under "group"/"batch" (the batch's lowest for an all-unscorable group). 0 for groups of one."""
        rr = _reward_range(self.args)
        if group_size < 2:
            return torch.zeros(rewards.shape, dtype=torch.long, device=rewards.device)
        if isinstance(rr, tuple):
            return advantages.success_count(rewards.nan_to_num(rr[0]), group_size, reward_range=rr)
        grouped = rewards.double().view(-1, group_size)
        nan = torch.isnan(grouped)
        low = torch.where(nan, torch.inf, grouped).amin(1, keepdim=True)  # the group's lowest finite reward
        batch_low = low[torch.isfinite(low)].min().item() if torch.isfinite(low).any() else 0.0
        low = torch.where(torch.isfinite(low), low, torch.full_like(low, batch_low))
        return advantages.success_count(torch.where(nan, low, grouped).reshape(-1), group_size, reward_range=rr)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # Gathered over processes: rows are the whole generation batch, groups contiguous and complete.
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's per-completion reward
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        eps_high = self.compute_eps_high(rewards, group_size)  # also checks the rewards against reward_range
        c = self.success_count(rewards, group_size)
        start = self.accelerator.process_index * len(prompts)  # the slice TRL takes for advantages
        local = slice(start, start + len(prompts))
        self._gapo_pending = (eps_high[local], c[local])
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
    def _get_per_token_logps_and_entropies(self, *pargs, **kwargs):  # TRL's own arguments, forwarded
        out = super()._get_per_token_logps_and_entropies(*pargs, **kwargs)
        if self._gapo_in_loss:  # keep the policy log-probs of the loss call for GAPO's metrics
            self._gapo_logps = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        eps_high = inputs["gapo_eps_high"]  # (B,)
        base = (self.epsilon_low, self.epsilon_high)
        self.epsilon_low = torch.tensor(float(base[0]), dtype=eps_high.dtype, device=eps_high.device)
        # (B, 1): broadcasts over (B, T) token and (B, 1) sequence ratios. TRL's cispo caps the IS weight at
        # epsilon_high itself (min(ρ, ε_max)); GAPO's cap of completion i is 1 + ε_high(i).
        self.epsilon_high = (1.0 + eps_high if self.loss_type == "cispo" else eps_high).unsqueeze(1)
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
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
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
        # cispo has no lower bound: nothing is clipped below (ρ < 1 − 1 never holds)
        counts = clip_counts_by_c(
            ratio,
            adv,
            units,
            inputs["gapo_success_count"],
            eps_low=1.0 if self.loss_type == "cispo" else eps_low,
            eps_high=eps,
        )
        at_eps_low = ((ratio > 1 + eps_low) * units * (adv > 0).unsqueeze(1)).sum()
        n_buckets = max(group_size, 1) + 1
        local = torch.cat([counts_to_tensor(counts, n_buckets).flatten().float(), at_eps_low.float().view(1).cpu()])
        total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu().double()
        by_c = counts_from_tensor(total[:-1].view(n_buckets, -1))
        if group_size >= 2:  # groups of one (num_generations_eval=1) have no success count: no per-c metrics
            merge_counts(self._gapo_counts[mode], by_c)

        # whole-micro-batch rates, averaged over micro-batches by TRL's log like its clip_ratio/*
        s = {
            k: sum(f[k] for f in by_c.values())
            for k in ("rows", "eps_sum", "pos_rows", "pos_eps_sum", "pos_tokens", "pos_clipped")
        }
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
