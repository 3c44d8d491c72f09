"""gapo.core.shaping: DAPO's overlong penalty (hand values, verl's DAPO reward manager) and the
high-entropy token mask (hand values, TRL's get_high_entropy_mask)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.shaping import high_entropy_mask, overlong_penalty


# ------------------------------------------------------------------ overlong (DAPO Eq. 13)
def test_overlong_penalty_by_hand():
    # L_max = 10, L_cache = 4: nothing up to 6 tokens, then −1/4 a token, −p at the cap and beyond
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 12])
    got = overlong_penalty(lengths, 10, 4, 1.0)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4, 2.0).tolist() == [0.0, 0.0, 0.0, -0.5, -1.0, -1.5, -2.0, -2.0]
    assert overlong_penalty(lengths, 10, 4, 0.0).abs().sum() == 0


@pytest.mark.parametrize(
    ("args", "word"),
    [
        ((10, 0, 1.0), "buffer"),
        ((10, 10, 1.0), "buffer"),
        ((10, 2.0, 1.0), "buffer"),
        ((0, 1, 1.0), "max_new_tokens"),
        ((10, 4, -1.0), "penalty"),
        ((10, 4, float("nan")), "penalty"),
        ((10, True, 1.0), "buffer"),
    ],
)
def test_overlong_penalty_refuses_bad_arguments(args, word):
    with pytest.raises(ValueError, match=f"overlong_penalty's {word}"):
        overlong_penalty(torch.tensor([3]), *args)


class _Tok:
    eos_token = "</s>"

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids.tolist()))


def _verl_overlong(lengths: list[int], max_len: int, buffer: int, penalty: float) -> list[float]:
    """verl 0.9.1's DAPO reward manager on rows of these response lengths, with a score of 0."""
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    B = len(lengths)
    resp_mask = torch.tensor([[1] * n + [0] * (max_len - n) for n in lengths])
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.ones(B, 2, dtype=torch.long),
            "responses": torch.full((B, max_len), 5, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, 2, dtype=torch.long), resp_mask], 1),
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": ""}] * B, dtype=object),
            "data_source": np.array(["x"] * B, dtype=object),
        },
    )
    cfg = SimpleNamespace(enable=True, len=buffer, penalty_factor=penalty, log=True)
    rm = DAPORewardManager(_Tok(), 0, compute_score=lambda **_: 0.0, max_resp_len=max_len, overlong_buffer_cfg=cfg)
    return [float(x) for x in rm(data, return_dict=True)["reward_extra_info"]["overlong_reward"]]


@settings(max_examples=20, deadline=None)
@given(
    max_len=st.integers(2, 40),
    data=st.data(),
    penalty=st.floats(0.0, 5.0, allow_nan=False),
)
def test_overlong_penalty_is_verls_dapo_reward_manager(max_len, data, penalty):
    buffer = data.draw(st.integers(1, max_len - 1))
    lengths = data.draw(st.lists(st.integers(1, max_len), min_size=1, max_size=6))
    ours = overlong_penalty(torch.tensor(lengths), max_len, buffer, penalty).tolist()
    assert ours == pytest.approx(_verl_overlong(lengths, max_len, buffer, penalty), abs=1e-6)


# ------------------------------------------------------------------ top-q entropy tokens
def test_high_entropy_mask_by_hand():
    ent = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.3, 0.7, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # 6 response tokens; 7.0 is padding
    # sorted 0.1 0.2 0.3 0.5 0.7 0.9; the 0.5 quantile is (0.3 + 0.5)/2 = 0.4: keep 0.5, 0.7, 0.9
    got = high_entropy_mask(ent, mask, 0.5)
    assert got.tolist() == [[False, True, True, False], [False, True, False, False]]
    # q = 1: the threshold is the minimum, every response token and no padding
    assert high_entropy_mask(ent, mask, 1.0).tolist() == mask.bool().tolist()
    # ties at the threshold are all kept: the kept share is at least q
    flat = torch.full((1, 4), 0.5)
    assert high_entropy_mask(flat, torch.ones(1, 4), 0.25).all()
    # no response token: nothing kept, no error
    assert not high_entropy_mask(ent, torch.zeros_like(mask), 0.5).any()


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5, float("nan"), True])
def test_high_entropy_mask_refuses_a_bad_quantile(q):
    with pytest.raises(ValueError, match="quantile"):
        high_entropy_mask(torch.ones(1, 2), torch.ones(1, 2), q)


def _trl_mask(ent, mask, q):
    from trl import GRPOTrainer

    # one process: padding across processes and gathering are the identity
    acc = SimpleNamespace(pad_across_processes=lambda x, dim, pad_index: x, gather=lambda x: x)
    return GRPOTrainer.get_high_entropy_mask(SimpleNamespace(accelerator=acc), ent, mask, 1 - q)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
    q=st.sampled_from([0.05, 0.2, 0.25, 0.5, 0.8, 0.999, 1.0]),
    ties=st.booleans(),
)
def test_high_entropy_mask_is_trls(rows, cols, seed, q, ties):
    g = torch.Generator().manual_seed(seed)
    ent = torch.rand(rows, cols, generator=g) * 3
    if ties:  # few distinct values: ties at the threshold
        ent = (ent * 2).round() / 2
    mask = (torch.rand(rows, cols, generator=g) < 0.7).long()
    assert torch.equal(high_entropy_mask(ent, mask, q), _trl_mask(ent, mask, q))
