"""The verl adapter (gapo.integrations.verl) against the installed verl, on CPU.

Losses are fetched from verl's registry with ``get_policy_loss_fn`` and called with verl's own
config objects, as verl's actor (``verl.workers.utils.losses.ppo_loss``) calls them.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import (  # noqa: E402
    POLICY_LOSS_REGISTRY,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_policy_loss_fn,
)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.metric import Metric, reduce_metrics  # noqa: E402
from verl.utils.py_functional import append_to_dict  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import gapo.integrations.verl as gv  # noqa: E402
from gapo.core.advantages import success_count  # noqa: E402
from gapo.core.clipping import gapo_eps_high, success_weight  # noqa: E402
from gapo.core.metrics import clip_stats_by_c, ratio_adv_pairs  # noqa: E402
from gapo.core.surrogate import log_ratio  # noqa: E402
from gapo.integrations.verl import GAPOPolicyLossConfig  # noqa: E402
from gapo.integrations.verl_metrics import clip_stats_from_verl  # noqa: E402
from gapo.integrations.verl_success import (  # noqa: E402
    row_advantages,
    success_from_advantages,
    success_weight_from_advantages,
)

VERL_AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
TOL = 1e-6


def actor(G=8, low=0.2, high=0.2, agg="token-mean", policy_loss=None, **kw):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=G,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        loss_agg_mode=agg,
        policy_loss=policy_loss or PolicyLossConfig(),
        **kw,
    )


def group_batch(seed, G=8, prompts=4, T=16, noise=0.3, rewards=None, estimator="drgrpo"):
    """Binary-reward groups, advantages from verl's own estimator, ragged response masks."""
    g = torch.Generator().manual_seed(seed)
    B = G * prompts
    if rewards is None:
        rewards = (torch.rand(B, generator=g) < 0.4).float()
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), lengths - 1] = rewards  # verl puts the outcome on the last token
    index = np.repeat(np.arange(prompts), G)
    if estimator == "rloo":
        adv, _ = compute_rloo_outcome_advantage(token_rewards, mask.float(), index)
    elif estimator == "rloo_vectorized":
        adv, _ = compute_rloo_vectorized_outcome_advantage(token_rewards, mask.float(), index)
    elif estimator == "grpo_vectorized":
        adv, _ = compute_grpo_vectorized_outcome_advantage(token_rewards, mask.float(), index)
    else:
        adv, _ = compute_grpo_outcome_advantage(
            token_rewards, mask.float(), index, norm_adv_by_std_in_grpo=(estimator == "grpo")
        )
    old = -torch.rand(B, T, generator=g) * 3.0
    logp = old + torch.randn(B, T, generator=g) * noise
    return old, logp, adv, mask, rewards


def call(name, old, logp, adv, mask, cfg, agg=None, **kw):
    x = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=x,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg or cfg.loss_agg_mode,
        config=cfg,
        **kw,
    )
    loss.backward()
    return loss.detach(), x.grad, metrics


def assert_same(a, b, keys=("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")):
    assert abs(a[0].item() - b[0].item()) <= TOL, (a[0].item(), b[0].item())
    assert (a[1] - b[1]).abs().max().item() <= TOL
    for k in keys:
        assert abs(a[2][k] - b[2][k]) <= TOL, (k, a[2][k], b[2][k])


# ---------------------------------------------------------------------------------------------
# registration and loading


def test_registered_under_verl_names():
    assert POLICY_LOSS_REGISTRY["gapo"] is gv.compute_policy_loss_gapo
    assert POLICY_LOSS_REGISTRY["gapo_seq"] is gv.compute_policy_loss_gapo_seq


def test_entry_point_declared():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert eps.get("gapo") == "gapo.integrations.verl"


# `import verl` in fresh processes (entry point, VERL_USE_EXTERNAL_MODULES, a failing import):
# tests/integrations/test_verl_config.py::test_loading_in_fresh_processes, next to the documented
# scripts' start-up, whose fresh processes it shares an interpreter's imports with


def test_unsupported_verl_version_is_an_import_error(monkeypatch):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.8.3")
    with pytest.raises(ImportError, match=r"verl>=0\.9\.1,<0\.10.*found verl 0\.8\.3"):
        gv._require_supported_verl()
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(ImportError, match=r"supports verl>=0\.9\.1,<0\.10"):
        gv._require_supported_verl()
    # not a version (InvalidVersion) or not a string (TypeError): unsupported, not a crash
    for version in ("unknown", None):
        monkeypatch.setattr(verl, "__version__", version)
        with pytest.raises(ImportError, match=rf"found verl {version}\."):
            gv._require_supported_verl()
    monkeypatch.delattr(verl, "__version__")
    with pytest.raises(ImportError, match=r"found verl unknown\."):
        gv._require_supported_verl()


