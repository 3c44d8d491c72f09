import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.advantages import compute
from gapo.core.clipping import gapo_eps_high
from gapo.core.losses import LOSSES, cispo_loss, policy_loss
from gapo.core.surrogate import ClipBounds, log_ratio, split_token_diagnostics


def _batch(B=8, T=6, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + scale * torch.randn(B, T, generator=g)).requires_grad_(True)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    mask[:, 0] = 1
    rewards = (torch.rand(B, generator=g) > 0.6).float()
    return logp, old, mask, rewards


def _hand_batch():
    # one token per rollout, eps_low = 0.2, eps_high = 0.28; ratios chosen by hand
    ratios = torch.tensor([1.5, 1.1, 0.5, 2.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    old = torch.zeros(4, 1)
    logp = torch.log(ratios).unsqueeze(-1).requires_grad_(True)
    return logp, old, adv, torch.ones(4, 1)


def test_token_loss_hand_computed():
    logp, old, adv, mask = _hand_batch()
    loss, m = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, 0.28))
    # row 0: A=+1, rho=1.5 > 1.28 -> max(-1.5, -1.28) = -1.28, clipped, no gradient
    # row 1: A=+1, rho=1.1 inside  -> -1.1, gradient -A*rho = -1.1
    # row 2: A=-1, rho=0.5 < 0.8   -> max(0.5, 0.8) = 0.8, clipped, no gradient
    # row 3: A=-1, rho=2.0         -> max(2.0, 1.28) = 2.0, unclipped, gradient -A*rho = 2.0
    # token-mean over 4 tokens: (-1.28 - 1.1 + 0.8 + 2.0) / 4 = 0.105
    assert loss.item() == pytest.approx(0.105, abs=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -1.1 / 4, 0.0, 2.0 / 4], abs=1e-6)
    assert m["loss/clipfrac"].item() == pytest.approx(0.5)
    assert m["loss/clipfrac_high"].item() == pytest.approx(0.25)
    assert m["loss/clipfrac_low"].item() == pytest.approx(0.25)
    # approx_kl = mean(-log rho) = -(log 1.5 + log 1.1 + log 0.5 + log 2) / 4
    assert m["loss/approx_kl"].item() == pytest.approx(-math.log(1.5 * 1.1 * 0.5 * 2.0) / 4, abs=1e-6)


def test_per_rollout_eps_high_unclips_only_that_rollout():
    logp, old, adv, mask = _hand_batch()
    # row 0 (rho = 1.5) gets eps_high 0.6: now inside the trust region, gradient -1.5/4
    eps = torch.tensor([0.6, 0.28, 0.28, 0.28])
    loss, m = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, eps))
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1.5 / 4, -1.1 / 4, 0.0, 2.0 / 4], abs=1e-6)
    assert m["loss/clipfrac_high"].item() == 0.0
    assert m["clip/eps_high_mean"].item() == pytest.approx((0.6 + 3 * 0.28) / 4)


