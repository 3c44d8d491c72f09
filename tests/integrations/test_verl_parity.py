"""Parity of gapo's core math with verl 0.9.1's registered policy losses and ``agg_loss`` (issue 2).

verl's losses are called exactly as its actor calls them (``get_policy_loss_fn(name)(...)`` with
an ``ActorConfig`` built like verl's own CPU tests). Tolerance 1e-6 on value, gradient and the
clip-fraction / KL metrics.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from verl.trainer.ppo.core_algos import agg_loss as verl_agg_loss  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from gapo.core.aggregation import AGG_MODES, AggNorms, agg_loss  # noqa: E402
from gapo.core.losses import policy_loss  # noqa: E402
from gapo.core.surrogate import ClipBounds  # noqa: E402

TOL = 1e-6


def _actor(eps_low, eps_high, agg="token-mean", clip_ratio_c=3.0):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=eps_low,
        clip_ratio_low=eps_low,
        clip_ratio_high=eps_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=agg,
    )


def _batch(seed, B=12, T=16, noise=0.3, adv_per_token=False):
    """Random log-probs with ratios spread well past the clip range; ragged masks, one empty row."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3.0
    logp = old + torch.randn(B, T, generator=g) * noise
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0  # a response with no tokens must contribute nothing
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, T if adv_per_token else 1, generator=g).expand(B, T) * mask
    adv[-2:] = 0.0  # zero-advantage rows (all-equal groups) are never "clipped"
    return old, logp, adv.contiguous(), mask


def _both(verl_name, agg, old, logp, adv, mask, cfg, **gapo_kwargs):
    x_v = logp.clone().requires_grad_(True)
    loss_v, m_v = get_policy_loss_fn(verl_name)(
        old_log_prob=old, log_prob=x_v, advantages=adv, response_mask=mask, loss_agg_mode=agg, config=cfg
    )
    loss_v.backward()
    x_g = logp.clone().requires_grad_(True)
    loss_g, m_g = policy_loss(x_g, old, adv, mask, agg=agg, **gapo_kwargs)
    loss_g.backward()
    return (loss_v, x_v.grad, m_v), (loss_g, x_g.grad, m_g)


def _assert_close(v, g, dual=True):
    (loss_v, grad_v, m_v), (loss_g, grad_g, m_g) = v, g
    assert abs(loss_v.item() - loss_g.item()) <= TOL, (loss_v.item(), loss_g.item())
    assert (grad_v - grad_g).abs().max().item() <= TOL
    assert abs(m_v["actor/pg_clipfrac"] - float(m_g["loss/clipfrac"])) <= TOL
    assert abs(m_v["actor/ppo_kl"] - float(m_g["loss/approx_kl"])) <= TOL
    assert abs(m_v["actor/pg_clipfrac_lower"] - float(m_g["loss/clipfrac_dual"])) <= TOL
    return max(abs(loss_v.item() - loss_g.item()), (grad_v - grad_g).abs().max().item())


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
@pytest.mark.parametrize("seed", [0, 1])
def test_token_level_equals_verl_vanilla(agg, eps, seed):
    old, logp, adv, mask = _batch(seed)
    # a few tokens far out, so that the dual clip (ratio > 3 with A < 0) is exercised
    logp[3:6, :4] += 1.5
    v, g = _both(
        "vanilla",
        agg,
        old,
        logp,
        adv,
        mask,
        _actor(*eps, agg=agg),
        bounds=ClipBounds(eps[0], eps[1], clip_ratio_c=3.0),
        level="token",
    )
    _assert_close(v, g)
    assert v[2]["actor/pg_clipfrac"] > 0.05  # the comparison covers clipped tokens ...
    assert v[2]["actor/pg_clipfrac_lower"] > 0  # ... and dual-clipped ones


