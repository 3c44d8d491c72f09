"""Resolving a run's policy changes no configuration (docs/design.md §3.2): ``resolve_policy``
takes plain values and returns a ``ResolvedPolicy``; ``with_policy`` applies it to a copy."""

import copy

from gapo.policy.base_policy import ResolvedPolicy, base_task_params, resolve, resolve_policy
from gapo.rl.config import Config, to_dict
from gapo.rl.trainer import with_policy


def test_the_embedded_policy_fills_task_params_on_a_copy_and_leaves_the_input_unchanged():
    cfg = Config()  # embedded base policy ("low", shipped), countdown, no task params
    object.__setattr__(cfg, "_sources", {"optim.lr": "run.yaml:4"})
    before, task_before = copy.deepcopy(to_dict(cfg)), cfg.task
    out, path = with_policy(cfg, progress=False)
    assert to_dict(cfg) == before and cfg.task is task_before and cfg.task.params == {}
    assert out is not cfg and out.task is not cfg.task
    assert out.task.params == dict(resolve("low").rl_task) and out.task.params
    assert out._where("optim.lr") == "optim.lr (run.yaml:4)"  # where each key came from survives
    again, path_again = with_policy(out, progress=False)  # idempotent
    assert again is out and path_again == path


def test_an_explicit_model_or_given_params_keep_the_runs_own(tmp_path):
    assert base_task_params(None, "countdown", {"n_numbers": 3}, "low") is None
    assert base_task_params(str(tmp_path), "countdown", {}, "low") is None
    assert base_task_params(None, "arithmetic", {}, "low") is None
    got = resolve_policy(tmp_path, "low", task_name="countdown", task_params={}, progress=False)
    assert got == ResolvedPolicy(str(tmp_path), None)
    cfg = Config()
    cfg.model.path = str(tmp_path)
    before = copy.deepcopy(to_dict(cfg))
    out, path = with_policy(cfg, progress=False)
    assert out is cfg and path == str(tmp_path) and to_dict(cfg) == before