def test_failed_load_registers_loud_stubs(monkeypatch, caplog):
    monkeypatch.delitem(POLICY_LOSS_REGISTRY, "gapo")
    monkeypatch.delitem(POLICY_LOSS_REGISTRY, "gapo_seq")
    with caplog.at_level(logging.ERROR, logger="gapo.integrations.verl"):
        gv._announce_failure(ImportError("boom"))
    assert "failed to load" in caplog.text and "boom" in caplog.text
    with pytest.raises(RuntimeError, match="boom"):
        get_policy_loss_fn("gapo_seq")()


# the documented launch commands: tests/test_verl_config.py


# ---------------------------------------------------------------------------------------------
# equal to verl's own losses when GAPO's range is empty


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
@pytest.mark.parametrize("schedule", ["linear", "log"])
def test_gapo_with_eps_high_max_eq_eps_low_equals_vanilla(agg, schedule):
    old, logp, adv, mask, _ = group_batch(1)
    logp[:6, :3] += 1.5  # dual clip (ratio > 3, A < 0) gets exercised too
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.2, eps_schedule=schedule)
    ours = call("gapo", old, logp, adv, mask, actor(agg=agg, policy_loss=pl))
    ref = call("vanilla", old, logp, adv, mask, actor(agg=agg))
    assert_same(ours, ref)
    assert ref[2]["actor/pg_clipfrac"] > 0.05 and ref[2]["actor/pg_clipfrac_lower"] > 0
    assert abs(ours[2]["actor/gapo_eps_high_mean"] - 0.2) < TOL


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
def test_gapo_seq_with_eps_high_max_eq_eps_low_equals_gspo(agg):
    old, logp, adv, mask, _ = group_batch(2, noise=0.02)
    pl = GAPOPolicyLossConfig(loss_mode="gapo_seq", eps_high_max=3e-3)
    ours = call("gapo_seq", old, logp, adv, mask, actor(low=3e-3, high=3e-3, agg=agg, policy_loss=pl))
    ref = call("gspo", old, logp, adv, mask, actor(low=3e-3, high=3e-3, agg=agg))
    assert_same(ours, ref)
    assert 0.1 < ref[2]["actor/pg_clipfrac"] < 0.9


def test_global_batch_info_is_honoured_like_verl():
    """verl's actor sets dp_size / global counts before each call; the loss must scale like vanilla."""
    old, logp, adv, mask, _ = group_batch(3)
    info = {"dp_size": 4, "batch_num_tokens": 1234, "global_batch_size": 96, "loss_scale_factor": 512}
    for agg in VERL_AGG_MODES:
        pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.2)
        cfg_ours, cfg_ref = actor(agg=agg, policy_loss=pl), actor(agg=agg)
        cfg_ours.global_batch_info.update(info)
        cfg_ref.global_batch_info.update(info)
        assert_same(call("gapo", old, logp, adv, mask, cfg_ours), call("vanilla", old, logp, adv, mask, cfg_ref))


def test_plain_policy_loss_config_uses_documented_defaults():
    """loss_mode=gapo with none of GAPO's keys set: ε_high_max = clip_ratio_high, Dr.GRPO, rewards in [0, 1]."""
    G = 4
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])  # c = 1 and c = 2
    old, logp, adv, mask, _ = group_batch(4, G=G, prompts=2, rewards=rewards)
    _, _, m = call(
        "gapo", old, logp, adv, mask, actor(G=G, low=0.2, high=0.28, policy_loss=PolicyLossConfig(loss_mode="gapo"))
    )
    # w: c=1 correct → 1; c=2 correct → 2/3 (×2 rows); others 0 → ε = 0.2 + 0.08·w
    expected = 0.2 + 0.08 * (1 + 2 / 3 + 2 / 3) / 8
    assert abs(m["actor/gapo_eps_high_mean"] - expected) < 1e-6


# ---------------------------------------------------------------------------------------------
# GAPO's ε from the advantages verl computes


