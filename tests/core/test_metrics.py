import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.metrics import clip_counts_by_c, clip_stats_by_c, clip_stats_from_counts, counts_from_tensor, counts_to_tensor, merge_counts, entropy_from_logits, first_move_entropy, pass_at_k, pass_at_k_curve


def _brute(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(max(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_for_small_n():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_and_stable():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    # large n: no overflow, matches the closed form via lgamma
    n, c, k = 10_000, 7, 256
    exact = 1 - math.exp(math.lgamma(n - c + 1) - math.lgamma(n - c - k + 1) - math.lgamma(n + 1) + math.lgamma(n - k + 1))
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_a_monotone_probability(args):
    n, c, k = args
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12
    assert (p == 0.0) == (c == 0)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1), (4.5, 1, 1)])
def test_pass_at_k_bad_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


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
        merge_counts(total, clip_counts_by_c(ratio[rows], adv[rows], mask[rows], c[rows], eps_low=0.2, eps_high=eps[rows]))
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
