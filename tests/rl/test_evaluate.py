"""``evaluate(model, tok, task, problems, SamplingParams, EvalPlan)``: the plan's validation, and
the arguments taken as objects only (0.3 dropped the keyword form)."""

import dataclasses

import pytest
import torch

from gapo import tasks
from gapo.policy.model import build_model, build_tokenizer, eos_token_ids
from gapo.policy.sampling import SamplingParams
from gapo.rl.evaluate import EvalPlan, evaluate

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup():
    task = tasks.get("countdown", n_numbers=2, num_range=(1, 10))
    tok = build_tokenizer(task.alphabet)
    model = build_model(len(tok), "micro", seed=0).eval()
    with torch.no_grad():  # a frequent EOS: some samples stop before max_new_tokens
        model.lm_head.weight[tok.eos_token_id] *= 6.0
    return model, tok, task, task.generate("eval", 3, 0)


def _run(*args, **kwargs):
    res = evaluate(*args, **kwargs)
    res.pop("time/eval_s")
    return res


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n=0), "n must be"),
        (dict(n=2.0), "n must be"),
        (dict(seed="1"), "seed must be"),
        (dict(seed=True), "seed must be"),
        (dict(batch_size=0), "batch_size must be"),
    ],
)
def test_bad_plan_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EvalPlan(**kwargs)


def test_plan_defaults_and_frozen():
    assert EvalPlan() == EvalPlan(n=16, seed=0, batch_size=512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EvalPlan().n = 4


def test_the_plan_shapes_the_result(setup):
    model, tok, task, problems = setup
    params, plan = SamplingParams(6, temperature=0.8), EvalPlan(n=4, seed=1, batch_size=5)
    res = _run(model, tok, task, problems, params, plan)
    assert res["eval/n"] == 4 and res["eval/problems"] == 3 and len(res["eval/correct"]) == 3
    assert 0 < res["eval/response_len"] <= 6
    # the same plan (seed), the same samples
    assert res == _run(model, tok, task, problems, params, plan)


def test_plan_and_params_reach_the_sampler(setup):
    model, tok, task, problems = setup
    a = _run(model, tok, task, problems, SamplingParams(6), EvalPlan(n=2, seed=1))
    b = _run(model, tok, task, problems, SamplingParams(6), EvalPlan(n=2, seed=2))
    assert a["eval/entropy_proxy"] != b["eval/entropy_proxy"]  # another seed, other samples
    short = _run(model, tok, task, problems, SamplingParams(1), EvalPlan(n=2, seed=1))
    assert short["eval/response_len"] == 1.0  # max_new_tokens=1: one token per sample


def test_no_stop_token_given_means_the_models_own(setup):
    model, tok, task, problems = setup
    implicit = _run(model, tok, task, problems, SamplingParams(6), EvalPlan(n=2))
    eos = eos_token_ids(model, tok)
    explicit = _run(model, tok, task, problems, SamplingParams(6, eos_token_id=eos), EvalPlan(n=2))
    assert implicit == explicit
    never = _run(model, tok, task, problems, SamplingParams(6, eos_token_id=()), EvalPlan(n=2))  # no stop token
    assert never["eval/response_len"] == 6.0 > implicit["eval/response_len"]


def test_a_wrong_call_names_the_problem(setup):
    model, tok, task, problems = setup
    with pytest.raises(TypeError, match="needs params=SamplingParams"):
        evaluate(model, tok, task, problems)
    with pytest.raises(TypeError, match="plan must be an EvalPlan, got dict"):
        evaluate(model, tok, task, problems, SamplingParams(4), {"n": 2})
    for kw in (dict(temperature=0.5), dict(n=2, max_new_tokens=4)):  # 0.1's keyword form is gone
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            evaluate(model, tok, task, problems, SamplingParams(4), **kw)
