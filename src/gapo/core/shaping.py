"""Reward and token shaping of the update: DAPO's overlong penalty and the high-entropy token mask.

Pure functions, as the rest of ``gapo.core``::

    overlong      R_length(y) = 0                                  |y| <= L_max − L_cache
                              = ((L_max − L_cache) − |y|)/L_cache · p   L_max − L_cache < |y| <= L_max
                              = −p                                  |y| > L_max
                  (DAPO's soft overlong punishment, Eq. 13, arXiv 2503.14476; p = the penalty factor)
    entropy mask  keep token t  iff  m_t = 1  and  H_t >= Q_{1−q}({H_s : m_s = 1})
                  (the top-q entropy tokens, "Beyond the 80/20 rule", arXiv 2506.01939; TRL's
                  top_entropy_quantile)

``|y|`` is the response length in tokens, the stop token included (the response mask's row sum):
verl's DAPO reward manager (``verl/workers/reward_manager/dapo.py``) counts the response's
attention mask, which holds the EOS, and computes ``min(−(|y| − (L_max − L_cache))/L_cache · p, 0)``;
a response never exceeds ``L_max`` there, and here the term is clamped at ``−p`` for one that does.
"""

from __future__ import annotations

import math

import torch

from gapo.core.checks import check_same_shape, is_real

__all__ = ["overlong_penalty", "high_entropy_mask"]


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:  # (B,)
    """DAPO's soft overlong punishment ``R_length`` per rollout (module docstring; arXiv 2503.14476 Eq. 13).

    ``lengths`` (B,) are the responses' token counts (EOS included, as verl), ``max_new_tokens``
    is ``L_max``, ``buffer`` is ``L_cache`` (``0 < buffer < max_new_tokens``) and ``penalty`` the
    factor ``p >= 0`` (verl's ``overlong_buffer.penalty_factor``). Float32, in ``[−p, 0]``.
    """
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not (whole(max_new_tokens) and max_new_tokens >= 1):
        raise ValueError(f"overlong_penalty's max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not (whole(buffer) and 0 < buffer < max_new_tokens):
        raise ValueError(
            f"overlong_penalty's buffer must be an int in (0, max_new_tokens={max_new_tokens}), got {buffer!r}"
        )
    if not (is_real(penalty) and math.isfinite(penalty) and penalty >= 0):
        raise ValueError(f"overlong_penalty's penalty must be a finite number >= 0, got {penalty!r}")
    expected = max_new_tokens - buffer  # L_max − L_cache: the length up to which nothing is taken off
    exceed = lengths.to(torch.float64) - expected
    term = (-exceed / buffer * penalty).clamp(min=-float(penalty), max=0.0)
    return term.to(torch.float32)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:  # (B, T) bool
    """The response tokens among the top ``quantile`` of entropy (arXiv 2506.01939; TRL's
    ``GRPOTrainer.get_high_entropy_mask`` with its threshold ``1 − quantile``).

    The threshold is ``torch.quantile`` (linear interpolation) at ``1 − quantile`` of the
    entropies of the response tokens (``mask = 1``); a token is kept when it is a response token
    and its entropy is ``>=`` the threshold, so ties at the threshold are all kept and the kept
    share is at least ``quantile``. No response token: nothing is kept. ``quantile = 1`` keeps
    every response token (the threshold is the minimum); callers skip the mask then, so that the
    loss is bit for bit the unmasked one. ``entropy`` needs no gradient: the mask is a selection.
    """
    if isinstance(quantile, bool) or not is_real(quantile) or not 0 < quantile <= 1:
        raise ValueError(f"high_entropy_mask's quantile must be a number in (0, 1], got {quantile!r}")
    check_same_shape({"entropy": entropy, "mask": mask})
    keep = mask.bool()
    values = entropy.detach()[keep].float()
    if values.numel() == 0:
        return torch.zeros_like(keep)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropy.detach().float() >= threshold) & keep
