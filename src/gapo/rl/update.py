"""The policy update's data and its per-micro-batch loss (docs/design.md §4.2, §4.3).

``UpdateBatch`` is everything one step's update reads, built before the first epoch: the
sampled rows and their response mask, the advantages ``A_i``, GAPO's ``ε_high(i)`` per rollout,
the group success count ``c_i`` and the reference (π_ref) token log-probs. ``OldPolicy`` holds
the old (π_old) token log-probs and completes what the update itself learns about π_old: the old
log-probs of epoch 0's first mini-batch (§4.3) and the token entropy of π_old's samples.
``UpdateStats`` is what the update accumulates for the step's record (``rl.step_metrics``).

``micro_batch_loss`` is a pure function of one micro-batch's forward (``logp``, ``ent``), its
slice of the ``UpdateBatch``, the ``LossSettings`` and the whole mini-batch's normalisers::

    total = L_clip(logp, old_logp, A, ε_low, ε_high(i); w)       (§2.4 / §2.8, LOSSES[loss])
            + β · agg(KL_est(π ‖ π_ref))                           (β = kl_coef, when π_ref is set)
            − α · agg(H(π))                                        (α = entropy_coef, when > 0)

``w`` is 1, or with ``algo.top_entropy_quantile = q < 1`` the micro-batch's top-q entropy tokens
(``gapo.core.shaping.high_entropy_mask``, TRL's): the surrogate keeps only their loss and is still
normalised by every response token, as TRL; the KL and entropy terms keep every response token.
The response mask itself leaves out the rows that ``algo.mask_truncated`` masks (:func:`loss_mask`):
their tokens are in no term and no normaliser. The rewards the advantages see may carry DAPO's
overlong term (:func:`advantage_rewards`).

With micro-batches every ``agg`` is normalised by the whole mini-batch (``minibatch_norms``), so
the micro-batches' losses add up to the mini-batch's loss and so do their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from gapo.core.adaptive_bounds import BOUND_SCHEDULES
from gapo.core.aggregation import AggNorms, agg_loss
from gapo.core.clipping import eps_high_for
from gapo.core.losses import LOSSES, RATIO_LEVEL, kl_estimate
from gapo.core.metrics import clip_counts_by_c, merge_counts
from gapo.core.shaping import high_entropy_mask, overlong_penalty
from gapo.core.surrogate import ClipBounds, log_ratio, split_token_diagnostics

__all__ = [
    "LossSettings",
    "UpdateBatch",
    "OldPolicy",
    "UpdateStats",
    "micro_batches",
    "minibatch_norms",
    "token_share",
    "micro_batch_loss",
    "loss_mask",
    "advantage_rewards",
    "check_overlong",
    "rollout_eps_high",
    "clip_bounds",
    "clip_counts",
    "ADDITIVE",
]

# metrics that add up over a mini-batch's micro-batches (each is a share of the mini-batch loss);
# every other metric is a rate, weighted by the micro-batch's share of the response tokens
ADDITIVE = ("loss/policy", "loss/total", "loss/kl_ref")


@dataclass(frozen=True)
class LossSettings:
    """The loss's hyper-parameters (the ``algo`` config keys of the same names)."""

    loss: str = "ppo"  # a key of gapo.core.losses.LOSSES
    loss_params: dict = field(default_factory=dict)  # its own (gapo.core.method_params.LOSS_PARAMS)
    eps_schedule: str = "fixed"  # a bound schedule (BAPO, DCPO) sets the widths in the loss call
    eps_schedule_params: dict = field(default_factory=dict)
    eps_low: float = 0.2
    eps_high_max: float = 0.2
    agg: str = "token-mean"
    clip_ratio_c: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0  # q: the surrogate over the top-q entropy tokens; 1: all

    @classmethod
    def from_algo(cls, algo) -> LossSettings:
        return cls(**{f.name: getattr(algo, f.name) for f in fields(cls)})


