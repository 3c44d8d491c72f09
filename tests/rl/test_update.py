"""The update's pure per-micro-batch loss and its π_old bookkeeping (gapo.rl.update)."""

import math

import pytest
import torch

from gapo.rl.config import load_config
from gapo.rl.update import (
    LossSettings,
    OldPolicy,
    UpdateBatch,
    UpdateStats,
    micro_batch_loss,
    micro_batch_rows,
    micro_batches,
    minibatch_norms,
    token_share,
)


def _batch(logp_old, adv, mask, eps_high, ref=None):
    B = len(adv)
    return UpdateBatch(
        rollout=None,
        mask=torch.tensor(mask, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        eps_high=torch.tensor(eps_high, dtype=torch.float32),
        c=torch.zeros(B, dtype=torch.long),
        ref_logp=None if ref is None else torch.tensor(ref, dtype=torch.float32),
        old_logp=torch.tensor(logp_old, dtype=torch.float32),
    )


def test_ppo_clip_above_one_plus_eps_high_with_positive_advantage_gives_the_clipped_value():
    # one token, ratio e^0.5 ≈ 1.65 > 1 + 0.28, A = 2: L = −A·(1 + ε_high) = −2.56, no gradient
    logp = torch.tensor([[0.5]], requires_grad=True)
    mb = _batch([[0.0]], [2.0], [[1.0]], [0.28])
    total, mets, _ = micro_batch_loss(logp, torch.zeros(1, 1), mb, LossSettings(), None)
    assert total.item() == pytest.approx(-2.0 * 1.28)
    assert mets["loss/clipfrac_high"].item() == 1.0 and mets["loss/policy"].item() == pytest.approx(-2.56)
    total.backward()
    assert logp.grad.item() == 0.0
    # inside the band (ratio e^0.1 < 1.28) the unclipped −A·ρ, gradient −A·ρ
    logp = torch.tensor([[0.1]], requires_grad=True)
    total, mets, _ = micro_batch_loss(logp, torch.zeros(1, 1), mb, LossSettings(), None)
    assert total.item() == pytest.approx(-2.0 * math.exp(0.1))
    total.backward()
    assert logp.grad.item() == pytest.approx(-2.0 * math.exp(0.1))
    assert mets["loss/clipfrac"].item() == 0.0


def test_kl_and_entropy_terms_by_hand():
    # token-mean over 3 live tokens (the 4th masked). ratio 1, A = 1: policy loss −1.
    # k3 with d = ref − logp: exp(d) − d − 1; entropy term −α · mean(H)
    logp = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    ref = [[0.5, -0.5], [1.0, 9.0]]
    ent = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mb = _batch([[0.0, 0.0], [0.0, 0.0]], [1.0, 1.0], [[1, 1], [1, 0]], [0.2, 0.2], ref=ref)
    s = LossSettings(kl_coef=0.1, entropy_coef=0.01)
    total, mets, _ = micro_batch_loss(logp, ent, mb, s, None)
    k3 = [math.exp(d) - d - 1 for d in (0.5, -0.5, 1.0)]
    kl = sum(k3) / 3
    assert mets["loss/kl_ref"].item() == pytest.approx(kl)
    assert mets["loss/policy"].item() == pytest.approx(-1.0)
    assert total.item() == pytest.approx(-1.0 + 0.1 * kl - 0.01 * (1 + 2 + 3) / 3)
    # the terms are off when their settings are
    total0, mets0, _ = micro_batch_loss(
        logp, ent, _batch([[0.0, 0.0]] * 2, [1.0, 1.0], [[1, 1], [1, 0]], [0.2, 0.2]), LossSettings(), None
    )
    assert total0.item() == pytest.approx(-1.0) and "loss/kl_ref" not in mets0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"])
@pytest.mark.parametrize("loss", ["ppo", "gspo", "cispo"])
def test_micro_batch_losses_add_up_to_the_mini_batch_loss(agg, loss):
    g = torch.Generator().manual_seed(0)
    B, T = 7, 5
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[3] = 0.0  # an empty row: it counts in no normaliser
    logp = -torch.rand(B, T, generator=g)
    advantages, eps_high = torch.randn(B, generator=g), 0.2 + 0.1 * torch.rand(B, generator=g)
    old_logp = logp + 0.3 * torch.randn(B, T, generator=g)
    ub = UpdateBatch(None, mask, advantages, eps_high, torch.zeros(B, dtype=torch.long), -torch.rand(B, T, generator=g))
    ent = torch.rand(B, T, generator=g)
    s = LossSettings(loss=loss, agg=agg, kl_coef=0.05, entropy_coef=0.01)
    rows = torch.tensor([6, 0, 3, 2, 5, 1, 4])
    whole, whole_m, _ = micro_batch_loss(logp[rows], ent[rows], ub.rows(rows, old_logp[rows]), s, None)
    subs = micro_batches(rows, 3)
    assert [len(x) for x in subs] == [3, 3, 1]
    norms = minibatch_norms(mask[rows], T, split=len(subs) > 1)
    parts, stats = 0.0, UpdateStats()
    for sub in subs:
        mb = ub.rows(sub, old_logp[sub])
        part, m, _ = micro_batch_loss(logp[sub], ent[sub], mb, s, norms)
        parts = parts + part
        stats.add(m, {}, token_share(mb.mask, mask[rows], norms))
    stats.end_update(1.0)
    assert parts.item() == pytest.approx(whole.item(), abs=1e-6)
    for k in ("loss/policy", "loss/total", "loss/kl_ref", "loss/approx_kl"):
        assert stats.sums[k] == pytest.approx(float(whole_m[k]), abs=1e-6), k
    # without the whole-mini-batch normalisers the micro-batch token means do not add up
    if agg == "token-mean":
        naive = sum(micro_batch_loss(logp[x], ent[x], ub.rows(x, old_logp[x]), s, None)[0].item() for x in subs)
        assert naive != pytest.approx(whole.item(), abs=1e-3)


def test_old_policy_fills_pending_rows_once_and_measures_each_row_once():
    B, T = 4, 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float32)
    known = torch.arange(B * T, dtype=torch.float32).view(B, T)  # rows 1 and 3: the sampler's, kept
    old = OldPolicy(known.clone(), mask, pending=torch.tensor([2, 0]))
    ent = torch.ones(2, T)
    got = old.first_forward(torch.tensor([1, 3]), torch.full((2, T), -9.0), ent)  # not pending: returned as known
    assert torch.equal(got, known[[1, 3]]) and old.entropy_sum == 1.0
    got = old.first_forward(torch.tensor([2, 0]), torch.full((2, T), -1.0, requires_grad=True), 2 * ent)
    assert torch.equal(got, torch.full((2, T), -1.0)) and not got.requires_grad  # this forward's, detached
    assert old.entropy_sum == 1.0 + 2 * 5
    got = old.first_forward(torch.tensor([2, 0]), torch.full((2, T), -5.0), 3 * ent)  # later forwards change nothing
    assert torch.equal(got, torch.full((2, T), -1.0)) and old.entropy_sum == 11.0
    assert torch.equal(old.logp[[1, 3]], known[[1, 3]]) and torch.equal(old.logp[[0, 2]], torch.full((2, T), -1.0))


