import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.clipping import EPS_SCHEDULES, eps_high_for, gapo_eps_high, success_weight


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
    eps = gapo_eps_high(r, 4, eps_low=0.2, eps_high_max=0.28, eps_schedule="log")
    assert eps[0].item() == pytest.approx(1.2 * (1.28 / 1.2) ** (2 / 3) - 1, rel=1e-6)


def test_non_binary_rewards_and_reward_range():
    # rewards in [-1, 1]: span 2. Group (1, -1): mean 0, centred 1, (G-1)/G * 2 = 1 -> w = 1.
    r = torch.tensor([1.0, -1.0])
    assert success_weight(r, 2, reward_range=(-1, 1)).tolist() == [1.0, 0.0]
    # partial credit 0.5 among zeros (G = 2): centred 0.25, denominator 0.5 -> w = 0.5
    assert success_weight(torch.tensor([0.5, 0.0]), 2).tolist() == [0.5, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    G=st.integers(3, 16),
    data=st.data(),
    eps_low=st.floats(0.0, 0.5),
    extra=st.floats(0.01, 0.5),
)
def test_schedules_agree_at_endpoints_and_log_below_linear(G, data, eps_low, extra):
    # Groups of G >= 3 with 1 <= c <= G-1 successes: for c >= 2 the correct rollouts have 0 < w < 1, the
    # interior, where the two schedules differ and AM-GM says log < linear strictly.
    c = data.draw(st.integers(1, G - 1), label="c")
    r = torch.tensor([1.0] * c + [0.0] * (G - c))
    lin = gapo_eps_high(r, G, eps_low=eps_low, eps_high_max=eps_low + extra)
    log = gapo_eps_high(r, G, eps_low=eps_low, eps_high_max=eps_low + extra, eps_schedule="log")
    w = success_weight(r, G)
    ends = (w < 1e-6) | (w > 1 - 1e-6)  # w = 1 may come out as 1 - 2^-24 in float32
    assert torch.allclose(lin[ends], log[ends], atol=1e-6)
    # geometric interpolation of (1+eps) lies below the arithmetic one (weighted AM-GM)
    assert (log <= lin + 1e-6).all()
    inner = ~ends
    assert bool(inner.any()) == (c >= 2)  # the correct rollouts of a group with c >= 2 have 0 < w < 1
    # strictly below inside: (1-w)e^a + w e^b - e^(a + w(b-a)) >= e^a (b-a)^2/2 · w(1-w) (Taylor, all
    # terms positive); asserted with a factor 4 of margin for float32
    a, b = math.log1p(eps_low), math.log1p(eps_low + extra)
    gap = (lin - log)[inner]
    wi = w[inner].double()
    bound = wi * (1 - wi) * math.exp(a) * (b - a) ** 2 / 2
    assert (gap.double() >= 0.25 * bound - 1e-7).all()
    assert (lin >= eps_low - 1e-6).all() and (lin <= eps_low + extra + 1e-6).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 16))
def test_weight_monotone_in_group_success(G):
    # a correct rollout's headroom never grows when its group gets more successes
    ws = [success_weight(torch.tensor([1.0] * c + [0.0] * (G - c)), G)[0].item() for c in range(1, G + 1)]
    assert all(a > b for a, b in zip(ws, ws[1:]))


def test_equal_endpoints_is_fixed():
    r = torch.tensor([1.0, 0, 1, 1])
    for schedule in ("linear", "log"):
        eps = gapo_eps_high(r, 2, eps_low=0.2, eps_high_max=0.2, eps_schedule=schedule)
        assert torch.allclose(eps, torch.full((4,), 0.2), atol=1e-7)


