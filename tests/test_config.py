"""Config: YAML + key=value overrides, typed, validated before any work, with helpful errors."""

import pytest

from gapo.config import Config, load_config


def test_overrides_are_typed():
    cfg = load_config(None, ["algo.eps_high=0.28", "train.steps=7", "algo.reward_range=[-1, 1]",
                             "algo.advantage_params={k: 4}", "task.params.n_numbers=3", "algo.clip_ratio_c=none",
                             "algo.dynamic_sampling=true", "model.threads=2"])
    assert cfg.algo.eps_high == 0.28 and cfg.train.steps == 7 and cfg.algo.reward_range == (-1.0, 1.0)
    assert cfg.algo.advantage_params == {"k": 4} and cfg.task.params == {"n_numbers": 3}
    assert cfg.algo.clip_ratio_c is None and cfg.algo.dynamic_sampling is True and cfg.model.threads == 2


def test_yaml_file_then_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("algo:\n  eps_schedule: linear\n  eps_high: 0.28\ntrain:\n  steps: 5\n")
    cfg = load_config(f, ["train.steps=9"])
    assert cfg.algo.eps_schedule == "linear" and cfg.train.steps == 9


@pytest.mark.parametrize("overrides, match", [
    (["algo.eps_hgh=0.3"], r"unknown config key 'algo.eps_hgh'.*Did you mean algo.eps_high"),
    (["trian.steps=3"], r"unknown config key 'trian.steps'"),
    (["train.steps=abc"], r"train.steps: expected int"),
    (["train.steps=2.5"], r"train.steps: expected int"),
    (["algo.dynamic_sampling=maybe"], r"expected true/false"),
    (["train.group_size=1"], r"group_size must be >= 2"),
    (["train.mini_batches=5"], r"does not divide the rollout batch"),
    (["algo.eps_schedule=linear", "algo.eps_high=0.1"], r"eps_high \(ε_high_max\) >= algo.eps_low"),
    (["algo.loss=ppo2"], r"unknown policy loss 'ppo2'.*Did you mean 'ppo'"),
    (["algo.advantage=gae"], r"unknown advantage estimator 'gae'"),
    (["task.name=countdwn"], r"unknown task 'countdwn'"),
    (["algo.loss=cispo", "algo.clip_ratio_c=3"], r"not defined for the cispo loss"),
    (["sampling.temperature=0"], r"temperature must be > 0"),
    (["model.base_preset=medium"], r"unknown base-policy preset 'medium'"),
    (["steps=3"], r"must look like section.key=value|unknown config key"),
])
def test_bad_input_fails_before_any_work(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("algo:\n  eps: 0.2\n")
    with pytest.raises(ValueError, match="algo.eps"):
        load_config(wrong)


def test_defaults_validate():
    assert Config().validate().algo.eps_schedule == "fixed"