def test_eps_hand_computed_binary_group():
    """G = 4. Group A [1,0,0,0]: c = 1, the correct rollout has w = (4−1)/(4−1) = 1 → ε = 0.28.
    Group B [1,1,0,0]: c = 2, w = (4−2)/3 = 2/3 → ε = 0.2 + 0.08·2/3 = 0.25333.
    Group C [1,1,1,1]: A = 0 → ε_low. Incorrect rollouts → ε_low.
    Ratios 1.26 on every token: inside 1 + 0.28 (gradient flows) but outside 1 + 0.2533 (clipped,
    no gradient) — so the per-row ε is visible in the gradient verl would back-propagate."""
    G = 4
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    adv_row = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0])
    B, T = 12, 5
    mask = torch.ones(B, T, dtype=torch.bool)
    adv = adv_row[:, None].expand(B, T).contiguous()
    old = torch.full((B, T), -2.0)
    logp = old + torch.log(torch.tensor(1.26))
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.28)
    loss, grad, m = call("gapo", old, logp, adv, mask, actor(G=G, low=0.2, high=0.2, policy_loss=pl))

    w = success_weight_from_advantages(adv_row, G)
    assert torch.allclose(w, torch.tensor([1.0, 0, 0, 0, 2 / 3, 2 / 3, 0, 0, 0, 0, 0, 0]), atol=1e-6)
    assert torch.allclose(w, success_weight(rewards, G), atol=1e-6)
    assert abs(m["actor/gapo_eps_high_mean"] - (0.28 + 2 * 0.25333333 + 9 * 0.2) / 12) < 1e-6
    assert (grad[0] != 0).all()  # ρ = 1.26 < 1.28: unclipped
    assert (grad[4:6] == 0).all()  # ρ = 1.26 > 1.2533: clipped
    assert (grad[1:4] != 0).all() and (grad[8:] == 0).all()  # A < 0 unclipped above; A = 0 no gradient
    # tokens of rows 4, 5 are clipped; nothing else is (A < 0 rows: ρ > 1 − ε_low)
    assert abs(m["actor/pg_clipfrac"] - 2 / 12) < 1e-6
    assert abs(m["actor/gapo_clipfrac_high"] - 2 / 12) < 1e-6


@pytest.mark.parametrize(
    "estimator,norm",
    [("drgrpo", False), ("grpo", True), ("rloo", False), ("grpo_vectorized", True), ("rloo_vectorized", False)],
)
@pytest.mark.parametrize("G", [2, 5, 8, 16])
def test_success_weight_recovered_from_verl_advantages_in_any_row_order(estimator, norm, G):
    """Advantages from verl's own estimators, rows shuffled as in a verl micro-batch: the weight of
    every row equals ``gapo.core.clipping.success_weight`` on the raw rewards."""
    prompts = 40
    g = torch.Generator().manual_seed(G)
    rewards = (torch.rand(G * prompts, generator=g) < torch.rand(prompts, generator=g).repeat_interleave(G)).float()
    _, _, adv, mask, _ = group_batch(G, G=G, prompts=prompts, rewards=rewards, estimator=estimator)
    perm = torch.randperm(G * prompts, generator=g)
    est = "grpo" if estimator == "drgrpo" else estimator
    w = success_weight_from_advantages(
        row_advantages(adv[perm], mask[perm]), G, adv_estimator=est, norm_adv_by_std_in_grpo=norm
    )
    assert torch.allclose(w, success_weight(rewards, G)[perm], atol=1e-5)
    # ε of a row equals the core's gapo_eps_high on the full group, for both schedules
    for schedule in ("linear", "log"):
        pl = GAPOPolicyLossConfig(
            loss_mode="gapo", eps_high_max=0.28, eps_schedule=schedule, adv_estimator=est, norm_adv_by_std_in_grpo=norm
        )
        ref = gapo_eps_high(rewards, G, eps_low=0.2, eps_high_max=0.28, eps_schedule=schedule)[perm]
        for mb in range(0, 12, 3):  # micro-batches of three shuffled rows
            rows = slice(mb, mb + 3)
            _, _, m = call(
                "gapo",
                torch.zeros(3, mask.shape[1]),
                torch.zeros(3, mask.shape[1]),
                adv[perm][rows],
                mask[perm][rows],
                actor(G=G, policy_loss=pl),
            )
            assert abs(m["actor/gapo_eps_high_mean"] - ref[rows].mean().item()) < 1e-5


def test_non_binary_rewards_with_drgrpo():
    G = 4
    rewards = torch.tensor([0.5, 0.25, 0.0, 1.0, -1.0, 1.0, 0.0, 0.0])
    _, _, adv, mask, _ = group_batch(0, G=G, prompts=2, rewards=rewards)
    a = row_advantages(adv, mask)
    w = success_weight_from_advantages(a, G, reward_range=(-1.0, 1.0), binary_rewards=False)
    assert torch.allclose(w, success_weight(rewards, G, reward_range=(-1.0, 1.0)), atol=1e-6)
    with pytest.raises(ValueError, match="binary rewards"):
        success_weight_from_advantages(a, G, reward_range=(-1.0, 1.0))