@pytest.mark.parametrize("name", sorted(EPS_SCHEDULES))
def test_every_schedule_has_one_signature(name):
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = eps_high_for(name, r, 4, eps_low=0.2, eps_high_max=0.28, reward_range=(0.0, 1.0))
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
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, eps_low=-0.1), "eps_low must be finite and >= 0"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, eps_low=float("nan")), "eps_low must be finite"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, eps_high_max=float("nan")), "eps_high_max"),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, eps_schedule="cubic"), "eps_schedule .cubic."),
        (dict(rewards=torch.tensor([1.0, 0.0]), group_size=2, reward_range=(1, 1)), "reward_range"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(eps_low=0.2, eps_high_max=0.28) | kwargs
    with pytest.raises(ValueError, match=match):
        gapo_eps_high(args.pop("rewards"), args.pop("group_size"), **args)


@pytest.mark.parametrize("schedule", ["linear", "log"])
def test_schedule_takes_widths_of_one_or_more_as_caps(schedule):
    # TRL's cispo uses 1 + ε only as an IS-weight cap (no 1 − ε_low bound): ε_low = 4 is its cap 5
    eps = gapo_eps_high(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps_low=4.0, eps_high_max=6.0, eps_schedule=schedule)
    assert eps.tolist() == pytest.approx([6.0, 4.0, 4.0, 4.0])


def test_unknown_schedule_suggests_close_match():
    with pytest.raises(ValueError, match="Did you mean 'linear'"):
        eps_high_for("lineer", torch.tensor([1.0, 0.0]), 2, eps_low=0.2, eps_high_max=0.28)


# --- reward_range = "group" / "batch" -------------------------------------------------------------
def _reference_weight(r, G, lo, hi, dtype=torch.float32):
    """The fixed-range formula written out: clamp((R − mean) · G/((G−1)(hi − lo)), 0, 1); in float64
    against a group's own range (float32 loses a range as small as a subnormal's, which hypothesis finds)."""
    g = r.view(-1, G).to(dtype)
    return (g - g.mean(1, keepdim=True)).mul_(G / ((G - 1) * (hi - lo))).clamp_(0, 1).view(-1).float()


def test_group_range_survives_a_subnormal_range():
    # found by hypothesis: a group whose only spread is a float32 subnormal still gives its lone
    # best rollout w = 1 (and three tied best rollouts 1/3 each), as any other range would
    tiny = 4.203895392974451e-45
    w = success_weight(torch.tensor([0.0, 0.0, 0.0, tiny, 0.0, 0.0, 0.0, -tiny]), 4, reward_range="group")
    torch.testing.assert_close(w, torch.tensor([0, 0, 0, 1, 1 / 3, 1 / 3, 1 / 3, 0]))


def test_group_range_hand_computed():
    # G = 4, "group": each group's own R_min, R_max.
    #   [5, 3, 3, 3]: mean 3.5, span 2; best: 1.5 · (4/3) / 2 = 1 → the lone best rollout gets ε_high_max
    #   [7, 6, 5, 3]: mean 5.25, span 4; 7: 1.75 · (4/3)/4 = 7/12; 6: 0.75 · (4/3)/4 = 1/4; 5, 3 below mean → 0
    #   [2, 2, 2, 2]: no spread → w = 0 (no NaN)
    r = torch.tensor([5.0, 3, 3, 3, 7, 6, 5, 3, 2, 2, 2, 2])
    w = success_weight(r, 4, reward_range="group")
    assert w.tolist() == pytest.approx([1, 0, 0, 0, 7 / 12, 1 / 4, 0, 0, 0, 0, 0, 0], abs=1e-6)
    eps = gapo_eps_high(r, 4, eps_low=0.2, eps_high_max=0.28, reward_range="group")
    assert eps.tolist() == pytest.approx([0.28, 0.2, 0.2, 0.2, 0.2 + 0.08 * 7 / 12, 0.22] + [0.2] * 6, abs=1e-6)


def test_batch_range_hand_computed():
    # same rewards, "batch": R_min = 2, R_max = 7 over the whole batch, span 5.
    #   [5, 3, 3, 3]: 1.5 · (4/3) / 5 = 0.4;  [7, 6, 5, 3]: 7 → 1.75 · (4/3)/5 = 7/15, 6 → 0.75 · (4/3)/5 = 0.2
    r = torch.tensor([5.0, 3, 3, 3, 7, 6, 5, 3, 2, 2, 2, 2])
    w = success_weight(r, 4, reward_range="batch")
    assert w.tolist() == pytest.approx([0.4, 0, 0, 0, 7 / 15, 0.2, 0, 0, 0, 0, 0, 0], abs=1e-6)
    # a constant batch has no range: w = 0 everywhere, ε_low
    assert success_weight(torch.full((4,), 3.0), 2, reward_range="batch").tolist() == [0.0] * 4
    eps = eps_high_for("log", torch.full((4,), 3.0), 2, eps_low=0.2, eps_high_max=0.28, reward_range="batch")
    assert torch.allclose(eps, torch.full((4,), 0.2))


def test_default_tuple_range_is_the_fixed_formula_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(64, generator=g)
    assert torch.equal(success_weight(r, 8), _reference_weight(r, 8, 0.0, 1.0))
    assert torch.equal(success_weight(r * 2 - 1, 8, reward_range=(-1, 1)), _reference_weight(r * 2 - 1, 8, -1.0, 1.0))


@settings(max_examples=150, deadline=None)
@given(rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=24).filter(lambda x: len(x) % 4 == 0))
def test_binary_rewards_group_and_batch_equal_unit_range(rewards):
    # 0/1 rewards: a mixed group spans [0, 1]; a constant group has w = 0 under every range.
    # "batch" spans [0, 1] unless the batch is constant (then every group is, and w = 0 anyway).
    r = torch.tensor(rewards)
    ref = success_weight(r, 4)
    assert torch.equal(success_weight(r, 4, reward_range="group"), ref)
    assert torch.equal(success_weight(r, 4, reward_range="batch"), ref)