def test_dual_clip_hand_computed():
    # A = -1, rho = 4: max(4, -(-1)*1.28) = 4 > c = 3 -> loss 3, no gradient
    logp = torch.log(torch.tensor([[4.0], [2.0]])).requires_grad_(True)
    adv = torch.tensor([-1.0, -1.0])
    loss, m = policy_loss(
        logp, torch.zeros(2, 1), adv, torch.ones(2, 1), bounds=ClipBounds(0.2, 0.28, clip_ratio_c=3.0)
    )
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, 2.0 / 2])
    assert m["loss/clipfrac_dual"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gapo_with_equal_endpoints_equals_fixed_exactly(level, agg):
    logp, old, mask, rewards = _batch(scale=0.4)
    eps_low = 0.2 if level == "token" else 3e-3
    adv = compute("drgrpo", rewards, 4)
    eps = gapo_eps_high(rewards, 4, eps_low=eps_low, eps_high_max=eps_low)
    l_fixed, m_fixed = policy_loss(logp, old, adv, mask, bounds=ClipBounds(eps_low, eps_low), level=level, agg=agg)
    (g_fixed,) = torch.autograd.grad(l_fixed, logp)
    l_gapo, m_gapo = policy_loss(logp, old, adv, mask, bounds=ClipBounds(eps_low, eps), level=level, agg=agg)
    (g_gapo,) = torch.autograd.grad(l_gapo, logp)
    assert torch.equal(l_fixed, l_gapo)
    assert torch.equal(g_fixed, g_gapo)
    assert m_fixed.keys() == m_gapo.keys()
    for k in m_fixed:
        assert torch.allclose(torch.as_tensor(m_fixed[k]).float(), torch.as_tensor(m_gapo[k]).float(), atol=1e-7), k


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_masked_tokens_change_neither_loss_nor_gradient(name):
    logp, old, mask, rewards = _batch()
    adv = compute("drgrpo", rewards, 4)
    kw = dict(bounds=ClipBounds(0.2, gapo_eps_high(rewards, 4, eps_low=0.2, eps_high_max=0.28)))
    loss, _ = LOSSES[name](logp, old, adv, mask, **kw)
    (g,) = torch.autograd.grad(loss, logp)
    # scramble everything under the mask (including huge values)
    noise = torch.where(mask.bool(), torch.zeros_like(old), 50 * torch.randn_like(old))
    logp2 = (logp.detach() + noise).requires_grad_(True)
    old2 = old + torch.where(mask.bool(), torch.zeros_like(old), 30 * torch.randn_like(old))
    loss2, _ = LOSSES[name](logp2, old2, adv, mask, **kw)
    (g2,) = torch.autograd.grad(loss2, logp2)
    assert torch.allclose(loss, loss2, atol=1e-6)
    assert torch.allclose(g, g2, atol=1e-6)
    assert (g2[~mask.bool()] == 0).all()


def test_gradient_vanishes_exactly_where_clip_binds():
    logp, old, mask, rewards = _batch(B=16, T=8, scale=0.5)
    adv = torch.randn(16)
    loss, _ = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, 0.28))
    (g,) = torch.autograd.grad(loss, logp)
    ratio = torch.exp(logp.detach() - old)
    binds = ((adv[:, None] > 0) & (ratio > 1.28)) | ((adv[:, None] < 0) & (ratio < 0.8))
    m = mask.bool()
    assert binds[m].any() and (~binds[m]).any()  # the batch exercises both cases
    assert (g[binds & m] == 0).all()
    # elsewhere: dL/dlogp = -A * rho / N exactly
    expected = -adv[:, None] * ratio / mask.sum()
    free = ~binds & m & (adv[:, None] != 0)
    assert torch.allclose(g[free], expected[free], rtol=1e-5)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_extreme_log_ratios_are_finite(name):
    logp = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, 5.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    loss, metrics = LOSSES[name](logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 3), bounds=ClipBounds(0.2, 0.28))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())


def test_sequence_ratio_is_exp_of_masked_mean_log_ratio():
    logp, old, mask, _ = _batch()
    lr = log_ratio(logp, old, mask, "sequence")
    expected = ((logp.detach() - old) * mask).sum(-1) / mask.sum(-1)
    # every token of a rollout carries the same value s_i ...
    assert torch.allclose(lr.detach(), expected[:, None].expand_as(lr), atol=1e-6)
    # ... and the gradient flows per token: d log s[i,t] / d logp[i,t] = 1 (GSPO-token), 0 at padding
    (g,) = torch.autograd.grad(lr.sum(), logp)
    assert torch.equal(g, mask)


def test_gspo_gradient_matches_closed_form():
    # unclipped GSPO-token with token-mean: dL/dlogp[i,t] = -A_i * s_i / N
    logp, old, mask, _ = _batch(scale=1e-3)
    adv = torch.randn(logp.shape[0])
    loss, m = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.5, 0.5), level="sequence")
    (g,) = torch.autograd.grad(loss, logp)
    s = torch.exp(((logp.detach() - old) * mask).sum(-1) / mask.sum(-1))
    expected = (-adv * s)[:, None] * mask / mask.sum()
    assert torch.allclose(g, expected, atol=1e-7)
    assert m["loss/clipfrac"].item() == 0.0


