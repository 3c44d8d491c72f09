"""The rival losses of gapo.core.rival_losses: parity with verl 0.9.1 / TRL, hand cases, gradients,
their parameters, and the per-token diagnostics of every registered loss."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.aggregation import AGG_MODES
from gapo.core.losses import LOSSES, RATIO_LEVEL
from gapo.core.method_params import DUAL_CLIP, LOSS_PARAMS, USES_BOUNDS, check_loss_params
from gapo.core.rival_losses import cegppo_loss, clip_cov_loss, kl_cov_loss, sapo_loss
from gapo.core.surrogate import ClipBounds, split_token_diagnostics

RIVALS = ("sapo", "cegppo", "clip_cov", "kl_cov")
VERL_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _batch(seed, B=6, T=9, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + spread * torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    adv = torch.randn(B, generator=g)[:, None].expand(B, T).clone()
    return logp, old, adv, mask


def _verl_config(mode, **pl):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss=PolicyLossConfig(loss_mode=mode, **pl),
        use_dynamic_bsz=False,
        rollout_n=1,
    )


def _grad(fn, logp):
    x = logp.clone().requires_grad_(True)
    loss = fn(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g


# ------------------------------------------------------------------ SAPO
@pytest.mark.parametrize("seed", range(4))
def test_sapo_matches_verl(seed):
    from verl.trainer.ppo.core_algos import compute_policy_loss_sapo

    logp, old, adv, mask = _batch(seed, spread=2.0 if seed == 3 else 0.6)  # seed 3: far off-policy
    cfg = _verl_config("sapo")
    ref, g_ref = _grad(lambda x: compute_policy_loss_sapo(old, x, adv, mask, "seq-mean-token-mean", cfg)[0], logp)
    bounds = ClipBounds(0.2, 0.28)
    ours, g = _grad(lambda x: sapo_loss(x, old, adv, mask, bounds, agg="seq-mean-token-mean")[0], logp)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-8)


class _FakeTRL:
    """Just what TRL's GRPOTrainer._compute_loss reads, the policy's log-probs given."""

    def __init__(self, logp, tau_pos, tau_neg):
        self._logp = logp
        self.top_entropy_quantile, self.off_policy_mask_threshold = 1.0, None
        self.importance_sampling_level, self.loss_type, self.beta = "token", "sapo", 0.0
        self.args = SimpleNamespace(sapo_temperature_pos=tau_pos, sapo_temperature_neg=tau_neg, delta=None)
        self.use_vllm, self.aux_loss_enabled, self._entropy_bonus_enabled = False, False, False
        self.model = SimpleNamespace(training=True)
        self.current_gradient_accumulation_steps = 1
        self.accelerator = SimpleNamespace(gather=lambda x: x, reduce=lambda x, reduction: x)
        self._metrics = {"train": defaultdict(list)}

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        return self._logp, torch.zeros_like(self._logp), None


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 3.0)])
def test_sapo_matches_trl(taus):
    from trl import GRPOTrainer

    logp, old, adv, mask = _batch(7)
    B, T = logp.shape

    def trl(x):
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": mask,
            "advantages": adv[:, 0],
            "old_per_token_logps": old,
        }
        return GRPOTrainer._compute_loss(_FakeTRL(x, *taus), None, inputs)

    ref, g_ref = _grad(trl, logp)
    params = dict(tau_pos=taus[0], tau_neg=taus[1])
    ours, g = _grad(
        lambda x: sapo_loss(x, old, adv[:, 0], mask, ClipBounds(0.2, 0.2), agg="seq-mean-token-mean", **params)[0], logp
    )
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-8)


def test_sapo_degenerate_and_hand_case():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # an all-padding row
    adv = torch.tensor([0.0, 2.0])
    loss, m = sapo_loss(logp, logp.detach(), adv, mask, ClipBounds(0.2, 0.2))
    loss.backward()
    assert loss.item() == 0.0 and (logp.grad == 0).all()  # A = 0 and ρ = 1 give nothing
    # ρ = 1: gate 4σ(0)(1−σ(0)) = 1, value −A·(4/τ)·½
    lp = torch.tensor([[0.0, math.log(2.0)]], requires_grad=True)
    loss, m = sapo_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), ClipBounds(0.2, 0.2))
    s = torch.sigmoid(torch.tensor(1.0)).item()  # τ_pos = 1, ρ − 1 = 1
    assert loss.item() == pytest.approx(-(2.0 + 4.0 * s) / 2, rel=1e-6)
    assert m["token/gate"].flatten().tolist() == pytest.approx([1.0, 4 * s * (1 - s)], rel=1e-6)
    assert not m["token/clipped"].any() and m["loss/clipfrac"].item() == 0.0
    loss.backward()  # dL/dlogp = −A·gate·ρ / N
    assert lp.grad.flatten().tolist() == pytest.approx([-0.5, -4 * s * (1 - s) * 2 / 2], rel=1e-6)


def test_sapo_extreme_ratios_stay_finite():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-60.0, 60.0]])
    loss, m = sapo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), ClipBounds(0.2, 0.2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and torch.isfinite(m["token/gate"]).all()


# ------------------------------------------------------------------ CE-GPPO
def _hand():
    # ρ = 1.5 (A>0, above 1.28), 1.1 (A>0), 0.5 (A<0, below 0.8), 2.0 (A<0: PPO does not clip)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 2.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    return logp, old, adv, torch.ones(1, 4)


def test_cegppo_hand_values_and_gradients():
    logp, old, adv, mask = _hand()
    x = logp.clone().requires_grad_(True)
    loss, m = cegppo_loss(x, old, adv, mask, ClipBounds(0.2, 0.28), beta_low=0.5, beta_high=2.0)
    # value: PPO's −A·clip: −1.28, −1.1, +0.8, +2.0, mean over 4
    assert loss.item() == pytest.approx((-1.28 - 1.1 + 0.8 + 2.0) / 4, abs=1e-6)
    loss.backward()
    # gradient wrt logp: clipped −A·β·b; else −A·ρ; / N
    expected = [-2.0 * 1.28 / 4, -1.1 / 4, 0.5 * 0.8 / 4, 2.0 / 4]
    assert x.grad.flatten().tolist() == pytest.approx(expected, abs=1e-6)
    assert m["token/clipped"].tolist() == [[True, False, True, False]]
    assert m["token/gate"].flatten().tolist() == pytest.approx([2.0 * 1.28 / 1.5, 1.0, 0.5 * 0.8 / 0.5, 1.0], rel=1e-6)
    assert m["loss/clipfrac_high"].item() == 0.25 and m["loss/clipfrac_low"].item() == 0.25


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("agg", AGG_MODES)
def test_cegppo_with_zero_betas_is_ppo_exactly(seed, agg):
    logp, old, adv, mask = _batch(seed, spread=1.0)
    eps_high = 0.1 + 0.3 * torch.rand(logp.shape[0])
    bounds = ClipBounds(0.2, eps_high)
    ref, g_ref = _grad(lambda x: LOSSES["ppo"](x, old, adv, mask, bounds, agg=agg)[0], logp)
    ours, g = _grad(lambda x: cegppo_loss(x, old, adv, mask, bounds, agg=agg, beta_low=0.0, beta_high=0.0)[0], logp)
    assert torch.equal(ours, ref) and torch.equal(g, g_ref)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b_lo=st.floats(0, 3), b_hi=st.floats(0, 3))
def test_cegppo_gradient_is_the_formula(seed, b_lo, b_hi):
    logp, old, adv, mask = _batch(seed, spread=1.0)
    bounds = ClipBounds(0.2, 0.28)
    _, g = _grad(lambda x: cegppo_loss(x, old, adv, mask, bounds, beta_low=b_lo, beta_high=b_hi)[0], logp)
    rho = torch.exp(logp - old)
    high, low = (rho > 1.28) & (adv > 0), (rho < 0.8) & (adv < 0)
    per_token = torch.where(high, -adv * b_hi * 1.28, torch.where(low, -adv * b_lo * 0.8, -adv * rho))
    torch.testing.assert_close(g, per_token * mask / mask.sum(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ Clip-Cov, KL-Cov
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", VERL_AGG)
def test_clip_cov_matches_verl(seed, agg):
    from verl.trainer.ppo.core_algos import compute_policy_loss_clip_cov

    logp, old, adv, mask = _batch(seed, B=8, T=30)
    # a wide [lb, ub] and ratio so that the random choice binds (more candidates than drops)
    pl = dict(clip_cov_ratio=0.05, clip_cov_lb=-0.5, clip_cov_ub=0.5)
    cfg = _verl_config("clip_cov", **pl)
    torch.manual_seed(seed)
    ref, g_ref = _grad(lambda x: compute_policy_loss_clip_cov(old, x, adv, mask, agg, cfg)[0], logp)
    torch.manual_seed(seed)
    params = dict(ratio=0.05, lb=-0.5, ub=0.5)
    ours, g = _grad(lambda x: clip_cov_loss(x, old, adv, mask, ClipBounds(0.2, 0.28), agg=agg, **params)[0], logp)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-8)
    # the verl draw, with our own generator
    gen = torch.Generator().manual_seed(seed)
    ours2, g2 = _grad(
        lambda x: clip_cov_loss(x, old, adv, mask, ClipBounds(0.2, 0.28), agg=agg, generator=gen, **params)[0], logp
    )
    assert torch.equal(ours2, ours) and torch.equal(g2, g)


def test_clip_cov_drops_the_chosen_tokens():
    logp, old, adv, mask = _batch(3, B=8, T=30)
    x = logp.clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(0)
    loss, m = clip_cov_loss(x, old, adv, mask, ClipBounds(0.2, 0.28), ratio=0.05, lb=-0.5, ub=0.5, generator=gen)
    loss.backward()
    n_drop = max(int(0.05 * mask.sum().item()), 1)
    dropped = m["token/clipped"] & (m["token/gate"] == 0)
    assert m["loss/clipfrac_cov"].item() * mask.sum().item() == pytest.approx(n_drop)
    assert (x.grad[m["token/clipped"]] == 0).all() and (x.grad[~m["token/clipped"] & (mask > 0)] != 0).all()
    assert dropped.sum().item() == m["token/clipped"].sum().item()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", VERL_AGG)
@pytest.mark.parametrize("ratio", [2e-4, 0.1])
def test_kl_cov_matches_verl(seed, agg, ratio):
    from verl.trainer.ppo.core_algos import compute_policy_loss_kl_cov

    logp, old, adv, mask = _batch(seed, B=8, T=30)
    cfg = _verl_config("kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=0.7)
    ref, g_ref = _grad(lambda x: compute_policy_loss_kl_cov(old, x, adv, mask, agg, cfg)[0], logp)
    ours, g = _grad(
        lambda x: kl_cov_loss(x, old, adv, mask, ClipBounds(0.2, 0.2), agg=agg, ratio=ratio, coef=0.7)[0], logp
    )
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-8)


def test_kl_cov_hand_case():
    # covariance (A − Ā)(logp − mean logp): the largest is token 0 (A=1, logp=0 above the mean)
    logp = torch.tensor([[0.0, -2.0], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -2.0], [-1.0, -1.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, m = kl_cov_loss(logp, old, adv, torch.ones(2, 2), ClipBounds(0.2, 0.2), ratio=0.25, coef=2.0)
    rho = math.exp(0.5)
    assert loss.item() == pytest.approx((-rho + 2.0 * 0.5 - 1.0 + 1.0 + 1.0) / 4, rel=1e-6)
    assert m["token/clipped"].tolist() == [[True, False], [False, False]]
    assert (m["token/gate"] == 1).all()


# ------------------------------------------------------------------ registry and parameters
def test_registry_and_tables():
    from gapo.rl import names

    assert set(RIVALS) <= set(LOSSES)
    assert set(LOSSES) == set(LOSS_PARAMS) == set(USES_BOUNDS) == set(DUAL_CLIP) == set(RATIO_LEVEL)
    assert names.LOSSES == tuple(LOSSES)


@pytest.mark.parametrize(
    "loss, params, match",
    [
        ("sapo", {"tau_pos": 0.0}, "tau_pos must be > 0"),
        ("sapo", {"tau": 1.0}, "unknown parameter.*'tau'.*tau_pos, tau_neg"),
        ("cegppo", {"beta_low": -0.1}, "beta_low must be >= 0"),
        ("cegppo", {"beta_high": float("nan")}, "beta_high"),
        ("clip_cov", {"ratio": 0.0}, r"ratio must be in \(0, 1\]"),
        ("clip_cov", {"ratio": 1.5}, "ratio"),
        ("clip_cov", {"lb": 5.0}, "lb must be below ub"),
        ("kl_cov", {"coef": True}, "coef"),
        ("ppo", {"beta_low": 1.0}, "accepted: none"),
        ("nope", {}, "unknown policy loss"),
    ],
)
def test_bad_params_are_named(loss, params, match):
    msg = check_loss_params(loss, params)
    assert msg is not None
    import re

    assert re.search(match, msg), msg
    if loss in LOSSES:  # a keyword the loss does not take is a wrong call (TypeError), as Python's
        logp, old, adv, mask = _batch(0)
        unknown_name = not set(params) <= set(LOSS_PARAMS[loss])
        with pytest.raises(TypeError if unknown_name else ValueError, match=list(params)[0]):
            LOSSES[loss](logp, old, adv, mask, ClipBounds(0.2, 0.2), **params)


def test_good_params_and_defaults():
    for loss, defaults in LOSS_PARAMS.items():
        assert check_loss_params(loss, {}) is None
        assert check_loss_params(loss, dict(defaults)) is None


@pytest.mark.parametrize("name", [n for n in LOSSES if not DUAL_CLIP[n]])
def test_dual_clip_refused_where_undefined(name):
    logp, old, adv, mask = _batch(0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LOSSES[name](logp, old, adv, mask, ClipBounds(0.2, 0.2, clip_ratio_c=3.0))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_widths_matter_only_where_used(name):
    logp, old, adv, mask = _batch(1, spread=1.0)
    kw = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
    a, _ = LOSSES[name](logp, old, adv, mask, ClipBounds(0.1, 0.1), **kw)
    kw = {"generator": torch.Generator().manual_seed(0)} if name == "clip_cov" else {}
    b, _ = LOSSES[name](logp, old, adv, mask, ClipBounds(0.3, 0.5), **kw)
    assert (a != b) == USES_BOUNDS[name]


# ------------------------------------------------------------------ per-token bounds and diagnostics
@pytest.mark.parametrize("name", ["ppo", "cispo", "cegppo"])
def test_per_token_bounds_equal_per_row_bounds_when_constant_over_tokens(name):
    logp, old, adv, mask = _batch(2, spread=1.0)
    lo, hi = 0.1 + 0.2 * torch.rand(logp.shape[0]), 0.1 + 0.3 * torch.rand(logp.shape[0])
    a, ma = LOSSES[name](logp, old, adv, mask, ClipBounds(lo, hi))
    b, mb = LOSSES[name](logp, old, adv, mask, ClipBounds(lo[:, None].expand_as(logp), hi[:, None].expand_as(logp)))
    assert torch.equal(a, b) and torch.equal(ma["token/clipped"], mb["token/clipped"])


def test_per_token_bounds_clip_per_token():
    logp, old, adv, mask = _hand()
    eps_high = torch.tensor([[0.6, 0.05, 0.0, 0.0]])  # token 0 no longer clipped, token 1 now is
    eps_low = torch.tensor([[0.2, 0.2, 0.6, 0.2]])  # token 2 no longer clipped
    _, m = LOSSES["ppo"](logp, old, adv, mask, ClipBounds(eps_low, eps_high))
    assert m["token/clipped"].tolist() == [[False, True, False, False]]
    assert m["clip/eps_high_mean"].item() == pytest.approx(0.1625)


@pytest.mark.parametrize("eps_low", [torch.tensor([0.2, 1.0]), torch.tensor([-0.1, 0.2]), torch.tensor([float("nan")])])
def test_bad_eps_low_tensor(eps_low):
    with pytest.raises(ValueError, match="eps_low"):
        ClipBounds(eps_low, 0.2)


def test_token_diagnostics_hand_case_for_every_loss():
    logp, old, adv, mask = _hand()
    bounds = ClipBounds(0.2, 0.28)
    rho = torch.tensor([1.5, 1.1, 0.5, 2.0])
    clip = rho.clamp(0.8, 1.28)  # CISPO caps the weight on both sides, whatever A's sign
    s = torch.sigmoid(torch.where(adv[0] > 0, 1.0, 1.05) * (rho - 1))
    expected = {
        "ppo": ([True, False, True, False], [0.0, 1.0, 0.0, 1.0]),
        "cispo": ([True, False, True, False], (clip / rho).tolist()),
        "cegppo": ([True, False, True, False], [1.0 * 1.28 / 1.5, 1.0, 0.75 * 0.8 / 0.5, 1.0]),
        "sapo": ([False] * 4, (4 * s * (1 - s)).tolist()),
        "kl_cov": (None, [1.0] * 4),
    }
    for name, (clipped, gate) in expected.items():
        _, m = LOSSES[name](logp, old, adv, mask, bounds)
        scalars, tokens = split_token_diagnostics(m)
        assert all(v.ndim == 0 for v in scalars.values()), name
        if clipped is not None:
            assert tokens["token/clipped"].flatten().tolist() == clipped, name
        assert tokens["token/gate"].flatten().tolist() == pytest.approx(gate, rel=1e-6), name
    # the dual clip's cap has gate 0 too: A < 0 and ρ = 2 > clip_ratio_c = 1.5
    _, m = LOSSES["ppo"](logp, old, adv, mask, ClipBounds(0.2, 0.28, clip_ratio_c=1.5))
    assert m["token/gate"].flatten().tolist() == [0.0, 1.0, 0.0, 0.0]
