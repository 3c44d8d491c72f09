import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.metrics import (
    RATIO_ADV_WINDOW,
    clip_counts_by_c,
    clip_stats_by_c,
    clip_stats_from_counts,
    counts_from_tensor,
    counts_to_tensor,
    entropy_from_logits,
    first_move_entropy,
    merge_counts,
    pass_at_k,
    pass_at_k_curve,
    pearson,
    ratio_adv_corr,
    ratio_adv_pairs,
)


def _brute(n, n_correct, k):
    samples = [1] * n_correct + [0] * (n - n_correct)
    subsets = list(itertools.combinations(samples, k))
    return sum(max(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_for_small_n():
    for n in range(1, 9):
        for n_correct in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, n_correct, k) == pytest.approx(_brute(n, n_correct, k), abs=1e-12), (
                    n,
                    n_correct,
                    k,
                )


def test_pass_at_k_hand_and_stable():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    # large n: no overflow, matches the closed form via lgamma
    n, n_correct, k = 10_000, 7, 256
    exact = 1 - math.exp(
        math.lgamma(n - n_correct + 1)
        - math.lgamma(n - n_correct - k + 1)
        - math.lgamma(n + 1)
        + math.lgamma(n - k + 1)
    )
    assert pass_at_k(n, n_correct, k) == pytest.approx(exact, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_a_monotone_probability(args):
    n, n_correct, k = args
    p = pass_at_k(n, n_correct, k)
    assert 0.0 <= p <= 1.0
    if k < n:
        assert pass_at_k(n, n_correct, k + 1) >= p - 1e-12
    assert (p == 0.0) == (n_correct == 0)


@pytest.mark.parametrize("n, n_correct, k", [(4, 5, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1), (4.5, 1, 1)])
def test_pass_at_k_bad_input(n, n_correct, k):
    with pytest.raises(ValueError):
        pass_at_k(n, n_correct, k)


def test_counts_are_named_apart():
    # a problem's correct samples are n_correct; c is only the group success count
    assert pass_at_k(n=4, n_correct=1, k=2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="n_correct <= n, got n=4, n_correct=5"):
        pass_at_k(4, 5, 1)
    ratio, adv = torch.tensor([[1.5], [1.0]]), torch.tensor([1.0, -1.0])
    counts = clip_counts_by_c(ratio, adv, torch.ones(2, 1), c=torch.tensor([1, 1]), eps_low=0.2, eps_high=0.28)
    assert list(counts) == [1] and counts[1]["pos_clipped"] == 1.0  # 1.5 > 1.28


def test_pass_at_k_curve():
    curve = pass_at_k_curve(4, [0, 1, 4])
    assert list(curve) == [1, 2, 4]
    assert curve[1] == pytest.approx((0 + 0.25 + 1) / 3)
    assert curve[4] == pytest.approx(2 / 3)


def test_entropy_from_logits():
    # uniform over 4 -> log 4; one-hot-ish -> ~0
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(3, 5, 7)
    p = torch.softmax(logits, -1)
    assert torch.allclose(entropy_from_logits(logits), -(p * p.log()).sum(-1), atol=1e-5)


def test_clip_stats_by_c_hand_computed():
    # two groups of G = 2, one token each. group A: c = 1 (rows 0, 1); group B: c = 2 (rows 2, 3)
    ratio = torch.tensor([[1.5], [0.7], [1.1], [1.3]])
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0])
    c = torch.tensor([1, 1, 2, 2])
    eps = torch.tensor([0.28, 0.2, 0.2, 0.2])
    s = clip_stats_by_c(ratio, adv, torch.ones(4, 1), c, eps_low=0.2, eps_high=eps)
    assert s["clip/frac_high_by_c/1"] == 1.0  # 1.5 > 1.28 with A > 0
    assert s["clip/frac_low_by_c/1"] == 1.0  # 0.7 < 0.8 with A < 0
    assert s["clip/ratio_dev_by_c/1"] == pytest.approx((0.5 + 0.3) / 2)
    assert s["clip/ratio_dev_by_c/2"] == pytest.approx((0.1 + 0.3) / 2)
    assert s["clip/eps_high_by_c/1"] == pytest.approx(0.24)
    assert "clip/frac_high_by_c/2" not in s  # no positive-advantage tokens there