def test_success_count_recovered_from_advantages():
    """c of every row's group, from all three invertible estimators; −1 for zero-advantage rows."""
    G = 4
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1])  # c = 1, 2, 3, 4
    expected = torch.tensor([1] * 4 + [2] * 4 + [3] * 4 + [-1] * 4)
    for estimator, norm in (("drgrpo", False), ("grpo", True), ("rloo", False)):
        _, _, adv, mask, _ = group_batch(0, G=G, prompts=4, rewards=rewards, estimator=estimator)
        est = "grpo" if estimator == "drgrpo" else estimator
        w, c = success_from_advantages(row_advantages(adv, mask), G, adv_estimator=est, norm_adv_by_std_in_grpo=norm)
        assert torch.equal(c, expected), (estimator, c)
        assert torch.allclose(w, success_weight(rewards, G), atol=1e-5)
    assert success_from_advantages(row_advantages(adv, mask), G, adv_estimator="rloo", binary_rewards=False)[1] is None


# ---------------------------------------------------------------------------------------------
# per-success-count metrics


BY_C_KEYS = (
    "actor/gapo_tokens_by_c",
    "actor/gapo_ratio_dev_sum_by_c",
    "actor/gapo_tokens_pos_by_c",
    "actor/gapo_clipped_high_by_c",
    "actor/gapo_eps_high_pos_by_c",
    "actor/gapo_ratio_dev_pos_sum_by_c",
    "actor/gapo_rows_pos_by_c",
    "actor/gapo_adv_pos_sum_by_c",
)


