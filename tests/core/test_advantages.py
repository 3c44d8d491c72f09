import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.advantages import ADVANTAGES, compute, rescaled_rewards, success_count, zero_std_groups

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # G = 4: c = 1 and c = 2


def test_drgrpo_hand_computed():
    # group 1 mean 0.25, group 2 mean 0.5
    assert compute("drgrpo", R, 4).tolist() == [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]


def test_grpo_unbiased_and_population_std():
    # group 1: unbiased std = sqrt(0.75 / 3) = 0.5 -> A = 0.75/0.5 = 1.5, -0.5
    a = compute("grpo", R, 4, eps=0.0)
    assert a[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # population std = sqrt(0.1875) = 0.4330 -> 0.75 / 0.4330 = 1.7320
    a = compute("grpo", R, 4, eps=0.0, std="population")
    assert a[0].item() == pytest.approx(0.75 / math.sqrt(0.1875))
    # eps is applied to the std: 0.75 / (0.5 + 1e-4)
    assert compute("grpo", R, 4, eps=1e-4)[0].item() == pytest.approx(0.75 / 0.5001)


def test_rloo_hand_computed():
    # lone success: 1 - mean(0, 0, 0) = 1; a failure: 0 - mean(1, 0, 0) = -1/3
    assert compute("rloo", R, 4)[:4].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def _passk_brute(group, k):
    """Per-rollout advantage = mean over k-subsets containing it of (max reward − R̄)/σ."""
    G = len(group)
    subsets = list(itertools.combinations(range(G), k))
    rew = {s: max(group[i] for i in s) for s in subsets}
    r_bar = sum(rew.values()) / len(subsets)
    sigma = math.sqrt(r_bar * (1 - r_bar))
    if sigma == 0:
        return [0.0] * G
    return [
        sum(rew[s] - r_bar for s in subsets if i in s) / sum(1 for s in subsets if i in s) / sigma for i in range(G)
    ]


@pytest.mark.parametrize("G", [2, 3, 4, 5, 6])
def test_passk_equals_brute_force_expectation(G):
    for k in range(1, G + 1):
        for c in range(G + 1):
            group = [1.0] * c + [0.0] * (G - c)
            got = compute("passk", torch.tensor(group), G, k=k).tolist()
            assert got == pytest.approx(_passk_brute(group, k), abs=1e-6), (G, k, c)


def test_passk_with_k1_is_std_normalised_grpo():
    # k = 1: R̄ = c/G, A_pos = (1-p)/sqrt(p(1-p)), A_neg = -p/sqrt(p(1-p)) = population-std GRPO
    assert torch.allclose(compute("passk", R, 4, k=1), compute("grpo", R, 4, eps=0.0, std="population"), atol=1e-6)


def test_focal_scales_by_failure_rate():
    # group 1: p = 1/4 -> (3/4)^2 = 0.5625; group 2: p = 1/2 -> 0.25
    a = compute("focal", R, 4, gamma=2.0)
    assert a.tolist() == pytest.approx([0.75 * 0.5625] + [-0.25 * 0.5625] * 3 + [0.125, 0.125, -0.125, -0.125])
    # on top of another base estimator, with its parameters passed through
    b = compute("focal", R, 4, gamma=1.0, base="grpo", eps=0.0)
    assert b[0].item() == pytest.approx(1.5 * 0.75)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_estimator_has_one_signature_and_zero_for_equal_rewards(name):
    # G = 8 (passk's default k = 4 needs G - c >= 4 failures to give signal)
    rewards = torch.tensor([1.0] * 8 + [0.0] * 8 + [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    a = compute(name, rewards, 8)
    assert a.shape == (24,) and torch.isfinite(a).all()
    assert (a[:16] == 0).all()  # all-correct and all-wrong groups carry no signal
    assert (a[16:] != 0).any()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=8, max_size=8), st.sampled_from(["drgrpo", "grpo", "rloo"]))
def test_centred_estimators_sum_to_zero_per_group(rewards, name):
    a = compute(name, torch.tensor(rewards), 4).view(-1, 4)
    assert torch.allclose(a.sum(1), torch.zeros(2), atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=4, max_size=4))
def test_correct_rollouts_get_positive_advantage(rewards):
    r = torch.tensor(rewards)
    a = compute("drgrpo", r, 4)
    assert ((a > 0) == (r > r.double().mean().float() + 1e-6)).all() or torch.allclose(r, r.mean().expand(4), atol=1e-5)


