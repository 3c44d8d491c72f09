"""Config: YAML + key=value overrides, typed, validated before any work, with helpful errors."""

import re
from pathlib import Path

import pytest

from gapo.rl.config import Config, load_config


def test_overrides_are_typed():
    cfg = load_config(
        None,
        [
            "algo.eps_high_max=0.28",
            "train.steps=7",
            "algo.reward_range=[-1, 1]",
            "algo.advantage=passk",
            "algo.advantage_params={k: 4}",
            "task.params.n_numbers=3",
            "algo.clip_ratio_c=none",
            "algo.dynamic_sampling=true",
            "model.threads=2",
        ],
    )
    assert cfg.algo.eps_high_max == 0.28 and cfg.train.steps == 7 and cfg.algo.reward_range == (-1.0, 1.0)
    assert cfg.algo.advantage_params == {"k": 4} and cfg.task.params == {"n_numbers": 3}
    assert cfg.algo.clip_ratio_c is None and cfg.algo.dynamic_sampling is True and cfg.model.threads == 2


def test_a_renamed_key_is_an_error_naming_its_new_name_everywhere(tmp_path):
    """``config.RENAMED`` is the one table: on the command line, in a YAML file and in a saved run's
    config (``base``, as resuming reads it), 0.1's ``algo.eps_high`` names ``algo.eps_high_max``."""
    f = tmp_path / "run.yaml"
    f.write_text("algo:\n  eps_high: 0.28\n")
    for call in (
        lambda: load_config(None, ["algo.eps_high=0.28"]),
        lambda: load_config(f),
        lambda: load_config(None, base={"algo": {"eps_high": 0.28}}),
    ):
        with pytest.raises(ValueError, match=r"'algo.eps_high' is now 'algo.eps_high_max'"):
            call()


def test_yaml_file_then_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("algo:\n  eps_schedule: linear\n  eps_high_max: 0.28\ntrain:\n  steps: 5\n")
    cfg = load_config(f, ["train.steps=9"])
    assert cfg.algo.eps_schedule == "linear" and cfg.train.steps == 9


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algo.eps_hgh=0.3"], r"unknown config key 'algo.eps_hgh'.*Did you mean algo.eps_high_max"),
        (["algo.eps_high=0.3"], r"'algo.eps_high' is now 'algo.eps_high_max'.*write algo.eps_high_max=0.3"),
        (["trian.steps=3"], r"unknown config key 'trian.steps'"),
        (["train.steps=abc"], r"train.steps: expected int"),
        (["train.steps=2.5"], r"train.steps: expected int"),
        (["algo.dynamic_sampling=maybe"], r"expected true/false"),
        (["train.group_size=1"], r"train.group_size \(command line\): must be an integer >= 2"),
        (["train.mini_batches=5"], r"does not divide the rollout batch"),
        (["algo.eps_schedule=linear", "algo.eps_high_max=0.1"], r"needs algo.eps_high_max >= algo.eps_low"),
        (["algo.loss=ppo2"], r"unknown policy loss 'ppo2'.*Did you mean 'ppo'"),
        (["algo.advantage=gae"], r"unknown advantage estimator 'gae'"),
        (["task.name=countdwn"], r"unknown task 'countdwn'"),
        (["algo.loss=cispo", "algo.clip_ratio_c=3"], r"not defined for the cispo loss"),
        (["sampling.temperature=0"], r"sampling.temperature \(command line\): must be a finite number > 0"),
        (["model.base_preset=hihg"], r"unknown base-policy preset 'hihg'.*'high'"),
        (["steps=3"], r"must look like section.key=value|unknown config key"),
        (
            ["algo.advantage=passk", "algo.advantage_params={k: 4"],
            r"algo.advantage_params: cannot read '\{k: 4' as a YAML",
        ),
        (
            ["algo.reward_range=[0, 1"],
            r"algo.reward_range \(command line\): must be \[R_min, R_max\], 'group' or 'batch'",
        ),
        (["algo.advantage=passk", "algo.advantage_params={k: 4, k: 5}"], r"duplicate key 'k'"),
    ],
)
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


# ------------------------------------------------------------------ every field has a domain
def _numeric_fields():
    import dataclasses
    import typing

    from gapo.rl.config import Config

    for sec, cls in typing.get_type_hints(Config).items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            args = set(typing.get_args(tp)) or {tp}
            if args & {int, float} or typing.get_origin(tp) is tuple:
                yield f"{sec}.{f.name}", tp