def test_clip_counts_merge_equals_whole_batch():
    g = torch.Generator().manual_seed(0)
    ratio = 1 + 0.4 * torch.randn(8, 5, generator=g)
    adv = torch.randn(8, generator=g)
    mask = (torch.rand(8, 5, generator=g) > 0.3).float()
    c = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    eps = torch.rand(8, generator=g) * 0.3
    whole = clip_stats_by_c(ratio, adv, mask, c, eps_low=0.2, eps_high=eps)
    total = {}
    for rows in (slice(0, 3), slice(3, 8)):
        merge_counts(
            total, clip_counts_by_c(ratio[rows], adv[rows], mask[rows], c[rows], eps_low=0.2, eps_high=eps[rows])
        )
    parts = clip_stats_from_counts(total)
    assert parts.keys() == whole.keys()
    for k in whole:
        assert parts[k] == pytest.approx(whole[k], rel=1e-6), k


def test_counts_tensor_round_trip_and_sum():
    # the dense (c, field) form sums like merge_counts does (what an all-reduce over processes does)
    g = torch.Generator().manual_seed(1)
    ratio = 1 + 0.4 * torch.randn(8, 5, generator=g)
    adv = torch.randn(8, generator=g)
    mask = torch.ones(8, 5)
    c = torch.tensor([0, 0, 1, 1, 3, 3, 3, 3])
    a = clip_counts_by_c(ratio[:4], adv[:4], mask[:4], c[:4], eps_low=0.2, eps_high=0.28)
    b = clip_counts_by_c(ratio[4:], adv[4:], mask[4:], c[4:], eps_low=0.2, eps_high=0.28)
    assert counts_from_tensor(counts_to_tensor(a, 5)) == a
    summed = counts_from_tensor(counts_to_tensor(a, 5) + counts_to_tensor(b, 5))
    assert summed == merge_counts(merge_counts({}, a), b) and sorted(summed) == [0, 1, 3]  # c = 2, 4: no rows
    with pytest.raises(ValueError, match="c=3"):
        counts_to_tensor(b, 3)


def test_first_move_entropy():
    assert first_move_entropy([("3", "+")] * 4) == 0.0
    assert first_move_entropy([1, 2, None, 1, 2]) == pytest.approx(math.log(2))
    assert first_move_entropy([]) == 0.0


def test_positive_advantage_ratio_and_advantage_by_c_hand_computed():
    """G = 4. Group c = 1: the correct row (A = 0.75) has ratios (1.5, 1.1), the others 0.9.
    Group c = 2: correct rows A = 0.5 with ratios (1.2, 1.2) and (1.0, 0.8 masked out).
    |ρ−1| of positive tokens: c = 1 (0.5 + 0.1)/2 = 0.3; c = 2 (0.2 + 0.2 + 0.0)/3 = 0.1333."""
    ratio = torch.tensor(
        [[1.5, 1.1], [0.9, 0.9], [0.9, 0.9], [0.9, 0.9], [1.2, 1.2], [1.0, 0.8], [0.7, 0.7], [0.7, 0.7]]
    )
    mask = torch.ones(8, 2)
    mask[5, 1] = 0
    adv = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    c = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    s = clip_stats_by_c(ratio, adv, mask, c, eps_low=0.2, eps_high=0.2)
    assert s["clip/ratio_dev_pos_by_c/1"] == pytest.approx(0.3)
    assert s["clip/ratio_dev_pos_by_c/2"] == pytest.approx(0.4 / 3)
    assert s["clip/adv_pos_by_c/1"] == pytest.approx(0.75)
    assert s["clip/adv_pos_by_c/2"] == pytest.approx(0.5)
    # all tokens, for contrast: c = 1 (0.5 + 0.1 + 6·0.1)/8
    assert s["clip/ratio_dev_by_c/1"] == pytest.approx(1.2 / 8)
    pairs = sorted(ratio_adv_pairs(s), key=lambda p: p[1])
    assert pairs == [(pytest.approx(0.4 / 3), 0.5), (pytest.approx(0.3), 0.75)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=3, max_size=30))
def test_pearson_matches_the_standard_library(pts):
    import statistics

    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    r = pearson(xs, ys)
    try:
        ref = statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # constant input
        ref = None
    if r is None or ref is None:
        # undefined when either variable has (numerically) no spread
        assert r is None or abs(r) <= 1.0
        return
    assert r == pytest.approx(ref, abs=1e-6)


