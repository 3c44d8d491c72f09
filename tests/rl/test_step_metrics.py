"""gapo.rl.step_metrics: one step's train record from what the step produced, by hand."""

from types import SimpleNamespace

import pytest
import torch

from gapo.rl.step_metrics import gpu_memory, step_metrics, truncated
from gapo.rl.update import UpdateStats


def _counts(**kw):
    base = dict.fromkeys(
        (
            "tokens",
            "dev_sum",
            "pos_tokens",
            "pos_clipped",
            "neg_tokens",
            "neg_clipped",
            "rows",
            "eps_sum",
            "adv_abs_sum",
            "pos_rows",
            "pos_eps_sum",
            "pos_adv_sum",
            "pos_dev_sum",
        ),
        0.0,
    )
    return {**base, **kw}


def _step():
    # 4 rollouts of one group: response lengths 3, 1, 2, 2 (8 tokens); rewards 1, 0, 0, 1;
    # stop token 9: rows 1-3 end with it, row 0 is cut at max_new_tokens = 3
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
    ids = torch.tensor([[5, 6, 7], [9, 0, 0], [5, 9, 0], [6, 9, 0]])
    batch = SimpleNamespace(
        rollout=SimpleNamespace(response_mask=mask, completion_ids=ids, eos_ids=(9,), stop=()),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        group_size=4,
        info={"rollout/frac_zero_std": 0.0},
        stats={"reward/n": 4, "reward/n_timeout": 0, "other": 5},
    )
    ub = SimpleNamespace(advantages=torch.tensor([0.5, -0.5, -0.5, 0.5]), eps_high=torch.tensor([0.3, 0.2, 0.2, 0.4]))
    upd = UpdateStats(
        sums={"loss/policy": 3.0, "loss/clipfrac": 0.5},  # summed over 2 updates
        grad_norms=[1.0, 2.0],
        entropy_sum=4.0,
        # c = 2: 5 positive-advantage tokens, 1 of them clipped; 3 negative ones
        counts={2: _counts(tokens=8, dev_sum=0.8, pos_tokens=5, pos_clipped=1, neg_tokens=3, rows=4, eps_sum=1.1)},
    )
    return batch, ub, upd


class _Tok:
    """decode(ids): the ids as letters, 5 -> 'a', 6 -> 'b', … (special ids 0 and 9 skipped)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i - 5) for i in ids if not (skip_special_tokens and i in (0, 9)))


def _metrics(batch, ub, upd, **kw):
    return step_metrics(batch, ub, upd, max_new_tokens=3, tokenizer=_Tok(), **kw)


def test_the_record_by_hand():
    batch, ub, upd = _step()
    rec = _metrics(batch, ub, upd, step=7, lr=1e-4, reward_range=[0.0, 1.0])
    assert rec["kind"] == "train" and rec["step"] == 7
    assert rec["loss/policy"] == 1.5 and rec["loss/clipfrac"] == 0.25  # sums / 2 updates
    assert rec["policy/entropy"] == 0.5  # 4 / 8 tokens
    assert rec["rollout/reward"] == 0.5 and rec["rollout/pass_rate"] == 0.5
    assert rec["rollout/response_len"] == 2.0  # 8 tokens / 4 rollouts
    assert rec["rollout/response_len_min"] == 1 and rec["rollout/response_len_max"] == 3
    assert rec["rollout/frac_truncated"] == 0.25  # row 0: 3 tokens, the limit, no stop token
    # one group, rewards 1, 0, 0, 1: mean 1/2, unbiased variance 4 · (1/4) / 3 = 1/3
    assert rec["rollout/group_reward_std"] == pytest.approx(3**-0.5)
    assert rec["optim/lr"] == 1e-4 and rec["optim/grad_norm"] == 1.5
    assert rec["clip/eps_high_pos_mean"] == pytest.approx(0.35)  # (0.3 + 0.4) / 2
    assert rec["clip/frac_high_by_c/2"] == 0.2 and rec["clip/frac_high_pos"] == 0.2  # 1 / 5
    assert rec["clip/ratio_dev_by_c/2"] == pytest.approx(0.1)  # 0.8 / 8
    assert rec["rollout/frac_zero_std"] == 0.0 and rec["reward/n_timeout"] == 0
    assert "reward/n" not in rec and "other" not in rec
    assert not any(k.startswith(("time/", "memory/")) for k in rec)  # the trainer adds the machine's share


def test_a_success_is_the_top_of_the_range():
    batch, ub, upd = _step()
    batch.rewards = torch.tensor([2.0, 1.0, 0.0, 1.0])
    assert _metrics(batch, ub, upd, step=1, lr=0.0, reward_range=[0.0, 2.0])["rollout/pass_rate"] == 0.25
    # a "group"/"batch" range: gapo's verifiers' 1.0
    assert _metrics(batch, ub, upd, step=1, lr=0.0, reward_range="group")["rollout/pass_rate"] == 0.75


def test_no_positive_advantage_leaves_out_its_width_and_clips_nothing():
    batch, ub, upd = _step()
    ub.advantages = torch.zeros(4)
    upd.counts = {2: _counts(tokens=8, rows=4, eps_sum=1.1)}
    rec = _metrics(batch, ub, upd, step=1, lr=0.0, reward_range=[0.0, 1.0])
    assert "clip/eps_high_pos_mean" not in rec and rec["clip/frac_high_pos"] == 0.0


def test_gpu_memory_is_empty_off_cuda():
    assert gpu_memory(torch.device("cpu")) == {}


def test_truncated_is_the_limit_without_a_stop_token_or_string():
    batch, _, _ = _step()
    ro = batch.rollout
    assert truncated(ro, 3, _Tok()).tolist() == [True, False, False, False]
    # a higher limit: nothing reached it
    assert truncated(ro, 4, _Tok()).tolist() == [False] * 4
    # a stop token that is the limit's last token is a stop, not a cut: row 0 ends with 7
    ro.eos_ids = (9, 7)
    assert truncated(ro, 3, _Tok()).tolist() == [False] * 4
    # a stop string completed by the last allowed token ("abc" holds "bc") ended the row
    ro.eos_ids, ro.stop = (9,), ("bc",)
    assert truncated(ro, 3, _Tok()).tolist() == [False] * 4
    ro.stop = ("zz",)  # a stop string that never occurs: still cut
    assert truncated(ro, 3, _Tok()).tolist() == [True, False, False, False]
    # without stop tokens: every row of full length is cut (rows 1-3 are shorter, ended by a stop)
    ro.eos_ids, ro.stop = (), ()
    assert truncated(ro, 2, _Tok()).tolist() == [True, False, True, True]


def test_group_reward_std_is_the_mean_over_groups():
    batch, ub, upd = _step()
    # two groups of 2: (1, 0) has unbiased std sqrt(1/2), (0, 0) has 0; the mean is sqrt(1/2) / 2
    batch.rewards, batch.group_size = torch.tensor([1.0, 0.0, 0.0, 0.0]), 2
    rec = _metrics(batch, ub, upd, step=1, lr=0.0, reward_range=[0.0, 1.0])
    assert rec["rollout/group_reward_std"] == pytest.approx(0.5**0.5 / 2)