def test_every_numeric_field_has_a_domain():
    from gapo.rl.config import DOMAINS

    missing = [k for k, _ in _numeric_fields() if k not in DOMAINS]
    assert not missing, f"numeric config fields without a domain check: {missing}"


@pytest.mark.parametrize("key", [k for k, tp in _numeric_fields() if "float" in str(tp) and "tuple" not in str(tp)])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_floats_are_rejected_everywhere(key, value):
    with pytest.raises(ValueError, match=rf"{key} \(command line\): must be a finite number"):
        load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize(
    "override, match",
    [
        ("optim.warmup_steps=-5", r"optim.warmup_steps \(command line\): must be an integer >= 0"),
        ("optim.grad_clip=-1", r"optim.grad_clip .*> 0"),
        ("optim.grad_clip=0", r"optim.grad_clip .*> 0, got 0.0"),
        ("optim.lr=2", r"optim.lr .*<= 1"),
        ("optim.betas=[0.9, 1.0]", r"optim.betas .*< 1"),
        ("algo.kl_coef=-1", r"algo.kl_coef .*>= 0"),
        ("algo.eps_low=1", r"algo.eps_low .*< 1"),
        ("task.train_size=0", r"task.train_size .*>= 1"),
        ("task.scoring_workers=-1", r"task.scoring_workers .*>= 0"),
        ("model.threads=0", r"model.threads .*>= 1"),
        ("sampling.top_p=0", r"sampling.top_p .*> 0"),
        ("sampling.max_new_tokens=100000000", r"sampling.max_new_tokens .*<= 1048576"),
        ("eval.samples=0", r"eval.samples .*>= 1"),
        ("train.seed=-1", r"train.seed .*>= 0"),
        ("algo.reward_range=[0, inf]", r"algo.reward_range .*finite"),
        ("algo.reward_range=everything", r"algo.reward_range .*'group' or 'batch'"),
        ("model.device=tpu9", r"model.device .*not a device name"),
        ("model.device=cuda:3", r"model.device .*(not available|does not exist)"),
    ],
)
def test_out_of_domain_values_name_key_and_accepted_range(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


def test_reward_range_accepts_group_and_batch():
    assert load_config(None, ["algo.reward_range=group"]).algo.reward_range == "group"
    assert load_config(None, ["algo.reward_range=batch"]).algo.reward_range == "batch"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algo.advantage_params={eps: 1e-4}"], r"algo.advantage_params .*unknown entry 'eps'; accepted: \[\]"),
        (["algo.advantage=grpo", "algo.advantage_params={esp: 1e-4}"], r"unknown entry 'esp'.*Did you mean eps"),
        (["algo.advantage=passk", "algo.advantage_params={k: 4, kk: 2}"], r"unknown entry 'kk'"),
        (["task.params.n_numbrs=3"], r"task.params: unknown entry 'n_numbrs'.*Did you mean n_numbers"),
    ],
)
def test_dict_params_are_checked_against_the_component(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_dict_params_the_component_accepts_pass():
    cfg = load_config(
        None,
        [
            "algo.advantage=focal",
            "algo.advantage_params={gamma: 2, base: grpo, eps: 1e-4}",
            "task.params.n_numbers=3",
            "task.params.min_solutions=2",
        ],
    )
    assert cfg.algo.advantage_params == {"gamma": 2, "base": "grpo", "eps": 1e-4}


def test_duplicate_yaml_keys_name_file_and_line(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("algo:\n  eps_low: 0.2\n  eps_high: 0.28\n  eps_low: 0.1\n")
    with pytest.raises(ValueError, match=r"run.yaml', line 4: duplicate key 'eps_low' \(first set at line 2\)"):
        load_config(f)
    f.write_text("train:\n  steps: 3\ntrain:\n  steps: 4\n")
    with pytest.raises(ValueError, match=r"line 3: duplicate key 'train'"):
        load_config(f)


def test_non_utf8_yaml_names_file_and_line(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("train:\n  steps: 3\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.yaml', line 3: not UTF-8 .*0xe9"):
        load_config(f)


def test_values_from_a_file_name_the_file_and_line(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("train:\n  steps: 3\noptim:\n  lr: .nan\n")
    with pytest.raises(ValueError, match=r"optim.lr \(run.yaml:4\): must be a finite number > 0"):
        load_config(f)
    f.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ValueError, match=r"run.yaml', line 2: unknown config key 'train.stpes'.*train.steps"):
        load_config(f)
    f.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="must be a mapping of sections"):
        load_config(f)


def test_config_diff_lists_changed_keys():
    from gapo.rl.config import diff, to_dict

    a = to_dict(load_config(None, ["task.params.n_numbers=3"]))
    b = to_dict(load_config(None, ["task.params.n_numbers=4", "optim.lr=1e-4"]))
    assert diff(a, b) == {"optim.lr": (5e-05, 1e-4), "task.params.n_numbers": (3, 4)}
    assert diff(a, a) == {}


@pytest.mark.parametrize(
    "override, match",
    [
        ("task.params.n_numbers=abc", r"task.params.n_numbers: cannot interpret 'abc' as int.*\(task 'countdown'\)"),
        ("task.params.num_range=[1, 2, 3]", r"task.params.num_range: expected a list of 2 values"),
        ("task.params.min_solutions=1.5", r"task.params.min_solutions"),
    ],
)
def test_task_params_have_the_types_the_task_declares(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


# ------------------------------------------------------------------ names checked without torch
def test_the_names_lists_equal_the_registries():
    """gapo.rl.names mirrors each registry so that validation needs no torch; they must agree."""
    import inspect

    from gapo.core import adaptive_bounds, advantages, aggregation, clipping, losses
    from gapo.policy import base_policy, precision
    from gapo.rl import names

    assert names.ADVANTAGES == tuple(advantages.ADVANTAGES)
    assert names.LOSSES == tuple(losses.LOSSES)
    assert names.EPS_SCHEDULES == tuple(clipping.EPS_SCHEDULES)
    assert names.BOUND_SCHEDULES == tuple(adaptive_bounds.BOUND_SCHEDULES)
    assert names.AGG_MODES == tuple(aggregation.AGG_MODES)
    assert names.KL_ESTIMATORS == tuple(losses.KL_ESTIMATORS)
    assert names.DTYPES == tuple(precision.DTYPES)
    assert names.BASE_PRESETS == tuple(base_policy.PRESETS)
    for name, fn in advantages.ADVANTAGES.items():
        own = {
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.name != "reward_range"
        }
        assert set(names.ADVANTAGE_PARAMS[name]) == own, name
    assert inspect.signature(advantages.passk).parameters["k"].default == names.PASSK_DEFAULT_K


def test_accepted_advantage_params_are_the_same_with_and_without_the_registry(monkeypatch):
    import sys

    import gapo.core.advantages  # noqa: F401  (the live registry)
    from gapo.rl.domains import advantage_params

    live = {n: advantage_params(n) for n in ("drgrpo", "grpo", "rloo", "passk", "focal")}
    monkeypatch.delitem(sys.modules, "gapo.core.advantages")
    assert {n: advantage_params(n) for n in live} == live


def test_an_estimator_registered_at_run_time_is_accepted(monkeypatch):
    from gapo.core import advantages

    monkeypatch.setitem(advantages.ADVANTAGES, "mine", lambda rewards, group_size, *, scale=1.0: rewards)
    cfg = load_config(None, ["algo.advantage=mine", "algo.advantage_params={scale: 2}"])
    assert cfg.algo.advantage == "mine"
    with pytest.raises(ValueError, match="unknown entry 'scal'"):
        load_config(None, ["algo.advantage=mine", "algo.advantage_params={scal: 2}"])


# ------------------------------------------------------------------ the unknown-key message
@pytest.mark.parametrize(
    "key, close, section",
    [
        ("algo.eps_hgh", "algo.eps_high_max", "algo"),
        ("train.step", "train.steps", "train"),
        ("optim.learning_rate", None, "optim"),
    ],
)
def test_unknown_key_says_did_you_mean_first_then_only_its_section(key, close, section):
    from gapo.rl.config import _all_keys

    with pytest.raises(ValueError) as e:
        load_config(None, [f"{key}=1"])
    msg = str(e.value)
    if close:
        assert msg.index("Did you mean") < msg.index(f"The keys of section '{section}'"), msg
        assert close in msg.split("The keys of")[0]
    listed = msg.split(f"The keys of section '{section}' are: ")[1].rstrip(".").split(", ")
    own = [k.split(".", 1)[1] for k in _all_keys() if k.startswith(section + ".")]
    assert sorted(listed) == sorted(own)
    others = [k for k in _all_keys() if not k.startswith(section + ".")]
    assert not any(k in msg for k in others), msg
    assert len(msg) < 500, len(msg)


def test_unknown_section_suggests_the_section_and_lists_the_sections():
    with pytest.raises(ValueError) as e:
        load_config(None, ["trian.steps=3"])
    msg = str(e.value)
    assert msg.startswith("unknown config key 'trian.steps'. Did you mean train.steps?"), msg
    assert "the sections are: task, reward, model, sampling, algo, optim, train, eval, log" in msg
    assert "eps_high_max" not in msg


def test_a_section_written_as_a_value_says_so(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("algo: 5\n")
    with pytest.raises(ValueError, match=r"line 1: section 'algo' must be a mapping of keys"):
        load_config(f)
    with pytest.raises(ValueError, match=r"'algo.eps_low' takes a value, not sub-keys"):
        load_config(None, ["algo.eps_low.x=1"])


# ------------------------------------------------------------------ values of advantage params
@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["algo.advantage=passk", "algo.advantage_params={k: 9}"],
            r"passk's k=9 exceeds the group size train.group_size=8",
        ),
        (
            ["algo.advantage=passk", "train.group_size=3"],
            r"passk's default k=4 exceeds the group size train.group_size=3",
        ),
        (["algo.advantage=passk", "algo.advantage_params={k: 0}"], r"passk's k must be an integer >= 1"),
        (["algo.advantage=passk", "algo.advantage_params={k: 2.5}"], r"passk's k must be an integer >= 1"),
        (["algo.advantage=focal", "algo.advantage_params={base: passk, k: 16}"], r"passk's k=16 exceeds"),
        (["algo.advantage=focal", "algo.advantage_params={base: grpp}"], r"focal's base must be another .*'grpo'"),
        (["algo.advantage=focal", "algo.advantage_params={base: focal}"], r"focal's base must be another"),
        (["algo.advantage=focal", "algo.advantage_params={gamma: -1}"], r"focal's gamma must be a finite number >= 0"),
        (
            ["algo.advantage=grpo", "algo.advantage_params={std: sample}"],
            r"grpo's std must be 'unbiased' or 'population'",
        ),
        (["algo.advantage=grpo", "algo.advantage_params={eps: -1}"], r"grpo's eps must be a finite number >= 0"),
    ],
)
def test_advantage_param_values_are_checked_against_the_group(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_passk_with_k_up_to_g_is_accepted():
    assert load_config(None, ["algo.advantage=passk", "algo.advantage_params={k: 8}"]).algo.advantage_params == {"k": 8}
    assert (
        load_config(None, ["algo.advantage=passk", "train.group_size=4", "train.mini_batches=2"]).train.group_size == 4
    )


# ------------------------------------------------------------------ files, before the model loads
def test_missing_files_are_config_errors(tmp_path):
    with pytest.raises(ValueError, match=r"model.path \(command line\): model path '\./nope' does not exist"):
        load_config(None, ["model.path=./nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_config(None, [f"model.path={tmp_path / 'empty'}"])
    with pytest.raises(ValueError, match=r"task.params.path \(command line\): dataset 'nope.jsonl' not found"):
        load_config(None, ["task.name=math", "task.params.path=nope.jsonl", "model.path=org/model"])
    assert load_config(None, ["model.path=Qwen/Qwen2.5-0.5B", "task.name=arithmetic"]).model.path  # a hub id


# ------------------------------------------------------------------ optim.schedule, train.keep_checkpoints
def test_lr_schedules_mirror_the_optimizer_and_are_checked():
    from gapo.rl import names, optimizer

    assert names.LR_SCHEDULES == tuple(optimizer.LR_SCHEDULES)
    assert load_config(None, ["optim.schedule=cosine"]).optim.schedule == "cosine"
    assert load_config(None, []).optim.schedule == "constant"  # today's warm-up then constant
    with pytest.raises(ValueError, match=r"unknown learning-rate schedule 'cosin'.*Did you mean 'cosine'") as e:
        load_config(None, ["optim.schedule=cosin"])
    assert str(e.value).startswith("optim.schedule (command line): ")


def test_keep_checkpoints_is_a_count():
    assert load_config(None, ["train.keep_checkpoints=3"]).train.keep_checkpoints == 3
    for bad in ("-1", "2.5", "true"):
        with pytest.raises(ValueError, match="train.keep_checkpoints"):
            load_config(None, [f"train.keep_checkpoints={bad}"])


# ------------------------------------------------------------------ TRL's names (docs/from-trl.md)
@pytest.mark.parametrize(
    "trl, key",
    [
        ("beta", "algo.kl_coef"),
        ("num_generations", "train.group_size"),
        ("learning_rate", "optim.lr"),
        ("epsilon", "algo.eps_low"),
        ("epsilon_high", "algo.eps_high_max"),
        ("max_completion_length", "sampling.max_new_tokens"),
        ("num_iterations", "train.epochs"),
        ("loss_type", "algo.agg"),
        ("scale_rewards", "algo.advantage"),
        ("lr_scheduler_type", "optim.schedule"),
        ("save_total_limit", "train.keep_checkpoints"),
        ("temperature", "sampling.temperature"),
        ("top_p", "sampling.top_p"),
        ("mask_truncated_completions", "algo.mask_truncated"),
        ("off_policy_mask_threshold", None),
    ],
)
def test_a_trl_name_bare_or_under_any_section_names_the_gapo_key(trl, key, tmp_path):
    want = f"Did you mean {key}? (TRL's {trl}" if key else f"TRL's {trl} has no gapo equivalent: "
    for given in (trl, f"algo.{trl}", f"train.{trl}", f"grpo.{trl}"):
        with pytest.raises(ValueError) as e:
            load_config(None, [f"{given}=1"])
        assert str(e.value).startswith(f"unknown config key {given!r}.{' ' + want}"), str(e.value)
    f = tmp_path / "trl.yaml"  # a TRL-style file: the name at the top level
    f.write_text(f"{trl}: 1\n")
    with pytest.raises(ValueError, match=re.escape(want)):
        load_config(f, [])


def test_every_trl_name_is_answered_and_names_a_real_key():
    from gapo.rl.config import _all_keys
    from gapo.rl.names import TRL_NAMES

    for name, (key, _) in TRL_NAMES.items():
        assert key is None or key in _all_keys() or key in ("--out", "--resume"), (name, key)
        with pytest.raises(ValueError) as e:
            load_config(None, [f"{name}=1"])
        assert (f"Did you mean {key}?" if key else "has no gapo equivalent") in str(e.value), name


def test_the_trl_table_covers_grpo_config():
    """Every field TRL's GRPOConfig declares has a row; every row is a field of GRPOConfig (its own
    or a TrainingArguments one)."""
    import dataclasses

    trl = pytest.importorskip("trl")
    from gapo.rl.names import TRL_NAMES

    own = set(trl.GRPOConfig.__annotations__)
    assert own - set(TRL_NAMES) == set()
    assert set(TRL_NAMES) - {f.name for f in dataclasses.fields(trl.GRPOConfig)} == set()


def _doc_rows(heading: str) -> list[list[str]]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "from-trl.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln.strip("|").split("|") for ln in section.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:]]  # without the header


def test_from_trl_md_is_the_table_both_ways():
    from gapo.rl.config import _all_keys
    from gapo.rl.names import TRL_NAMES

    def unquote(cell):
        return None if cell == "—" else cell.strip("`")

    rows = _doc_rows("TRL's names in gapo")
    assert {r[0].strip("`"): (unquote(r[1]), r[2]) for r in rows} == TRL_NAMES
    assert len(rows) == len(TRL_NAMES)  # no name twice
    inverse: dict = {}
    for name, (key, _) in TRL_NAMES.items():
        if key in _all_keys():
            inverse.setdefault(key, []).append(name)
    back = {
        r[0].strip("`"): [] if r[1] == "—" else [n.strip(" `") for n in r[1].split(",")]
        for r in _doc_rows("gapo's keys in TRL")
    }
    assert list(back) == _all_keys()
    assert back == {k: inverse.get(k, []) for k in _all_keys()}


def test_a_loss_registered_at_run_time_is_accepted_without_params(monkeypatch):
    from gapo.core import losses

    monkeypatch.setitem(losses.LOSSES, "mine", losses.LOSSES["ppo"])
    assert load_config(None, ["algo.loss=mine"]).algo.loss == "mine"
    with pytest.raises(ValueError, match="algo.loss_params"):
        load_config(None, ["algo.loss=mine", "algo.loss_params={tau: 1}"])