@dataclass
class UpdateBatch:
    """One step's update data, ``B`` rollouts (rows) of ``T`` response positions; a micro-batch
    (:meth:`rows`) also carries its rows' old log-probs."""

    rollout: object  # the sampled rows (input_ids, attention_mask, response_mask), gapo.rl.rollout
    mask: torch.Tensor  # (B, T) float response mask
    advantages: torch.Tensor  # (B,) or (B, T)
    eps_high: torch.Tensor | None  # (B,) GAPO's upper width per rollout; None: a bound schedule's
    c: torch.Tensor  # (B,) successes in each rollout's group
    ref_logp: torch.Tensor | None = None  # (B, T) log π_ref, when kl_coef > 0
    old_logp: torch.Tensor | None = None  # (b, T) log π_old of a micro-batch; the whole batch's: OldPolicy
    overlong: torch.Tensor | None = None  # (B,) DAPO's overlong term in the advantages' rewards (advantage_rewards)

    def rows(self, idx: torch.Tensor, old_logp: torch.Tensor) -> UpdateBatch:
        """The rows ``idx`` (a micro-batch), copied, with their ``old_logp`` (``OldPolicy.first_forward``)."""
        pick = lambda x: None if x is None else x[idx]  # noqa: E731
        return replace(
            self,
            mask=self.mask[idx],
            advantages=self.advantages[idx],
            eps_high=pick(self.eps_high),
            c=self.c[idx],
            ref_logp=pick(self.ref_logp),
            old_logp=old_logp,
        )


class OldPolicy:
    """π_old's token log-probs ``logp`` (B, T), completed by each row's *first* forward of the step.

    - ``pending`` rows (``algo.old_logp=recompute``: all) have no old log-prob yet. Each one's
      first forward is under exactly π_old's parameters (the trainer's no-grad pass, or, for
      epoch 0's first mini-batch, the update's very first forward, before any step), so its
      ``logp.detach()`` *is* the row's old log-prob (docs/design.md §4.3; TRL does the same for
      one iteration). Under ``old_logp=sampler`` none is pending: ``logp`` is the sampler's.
    - ``entropy_sum`` sums the token entropy ``Σ m·H`` at each row's first forward, the
      ``policy/entropy`` diagnostic. Rows first forwarded by the no-grad behaviour pass are
      measured there; under ``old_logp=sampler`` every row is measured at its epoch-0 forward.
    """

    def __init__(self, logp: torch.Tensor, mask: torch.Tensor, pending: torch.Tensor):
        self.logp, self.mask = logp, mask  # (B, T): the known rows' old log-probs (pending rows: any value)
        B = mask.shape[0]
        self.pending = torch.zeros(B, dtype=torch.bool, device=mask.device)
        self.pending[pending] = True
        self.unmeasured = torch.ones(B, dtype=torch.bool, device=mask.device)
        self.entropy_sum = 0.0

    def first_forward(self, rows: torch.Tensor, logp: torch.Tensor, ent: torch.Tensor) -> torch.Tensor:  # (b, T)
        """The old log-probs of ``rows``, given a forward of them (whole micro-batches: all
        pending/unmeasured or none): that forward's own where they were pending."""
        if bool(self.pending[rows].all()):
            self.logp[rows] = logp.detach().float()
            self.pending[rows] = False
        if bool(self.unmeasured[rows].all()):
            self.entropy_sum += float((ent.detach() * self.mask[rows]).sum())
            self.unmeasured[rows] = False
        return self.logp[rows]


@dataclass
class UpdateStats:
    """What one step's ``U = E × M`` optimiser updates accumulated, for ``rl.step_metrics``: the
    loss metrics of each update (``ADDITIVE`` ones summed over its micro-batches, the rates
    weighted by their share of the mini-batch's response tokens), summed over updates; the raw
    clip counts per ``c`` of every micro-batch (``core.metrics.merge_counts``); each update's
    pre-clipping gradient norm; π_old's entropy sum (``OldPolicy.entropy_sum``)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[int, dict[str, float]] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    entropy_sum: float = 0.0
    current: dict[str, float] = field(default_factory=dict, repr=False)  # the update under way

    def add(self, metrics: dict, counts: dict, share: float = 1.0) -> None:
        """A micro-batch's loss ``metrics`` (``ADDITIVE`` keys whole, the others × ``share``) and clip counts."""
        for k, v in metrics.items():
            self.current[k] = self.current.get(k, 0.0) + (1.0 if k in ADDITIVE else share) * float(v)
        merge_counts(self.counts, counts)

    def end_update(self, grad_norm: float) -> None:
        """Close an optimiser update: its metrics join the sums, its gradient norm the list."""
        for k, v in self.current.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.current = {}
        self.grad_norms.append(grad_norm)


# train.micro_batch_size=auto: the float32 logits of one micro-batch's forward, at most
AUTO_MICRO_BATCH_BYTES = 256 * 2**20


