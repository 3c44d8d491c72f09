"""gapo.rl.rollout without a model: ``collect`` (DAPO's dynamic sampling), ``concat`` and
``merge_stats`` on small hand-built batches, every expected value written out by hand."""

import pytest
import torch

from gapo.policy.sampling import Rollout
from gapo.rl.rollout import Batch, collect, concat, merge_stats

PAD = 9


def _batch(problems, rewards, *, prompt_w=1, comp_w=2, tag=0, stats=None, score_s=0.0):
    """G = len(rewards) // len(problems) rows per group; row i's tokens encode (tag, i) so a test
    can tell where each row of a concatenated batch came from."""
    B = len(rewards)
    rows = torch.arange(B)
    return Batch(
        list(problems),
        Rollout(
            prompt_ids=(100 * tag + rows).unsqueeze(1).repeat(1, prompt_w),
            prompt_mask=torch.ones(B, prompt_w, dtype=torch.long),
            completion_ids=(1000 * (tag + 1) + rows).unsqueeze(1).repeat(1, comp_w),
            response_mask=torch.ones(B, comp_w, dtype=torch.long),
            logp=-(tag + 1 + rows.float() / 10).unsqueeze(1).repeat(1, comp_w),
            eos_ids=(7,),
            stop=("###",),
        ),
        torch.tensor(rewards, dtype=torch.float32),
        dict(stats or {}),
        score_s,
        texts=[f"t{tag}r{i}" for i in range(B)],
    )


# ---------------------------------------------------------------------------------------- concat
def _two_parts():
    a = Batch(
        ["A0", "A1"],
        Rollout(
            prompt_ids=torch.tensor([[1], [1], [2], [2]]),
            prompt_mask=torch.ones(4, 1, dtype=torch.long),
            completion_ids=torch.tensor([[11, 12], [13, PAD], [21, 22], [23, 24]]),
            response_mask=torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]]),
            logp=torch.tensor([[-0.1, -0.2], [-0.3, 0], [-0.4, -0.5], [-0.6, -0.7]]),
            eos_ids=(7,),
            stop=("##",),
        ),
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        texts=["a0", "a1", "a2", "a3"],
    )
    b = Batch(
        ["B0"],
        Rollout(
            prompt_ids=torch.tensor([[5, 3], [5, 3]]),
            prompt_mask=torch.ones(2, 2, dtype=torch.long),
            completion_ids=torch.tensor([[31], [32]]),
            response_mask=torch.ones(2, 1, dtype=torch.long),
            logp=torch.tensor([[-0.8], [-0.9]]),
            eos_ids=(7,),
            stop=("##",),
        ),
        torch.tensor([0.0, 1.0]),
        texts=["b0", "b1"],
    )
    return a, b


def test_concat_pads_prompts_left_and_completions_right_in_the_chosen_order():
    a, b = _two_parts()
    out = concat([a, b], [(1, 0), (0, 1)], pad_id=PAD)
    assert out.problems == ["B0", "A1"] and out.group_size == 2
    assert out.texts == ["b0", "b1", "a2", "a3"]
    assert out.rewards.tolist() == [0.0, 1.0, 1.0, 1.0]
    r = out.rollout
    assert r.prompt_ids.tolist() == [[5, 3], [5, 3], [PAD, 2], [PAD, 2]]  # prompts: padded on the left
    assert r.prompt_mask.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    assert r.completion_ids.tolist() == [[31, PAD], [32, PAD], [21, 22], [23, 24]]  # completions: on the right
    assert r.response_mask.tolist() == [[1, 0], [1, 0], [1, 1], [1, 1]]
    torch.testing.assert_close(r.logp, torch.tensor([[-0.8, 0], [-0.9, 0], [-0.4, -0.5], [-0.6, -0.7]]))
    assert r.eos_ids == (7,) and r.stop == ("##",)
    assert r.prompt_ids.dtype == torch.long and r.logp.dtype == torch.float32


def test_concat_keeps_a_groups_own_padding_and_repeats_nothing():
    a, b = _two_parts()
    out = concat([a, b], [(0, 0), (0, 1), (1, 0)], pad_id=PAD)
    assert out.problems == ["A0", "A1", "B0"]
    # row 1 of A0 was already right-padded by the sampler: its pad and zero mask stay as they were
    assert out.rollout.completion_ids[1].tolist() == [13, PAD] and out.rollout.response_mask[1].tolist() == [1, 0]
    assert out.rollout.prompt_ids[:4, 0].tolist() == [PAD] * 4
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    one = concat([a], [(0, 1)], pad_id=PAD)  # one part, one group: its rows exactly
    assert one.rollout.completion_ids.tolist() == [[21, 22], [23, 24]] and one.problems == ["A1"]


# --------------------------------------------------------------------------------- merge_stats
def test_merge_stats_adds_counts_and_reweights_fractions_and_means():
    first = {
        "reward/n": 4.0,
        "reward/mean": 0.5,
        "reward/n_timeout": 1.0,
        "reward/timeout_frac": 0.25,
        "reward/n_fmt": 3.0,
        "reward/fmt": 0.5,
    }
    second = {"reward/n": 2.0, "reward/mean": 1.0, "reward/n_fmt": 1.0, "reward/fmt": 1.0}  # no timeouts
    out = merge_stats([(4, first), (2, second)])
    assert out["reward/n"] == 6.0 and out["reward/n_timeout"] == 1.0 and out["reward/n_fmt"] == 4.0
    assert out["reward/mean"] == pytest.approx((4 * 0.5 + 2 * 1.0) / 6)  # 2/3
    assert out["reward/timeout_frac"] == pytest.approx(1 / 6)  # one timeout in six completions
    assert out["reward/fmt"] == pytest.approx((3 * 0.5 + 1 * 1.0) / 4)  # per-term mean over its own count
    assert set(out) == set(first)
    assert merge_stats([(4, first)]) == first and merge_stats([(4, first)]) is not first


