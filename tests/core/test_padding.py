"""Padded positions are don't-care: NaN or ±inf there changes no loss, gradient or metric.

A model's log-probs at padded positions may be NaN or ±inf (a fully masked attention row, a
masked logit). ``x · mask`` lets them through (NaN · 0 is NaN, in the gradient too); the core
selects them away instead (docs/design.md §2.9). Each property compares non-finite padding with
zero padding of the same batch: the results must be identical, the gradient 0 at padding.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.aggregation import AGG_MODES, agg_loss
from gapo.core.losses import LOSSES
from gapo.core.method_params import DUAL_CLIP
from gapo.core.metrics import clip_counts_by_c
from gapo.core.surrogate import ClipBounds

BAD = (float("nan"), float("inf"), -float("inf"))


def _batch(seed, B=8, T=7):
    """Log-probs with ratios past both clip bounds, ragged masks with one empty row, rollouts of
    both advantage signs and some zero ones."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + 0.5 * torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g)
    adv[1] = 0.0
    return logp, old, adv, mask, g


def _poison(x, mask, g):
    """``x`` with every padded entry a random one of NaN, +inf, −inf."""
    pick = torch.randint(0, len(BAD), x.shape, generator=g)
    bad = torch.tensor(BAD, dtype=x.dtype)[pick]
    return torch.where(mask, x, bad)


def _zero_pad(x, mask):
    return torch.where(mask, x, torch.zeros_like(x))


def _run(name, logp, old, adv, mask, weights, agg, eps_high):
    x = logp.clone().requires_grad_(True)
    kw = {} if weights is None else dict(weights=weights)
    if name == "clip_cov":  # the same random draw in both runs
        kw["generator"] = torch.Generator().manual_seed(0)
    bounds = ClipBounds(0.2, eps_high, 3.0 if DUAL_CLIP[name] else None)
    loss, metrics = LOSSES[name](x, old, adv, mask.float(), bounds, agg=agg, **kw)
    loss.backward()
    return loss.detach(), x.grad, {k: torch.as_tensor(v) for k, v in metrics.items()}


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    name=st.sampled_from(sorted(LOSSES)),
    agg=st.sampled_from(AGG_MODES),
    poisoned=st.sets(st.sampled_from(["logp", "old", "adv", "weights"]), min_size=1),
    per_token=st.booleans(),
)
def test_non_finite_padding_equals_zero_padding(seed, name, agg, poisoned, per_token):
    logp, old, adv, mask, g = _batch(seed)
    # per rollout, as GAPO's, or per token (DCPO's)
    eps_high = 0.2 + 0.3 * torch.rand(logp.shape if per_token else adv.shape, generator=g)
    adv_tok = adv[:, None].expand_as(logp).clone()  # (B, T): the form verl passes
    weights = 0.5 + torch.rand(logp.shape, generator=g)
    clean = [_zero_pad(t, mask) if t is not None else None for t in (logp, old, adv_tok, weights)]
    dirty = [
        _poison(t, mask, g) if t is not None and key in poisoned else t
        for t, key in zip(clean, ("logp", "old", "adv", "weights"))
    ]
    ref = _run(name, *clean[:3], mask, clean[3], agg, eps_high)
    out = _run(name, *dirty[:3], mask, dirty[3], agg, eps_high)
    assert torch.isfinite(out[0]) and torch.isfinite(out[1]).all()
    assert torch.equal(out[0], ref[0])
    assert torch.equal(out[1], ref[1]) and (out[1][~mask] == 0).all()
    for k in ref[2]:
        assert torch.equal(out[2][k], ref[2][k]), k


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("bad", BAD)
def test_agg_loss_ignores_non_finite_padding(mode, bad):
    # hand-computed: rows [1, 2 | pad] and [4 | pad, pad] as in test_aggregation
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss_mat = torch.tensor([[1.0, 2.0, bad], [4.0, bad, bad]], requires_grad=True)
    expected = {
        "token-mean": (1 + 2 + 4) / 3,
        "seq-mean-token-mean": ((1 + 2) / 2 + 4) / 2,
        "seq-mean-token-sum": (3 + 4) / 2,
        "seq-mean-token-sum-norm": (3 + 4) / 2 / 3,
    }[mode]
    loss = agg_loss(loss_mat, mask, mode)
    loss.backward()
    assert loss.item() == pytest.approx(expected)
    assert torch.isfinite(loss_mat.grad).all() and (loss_mat.grad[mask == 0] == 0).all()


def test_clip_counts_ignore_non_finite_padded_ratios():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    ratio = torch.tensor([[1.5, 0.9, float("nan")], [0.7, float("inf"), float("nan")]])
    counts = clip_counts_by_c(ratio, torch.tensor([1.0, -1.0]), mask, torch.tensor([1, 1]), eps_low=0.2, eps_high=0.28)
    # Σ|ρ − 1| over the three response tokens: 0.5 + 0.1 + 0.3
    assert counts[1]["dev_sum"] == pytest.approx(0.9)
    assert counts[1]["pos_clipped"] == 1 and counts[1]["tokens"] == 3