def test_helpers():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    assert zero_std_groups(rewards, 2).tolist() == [True, True, False]
    assert success_count(rewards, 2).tolist() == [2, 2, 0, 0, 1, 1]


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("gae", {}, "advantage estimator 'gae'"),
        ("passk", {"k": 9}, "k must be"),
        ("passk", {"rewards": torch.tensor([0.5, 0.0, 1.0, 0.0])}, "binary"),
        ("grpo", {"std": "sample"}, "std 'sample'"),
        ("focal", {"gamma": -1.0}, "gamma"),
        ("drgrpo", {"rewards": torch.tensor([1.0, float("nan"), 0.0, 0.0])}, "NaN"),
        ("drgrpo", {"rewards": torch.tensor([1.0, 0.0, 0.0])}, "divisible"),
    ],
)
def test_bad_input(name, kwargs, match):
    rewards = kwargs.pop("rewards", torch.tensor([1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=match):
        compute(name, rewards, 4, **kwargs)


# --- reward_range = "group" / "batch" -------------------------------------------------------------
def test_success_count_under_group_and_batch_ranges_hand_computed():
    # G = 4, batch min 2, max 7.
    #   [5, 3, 3, 3]: "group" u = [1, 0, 0, 0] → c = 1 (the lone best);
    #                 "batch" u = [3/5, 1/5, 1/5, 1/5] → 1.2 → 1
    #   [7, 6, 5, 3]: "group" u = [1, 3/4, 1/2, 0] → 2.25 → 2; "batch" [1, 4/5, 3/5, 1/5] → 2.6 → 3
    #   [2, 2, 2, 2]: constant: "group" places it on the batch's scale, u = 0 → c = 0; "batch" u = 0 → 0
    #   [7, 7, 7, 7]: constant at the batch's max: u = 1 → c = 4 under both
    r = torch.tensor([5.0, 3, 3, 3, 7, 6, 5, 3, 2, 2, 2, 2, 7, 7, 7, 7])
    assert success_count(r, 4, reward_range="group").tolist() == [1] * 4 + [2] * 4 + [0] * 4 + [4] * 4
    assert success_count(r, 4, reward_range="batch").tolist() == [1] * 4 + [3] * 4 + [0] * 4 + [4] * 4
    u = rescaled_rewards(r, 4, reward_range="group")
    assert u[:8].tolist() == pytest.approx([1, 0, 0, 0, 1, 0.75, 0.5, 0])
    # a constant batch: nothing to rescale by → u = 0, c = 0 (no NaN)
    assert success_count(torch.full((4,), 0.3), 2, reward_range="group").tolist() == [0] * 4
    assert rescaled_rewards(torch.full((4,), 0.3), 2, reward_range="batch").tolist() == [0.0] * 4


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=24).filter(
        lambda x: len(x) % 4 == 0 and 0 < sum(x) < len(x)
    )
)
def test_binary_success_count_is_the_same_under_every_range(rewards):
    # 0/1 rewards, a batch holding both values: c is the number of successes under (0,1), "group", "batch"
    r = torch.tensor(rewards)
    ref = success_count(r, 4)
    assert torch.equal(ref, r.view(-1, 4).sum(1).long().repeat_interleave(4))
    assert torch.equal(success_count(r, 4, reward_range="group"), ref)
    assert torch.equal(success_count(r, 4, reward_range="batch"), ref)
    # and a shifted, scaled copy (e.g. ±1 rewards) gives the same counts without naming a range
    assert torch.equal(success_count(r * 2 - 1, 4, reward_range="group"), ref)


def test_tuple_range_success_count_unchanged():
    # the fixed-range formula: round(Σ (R − lo)/(hi − lo)); ±1 rewards with (−1, 1): [1, −1, −1, 1] → 2
    r = torch.tensor([1.0, -1, -1, 1, 0.5, 0.5, -1, -1])
    assert success_count(r, 4, reward_range=(-1, 1)).tolist() == [2] * 4 + [round(0.75 + 0.75)] * 4


def test_focal_under_group_range():
    # rewards 0/10: "group" rescales to 0/1, so focal equals its (0, 10) and its 0/1 version:
    # group 1 p̂ = 1/4 → (3/4)^2; A (drgrpo) scales with the rewards (×10)
    r10 = R * 10
    a = compute("focal", r10, 4, gamma=2.0, reward_range="group")
    torch.testing.assert_close(a, compute("focal", r10, 4, gamma=2.0, reward_range=(0, 10)))
    torch.testing.assert_close(a, 10 * compute("focal", R, 4, gamma=2.0))
    with pytest.raises(ValueError, match="reward_range"):
        compute("focal", R, 4, reward_range="per-group")


# --- arguments: one signature, nothing accepted silently --------------------------------------------
@pytest.mark.parametrize(
    "name, kwargs, bad, accepted",
    [
        ("drgrpo", {"eps": 0.0}, "eps", "none"),
        ("rloo", {"k": 2}, "k", "none"),
        ("grpo", {"k": 2}, "k", "['eps', 'std']"),
        ("grpo", {"stdd": "population"}, "stdd", "Did you mean 'std'"),
        ("passk", {"kk": 2}, "kk", "['k']"),
        ("focal", {"gama": 2.0}, "gama", "Did you mean 'gamma'"),
        ("focal", {"k": 2}, "k", "['base', 'gamma']"),  # drgrpo, the default base, takes no k
        ("focal", {"base": "grpo", "k": 2}, "k", "['base', 'eps', 'gamma', 'std']"),
    ],
)
def test_unknown_arguments_are_errors_naming_estimator_argument_and_accepted(name, kwargs, bad, accepted):
    with pytest.raises(ValueError) as err:
        compute(name, R, 4, **kwargs)
    msg = str(err.value)
    assert repr(name) in msg or f"{name} (base" in msg
    assert f"argument {bad!r}" in msg and accepted in msg
    assert isinstance(err.value, TypeError)  # Python's kind for an unexpected keyword, too