def test_cispo_keeps_gradient_of_clipped_tokens():
    logp, old, adv, mask = _hand_batch()
    loss, _ = cispo_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, 0.28))
    loss.backward()
    # dL/dlogp = -A * sg(clip(rho)) / N: clip(1.5)=1.28, 1.1, clip(0.5)=0.8, clip(2.0)=1.28
    assert logp.grad.flatten().tolist() == pytest.approx([-1.28 / 4, -1.1 / 4, 0.8 / 4, 1.28 / 4], abs=1e-6)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_has_one_signature(name):
    logp, old, mask, rewards = _batch()
    adv = compute("drgrpo", rewards, 4)
    loss, metrics = LOSSES[name](
        logp,
        old,
        adv,
        mask,
        bounds=ClipBounds(0.2, 0.28, clip_ratio_c=None),
        agg="token-mean",
    )
    assert loss.ndim == 0 and loss.requires_grad
    metrics, tokens = split_token_diagnostics(metrics)
    assert tokens["token/clipped"].dtype == torch.bool and tokens["token/clipped"].shape == logp.shape
    assert tokens["token/gate"].shape == logp.shape and not tokens["token/gate"].requires_grad
    assert not tokens["token/clipped"][mask == 0].any() and (tokens["token/gate"][mask == 0] == 0).all()
    for key, value in metrics.items():
        assert "/" in key
        assert isinstance(value, float) or (
            isinstance(value, torch.Tensor) and value.ndim == 0 and not value.requires_grad
        )
    for key in ("loss/clipfrac", "loss/clipfrac_high", "loss/clipfrac_low", "loss/approx_kl", "clip/eps_high_mean"):
        assert key in metrics


def test_token_level_advantages_accepted():
    logp, old, mask, rewards = _batch()
    adv = compute("drgrpo", rewards, 4)
    l1, _ = policy_loss(logp, old, adv, mask, bounds=ClipBounds(0.2, 0.28))
    l2, _ = policy_loss(logp, old, adv[:, None].expand_as(logp), mask, bounds=ClipBounds(0.2, 0.28))
    assert torch.allclose(l1, l2)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: a | dict(old_logp=torch.zeros(3, 3)), "shape mismatch"),
        (lambda a: a | dict(advantages=torch.zeros(5)), "advantages must have shape"),
        (lambda a: a | dict(advantages=torch.tensor([float("nan")] * 8)), "NaN"),
        (lambda a: a | dict(eps_high=torch.zeros(3)), "eps_high has 3 rows"),
        (lambda a: a | dict(level="segment"), "ratio level 'segment'"),
        (lambda a: a | dict(agg="token-avg"), "aggregation mode"),
        (lambda a: a | dict(clip_ratio_c=0.5), "clip_ratio_c"),
        (lambda a: a | dict(eps_low=1.5), "eps_low"),
    ],
)
def test_bad_input_is_a_clear_error(mutate, match):
    logp, old, mask, rewards = _batch()
    args = dict(logp=logp, old_logp=old, advantages=torch.zeros(8), response_mask=mask, eps_low=0.2, eps_high=0.28)
    args = mutate(args)
    with pytest.raises(ValueError, match=match):
        bounds = ClipBounds(args.pop("eps_low"), args.pop("eps_high"), args.pop("clip_ratio_c", None))
        policy_loss(
            args.pop("logp"), args.pop("old_logp"), args.pop("advantages"), args.pop("response_mask"), bounds, **args
        )


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    eps_low=st.floats(0.05, 0.4),
    extra=st.floats(0.0, 0.4),
    level=st.sampled_from(["token", "sequence"]),
)
def test_property_wider_upper_bound_never_lowers_positive_token_objective(seed, eps_low, extra, level):
    # for A > 0 the surrogate -L = min(A rho, A clip(rho)) is non-decreasing in eps_high
    logp, old, mask, _ = _batch(seed=seed, scale=0.5)
    adv = torch.rand(logp.shape[0]) + 0.1
    l_narrow, _ = policy_loss(logp, old, adv, mask, bounds=ClipBounds(eps_low, eps_low), level=level)
    l_wide, _ = policy_loss(logp, old, adv, mask, bounds=ClipBounds(eps_low, eps_low + extra), level=level)
    assert l_wide.item() <= l_narrow.item() + 1e-6
