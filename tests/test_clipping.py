import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.clipping import EPS_SCHEDULES, eps_high_for, gapo_eps_high, success_weight


def test_binary_group_hand_computed():
    # G = 4. Group 1: c = 1 -> mean 0.25; correct rollout centred = 0.75; (G-1)/G = 0.75 -> w = 1.
    # Group 2: c = 4 -> all centred 0 -> w = 0. Group 3: c = 2 -> centred 0.5 -> w = 0.5/0.75 = 2/3.
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    w = success_weight(r, 4)
    assert w.tolist() == pytest.approx([1, 0, 0, 0, 0, 0, 0, 0, 2 / 3, 2 / 3, 0, 0])
    eps = gapo_eps_high(r, 4, eps_low=0.2, eps_high_max=0.28)
    # lone correct rollout -> eps_high_max; all-correct group -> eps_low; incorrect -> eps_low;
    # c = 2: 0.2 + 0.08 * 2/3 = 0.253333...
    expected = [0.28, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2 + 0.08 * 2 / 3, 0.2 + 0.08 * 2 / 3, 0.2, 0.2]
    assert eps.tolist() == pytest.approx(expected, abs=1e-7)


def test_correct_rollout_weight_is_g_minus_c_over_g_minus_1():
    G = 8
    for c in range(1, G + 1):
        r = torch.tensor([1.0] * c + [0.0] * (G - c))
        assert success_weight(r, G)[0].item() == pytest.approx((G - c) / (G - 1))


def test_log_schedule_hand_computed():
    # w = 2/3: log(1.2) + 2/3 (log 1.28 - log 1.2) -> 1.2 * (1.28/1.2)^(2/3) - 1
    r = torch.tensor([1.0, 1, 0, 0])
    eps = gapo_eps_high(r, 4, eps_low=0.2, eps_high_max=0.28, schedule="log")
    assert eps[0].item() == pytest.approx(1.2 * (1.28 / 1.2) ** (2 / 3) - 1, rel=1e-6)


def test_non_binary_rewards_and_reward_range():
    # rewards in [-1, 1]: span 2. Group (1, -1): mean 0, centred 1, (G-1)/G * 2 = 1 -> w = 1.
    r = torch.tensor([1.0, -1.0])
    assert success_weight(r, 2, reward_range=(-1, 1)).tolist() == [1.0, 0.0]
    # partial credit 0.5 among zeros (G = 2): centred 0.25, denominator 0.5 -> w = 0.5
    assert success_weight(torch.tensor([0.5, 0.0]), 2).tolist() == [0.5, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16).filter(lambda x: len(x) % 2 == 0),
    eps_low=st.floats(0.0, 0.5),
    extra=st.floats(0.0, 0.5),
)
def test_schedules_agree_at_endpoints_and_log_below_linear(rewards, eps_low, extra):
    r = torch.tensor(rewards)
    lin = gapo_eps_high(r, 2, eps_low=eps_low, eps_high_max=eps_low + extra)
    log = gapo_eps_high(r, 2, eps_low=eps_low, eps_high_max=eps_low + extra, schedule="log")
    w = success_weight(r, 2)
    ends = (w == 0) | (w == 1)
    assert torch.allclose(lin[ends], log[ends], atol=1e-6)
    # geometric interpolation of (1+eps) lies below the arithmetic one (weighted AM-GM)
    assert (log <= lin + 1e-6).all()
    assert (lin >= eps_low - 1e-6).all() and (lin <= eps_low + extra + 1e-6).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.integers(1, 4), st.data())
def test_weight_monotone_in_group_success(G, P, data):
    # a correct rollout's headroom never grows when its group gets more successes
    ws = [success_weight(torch.tensor([1.0] * c + [0.0] * (G - c)), G)[0].item() for c in range(1, G + 1)]
    assert all(a >= b for a, b in zip(ws, ws[1:]))


def test_equal_endpoints_is_fixed():
    r = torch.tensor([1.0, 0, 1, 1])
    for schedule in ("linear", "log"):
        eps = gapo_eps_high(r, 2, eps_low=0.2, eps_high_max=0.2, schedule=schedule)
        assert torch.allclose(eps, torch.full((4,), 0.2), atol=1e-7)


@pytest.mark.parametrize("name", sorted(EPS_SCHEDULES))
def test_every_schedule_has_one_signature(name):
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = eps_high_for(name, r, 4, eps_low=0.2, eps_high=0.28, reward_range=(0.0, 1.0))
    assert out.shape == (4,)
    assert math.isclose(out[0].item(), 0.28, rel_tol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rewards=torch.tensor([1.0, 0.0, 1.0]), group_size=2), "not divisible by group_size"),
        (dict(rewards=torch.tensor([1.0, float("nan")]), group_size=2), "NaN/inf"),
        (dict(rewards=torch.tensor([1.0, float("inf")]), group_size=2), "NaN/inf"),
        (dict(rewards=torch.tensor([[1.0, 0.0]]), group_size=2), r"shape \(B,\)"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=1), "group_size"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, eps_high_max=0.1), "eps_high_max"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, schedule="cubic"), "schedule 'cubic'"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, reward_range=(1, 1)), "reward_range"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(eps_low=0.2, eps_high_max=0.28) | kwargs
    with pytest.raises(ValueError, match=match):
        gapo_eps_high(args.pop("rewards"), args.pop("group_size"), **args)


def test_unknown_schedule_suggests_close_match():
    with pytest.raises(ValueError, match="Did you mean 'linear'"):
        eps_high_for("lineer", torch.tensor([1.0, 0.0]), 2, eps_low=0.2, eps_high=0.28)