def test_token_level_per_token_advantages_and_per_rollout_eps_tensor():
    # advantages (B, T) that vary per token, and a constant per-rollout ε tensor (GAPO's input type)
    old, logp, adv, mask = _batch(5, adv_per_token=True)
    eps_high = torch.full((old.shape[0],), 0.28)
    v, g = _both(
        "vanilla",
        "token-mean",
        old,
        logp,
        adv,
        mask,
        _actor(0.2, 0.28),
        bounds=ClipBounds(0.2, eps_high, clip_ratio_c=3.0),
        level="token",
    )
    _assert_close(v, g)


def test_token_level_extreme_log_ratios_match():
    # both clamp the token log-ratio to ±20 before exp
    old, logp, adv, mask = _batch(2)
    logp[1:4] += 40.0
    logp[5:8] -= 40.0
    v, g = _both(
        "vanilla",
        "token-mean",
        old,
        logp,
        adv,
        mask,
        _actor(0.2, 0.28),
        bounds=ClipBounds(0.2, 0.28, clip_ratio_c=3.0),
        level="token",
    )
    _assert_close(v, g)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("eps", [(3e-3, 4e-3), (3e-3, 5e-3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_sequence_level_equals_verl_gspo(agg, eps, seed):
    # per-token noise 0.02 puts the sequence ratio on both sides of GSPO's tiny clip range
    old, logp, adv, mask = _batch(seed, noise=0.02)
    v, g = _both(
        "gspo",
        agg,
        old,
        logp,
        adv,
        mask,
        _actor(*eps, agg=agg),
        bounds=ClipBounds(eps[0], eps[1], clip_ratio_c=None),
        level="sequence",
    )
    _assert_close(v, g)
    assert 0.1 < v[2]["actor/pg_clipfrac"] < 0.9


@pytest.mark.parametrize("case", ["mean_log_ratio_12", "one_token_log_ratio_30"])
def test_sequence_level_large_log_ratios_match_verl_gspo(case):
    """verl's gspo clamps the GSPO log-ratio at max 10 and does not clamp tokens before the mean;
    a policy far from π_old must still give verl's value and gradient. Rows have A < 0, where the
    unclipped branch ``−A·s`` is taken, so the clamp shows in the loss."""
    old, logp, adv, mask = _batch(3, noise=0.02)
    mask[:] = True
    adv[:] = -1.0
    if case == "mean_log_ratio_12":
        logp[2:6] += 12.0  # sequence ratio e^12: verl uses e^10
    else:
        logp[7, 0] += 30.0  # mean log-ratio 30/16 for verl, 20/16 if the token is clamped first
    v, g = _both(
        "gspo",
        "token-mean",
        old,
        logp,
        adv,
        mask,
        _actor(3e-3, 4e-3),
        bounds=ClipBounds(3e-3, 4e-3, clip_ratio_c=None),
        level="sequence",
    )
    _assert_close(v, g)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("global_info", [False, True])
def test_agg_loss_equals_verl(mode, global_info):
    g = torch.Generator().manual_seed(7)
    loss_mat = torch.randn(9, 13, generator=g)
    mask = torch.rand(9, 13, generator=g) > 0.3
    mask[4] = False  # an empty row: excluded from the sequence count by both
    if not global_info:
        ref = verl_agg_loss(loss_mat, mask, mode)
        ours = agg_loss(loss_mat, mask, mode)
    else:
        # verl normalises by the global mini-batch counts and multiplies by dp_size; gapo divides by
        # the same counts per rank
        dp, n_tok, n_seq, horizon = 4, 301, 37, 2048
        ref = verl_agg_loss(
            loss_mat, mask, mode, dp_size=dp, batch_num_tokens=n_tok, global_batch_size=n_seq, loss_scale_factor=horizon
        )
        ours = agg_loss(
            loss_mat, mask, mode, norms=AggNorms(num_tokens=n_tok / dp, num_seqs=n_seq / dp, horizon=horizon)
        )
    assert abs(ref.item() - ours.item()) <= TOL * max(1.0, abs(ref.item()))
