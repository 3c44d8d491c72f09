import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.aggregation import AGG_MODES, AggNorms, agg_loss

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
    norms = AggNorms(num_tokens=mask.sum(), num_seqs=(mask.sum(-1) > 0).sum(), horizon=5)
    parts = sum(agg_loss(lm, mm, mode, norms=norms) for lm, mm in zip(loss_mat.chunk(splits), mask.chunk(splits)))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_unknown_mode():
    with pytest.raises(ValueError, match="Did you mean 'token-mean'"):
        agg_loss(L, M, "token_mean")


def test_global_normalisers_are_one_aggnorms():
    # token-mean with N = 8 for the whole mini-batch: (1 + 2 + 4) / 8, not / 3
    assert agg_loss(L, M, "token-mean", norms=AggNorms(num_tokens=8.0)).item() == pytest.approx(7 / 8)
    # seq-mean-token-sum-norm with S = 4, T = 7: (3 + 4) / 4 / 7
    norms = AggNorms(num_seqs=torch.tensor(4.0), horizon=7)
    assert agg_loss(L, M, "seq-mean-token-sum-norm", norms=norms).item() == pytest.approx(7 / 4 / 7)
    with pytest.raises(TypeError):  # the old keyword spelling is gone
        agg_loss(L, M, "token-mean", num_tokens=8.0)
    with pytest.raises(TypeError, match="AggNorms"):
        agg_loss(L, M, "token-mean", norms={"num_tokens": 8.0})


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(num_tokens=0.0), "num_tokens"),
        (dict(num_seqs=-1), "num_seqs"),
        (dict(num_seqs="4"), "num_seqs"),
        (dict(num_tokens=torch.ones(2)), "num_tokens"),
        (dict(horizon=float("nan")), "horizon"),
        (dict(horizon=torch.tensor(5.0)), "horizon"),
    ],
)
def test_bad_normalisers_name_the_field(bad, field):
    with pytest.raises(ValueError, match=f"AggNorms.{field} "):
        AggNorms(**bad)


def test_check_same_shape_names_each_tensor():
    from gapo.core.checks import check_same_shape

    check_same_shape({"a": torch.zeros(2, 3), "b": torch.ones(2, 3)})
    with pytest.raises(ValueError, match=r"'a': \(2, 3\), 'b': \(3, 2\)"):
        check_same_shape({"a": torch.zeros(2, 3), "b": torch.zeros(3, 2)})