def test_update_stats_sum_each_update_then_over_updates():
    # two updates: the first of two micro-batches holding 3/4 and 1/4 of its tokens, the second of one.
    # loss/policy (ADDITIVE) adds up whole within an update; loss/clipfrac is token-weighted:
    # update 1: policy −1 + −3 = −4, clipfrac 0.2·3/4 + 0.6·1/4 = 0.3; update 2: policy 2, clipfrac 0.5
    stats = UpdateStats()
    counts = {1: dict.fromkeys(("tokens", "pos_tokens"), 2.0)}
    stats.add({"loss/policy": -1.0, "loss/clipfrac": 0.2}, counts, 0.75)
    stats.add({"loss/policy": -3.0, "loss/clipfrac": 0.6}, counts, 0.25)
    stats.end_update(1.5)
    stats.add({"loss/policy": torch.tensor(2.0), "loss/clipfrac": 0.5}, {}, 1.0)
    stats.end_update(0.5)
    assert stats.sums == pytest.approx({"loss/policy": -2.0, "loss/clipfrac": 0.8})
    assert stats.grad_norms == [1.5, 0.5] and stats.counts[1]["tokens"] == 4.0 and stats.current == {}


def test_loss_settings_are_the_algo_keys():
    a = load_config(
        None, ["algo.kl_coef=0.3", "algo.entropy_coef=0.02", "algo.loss=gspo", "algo.agg=seq-mean-token-mean"]
    ).algo
    s = LossSettings.from_algo(a)
    assert (s.kl_coef, s.entropy_coef, s.loss, s.agg) == (0.3, 0.02, "gspo", "seq-mean-token-mean")
    assert (s.eps_low, s.clip_ratio_c, s.kl_estimator) == (a.eps_low, a.clip_ratio_c, a.kl_estimator)


