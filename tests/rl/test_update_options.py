"""algo.mask_truncated, algo.overlong_buffer / overlong_penalty and algo.top_entropy_quantile:
the update's pieces (gapo.rl.update) by hand, their config checks, and their effect in a run."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from gapo.core.aggregation import AGG_MODES
from gapo.core.losses import LOSSES, policy_loss
from gapo.core.shaping import high_entropy_mask, overlong_penalty
from gapo.core.surrogate import ClipBounds
from gapo.rl import update
from gapo.rl.config import load_config
from gapo.rl.update import LossSettings, UpdateBatch, micro_batch_loss


def _batch(B=4, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 5, 2])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g)
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    ent = torch.rand(B, T, generator=g) * 2
    mb = UpdateBatch(None, mask, torch.tensor([1.0, -0.5, 0.7, -1.2])[:B], torch.full((B,), 0.28), torch.zeros(B))
    return logp, ent, replace(mb, old_logp=old)


# ------------------------------------------------------------------ mask_truncated
def test_loss_mask_zeroes_the_truncated_rows_only():
    rm = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    got = update.loss_mask(rm, torch.tensor([False, True, False]))
    assert got.dtype == torch.float32 and got.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert update.loss_mask(rm, None).tolist() == rm.float().tolist()


@pytest.mark.parametrize("agg", AGG_MODES)
def test_masked_rows_are_as_if_removed(agg):
    # a row of the update mask zeroed (algo.mask_truncated) is in no term and no normaliser: the
    # loss is the loss of the batch without that row, and the row gets no gradient
    logp, ent, mb = _batch()
    cut = torch.tensor([False, True, False, False])
    s = LossSettings(agg=agg, kl_coef=0.1, entropy_coef=0.01)
    mb = replace(mb, mask=update.loss_mask(mb.mask, cut), ref_logp=mb.old_logp - 0.1)
    total, _, _ = micro_batch_loss(logp, ent, mb, s, None)
    total.backward()
    assert logp.grad[1].abs().sum() == 0 and logp.grad[0].abs().sum() > 0
    keep = torch.tensor([0, 2, 3])
    logp2 = logp.detach()[keep].requires_grad_(True)
    ref, _, _ = micro_batch_loss(logp2, ent[keep], mb.rows(keep, mb.old_logp[keep]), s, None)
    ref.backward()
    assert total.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(logp.grad[keep], logp2.grad)


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("split", [False, True])
def test_every_row_masked_is_a_zero_loss_not_nan(loss, agg, split):
    logp, ent, mb = _batch()
    mb = replace(mb, mask=update.loss_mask(mb.mask, torch.ones(4, dtype=torch.bool)))
    norms = update.minibatch_norms(mb.mask, mb.mask.shape[1], split=split)
    s = LossSettings(loss=loss, agg=agg, entropy_coef=0.01, top_entropy_quantile=0.5)
    total, metrics, _ = micro_batch_loss(logp, ent, mb, s, norms)
    total.backward()
    assert total.item() == 0.0 and logp.grad.abs().sum() == 0
    assert all(torch.isfinite(v) for v in metrics.values())


# ------------------------------------------------------------------ top_entropy_quantile
def test_top_entropy_quantile_weights_the_surrogate_normalised_by_every_token():
    logp, ent, mb = _batch()
    s = LossSettings(top_entropy_quantile=0.5, kl_coef=0.1)
    mb = replace(mb, ref_logp=mb.old_logp - 0.1)
    total, metrics, _ = micro_batch_loss(logp, ent, mb, s, None)
    keep = high_entropy_mask(ent, mb.mask, 0.5)
    bounds = ClipBounds(0.2, mb.eps_high)
    # TRL: per_token_loss * entropy_mask, summed over the response mask / its token count
    want, _ = policy_loss(logp, mb.old_logp, mb.advantages, mb.mask, bounds, weights=keep.float())
    assert metrics["loss/policy"].item() == pytest.approx(want.item(), rel=1e-6)
    assert metrics["loss/entropy_mask_frac"].item() == pytest.approx(keep.sum().item() / mb.mask.sum().item())
    total.backward()
    dropped = mb.mask.bool() & ~keep
    # the dropped tokens' gradient is the KL term's alone (it keeps every response token)
    kl_only = logp.detach().requires_grad_(True)
    (0.1 * update.agg_loss(update.kl_estimate(kl_only, mb.ref_logp, "k3"), mb.mask)).backward()
    torch.testing.assert_close(logp.grad[dropped], kl_only.grad[dropped])


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_top_entropy_quantile_leaves_the_dropped_tokens_no_gradient_under_every_loss(loss):
    logp, ent, mb = _batch()
    total, metrics, _ = micro_batch_loss(logp, ent, mb, LossSettings(loss=loss, top_entropy_quantile=0.3), None)
    total.backward()
    dropped = mb.mask.bool() & ~high_entropy_mask(ent, mb.mask, 0.3)
    assert dropped.any() and torch.isfinite(total)
    assert logp.grad[dropped].abs().sum() == 0 and logp.grad[~dropped & mb.mask.bool()].abs().sum() > 0


def test_top_entropy_quantile_one_is_the_unmasked_loss():
    logp, ent, mb = _batch()
    a, ma, _ = micro_batch_loss(logp, ent, mb, LossSettings(top_entropy_quantile=1.0), None)
    b, mb_, _ = micro_batch_loss(logp, ent, mb, LossSettings(), None)
    assert torch.equal(a, b) and "loss/entropy_mask_frac" not in ma and ma.keys() == mb_.keys()


# ------------------------------------------------------------------ overlong
def test_advantage_rewards_add_dapos_term_and_widen_a_fixed_range():
    rewards, lengths = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([3, 8, 10, 6])
    algo = SimpleNamespace(overlong_buffer=4, overlong_penalty=0.5, reward_range=(0.0, 1.0))
    shaped, rr, term = update.advantage_rewards(rewards, lengths, algo, 10)
    assert term.tolist() == [0.0, -0.25, -0.5, 0.0] and shaped.tolist() == [1.0, -0.25, 0.5, 0.0]
    assert rr == (-0.5, 1.0)
    _, rr, _ = update.advantage_rewards(rewards, lengths, replace_ns(algo, reward_range="group"), 10)
    assert rr == "group"
    same, rr, term = update.advantage_rewards(rewards, lengths, replace_ns(algo, overlong_buffer=0), 10)
    assert same is rewards and rr == (0.0, 1.0) and term is None


def replace_ns(ns, **kw):
    return SimpleNamespace(**{**vars(ns), **kw})


def test_check_overlong_names_the_key():
    algo = SimpleNamespace(overlong_buffer=10)
    update.check_overlong(algo, 11)
    update.check_overlong(SimpleNamespace(overlong_buffer=0), 1)
    with pytest.raises(ValueError, match=r"algo.overlong_buffer \(run.yaml:3\): 10 must be below the completion cap"):
        update.check_overlong(algo, 10, key="algo.overlong_buffer (run.yaml:3)")


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algo.top_entropy_quantile=0"], r"algo.top_entropy_quantile \(command line\): .*> 0"),
        (["algo.top_entropy_quantile=1.5"], r"algo.top_entropy_quantile .*<= 1"),
        (["algo.overlong_buffer=-1"], r"algo.overlong_buffer .*>= 0"),
        (["algo.overlong_buffer=2.5"], r"algo.overlong_buffer"),
        (["algo.overlong_penalty=-1"], r"algo.overlong_penalty .*>= 0"),
        (["algo.overlong_buffer=16", "sampling.max_new_tokens=16"], r"algo.overlong_buffer .*below .*=16"),
        (["algo.overlong_buffer=4", "algo.advantage=passk"], r"algo.overlong_buffer .*passk"),
        (["algo.mask_truncated=maybe"], r"algo.mask_truncated"),
    ],
)
def test_config_errors_name_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_trl_names_map_to_the_new_keys():
    for trl_name, key in (("mask_truncated_completions", "mask_truncated"), ("top_entropy_quantile",) * 2):
        with pytest.raises(ValueError, match=rf"Did you mean algo.{key}\?"):
            load_config(None, [f"algo.{trl_name}=1"] if trl_name != key else [f"train.{trl_name}=0.5"])


# ------------------------------------------------------------------ in a run
def _cfg(policy, *extra):
    return load_config(
        None,
        [
            f"model.path={policy}",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=64",
            "train.prompts=4",
            "train.group_size=4",
            "train.mini_batches=1",
            "train.steps=1",
            "train.progress=false",
            "train.checkpoint_every=0",
            "eval.problems=0",
            *extra,
        ],
    )


def _spied(tr, seen):
    """The trainer ``tr`` with its batch, update batch and advantage inputs recorded in ``seen``."""
    rollout_, update_ = tr._rollout, tr._update
    tr._rollout = lambda: seen.setdefault("batch", rollout_())
    tr._update = lambda ub, old, perm0: (seen.setdefault("ub", ub), update_(ub, old, perm0))[1]
    return tr


def _spy(fn, calls: list):
    """``fn``, recording each call's rewards (its second argument) and keyword arguments."""

    def spy(name, rewards, group_size, **kw):
        calls.append((rewards, kw))
        return fn(name, rewards, group_size, **kw)

    return spy