def micro_batch_rows(size: int | str | None, width: int, vocab: int) -> int | None:
    """Rows per micro-batch for ``train.micro_batch_size``: an int as given, ``None`` (one chunk),
    or ``"auto"``: as many rows as keep the float32 logits of their forward (``width`` completion
    positions × ``vocab``) within ``AUTO_MICRO_BATCH_BYTES``, at least 1. At a real vocabulary
    the logits are the update's largest tensor; bounding them bounds the update's memory, and on
    a CPU the fresh pages it touches (BENCHMARKS.md, section 13.2). A character vocabulary stays whole."""
    if size != "auto":
        return size
    return max(1, AUTO_MICRO_BATCH_BYTES // (4 * max(1, width) * vocab))


def micro_batches(rows: torch.Tensor, size: int | None) -> tuple[torch.Tensor, ...]:
    """``rows`` in consecutive chunks of ``size`` (``micro_batch_rows``; None: one chunk)."""
    return rows.split(size or rows.numel())


def minibatch_norms(mask: torch.Tensor, horizon: int, split: bool) -> AggNorms | None:
    """``agg_loss``'s whole-mini-batch normalisers for a mini-batch (response ``mask``) cut into
    micro-batches (``split``); None (each batch's own) when the mini-batch is one micro-batch."""
    if not split:
        return None
    # at least 1: a mini-batch of masked rows only (algo.mask_truncated) has a loss of 0, not 0/0
    return AggNorms(num_tokens=mask.sum().clamp(min=1), num_seqs=(mask.sum(-1) > 0).sum().clamp(min=1), horizon=horizon)


def token_share(mask: torch.Tensor, minibatch_mask: torch.Tensor, norms: AggNorms | None) -> float:
    """A micro-batch's share of its mini-batch's response tokens (1 when it is the whole)."""
    return float(mask.sum()) / max(float(minibatch_mask.sum()), 1.0) if norms is not None else 1.0


def micro_batch_loss(
    logp: torch.Tensor, ent: torch.Tensor, mb: UpdateBatch, s: LossSettings, norms: AggNorms | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
    """``(total, metrics, counts)`` of one micro-batch (formula in the module docstring);
    ``logp``/``ent`` ``(b, T)`` are the current policy's on ``mb``'s rows. Metrics are detached 0-d
    tensors: the surrogate's (``gapo.core.losses``), ``loss/kl_ref``, ``loss/policy``,
    ``loss/total`` and, with ``top_entropy_quantile < 1``, ``loss/entropy_mask_frac`` (the share
    of response tokens kept); ``counts`` are the clip counts per ``c`` (:func:`clip_counts`)."""
    bounds = clip_bounds(logp, mb, s)
    w, kept = _entropy_weights(ent, mb.mask, s.top_entropy_quantile)
    loss, metrics = LOSSES[s.loss](
        logp, mb.old_logp, mb.advantages, mb.mask, bounds, agg=s.agg, weights=w, norms=norms, **s.loss_params
    )
    metrics, tokens = split_token_diagnostics(metrics)
    if kept is not None:
        metrics["loss/entropy_mask_frac"] = kept
    total = loss
    if mb.ref_logp is not None:
        kl = agg_loss(kl_estimate(logp, mb.ref_logp, s.kl_estimator), mb.mask, s.agg, norms=norms)
        total = total + s.kl_coef * kl
        metrics["loss/kl_ref"] = kl.detach()
    if s.entropy_coef:
        total = total - s.entropy_coef * agg_loss(ent, mb.mask, s.agg, norms=norms)
    metrics["loss/policy"], metrics["loss/total"] = loss.detach(), total.detach()
    return total, metrics, clip_counts(logp, mb, s, bounds, tokens)


def rollout_eps_high(algo, rewards: torch.Tensor, group_size: int) -> torch.Tensor | None:  # (B,)
    """Each rollout's ``ε_high`` from its group's raw rewards (fixed, GAPO: ``core.clipping``), or
    None under a bound schedule (BAPO, DCPO), whose widths :func:`clip_bounds` sets in the loss call."""
    if algo.eps_schedule in BOUND_SCHEDULES:
        return None
    a = algo
    return eps_high_for(
        a.eps_schedule, rewards, group_size, eps_low=a.eps_low, eps_high_max=a.eps_high_max, reward_range=a.reward_range
    )


def clip_bounds(logp: torch.Tensor, mb: UpdateBatch, s: LossSettings) -> ClipBounds:
    """The widths in force for this micro-batch: ``ε_low`` and the rollouts' ``ε_high`` (fixed,
    GAPO), or a bound schedule's (docs/design.md §2.13) from this forward's token ratios and the
    old log-probs: BAPO's two widths for the micro-batch, DCPO's per token."""
    if s.eps_schedule not in BOUND_SCHEDULES:
        return ClipBounds(s.eps_low, mb.eps_high, s.clip_ratio_c)
    ratio = torch.exp(log_ratio(logp.detach(), mb.old_logp, mb.mask, "token"))
    eps_low, eps_high = BOUND_SCHEDULES[s.eps_schedule](
        ratio,
        mb.old_logp,
        mb.advantages,
        mb.mask,
        eps_low=s.eps_low,
        eps_high=s.eps_high_max,
        **s.eps_schedule_params,
    )
    return ClipBounds(eps_low, eps_high, s.clip_ratio_c)


def _entropy_weights(
    ent: torch.Tensor, mask: torch.Tensor, q: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(w, kept share)`` of ``top_entropy_quantile = q``; ``(None, None)`` at ``q = 1``, so that the
    loss is bit for bit the unmasked one. The threshold is the micro-batch's own, as TRL's per call."""
    if q >= 1:
        return None, None
    w = high_entropy_mask(ent.detach(), mask, q).to(mask.dtype)
    return w, (w.sum() / mask.sum().clamp(min=1)).detach()


def loss_mask(response_mask: torch.Tensor, truncated: torch.Tensor | None) -> torch.Tensor:  # (B, T) float
    """The update's mask: the response mask, less the rows of ``truncated`` ((B,) bool, the rows
    ``rl.step_metrics.truncated`` counts) under ``algo.mask_truncated`` (TRL's
    ``mask_truncated_completions``). Those rows keep their rewards in their groups' advantages
    (as TRL, which masks after the advantages); only their tokens leave the loss; None: all stay."""
    mask = response_mask.float()
    return mask if truncated is None else mask * (~truncated.to(mask.device)).to(mask.dtype)[:, None]


def check_overlong(algo, max_new_tokens: int, *, key: str = "algo.overlong_buffer") -> None:
    """``algo.overlong_buffer`` (``L_cache``) is below the completion cap ``max_new_tokens``
    (``L_max``): else a ``ValueError`` naming ``key``. 0 (off) always passes."""
    if algo.overlong_buffer and algo.overlong_buffer >= max_new_tokens:
        raise ValueError(
            f"{key}: {algo.overlong_buffer} must be below the completion cap, {max_new_tokens} tokens "
            "(sampling.max_new_tokens, or the task's max_completion_len + 1); DAPO's penalty ramps over "
            "the buffer's last tokens before the cap"
        )


def advantage_rewards(rewards: torch.Tensor, lengths: torch.Tensor, algo, max_new_tokens: int):
    """``(R', range', term)``: the rewards the advantage estimator sees, their range and DAPO's
    overlong term ``(B,)`` (None when ``algo.overlong_buffer = 0``: ``R' = R``).

    ``R' = R + R_length(|y|)`` (``gapo.core.shaping.overlong_penalty``, arXiv 2503.14476 Eq. 13,
    verl's ``overlong_buffer``): the term joins the reward before the advantages, as verl's DAPO
    reward manager. A fixed range ``(lo, hi)`` widens to ``(lo − p, hi)`` (focal's p̂ reads it);
    ``group``/``batch`` ranges are the rewards' own. GAPO's ``ε_high(i)`` and the success count
    ``c`` are *not* computed from ``R'``: ``c`` counts the group's successes, a property of the
    verifiable reward, which a shorter-is-better shaping term must not move (a success of full
    length is still a success); the trainer passes them the task's reward."""
    rr = algo.reward_range
    if not algo.overlong_buffer:
        return rewards, rr, None
    term = overlong_penalty(lengths, max_new_tokens, algo.overlong_buffer, algo.overlong_penalty).to(rewards.device)
    if not isinstance(rr, str):
        rr = (rr[0] - algo.overlong_penalty, rr[1])
    return rewards + term.to(rewards.dtype), rr, term


@torch.no_grad()
def clip_counts(logp: torch.Tensor, mb: UpdateBatch, s: LossSettings, bounds: ClipBounds, tokens: dict) -> dict:
    """Clip counts per group success count ``c`` (the paper's Fig. 2), ``gapo.core.metrics``: the
    ratio the loss clips against ``bounds``, with the loss's own clipped tokens and gradient weight
    (``tokens``: its ``token/clipped``, ``token/gate``, when it gives them)."""
    ratio = torch.exp(log_ratio(logp.detach(), mb.old_logp, mb.mask, RATIO_LEVEL.get(s.loss, "token")))
    return clip_counts_by_c(
        ratio,
        mb.advantages,
        mb.mask,
        mb.c,
        eps_low=bounds.eps_low,
        eps_high=bounds.eps_high,
        clipped=tokens.get("token/clipped"),
        gate=tokens.get("token/gate"),
    )