def test_ratio_adv_corr_pools_the_window():
    # ratio deviation rising with the advantage: r = +1; reversed: r = −1; one point per step: undefined
    up = [[(0.1 * a, a) for a in (0.25, 0.5, 0.75)] for _ in range(3)]
    assert ratio_adv_corr(up)["clip/ratio_adv_corr"] == pytest.approx(1.0)
    down = [[(1 - 0.1 * a, a) for a in (0.25, 0.5, 0.75)]]
    assert ratio_adv_corr(down)["clip/ratio_adv_corr"] == pytest.approx(-1.0)
    assert ratio_adv_corr([[(0.1, 0.5)], [(0.2, 0.5)]]) == {}
    assert ratio_adv_corr([]) == {}
    # the value pools every (step, c) pair: equal to Pearson over the concatenation
    steps = [[(0.3, 0.75), (0.1, 0.5)], [(0.2, 0.75), (0.15, 0.25)], [(0.05, 0.5)]]
    flat = [p for st_ in steps for p in st_]
    expected = pearson([p[0] for p in flat], [p[1] for p in flat])
    assert ratio_adv_corr(steps)["clip/ratio_adv_corr"] == pytest.approx(expected)
    assert RATIO_ADV_WINDOW == 8


def test_per_token_widths_own_clipped_mask_and_gate_by_c():
    # one group of G = 2 with c = 1: row 0 (A > 0) has 3 tokens, row 1 (A < 0) has 2 (+ padding)
    ratio = torch.tensor([[1.5, 1.1, 1.35], [0.7, 0.95, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, c = torch.tensor([0.5, -0.5]), torch.tensor([1, 1])
    # DCPO-like per-token widths: the upper bound binds on token 0 only (1.5 > 1.4; 1.35 < 1.4)
    eps_high = torch.tensor([[0.4, 0.05, 0.4], [0.2, 0.2, 0.2]])
    eps_low = torch.tensor([[0.2, 0.2, 0.2], [0.35, 0.02, 0.2]])  # row 1: 0.7 > 0.65, 0.95 < 0.98
    s = clip_stats_by_c(ratio, adv, mask, c, eps_low=eps_low, eps_high=eps_high)
    assert s["clip/frac_high_by_c/1"] == pytest.approx(2 / 3)  # 1.5 > 1.4 and 1.1 > 1.05
    assert s["clip/frac_low_by_c/1"] == pytest.approx(1 / 2)  # 0.95 < 0.98
    assert s["clip/gate_by_c/1"] == pytest.approx(1 / 3)  # a hard clip: 1 − the clipped share
    assert s["clip/eps_high_by_c/1"] == pytest.approx(((0.4 + 0.05 + 0.4) / 3 + 0.2) / 2)  # row means
    # the loss's own clipped tokens and soft gate replace the bound test (padding never counts)
    own = torch.tensor([[False, False, True], [True, False, True]])
    gate = torch.tensor([[0.5, 1.0, 0.25], [1.0, 1.0, 9.0]])
    s = clip_stats_by_c(ratio, adv, mask, c, eps_low=0.2, eps_high=0.2, clipped=own, gate=gate)
    assert s["clip/frac_high_by_c/1"] == pytest.approx(1 / 3)
    assert s["clip/frac_low_by_c/1"] == pytest.approx(1 / 2)
    assert s["clip/gate_by_c/1"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    assert math.isfinite(s["clip/ratio_dev_by_c/1"])


def test_scalar_and_row_widths_count_as_before():
    torch.manual_seed(0)
    ratio, adv = torch.rand(6, 5) * 1.0 + 0.5, torch.randn(6)
    mask, c = (torch.rand(6, 5) > 0.2).float(), torch.tensor([0, 0, 1, 1, 2, 2])
    rows = torch.rand(6) * 0.3
    by_rows = clip_counts_by_c(ratio, adv, mask, c, eps_low=0.2, eps_high=rows)
    by_tokens = clip_counts_by_c(ratio, adv, mask, c, eps_low=0.2, eps_high=rows[:, None].expand(6, 5))
    for k in by_rows:
        for f in ("pos_clipped", "neg_clipped", "pos_gate_sum", "tokens"):
            assert by_rows[k][f] == pytest.approx(by_tokens[k][f])
