"""Aggregation of a per-token loss matrix into a scalar, as in verl's ``agg_loss``.

Modes (``mask`` marks response tokens, ``N`` tokens, ``S`` non-empty sequences, ``T`` horizon)::

    token-mean               Σ_{i,t} L·m / N                       (DAPO, arXiv 2503.14476)
    seq-mean-token-mean      (1/S) Σ_i [Σ_t L·m / Σ_t m]            (GRPO, arXiv 2402.03300)
    seq-mean-token-sum       (1/S) Σ_i Σ_t L·m
    seq-mean-token-sum-norm  (1/S) Σ_i Σ_t L·m / T                  (Dr.GRPO, arXiv 2503.20783)

The normalisers ``N``, ``S`` and ``T`` may be passed for the *whole* mini-batch, as one
``AggNorms(num_tokens, num_seqs, horizon)``, so that summing the losses of its micro-batches gives
exactly the mini-batch loss, independent of how it was split.

A batch with no response token aggregates to 0 (its own counts are taken as at least 1).

Padded entries (``mask = 0``) are selected away, not multiplied by 0 (as verl's ``masked_sum``):
NaN or ±inf there (log-probs of padding) reach neither the loss nor its gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from gapo.core.checks import check_same_shape, is_real, unknown

__all__ = ["AggNorms", "agg_loss", "AGG_MODES"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True, eq=False)  # eq=False: the counts may be tensors (no elementwise ==)
class AggNorms:
    """Whole-mini-batch normalisers of :func:`agg_loss`; a field left ``None`` is the batch's own.

    - ``num_tokens``: ``N``, the response tokens (``token-mean``);
    - ``num_seqs``: ``S``, the non-empty sequences (the ``seq-mean-*`` modes);
    - ``horizon``: ``T``, the horizon of ``seq-mean-token-sum-norm``.

    Each is a real number > 0 or a one-element tensor (a count kept on the device: no host sync);
    anything else is a ``ValueError`` naming the field, raised when the normalisers are built.
    """

    num_tokens: float | torch.Tensor | None = None
    num_seqs: float | torch.Tensor | None = None
    horizon: float | None = None

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            # a count kept on the device is not read here (that would sync with the host)
            on_device = f.name != "horizon" and isinstance(v, torch.Tensor) and v.numel() == 1
            if not (v is None or on_device or (is_real(v) and v > 0)):
                what = "a number > 0" + ("" if f.name == "horizon" else " or a one-element tensor")
                raise ValueError(f"AggNorms.{f.name} must be None or {what}, got {v!r}")


def agg_loss(
    loss_mat: torch.Tensor,  # (B, T)
    mask: torch.Tensor,  # (B, T) 0/1
    mode: str = "token-mean",
    *,
    norms: AggNorms | None = None,  # whole-mini-batch normalisers; None: this batch's own
) -> torch.Tensor:  # ()
    """Aggregate ``loss_mat`` over ``mask`` by ``mode`` (see the module docstring)."""
    if mode not in AGG_MODES:
        raise unknown("aggregation mode", mode, AGG_MODES)
    norms = _checked_norms(norms)
    num_tokens, num_seqs, horizon = norms.num_tokens, norms.num_seqs, norms.horizon
    check_same_shape({"loss_mat": loss_mat, "mask": mask})
    # where, not loss_mat * mask: NaN · 0 is NaN, and padded log-probs may be NaN or ±inf
    masked = torch.where(mask.bool(), loss_mat, loss_mat.new_zeros(()))
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        # an empty mask (every row masked, e.g. algo.mask_truncated) is a loss of 0, not 0/0
        n = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
        return masked.sum() / n
    tokens_per_seq = mask.sum(-1)  # (B,)
    n_seq = (tokens_per_seq > 0).sum().clamp(min=1) if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        # sequences with no response tokens contribute 0 (their numerator is 0)
        return (masked.sum(-1) / tokens_per_seq.clamp(min=1e-8)).sum() / n_seq
    seq_sum = masked.sum(-1).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return seq_sum
    return seq_sum / (loss_mat.shape[-1] if horizon is None else horizon)


def _checked_norms(norms: AggNorms | None) -> AggNorms:
    """``norms`` when it is an ``AggNorms`` (its values were checked when it was built); None: none."""
    if norms is None:
        return AggNorms()
    if not isinstance(norms, AggNorms):
        raise TypeError(
            f"norms must be a gapo.core.aggregation.AggNorms(num_tokens, num_seqs, horizon), got {type(norms).__name__}"
        )
    return norms