# ------------------------------------------------------------------------------------ collect
class _Script:
    """``draw``/``make`` for :func:`collect`: round r's groups get ``rounds[r]``'s rewards, its
    problems are named ``r{r}g{g}``, its completions are r + 1 tokens wide (so the batch from
    several rounds needs padding), and its stats say which round they are."""

    def __init__(self, rounds):
        self.rounds, self.drawn = rounds, 0

    def draw(self):
        r = self.drawn
        self.drawn += 1
        return [f"r{r}g{g}" for g in range(len(self.rounds[r]))]

    def make(self, problems):
        r = int(problems[0][1:].split("g")[0])
        flat = [x for group in self.rounds[r] for x in group]
        return _batch(
            problems, flat, comp_w=r + 1, tag=r, stats={"reward/n": float(len(flat)), "round": r}, score_s=0.5
        )


ROUNDS = [
    [[1, 1], [0, 1], [0, 0]],  # round 0: only g1 has signal
    [[0, 0], [1, 0], [1, 1]],  # round 1: only g1
    [[0, 1], [1, 0], [0, 0]],  # round 2: g0 and g1
    [[0, 1], [0, 1], [0, 1]],
]  # never reached


def _collect(rounds, *, dynamic=True, max_rounds=3):
    s = _Script(rounds)
    return collect(s.draw, s.make, n_groups=3, dynamic_sampling=dynamic, max_refill_rounds=max_rounds, pad_id=PAD), s


def test_dynamic_sampling_replaces_zero_variance_groups_with_fresh_ones():
    batch, s = _collect(ROUNDS)
    assert s.drawn == 3  # stops as soon as 3 groups with signal are in hand
    assert batch.problems == ["r0g1", "r1g1", "r2g0"]
    assert batch.rewards.tolist() == [0, 1, 1, 0, 0, 1]
    assert batch.texts == ["t0r2", "t0r3", "t1r2", "t1r3", "t2r0", "t2r1"]
    assert batch.info["rollout/refill_rounds"] == 2
    assert batch.info["rollout/frac_zero_std"] == pytest.approx(2 / 3)  # of the first draw
    assert batch.info["rollout/frac_zero_std_after_refill"] == 0.0
    assert batch.stats == {"reward/n": 6.0, "round": 0}  # the first draw's, not a merge
    assert batch.score_s == batch.info["time/score_s"] == pytest.approx(1.5)  # every round's wait
    # rows from rounds with 1-, 2- and 3-token completions: right-padded to 3 with pad and mask 0
    assert batch.rollout.completion_ids.tolist() == [
        [1002, PAD, PAD],
        [1003, PAD, PAD],
        [2002, 2002, PAD],
        [2003, 2003, PAD],
        [3000] * 3,
        [3001] * 3,
    ]
    assert batch.rollout.response_mask.sum(1).tolist() == [1, 1, 2, 2, 3, 3]
    assert batch.rollout.logp[0].tolist() == pytest.approx([-1.2, 0.0, 0.0])


def test_refills_stop_at_max_refill_rounds_and_spares_fill_the_rest_in_draw_order():
    batch, s = _collect(ROUNDS, max_rounds=1)
    assert s.drawn == 2
    # two groups with signal; the third place goes to the first spare (round 0's g0)
    assert batch.problems == ["r0g1", "r1g1", "r0g0"]
    assert batch.info["rollout/refill_rounds"] == 1
    assert batch.info["rollout/frac_zero_std_after_refill"] == pytest.approx(1 / 3)
    assert batch.stats["round"] == 0 and batch.score_s == pytest.approx(1.0)


def test_no_refill_rounds_keeps_the_first_draw_with_signal_groups_first():
    batch, s = _collect(ROUNDS, max_rounds=0)
    assert s.drawn == 1
    assert batch.problems == ["r0g1", "r0g0", "r0g2"]
    assert batch.rewards.tolist() == [0, 1, 1, 1, 0, 0]
    assert batch.info["rollout/refill_rounds"] == 0
    assert batch.info["rollout/frac_zero_std_after_refill"] == pytest.approx(2 / 3)


def test_a_first_draw_with_signal_everywhere_draws_nothing_more():
    batch, s = _collect([[[0, 1], [1, 0], [1, 0]]] + ROUNDS)
    assert s.drawn == 1 and batch.problems == ["r0g0", "r0g1", "r0g2"]
    assert batch.info["rollout/refill_rounds"] == 0 and batch.info["rollout/frac_zero_std"] == 0.0


def test_without_dynamic_sampling_the_first_draw_is_the_batch():
    batch, s = _collect(ROUNDS, dynamic=False)
    assert s.drawn == 1
    assert batch.problems == ["r0g0", "r0g1", "r0g2"] and batch.rewards.tolist() == [1, 1, 0, 1, 0, 0]
    assert batch.info["rollout/frac_zero_std"] == pytest.approx(2 / 3)
    assert batch.info["rollout/refill_rounds"] == 0 and "rollout/frac_zero_std_after_refill" not in batch.info
    assert batch.stats == {"reward/n": 6.0, "round": 0} and batch.score_s == pytest.approx(0.5)