def _record(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]


def test_the_options_in_a_run(easy_policy, tmp_path, monkeypatch):
    from gapo.rl import trainer as trainer_mod
    from gapo.rl import update as update_mod
    from gapo.rl.step_metrics import truncated

    cap, buf, pen = 6, 3, 0.5  # the policy writes 6 or 7 tokens (EOS included): 7 is cut at 6
    extra = [f"sampling.max_new_tokens={cap}", "algo.mask_truncated=true", f"algo.overlong_buffer={buf}"]
    extra += [f"algo.overlong_penalty={pen}", "algo.top_entropy_quantile=0.5"]
    seen: dict = {}
    adv_in, eps_in = [], []
    monkeypatch.setattr(trainer_mod, "compute_advantages", _spy(trainer_mod.compute_advantages, adv_in))
    monkeypatch.setattr(update_mod, "eps_high_for", _spy(update_mod.eps_high_for, eps_in))
    tr = _spied(trainer_mod.Trainer(_cfg(easy_policy, *extra), tmp_path / "r"), seen)
    tr.fit()
    rec, batch, ub = _record(tmp_path / "r"), seen["batch"], seen["ub"]
    ro = batch.rollout
    # mask_truncated: exactly the rows rollout/frac_truncated counts leave the update's mask
    cut = truncated(ro, cap, tr.tok)
    assert 0 < cut.sum() < cut.numel(), "the test needs some rows truncated and some not"
    assert rec["rollout/frac_truncated"] == pytest.approx(cut.float().mean().item())
    assert ub.mask[cut].sum() == 0 and torch.equal(ub.mask[~cut], ro.response_mask[~cut].float())
    # overlong: the advantages saw R + R_length over the widened range; ε_high and c the task's R
    term = overlong_penalty(ro.lengths, cap, buf, pen)
    ((shaped, kw),) = adv_in
    assert (term < 0).any()
    torch.testing.assert_close(shaped.cpu(), batch.rewards + term)
    assert kw["reward_range"] == (0.0 - pen, 1.0)
    assert torch.equal(eps_in[0][0].cpu(), batch.rewards)
    assert rec["reward/overlong_penalty"] == pytest.approx(term.mean().item())
    assert rec["rollout/reward"] == pytest.approx(batch.rewards.mean().item())
    # top_entropy_quantile: about half of the (kept) response tokens are in the surrogate
    assert 0.5 <= rec["loss/entropy_mask_frac"] < 0.6


def test_every_row_truncated_trains_nothing_and_logs_no_nan(easy_policy, tmp_path):
    from gapo.rl.trainer import Trainer

    tr = Trainer(_cfg(easy_policy, "sampling.max_new_tokens=1", "algo.mask_truncated=true"), tmp_path / "r")
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.fit()
    rec = _record(tmp_path / "r")
    assert rec["rollout/frac_truncated"] == 1.0
    assert all(v == v for v in rec.values() if isinstance(v, float)), rec
    assert rec["loss/total"] == 0.0 and rec["optim/grad_norm"] == 0.0
    # no loss token: a zero gradient, and AdamW's first step of a zero gradient moves nothing
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())


def test_a_buffer_over_the_tasks_own_cap_is_refused_before_the_run(easy_policy, tmp_path):
    from gapo.rl.trainer import Trainer

    cap = r"algo.overlong_buffer \(command line\): 100000 must be below the completion cap, 14 tokens"
    with pytest.raises(ValueError, match=cap):
        Trainer(_cfg(easy_policy, "algo.overlong_buffer=100000"), tmp_path / "r")
    assert not (tmp_path / "r").exists()