def test_metrics_by_c_hand_computed():
    """G = 4, ε_low = 0.2, ε_high_max = 0.28, T = 2, token ratios set per row.
    Group A [1,0,0,0], c = 1: correct row ε = 0.28, ratios (1.26, 1.30): 1.30 > 1.28 clipped;
      incorrect rows ratio 0.9 (row 3 has one token). Tokens 2+2+2+1 = 7;
      Σ|ρ−1| = 0.26 + 0.30 + 5·0.1 = 1.06; positive tokens 2, clipped 1.
    Group B [1,1,0,0], c = 2: correct rows ε = 0.2 + 0.08·2/3 = 0.25333; row 4 (1.26, 1.26): both
      clipped; row 5 (1.10, 1.20): neither; incorrect rows ratio 1. Tokens 8;
      Σ|ρ−1| = 0.52 + 0.10 + 0.20 = 0.82; positive tokens 4, clipped 2.
    Group C [1,1,1,1]: A = 0 (c is 0 or 4, unknowable): ratio 2 everywhere, in no bucket.
    Bucket c = 3 is empty: zeros; its ε_high = 0.2 + 0.08·1/3."""
    G = 4
    adv_row = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0])
    ratio = torch.tensor(
        [[1.26, 1.30], [0.9, 0.9], [0.9, 0.9], [0.9, 0.9], [1.26, 1.26], [1.10, 1.20], [1.0, 1.0], [1.0, 1.0]]
        + [[2.0, 2.0]] * 4
    )
    mask = torch.ones(12, 2, dtype=torch.bool)
    mask[3, 1] = False
    old = torch.full((12, 2), -2.0)
    logp = old + torch.log(ratio)
    adv = adv_row[:, None].expand(12, 2).contiguous()
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.28)
    _, _, m = call("gapo", old, logp, adv, mask, actor(G=G, low=0.2, high=0.2, policy_loss=pl))
    # positive-advantage rows alone: c = 1 Σ|ρ−1| = 0.26 + 0.30, 1 row, ΣA = 0.75;
    # c = 2 Σ|ρ−1| = 0.52 + 0.30 = 0.82, 2 rows, ΣA = 1.0
    expected = {
        1: (7, 1.06, 2, 1, 0.28, 0.56, 1, 0.75),
        2: (8, 0.82, 4, 2, 0.2 + 0.08 * 2 / 3, 0.82, 2, 1.0),
        3: (0, 0, 0, 0, 0.2 + 0.08 / 3, 0, 0, 0),
    }
    for c, values in expected.items():
        for key, v in zip(BY_C_KEYS, values):
            assert abs(m[f"{key}/{c}"] - v) < 1e-5, (key, c, m[f"{key}/{c}"], v)
    assert not any(k.endswith(("/0", "/4")) for k in m)
    # the rates they give are gapo.core.metrics' own (c from the raw rewards, zero-advantage groups left out)
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    rows = slice(0, 8)
    ref = clip_stats_by_c(
        ratio[rows],
        adv_row[rows],
        mask[rows],
        success_count(rewards, G)[rows],
        eps_low=0.2,
        eps_high=gapo_eps_high(rewards, G, eps_low=0.2, eps_high_max=0.28)[rows],
    )
    for c in (1, 2):
        assert (
            abs(
                m[f"actor/gapo_clipped_high_by_c/{c}"] / m[f"actor/gapo_tokens_pos_by_c/{c}"]
                - ref[f"clip/frac_high_by_c/{c}"]
            )
            < 1e-6
        )
        assert (
            abs(
                m[f"actor/gapo_ratio_dev_sum_by_c/{c}"] / m[f"actor/gapo_tokens_by_c/{c}"]
                - ref[f"clip/ratio_dev_by_c/{c}"]
            )
            < 1e-6
        )
        assert abs(m[f"actor/gapo_eps_high_pos_by_c/{c}"] - ref[f"clip/eps_high_pos_by_c/{c}"]) < 1e-6
    # clip_stats_from_verl turns the logged sums into gapo's own per-c rates, so the
    # ratio-advantage correlation reads verl runs as it reads gapo's
    conv = clip_stats_from_verl(m)
    for key in ("frac_high_by_c", "ratio_dev_by_c", "ratio_dev_pos_by_c", "adv_pos_by_c", "eps_high_pos_by_c"):
        for c in (1, 2):
            assert abs(conv[f"clip/{key}/{c}"] - ref[f"clip/{key}/{c}"]) < 1e-6, (key, c)
    assert not any(k.endswith("/3") for k in conv if "pos" in k or "frac_high" in k)  # empty bucket left out
    for got, want in zip(sorted(ratio_adv_pairs(conv)), sorted(ratio_adv_pairs(ref)), strict=True):
        assert got == pytest.approx(want)
    # docs/scale-out.md's recipe for the windowed correlation from verl's logs runs as written
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scale-out.md").read_text()
    block = next(
        b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "clip_stats_from_verl(step_metrics)" in b
    )
    printed = []
    exec(compile(block, "docs/scale-out.md", "exec"), {"logged_steps": [m, m], "print": printed.append})
    # two buckets a step, (0.28, 0.75) and (0.205, 0.5): undefined on 2 points, r = +1 on 4
    assert printed[0] is None and printed[1] == pytest.approx(1.0)
    # gapo_seq counts the same tokens against the sequence ratio s = exp(mean log ρ): row 0
    # s = sqrt(1.26·1.30) = 1.27984 < 1.28 (unclipped), row 4 s = 1.26 > 1.2533 (2 tokens clipped),
    # row 5 s = sqrt(1.10·1.20) = 1.14891; Σ|s−1| of c = 1: 2·0.27984 + 5·0.1 = 1.05968
    pl = GAPOPolicyLossConfig(loss_mode="gapo_seq", eps_high_max=0.28)
    _, _, m = call("gapo_seq", old, logp, adv, mask, actor(G=G, low=0.2, high=0.2, policy_loss=pl))
    expected = {1: (7, 1.05968, 2, 0), 2: (8, 2 * 0.26 + 2 * 0.14891, 4, 2)}
    for c, values in expected.items():
        for key, v in zip(BY_C_KEYS, values):
            assert abs(m[f"{key}/{c}"] - v) < 1e-4, (key, c, m[f"{key}/{c}"], v)


def test_metrics_by_c_absent_for_non_binary_rewards():
    G = 4
    rewards = torch.tensor([0.5, 0.25, 0.0, 1.0, -1.0, 1.0, 0.0, 0.0])
    old, logp, adv, mask, _ = group_batch(0, G=G, prompts=2, rewards=rewards)
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.28, reward_min=-1.0, binary_rewards=False)
    _, _, m = call("gapo", old, logp, adv, mask, actor(G=G, policy_loss=pl))
    assert "actor/gapo_eps_high_mean" in m and not any("_by_c/" in k for k in m)
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.28)  # binary: present for c = 1 .. G−1
    _, _, m = call("gapo", old, logp, *group_batch(0, G=G, prompts=2)[2:4], actor(G=G, policy_loss=pl))
    assert sorted(k for k in m if "_by_c/" in k) == sorted(f"{k}/{c}" for k in BY_C_KEYS for c in (1, 2, 3))