def test_recompute_reuse_gives_the_old_logprobs_of_an_explicit_no_grad_forward(easy_policy, tmp_path):
    """algo.old_logp=recompute with 2 mini-batches: epoch 0's first mini-batch gets its old
    log-probs from the update's first (training) forward; they equal a no-grad forward of every
    row under π_old, i.e. the old log-probs that old_logp=recompute means."""
    from gapo.rl.trainer import Trainer

    cfg = load_config(
        None,
        [
            f"model.path={easy_policy}",
            "task.name=countdown",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=300",
            "train.prompts=4",
            "train.group_size=4",
            "train.mini_batches=2",
            "train.progress=false",
            "eval.problems=0",
            "train.checkpoint_every=0",
            "algo.old_logp=recompute",
        ],
    )
    tr = Trainer(cfg, tmp_path / "run")
    seen = {}
    inner_update = tr._update

    def update(ub, old, perm0):  # just before the loop, and after it
        first = perm0[: perm0.numel() // 2]
        with torch.no_grad():
            seen["explicit_first"] = tr._logprobs(tr.model, ub, first)[0]
            seen["explicit_all"] = tr._logprobs(tr.model, ub)[0]
        seen["first"], seen["pending_before"] = first, old.pending.clone()
        out = inner_update(ub, old, perm0)
        seen["old_logp"], seen["pending_after"] = old.logp.clone(), old.pending.clone()
        return out

    tr._update = update
    tr.train_step()
    first = seen["first"]
    assert first.numel() == 8 and seen["pending_before"][first].all() and seen["pending_before"].sum() == 8
    assert not seen["pending_after"].any()
    # the reused rows: bit for bit the no-grad forward of the same rows under π_old
    assert torch.equal(seen["old_logp"][first], seen["explicit_first"])
    assert seen["old_logp"][first].abs().sum() > 0  # filled by the reuse, not left at zero
    # every row: the no-grad forward of the whole batch (up to the forward's float rounding)
    assert torch.allclose(seen["old_logp"], seen["explicit_all"], atol=1e-5, rtol=0)


def test_auto_micro_batch_rows_bound_the_logits():
    # train.micro_batch_size=auto: 256 MiB of float32 logits per micro-batch; 128 positions of a
    # 32000-id vocabulary are 16,384,000 bytes a row, so 16 rows (262 MB) fit and 17 do not
    assert micro_batch_rows("auto", 128, 32000) == 16
    assert micro_batch_rows("auto", 1024, 151936) == 1  # a row over the budget still runs, alone
    assert micro_batch_rows("auto", 20, 40) == 83886  # a small vocabulary never splits a batch
    assert micro_batch_rows("auto", 0, 32000) == 2097  # no completion column: counted as one
    assert micro_batch_rows(3, 128, 32000) == 3 and micro_batch_rows(None, 128, 32000) is None
