"""verl's losses under non-finite padding: NaN or ±inf where ``response_mask`` is 0.

A model's log-probs at padded positions may be NaN or ±inf. verl's ``vanilla`` aggregates
``token-mean``/``token-sum`` with ``masked_sum`` (``torch.where``), so NaN padding of the
log-probs does not reach its loss; its seq-mean modes multiply by the mask (NaN · 0 = NaN), its
``gspo`` does so in the sequence mean, and NaN-padded advantages give it a NaN gradient. ``gapo``
and ``gapo_seq`` select every padded entry away (docs/design.md §2.9, docs/scale-out.md): loss,
gradient and every metric equal those of the same batch with finite padding, in every mode.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from test_verl import VERL_AGG_MODES, actor, assert_same, call, group_batch  # noqa: E402  (the verl tests' helpers)

from gapo.integrations.verl import GAPOPolicyLossConfig  # noqa: E402

BAD = (float("nan"), float("inf"), -float("inf"))


def _poison(x, mask, seed):
    """``x`` with every padded entry a random one of NaN, +inf, −inf."""
    g = torch.Generator().manual_seed(seed)
    bad = torch.tensor(BAD, dtype=x.dtype)[torch.randint(0, len(BAD), x.shape, generator=g)]
    return torch.where(mask.bool(), x, bad)


def _inputs(seed):
    """A verl batch (advantages from verl's estimator) with rollout-correction weights; padding finite."""
    old, logp, adv, mask, _ = group_batch(seed)
    g = torch.Generator().manual_seed(seed + 100)
    logp[:6, :3] += 1.5  # ratios past both clip bounds and the dual clip
    return dict(old=old, logp=logp, adv=adv, mask=mask, w=0.5 + torch.rand(logp.shape, generator=g))


def _call(name, x, cfg, agg):
    return call(name, x["old"], x["logp"], x["adv"], x["mask"], cfg, agg=agg, rollout_is_weights=x["w"])


def _assert_identical(a, b):
    """Loss, gradient and every metric the same, bit for bit; the gradient finite and 0 at padding."""
    assert torch.isfinite(a[0]) and torch.isfinite(a[1]).all()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[2] == b[2]


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
@pytest.mark.parametrize("name", ["gapo", "gapo_seq"])
def test_non_finite_padding_changes_nothing(name, agg):
    x = _inputs(4)
    cfg = actor(agg=agg, policy_loss=GAPOPolicyLossConfig(loss_mode=name, eps_high_max=0.28))
    ref = _call(name, x, cfg, agg)
    assert ref[2]["actor/pg_clipfrac"] > 0 and 0.2 < ref[2]["actor/gapo_eps_high_mean"] < 0.28
    for i, key in enumerate(("logp", "old", "adv", "w")):  # each input alone, then all at once
        bad = dict(x, **{key: _poison(x[key], x["mask"], seed=i)})
        _assert_identical(_call(name, bad, cfg, agg), ref)
    worst = {k: _poison(v, x["mask"], seed=9) if k != "mask" else v for k, v in x.items()}
    out = _call(name, worst, cfg, agg)
    _assert_identical(out, ref)
    assert (out[1][~x["mask"]] == 0).all()


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
def test_gapo_under_nan_padding_equals_vanilla(agg):
    # GAPO reduces to vanilla at eps_high_max = eps_low. With NaN/±inf padded log-probs it equals
    # vanilla on finite padding in every mode, and vanilla on the same padding where verl masks
    # with where (token-mean, token-sum; its seq-mean modes are NaN there).
    x = _inputs(5)
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.2)
    bad = dict(x, logp=_poison(x["logp"], x["mask"], 1), old=_poison(x["old"], x["mask"], 2))
    ours = _call("gapo", bad, actor(agg=agg, policy_loss=pl), agg)
    assert torch.isfinite(ours[0]) and torch.isfinite(ours[1]).all()
    assert_same(ours, _call("vanilla", x, actor(agg=agg), agg))
    vanilla_bad = _call("vanilla", bad, actor(agg=agg), agg)
    if agg in ("token-mean", "token-sum"):
        assert_same(ours, vanilla_bad)
    else:
        assert not torch.isfinite(vanilla_bad[0])  # verl's own limit, which gapo does not share


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
def test_gapo_seq_under_nan_padding_equals_gspo_on_finite_padding(agg):
    # verl's gspo is NaN under NaN padding in every mode (its sequence mean multiplies by the mask)
    old, logp, adv, mask, _ = group_batch(6, noise=0.02)
    pl = GAPOPolicyLossConfig(loss_mode="gapo_seq", eps_high_max=3e-3)
    cfg = actor(low=3e-3, high=3e-3, agg=agg, policy_loss=pl)
    ours = call("gapo_seq", _poison(old, mask, 1), _poison(logp, mask, 2), adv, mask, cfg)
    ref = call("gspo", old, logp, adv, mask, actor(low=3e-3, high=3e-3, agg=agg))
    assert_same(ours, ref)
    assert 0.1 < ref[2]["actor/pg_clipfrac"] < 0.9