def verl_ppo_loss(cfg, old, logp, adv, mask, *, dp_size, batch_num_tokens, global_batch_size):
    """verl's own actor loss (``verl.workers.utils.losses.ppo_loss``) on one micro-batch: log-probs
    as the model returns them (flat over prompt + response, one position early), a 1-token prompt."""
    B, T = mask.shape
    lens = mask.sum(-1).tolist()
    flat = torch.cat([torch.cat([logp[i, :n], torch.zeros(1)]) for i, n in enumerate(lens)])
    data = TensorDict(
        {
            "prompts": torch.zeros(B, 1, dtype=torch.long),
            "responses": torch.zeros(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, 1, dtype=torch.long), mask.long()], 1),
            "response_mask": mask.float(),
            "old_log_probs": old,
            "advantages": adv,
        },
        batch_size=[B],
    )
    tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    return ppo_loss(cfg, {"log_probs": flat}, data)[1]


@pytest.mark.parametrize("name", ["gapo", "gapo_seq"])
def test_metrics_by_c_survive_verl_aggregation_and_pool_exactly(name):
    """Through verl's ppo_loss and the reductions of its actor update (micro-batches → dp ranks →
    mini-batches → reduce_metrics): every per-c key has one value per micro-batch on every rank
    (verl's Metric.aggregate_dp raises otherwise), and the ratios of the logged means equal
    gapo.core.metrics' pooled rates over the whole batch."""
    G, prompts, ranks, mini, micro = 8, 6, 2, 2, 3  # 48 rows: 2 mini-batches × 2 ranks × 3 micro-batches × 4
    old, logp, adv, mask, rewards = group_batch(11, G=G, prompts=prompts, noise=0.3 if name == "gapo" else 0.6)
    perm = torch.randperm(G * prompts, generator=torch.Generator().manual_seed(0))
    pl = GAPOPolicyLossConfig(loss_mode=name, eps_high_max=0.28)
    cfg = actor(G=G, policy_loss=pl)
    step: dict = {}
    for mb_rows in perm.view(mini, -1):
        per_rank = []
        for rank_rows in mb_rows.view(ranks, -1):
            rank_metrics: dict = {}
            for rows in rank_rows.view(micro, -1):
                m = verl_ppo_loss(
                    cfg,
                    old[rows],
                    logp[rows],
                    adv[rows],
                    mask[rows],
                    dp_size=ranks,
                    batch_num_tokens=int(mask[mb_rows].sum()),
                    global_batch_size=len(mb_rows),
                )
                append_to_dict(rank_metrics, m)
            per_rank.append(rank_metrics)
        gathered = {k: [r[k] for r in per_rank] for k in per_rank[0]}  # allgather_dict_into_dict
        append_to_dict(step, {k: Metric.aggregate_dp(v) for k, v in gathered.items()})
    logged = reduce_metrics(step)

    known = (rewards.view(-1, G).sum(1) % G != 0).repeat_interleave(G)  # groups with 0 < c < G
    level = "token" if name == "gapo" else "sequence"
    ratio = torch.exp(log_ratio(logp, old, mask, level))
    ref = clip_stats_by_c(
        ratio[known],
        adv[known, 0],
        mask[known],
        success_count(rewards, G)[known],
        eps_low=0.2,
        eps_high=gapo_eps_high(rewards, G, eps_low=0.2, eps_high_max=0.28)[known],
    )
    checked = 0
    for c in range(1, G):
        if f"clip/ratio_dev_by_c/{c}" not in ref:
            assert logged[f"actor/gapo_tokens_by_c/{c}"] == 0
            continue
        assert (
            abs(
                logged[f"actor/gapo_ratio_dev_sum_by_c/{c}"] / logged[f"actor/gapo_tokens_by_c/{c}"]
                - ref[f"clip/ratio_dev_by_c/{c}"]
            )
            < 1e-6
        )
        if f"clip/frac_high_by_c/{c}" in ref:
            assert (
                abs(
                    logged[f"actor/gapo_clipped_high_by_c/{c}"] / logged[f"actor/gapo_tokens_pos_by_c/{c}"]
                    - ref[f"clip/frac_high_by_c/{c}"]
                )
                < 1e-6
            )
            assert abs(logged[f"actor/gapo_eps_high_pos_by_c/{c}"] - ref[f"clip/eps_high_pos_by_c/{c}"]) < 1e-6
            checked += ref[f"clip/frac_high_by_c/{c}"] > 0
    assert checked >= 2  # several buckets with clipping, so the comparison means something


# ---------------------------------------------------------------------------------------------
# configurations where ε would be wrong are rejected


def test_std_normalised_advantages_under_drgrpo_config_are_rejected():
    _, _, adv, mask, _ = group_batch(5, estimator="grpo")
    old = torch.zeros_like(adv)
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        call("gapo", old, old, adv, mask, actor(policy_loss=GAPOPolicyLossConfig(eps_high_max=0.28)))