@settings(max_examples=150, deadline=None)
@given(
    rewards=st.lists(st.floats(-10, 10, width=32), min_size=8, max_size=8),
    scale=st.lists(st.floats(0.1, 10), min_size=2, max_size=2),
    shift=st.lists(st.floats(-50, 50), min_size=2, max_size=2),
)
def test_group_range_is_per_group_min_max_and_affine_invariant(rewards, scale, shift):
    r = torch.tensor(rewards)
    w = success_weight(r, 4, reward_range="group")
    assert torch.isfinite(w).all() and ((w >= 0) & (w <= 1)).all()
    # equals the fixed-range formula with each group's own (min, max)
    for p in range(2):
        grp = r[4 * p : 4 * p + 4]
        if grp.max() > grp.min():
            torch.testing.assert_close(
                w[4 * p : 4 * p + 4],
                _reference_weight(grp, 4, grp.min().item(), grp.max().item(), torch.float64),
                rtol=1e-4,
                atol=1e-5,
            )
        else:
            assert (w[4 * p : 4 * p + 4] == 0).all()
    # a positive affine map of each group's rewards leaves w unchanged (up to float32 rounding)
    a = torch.tensor(scale).repeat_interleave(4)
    b = torch.tensor(shift).repeat_interleave(4)
    moved = (r.double() * a + b).float()
    spread_ok = all((r[4 * p : 4 * p + 4].max() - r[4 * p : 4 * p + 4].min()).item() > 1e-2 for p in range(2))
    if spread_ok:
        torch.testing.assert_close(success_weight(moved, 4, reward_range="group"), w, rtol=0, atol=2e-3)


@settings(max_examples=100, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10, width=32), min_size=8, max_size=8))
def test_batch_range_is_the_tuple_of_the_batch_min_max(rewards):
    r = torch.tensor(rewards)
    w = success_weight(r, 4, reward_range="batch")
    assert torch.isfinite(w).all(), w
    if (r.max() - r.min()).item() >= torch.finfo(torch.float32).tiny:  # a fixed range that narrow is refused
        ref = success_weight(r, 4, reward_range=(r.min().item(), r.max().item()))
        torch.testing.assert_close(w, ref, rtol=1e-5, atol=1e-6)
    elif r.max() == r.min():
        assert (w == 0).all()


def test_a_fixed_range_narrower_than_float32_resolves_is_an_error():
    # found by the test above: (0, 1e-39) gave NaN weights (1 / width overflows float32)
    with pytest.raises(ValueError, match="width R_max - R_min must be at least 1.18e-38"):
        success_weight(torch.tensor([0.0, 0, 0, 1e-39]), 4, reward_range=(0.0, 1e-39))


@pytest.mark.parametrize("name", sorted(EPS_SCHEDULES))
@pytest.mark.parametrize("rr", ["group", "batch"])
def test_every_schedule_takes_a_string_range(name, rr):
    # 10 points for the lone best of [10, 0, 0, 0]: w = 1 under both ("batch" spans 0..10 here)
    out = eps_high_for(name, torch.tensor([10.0, 0.0, 0.0, 0.0]), 4, eps_low=0.2, eps_high_max=0.28, reward_range=rr)
    assert out[0].item() == pytest.approx(0.28)
    assert torch.allclose(out[1:], torch.tensor(0.2 if name != "fixed" else 0.28))


@pytest.mark.parametrize(
    "bad, match",
    [
        ("grup", "Did you mean 'group'"),
        ("minmax", "one of"),
        ((0, 1, 2), "R_min"),
        ((0, float("inf")), "R_max > R_min"),
        (None, "R_min"),
    ],
)
def test_bad_reward_range_is_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        success_weight(torch.tensor([1.0, 0.0]), 2, reward_range=bad)
    with pytest.raises(ValueError, match=match):
        eps_high_for("fixed", torch.tensor([1.0, 0.0]), 2, eps_low=0.2, eps_high_max=0.2, reward_range=bad)
