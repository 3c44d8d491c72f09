"""One training step's record of ``metrics.jsonl`` (docs/design.md §4.2 step 6, §7), a pure
function of what the step produced.

With ``U`` optimiser updates (``E × M``), ``N`` response tokens and ``B`` rollouts: the loss
metrics are their sums over updates ``/ U``; ``policy/entropy`` is π_old's entropy summed over
every response token ``/ N``; ``rollout/response_len = N / B`` (``_min``, ``_max``: the shortest
and longest rollout, in tokens); ``rollout/frac_truncated`` the share of rollouts cut by
``max_new_tokens`` (ended by neither a stop token nor a stop string; TRL's
``completions/clipped_ratio``; under ``algo.mask_truncated`` exactly the rows left out of the
loss, so no second metric counts them); ``reward/overlong_penalty`` the mean over the batch of
DAPO's overlong term (``algo.overlong_buffer > 0``: what the advantages saw on top of the task's
reward; ``rollout/reward`` and ``rollout/pass_rate`` stay the task's); ``rollout/group_reward_std``
the mean over the ``P`` groups of ``std_g(R)`` (unbiased, as ``torch.std``); ``rollout/pass_rate`` the share
of rewards at the top of the reward range (a success reaches ``R_max``; gapo's verifiers' 1.0
under a ``group``/``batch`` range); ``optim/grad_norm`` the mean pre-clipping norm over updates;
the per-``c`` rates come from the raw counts summed over every mini-batch and epoch
(``core.metrics.clip_stats_from_counts``), so they do not depend on how the batch was split, and
``clip/frac_high_pos`` is the clipped share of all positive-advantage tokens.
"""

from __future__ import annotations

import torch

from gapo.core.metrics import clip_stats_from_counts
from gapo.rl.update import UpdateStats

__all__ = ["step_metrics", "truncated", "gpu_memory"]


def step_metrics(
    batch, ub, upd: UpdateStats, *, step: int, lr: float, reward_range, max_new_tokens: int, tokenizer
) -> dict:
    """The deterministic part of step ``step``'s train record: ``batch`` the rollout
    (``rollout.Batch``), ``ub`` the ``update.UpdateBatch``, ``upd`` what ``Trainer._update``
    accumulated (``update.UpdateStats``), ``lr`` the learning rate
    after the step; ``max_new_tokens`` and ``tokenizer`` (its ``decode``) what the rollouts were
    sampled with (:func:`truncated`). The trainer appends ``gpu_memory`` and the ``time/*`` fields."""
    advantages, rewards, mask = ub.advantages, batch.rewards, batch.rollout.response_mask.float()
    n_updates, n_tok = len(upd.grad_norms), float(mask.sum())
    lengths = batch.rollout.response_mask.sum(1)
    out = {"kind": "train", "step": step}
    out.update({k: v / n_updates for k, v in upd.sums.items()})
    out["policy/entropy"] = upd.entropy_sum / max(n_tok, 1.0)
    out["rollout/reward"] = float(rewards.mean())
    top = 1.0 if isinstance(reward_range, str) else reward_range[1]
    out["rollout/pass_rate"] = float((rewards >= top).float().mean())
    out["rollout/response_len"] = n_tok / mask.shape[0]
    out["rollout/response_len_min"] = int(lengths.min())
    out["rollout/response_len_max"] = int(lengths.max())
    out["rollout/frac_truncated"] = float(truncated(batch.rollout, max_new_tokens, tokenizer).float().mean())
    out["rollout/group_reward_std"] = float(rewards.view(-1, batch.group_size).std(dim=1).mean())
    overlong = getattr(ub, "overlong", None)  # update.advantage_rewards' term, when algo.overlong_buffer > 0
    if overlong is not None:
        out["reward/overlong_penalty"] = float(overlong.mean())
    out["optim/lr"] = lr
    out["optim/grad_norm"] = sum(upd.grad_norms) / n_updates
    counts = upd.counts
    if ub.eps_high is not None and (advantages > 0).any():
        out["clip/eps_high_pos_mean"] = float(ub.eps_high[advantages > 0].mean())
    elif ub.eps_high is None and any(f["pos_rows"] for f in counts.values()):  # BAPO, DCPO: the widths used
        out["clip/eps_high_pos_mean"] = sum(f["pos_eps_sum"] for f in counts.values()) / sum(
            f["pos_rows"] for f in counts.values()
        )
    out.update(clip_stats_from_counts(counts))
    pos_tok = sum(f["pos_tokens"] for f in counts.values())
    out["clip/frac_high_pos"] = sum(f["pos_clipped"] for f in counts.values()) / pos_tok if pos_tok else 0.0
    out.update(batch.info)
    out.update({k: v for k, v in batch.stats.items() if k.startswith("reward/") and k != "reward/n"})
    return out


def truncated(rollout, max_new_tokens: int, tokenizer) -> torch.Tensor:  # (B,) bool
    """The rollouts cut by ``max_new_tokens``: as long as the limit and ended by neither a stop
    token (their last token is not one of ``rollout.eos_ids``) nor a stop string. A row ends at
    the token that completes its first stop string, so a row of full length was ended by one
    exactly when its decoded text (special tokens skipped, as ``Rollout.texts``) holds one; only
    those rows are decoded, and only when there are stop strings."""
    lengths = rollout.response_mask.sum(1)
    last = rollout.completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    eos = torch.tensor(rollout.eos_ids, dtype=last.dtype, device=last.device)
    cut = (lengths >= max_new_tokens) & ~torch.isin(last, eos)
    if rollout.stop:
        for i in cut.nonzero()[:, 0].tolist():
            text = tokenizer.decode(rollout.completion_ids[i, : int(lengths[i])].tolist(), skip_special_tokens=True)
            cut[i] = not any(s in text for s in rollout.stop)
    return cut


def gpu_memory(device: torch.device) -> dict:
    """``{"memory/peak_gpu_gb": GiB}``, the peak GPU memory allocated so far; empty off CUDA."""
    return {"memory/peak_gpu_gb": torch.cuda.max_memory_allocated(device) / 2**30} if device.type == "cuda" else {}
