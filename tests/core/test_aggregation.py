import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.aggregation import AGG_MODES, agg_loss

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 4) / 3),  # 3 tokens
        ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),  # = 2.25
        ("seq-mean-token-sum", ((1 + 2) + 4) / 2),  # = 3.5
        ("seq-mean-token-sum-norm", ((1 + 2) + 4) / 2 / 3),  # horizon T = 3
    ],
)
def test_hand_computed(mode, expected):
    assert agg_loss(L, M, mode).item() == pytest.approx(expected)


def test_empty_sequence_is_excluded():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert agg_loss(L, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert agg_loss(L, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 1000), mode=st.sampled_from(AGG_MODES), splits=st.integers(1, 4))
def test_micro_batches_with_global_normalisers_sum_to_the_whole(seed, mode, splits):
    g = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(8, 5, generator=g)
    mask = (torch.rand(8, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    whole = agg_loss(loss_mat, mask, mode)
    kw = dict(num_tokens=mask.sum(), num_seqs=(mask.sum(-1) > 0).sum(), horizon=5)
    parts = sum(agg_loss(lm, mm, mode, **kw) for lm, mm in zip(loss_mat.chunk(splits), mask.chunk(splits)))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_unknown_mode():
    with pytest.raises(ValueError, match="Did you mean 'token-mean'"):
        agg_loss(L, M, "token_mean")
