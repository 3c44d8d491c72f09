"""``ClipBounds``: the loss's clip bounds as one object, its only form (0.3 dropped the keywords).

Expected values are computed by hand from the surrogate's definition (one token per rollout, the
ratios chosen so that every branch is taken), never by calling the loss a second time only.
"""

import dataclasses
import math

import pytest
import torch

from gapo.core.aggregation import AggNorms
from gapo.core.losses import LOSSES, cispo_loss, policy_loss
from gapo.core.surrogate import ClipBounds


def _hand_batch():
    # ratios 1.5 (A=+1, above 1.28: clipped), 1.1 (A=+1, inside), 0.5 (A=-1, below 0.8: clipped),
    # 2.0 (A=-1, above 1.28: unclipped, the dual clip's case)
    ratios = torch.tensor([1.5, 1.1, 0.5, 2.0])
    logp = torch.log(ratios).unsqueeze(-1).requires_grad_(True)
    return logp, torch.zeros(4, 1), torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.ones(4, 1)


# token-mean of max(-A·ρ, -A·clip(ρ, 0.8, 1.28)) = (-1.28 - 1.1 + 0.8 + 2.0) / 4
PPO = 0.105
# dual clip c = 1.5: row 3 (A=-1) is capped at -A·c = 1.5 -> (-1.28 - 1.1 + 0.8 + 1.5) / 4
PPO_DUAL = -0.02
# CISPO: -sg(clip(ρ, 0.8, 1.28))·A·logp = -(1.28·log 1.5) - 1.1·log 1.1 + 0.8·log 0.5 + 1.28·log 2
CISPO = (-1.28 * math.log(1.5) - 1.1 * math.log(1.1) + 0.8 * math.log(0.5) + 1.28 * math.log(2.0)) / 4


@pytest.mark.parametrize(
    "bounds, expected",
    [(ClipBounds(0.2, 0.28), PPO), (ClipBounds(0.2, 0.28, clip_ratio_c=1.5), PPO_DUAL)],
)
def test_bounds_give_the_hand_computed_loss(bounds, expected):
    for call in (
        lambda lp, o, a, m: policy_loss(lp, o, a, m, bounds),
        lambda lp, o, a, m: policy_loss(lp, o, a, m, bounds=bounds),
        lambda lp, o, a, m: LOSSES["ppo"](lp, o, a, m, bounds, agg="token-mean"),
    ):
        logp, old, adv, mask = _hand_batch()
        loss, m = call(logp, old, adv, mask)
        assert loss.item() == pytest.approx(expected, abs=1e-6)
        loss.backward()
        # gradient -A·ρ/4 on the unclipped rows only (row 3 is the dual clip's when c is set)
        row3 = 0.0 if bounds.clip_ratio_c else 2.0 / 4
        assert logp.grad.flatten().tolist() == pytest.approx([0.0, -1.1 / 4, 0.0, row3], abs=1e-6)
        assert m["loss/clipfrac_dual"].item() == (0.25 if bounds.clip_ratio_c else 0.0)


def test_per_rollout_eps_high_in_the_bounds_unclips_that_rollout():
    logp, old, adv, mask = _hand_batch()
    eps = torch.tensor([0.6, 0.28, 0.28, 0.28])  # row 0 (ρ = 1.5) now inside its trust region
    loss, m = policy_loss(logp, old, adv, mask, ClipBounds(0.2, eps))
    assert loss.item() == pytest.approx((-1.5 - 1.1 + 0.8 + 2.0) / 4, abs=1e-6)
    assert m["clip/eps_high_mean"].item() == pytest.approx((0.6 + 3 * 0.28) / 4)


def test_cispo_takes_the_same_bounds():
    for call in (
        lambda lp, o, a, m: cispo_loss(lp, o, a, m, ClipBounds(0.2, 0.28)),
        lambda lp, o, a, m: LOSSES["cispo"](lp, o, a, m, ClipBounds(0.2, 0.28), agg="token-mean"),
    ):
        loss, _ = call(*_hand_batch())
        assert loss.item() == pytest.approx(CISPO, abs=1e-6)
    with pytest.raises(ValueError, match="CISPO"):
        cispo_loss(*_hand_batch(), ClipBounds(0.2, 0.28, clip_ratio_c=3.0))


def test_aggregation_normalisers_pass_beside_the_bounds():
    # token-mean normalised by a whole mini-batch of 8 tokens (micro-batching): the sum over 4 / 8
    loss, _ = policy_loss(*_hand_batch(), ClipBounds(0.2, 0.28), norms=AggNorms(num_tokens=8.0))
    assert loss.item() == pytest.approx(PPO * 4 / 8, abs=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(eps_low=-0.1, eps_high=0.2), "eps_low"),
        (dict(eps_low=1.0, eps_high=0.2), "eps_low"),
        (dict(eps_low=0.2, eps_high=-0.01), "eps_high"),
        (dict(eps_low=0.2, eps_high=float("nan")), "eps_high"),
        (dict(eps_low=0.2, eps_high=torch.tensor([0.2, float("inf")])), "eps_high"),
        (dict(eps_low=0.2, eps_high=torch.tensor([0.2, -0.1])), "eps_high"),
        (dict(eps_low=0.2, eps_high=0.28, clip_ratio_c=1.0), "clip_ratio_c"),
        (dict(eps_low=0.2, eps_high=0.28, clip_ratio_c=float("nan")), "clip_ratio_c"),
    ],
)
def test_bad_bounds_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ClipBounds(**kwargs)


def test_bounds_are_frozen():
    b = ClipBounds(0.2, 0.28)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.eps_high = 0.5


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda *a: policy_loss(*a), "bounds"),
        (lambda *a: policy_loss(*a, None), "ClipBounds.*got none"),
        (lambda *a: policy_loss(*a, (0.2, 0.28)), "ClipBounds.*got tuple"),
        (lambda *a: cispo_loss(*a, (0.2, 0.28)), "ClipBounds.*got tuple"),
        (lambda *a: policy_loss(*a, ClipBounds(0.2, 0.28), num_token=4), "num_token"),
        # 0.2's keyword form is gone: the keywords are errors, never a second spelling of bounds=
        (lambda *a: policy_loss(*a, eps_low=0.2, eps_high=0.28), "eps_low"),
        (lambda *a: cispo_loss(*a, eps_low=0.2, eps_high=0.28), "bounds"),
        (lambda *a: policy_loss(*a, ClipBounds(0.2, 0.28), eps_high=0.3), "eps_high"),
        # 0.3's loose normaliser keywords are gone: one spelling, norms=AggNorms(...)
        (lambda *a: policy_loss(*a, ClipBounds(0.2, 0.28), num_tokens=8.0), "num_tokens"),
        (lambda *a: cispo_loss(*a, ClipBounds(0.2, 0.28), num_seqs=2), "num_seqs"),
        (lambda *a: LOSSES["gspo"](*a, ClipBounds(0.2, 0.28), horizon=3), "horizon"),
        (lambda *a: LOSSES["ppo"](*a, ClipBounds(0.2, 0.28), level="sequence"), "level"),
        (lambda *a: policy_loss(*a, ClipBounds(0.2, 0.28), norms={"num_tokens": 8.0}), "AggNorms"),
    ],
)
def test_a_wrong_call_form_is_a_type_error_naming_it(call, match):
    with pytest.raises(TypeError, match=match):
        call(*_hand_batch())