def test_drgrpo_advantages_under_std_config_are_rejected():
    _, _, adv, mask, _ = group_batch(5, estimator="drgrpo")
    old = torch.zeros_like(adv)
    pl = GAPOPolicyLossConfig(eps_high_max=0.28, norm_adv_by_std_in_grpo=True)
    with pytest.raises(ValueError, match="binary rewards"):
        call("gapo", old, old, adv, mask, actor(policy_loss=pl))


def test_wrong_group_size_or_reward_range_is_rejected():
    _, _, adv, mask, _ = group_batch(6, G=8)
    old = torch.zeros_like(adv)
    pl = GAPOPolicyLossConfig(eps_high_max=0.28)
    with pytest.raises(ValueError, match="G=6"):
        call("gapo", old, old, adv, mask, actor(G=6, policy_loss=pl))
    pl = GAPOPolicyLossConfig(eps_high_max=0.28, reward_min=-1.0, reward_max=1.0)
    with pytest.raises(ValueError, match="binary rewards"):
        call("gapo", old, old, adv, mask, actor(policy_loss=pl))


def test_token_varying_advantages_are_rejected():
    _, _, adv, mask, _ = group_batch(7)
    adv = adv + torch.linspace(0, 0.1, adv.shape[1]) * mask
    old = torch.zeros_like(adv)
    with pytest.raises(ValueError, match="vary across the tokens"):
        call("gapo", old, old, adv, mask, actor(policy_loss=GAPOPolicyLossConfig(eps_high_max=0.28)))


@pytest.mark.parametrize("name, ref", [("gapo", "vanilla"), ("gapo_seq", "gspo")])
def test_rollout_correction_weights_match_verl(name, ref):
    old, logp, adv, mask, _ = group_batch(8)
    w = torch.rand(adv.shape, generator=torch.Generator().manual_seed(3)) * 2
    pl = GAPOPolicyLossConfig(loss_mode=name, eps_high_max=0.2)
    ours = call(name, old, logp, adv, mask, actor(policy_loss=pl), rollout_is_weights=w)
    theirs = call(ref, old, logp, adv, mask, actor(), rollout_is_weights=w)
    assert_same(ours, theirs)
    unweighted = call(ref, old, logp, adv, mask, actor())
    assert abs(theirs[0].item() - unweighted[0].item()) > 1e-4  # the weights matter


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"loss_mode": "vanilla"}, "loss_mode must be one of"),
        ({"eps_schedule": "cubic"}, "eps_schedule must be one of"),
        ({"reward_min": 1.0, "reward_max": 1.0}, "reward_max"),
        ({"adv_estimator": "gae"}, "adv_estimator='gae'"),
        ({"norm_adv_by_std_in_grpo": True, "binary_rewards": False}, "only for binary rewards"),
        ({"eps_high_max": -0.1}, "eps_high_max must be >= 0"),
    ],
)
def test_invalid_gapo_config_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        GAPOPolicyLossConfig(**fields)


@pytest.mark.parametrize(
    "kw,pl,match",
    [
        ({"low": 0.2, "high": 0.25}, {"eps_high_max": 0.28}, "ambiguous GAPO clip range"),
        ({"low": 0.2, "high": 0.2}, {"eps_high_max": 0.1}, "eps_high_max .* >= clip_ratio_low"),
        ({"G": 1}, {"eps_high_max": 0.28}, "rollout_n"),
    ],
)
def test_invalid_actor_combinations(kw, pl, match):
    old, logp, adv, mask, _ = group_batch(9)
    with pytest.raises(ValueError, match=match):
        call("gapo", old, logp, adv, mask, actor(policy_loss=GAPOPolicyLossConfig(**pl), **kw))


# ---------------------------------------------------------------------------------------------
# reward_range "group" / "batch" (the core's option; exact in verl only where a row's advantage
# fixes w without the reward's scale)