def test_estimator_functions_themselves_reject_unknown_keywords():
    for name in ("drgrpo", "grpo", "rloo", "passk"):
        with pytest.raises(TypeError):
            ADVANTAGES[name](R, 4, unknown_param=1)
    with pytest.raises(TypeError, match="focal"):
        ADVANTAGES["focal"](R, 4, unknown_param=1)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_reward_range_is_taken_by_every_estimator_and_read_only_by_focal(name):
    # one call for every estimator (the trainer's): the non-focal ones ignore reward_range ...
    r = R * 10
    params = {"k": 2} if name == "passk" else {}
    if name == "passk":
        r = R
    a = compute(name, r, 4, reward_range=(0, 10), **params)
    torch.testing.assert_close(a, compute(name, r, 4, reward_range="group", **params))
    if name != "focal":
        torch.testing.assert_close(a, compute(name, r, 4, **params))
    else:  # ... focal's p̂ is read on it: (0, 10) → p̂ = 1/4, 1/2; (0, 100) → p̂ = 1/40, 1/20
        torch.testing.assert_close(a, torch.tensor([7.5 * 0.75] + [-2.5 * 0.75] * 3 + [2.5, 2.5, -2.5, -2.5]))
        b = compute(name, r, 4, reward_range=(0, 100))
        assert b[0].item() == pytest.approx(7.5 * (1 - 1 / 40))
    # and it is checked for every estimator
    with pytest.raises(ValueError, match="reward_range"):
        compute(name, r, 4, reward_range=(1, 0), **params)


def test_an_estimator_registered_at_run_time_gets_the_same_checks(monkeypatch):
    def mine(rewards, group_size, *, beta=1.0):
        return beta * compute("drgrpo", rewards, group_size)

    def mine_range(rewards, group_size, *, reward_range=(0.0, 1.0)):
        return torch.full_like(rewards, float(reward_range[1]))

    monkeypatch.setitem(ADVANTAGES, "mine", mine)
    monkeypatch.setitem(ADVANTAGES, "mine_range", mine_range)
    assert compute("mine", R, 4, beta=2.0, reward_range=(0, 5))[0].item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match=r"'mine' takes no argument 'gamma'; it accepts \['beta'\]"):
        compute("mine", R, 4, gamma=2.0)
    assert compute("mine_range", R, 4, reward_range=(0, 5)).tolist() == [5.0] * 8


@pytest.mark.parametrize(
    "name, params",
    [
        ("drgrpo", {}),
        ("drgrpo", {"eps": 0.0}),
        ("grpo", {"eps": 0.0, "std": "population"}),
        ("grpo", {"k": 2}),
        ("rloo", {"gamma": 1.0}),
        ("passk", {"k": 2}),
        ("passk", {"eps": 0.0}),
        ("focal", {"gamma": 2.0}),
        ("focal", {"k": 2}),
        ("focal", {"base": "passk", "k": 2}),
        ("focal", {"base": "grpo", "std": "population"}),
        ("focal", {"base": "rloo", "eps": 0.0}),
    ],
)
def test_config_validation_accepts_exactly_what_the_estimator_accepts(name, params):
    # a config the trainer would fail on at its first step must fail at load, before any run folder
    from gapo.rl.config import load_config

    try:
        compute(name, R, 4, reward_range=(0, 1), **params)
        ok = True
    except ValueError:
        ok = False
    flat = "{" + ", ".join(f"{k}: {v}" for k, v in params.items()) + "}"
    overrides = [f"algo.advantage={name}", f"algo.advantage_params={flat}", "train.group_size=4"]
    if ok:
        load_config(None, overrides)
    else:
        with pytest.raises(ValueError, match="algo.advantage_params"):
            load_config(None, overrides)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("grpo", {"eps": None}, "grpo's eps must be a finite number >= 0, got None"),
        ("grpo", {"eps": float("nan")}, "grpo's eps"),
        ("grpo", {"eps": "1e-4"}, "grpo's eps"),
        ("focal", {"gamma": float("inf")}, "focal's gamma"),
        ("focal", {"gamma": True}, "focal's gamma"),
        ("passk", {"k": True}, "k must be an int"),
        ("passk", {"k": 2.0}, "k must be an int"),
        ("focal", {"base": "gae"}, "base advantage estimator of focal 'gae'"),
        ("focal", {"base": "focal"}, "its own base"),
    ],
)
def test_parameter_values_of_the_wrong_kind_are_value_errors(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute(name, R, 4, **kwargs)


def test_success_count_has_one_name():
    """0.2's name ``group_success_count`` is gone; ``success_count`` is in the lazy API."""
    import gapo
    import gapo.core.advantages as advantages

    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    assert success_count(r, 3).tolist() == [2, 2, 2, 1, 1, 1]
    assert gapo.success_count is success_count and "success_count" in gapo.__all__
    assert not hasattr(advantages, "group_success_count") and not hasattr(gapo, "group_success_count")