@pytest.mark.parametrize("mode", ["group", "batch"])
@pytest.mark.parametrize("values", [(0.0, 1.0), (-1.0, 1.0), (0.0, 5.0), (-3.0, -2.5)])
@pytest.mark.parametrize("G", [4, 8])
def test_reward_range_group_batch_from_std_grpo_advantages_equals_core(mode, values, G):
    """Binary rewards with any two values: w and ε from verl's std-normalised GRPO advantages,
    rows shuffled and split into micro-batches, equal the core's reward_range="group"/"batch"
    weights computed on the raw grouped rewards (constant groups included)."""
    prompts = 24
    g = torch.Generator().manual_seed(G)
    hit = (torch.rand(G * prompts, generator=g) < torch.rand(prompts, generator=g).repeat_interleave(G)).float()
    hit[:G] = 1.0  # an all-correct group and an all-wrong one
    hit[G : 2 * G] = 0.0
    lo, hi = values
    rewards = lo + (hi - lo) * hit
    _, _, adv, mask, _ = group_batch(G, G=G, prompts=prompts, rewards=rewards, estimator="grpo")
    perm = torch.randperm(G * prompts, generator=g)
    w, c = success_from_advantages(
        row_advantages(adv[perm], mask[perm]),
        G,
        adv_estimator="grpo",
        norm_adv_by_std_in_grpo=True,
        reward_range=mode,
    )
    core = success_weight(rewards, G, reward_range=mode)
    assert torch.allclose(w, core[perm], atol=1e-5)
    known = c >= 0
    assert torch.equal(c[known], success_count(rewards, G, reward_range=mode)[perm][known])
    pl = GAPOPolicyLossConfig(loss_mode="gapo", eps_high_max=0.28, reward_range=mode, norm_adv_by_std_in_grpo=True)
    ref = gapo_eps_high(rewards, G, eps_low=0.2, eps_high_max=0.28, reward_range=mode)[perm]
    assert ref.max() > 0.2 + 1e-6  # GAPO's headroom is in use
    T = mask.shape[1]
    for mb in range(0, G * prompts, 5):
        rows = slice(mb, mb + 5)
        n = perm[rows].numel()
        _, _, m = call(
            "gapo", torch.zeros(n, T), torch.zeros(n, T), adv[perm][rows], mask[perm][rows], actor(G=G, policy_loss=pl)
        )
        assert abs(m["actor/gapo_eps_high_mean"] - ref[rows].mean().item()) < 1e-5


def test_reward_range_group_with_nonbinary_rewards_the_core_would_differ():
    """Why Dr.GRPO is rejected under "group": two groups with the same Dr.GRPO advantage of their
    best rollout but different spreads get different core weights, so one row cannot tell w."""
    G = 4
    a = torch.tensor([0.3, -0.1, -0.1, -0.1, 0.3, 0.1, -0.2, -0.2])
    rewards = a + 0.5  # group means 0.5
    w = success_weight(rewards, G, reward_range="group")
    assert abs(w[0].item() - 1.0) < 1e-6 and w[4].item() < 0.99  # same A = 0.3, different w
    with pytest.raises(ValueError, match="only each row's advantage"):
        success_from_advantages(a, G, reward_range="group", binary_rewards=False)


@pytest.mark.parametrize(
    "fields",
    [
        {"reward_range": "group"},  # Dr.GRPO
        {"reward_range": "batch", "adv_estimator": "rloo"},
        {"reward_range": "group", "adv_estimator": "rloo", "norm_adv_by_std_in_grpo": True},  # rloo has no std
        {"reward_range": "batch", "binary_rewards": False},
    ],
)
def test_reward_range_group_batch_rejected_where_not_recoverable(fields):
    with pytest.raises(ValueError, match="verl's policy loss is given only each row's advantage"):
        GAPOPolicyLossConfig(loss_mode="gapo", **fields)


def test_reward_range_fixed_spelling_and_errors():
    G = 4
    rewards = torch.tensor([1.0, -1, -1, -1, 1, 1, -1, -1])
    old, logp, adv, mask, _ = group_batch(5, G=G, prompts=2, rewards=rewards)
    a = call(
        "gapo", old, logp, adv, mask, actor(G=G, high=0.28, policy_loss=GAPOPolicyLossConfig(reward_range=[-1, 1]))
    )
    b = call(
        "gapo",
        old,
        logp,
        adv,
        mask,
        actor(G=G, high=0.28, policy_loss=GAPOPolicyLossConfig(reward_min=-1.0, reward_max=1.0)),
    )
    assert_same(a, b, keys=("actor/gapo_eps_high_mean", "actor/pg_clipfrac"))
    expected = gapo_eps_high(rewards, G, eps_low=0.2, eps_high_max=0.28, reward_range=(-1.0, 1.0)).mean()
    assert abs(a[2]["actor/gapo_eps_high_mean"] - expected.item()) < 1e-6
    with pytest.raises(ValueError, match="ambiguous reward range"):
        GAPOPolicyLossConfig(reward_range=[-1, 1], reward_min=0.0, reward_max=2.0)
    with pytest.raises(ValueError, match="Did you mean 'group'"):
        GAPOPolicyLossConfig(reward_range="grup", norm_adv_by_std_in_grpo=True)
    with pytest.raises(ValueError, match="R_max > R_min"):
        GAPOPolicyLossConfig(reward_range=[1, 1])
