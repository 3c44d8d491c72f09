"""Resolving a run's policy changes no configuration (docs/design.md §3.2): ``resolve_policy``
takes plain values and returns a ``ResolvedPolicy``; ``with_policy`` applies it to a copy."""

import copy

import pytest

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


def _no_pretraining(monkeypatch, tmp_path):
    """An empty cache, and building a base policy an error: what a test must not reach."""
    from gapo.policy import base_policy

    monkeypatch.setenv("GAPO_CACHE", str(tmp_path / "cache"))

    def pretrain(*a, **k):
        raise AssertionError("a base policy was built")

    monkeypatch.setattr(base_policy, "pretrain", pretrain)


def test_a_trainer_refuses_an_unresolved_policy_and_builds_none(monkeypatch, tmp_path):
    from gapo.rl.config import load_config
    from gapo.rl.trainer import Trainer

    _no_pretraining(monkeypatch, tmp_path)
    cfg = load_config(None, ["model.base_preset=medium", "train.progress=false"])  # not shipped, not cached
    with pytest.raises(ValueError, match=r"model.path is unset.*with_policy\(cfg\)"):
        Trainer(cfg, tmp_path / "run")
    # a path without the preset's task params applied is not a resolved policy either
    with pytest.raises(ValueError, match="with_policy"):
        Trainer(cfg, tmp_path / "run", policy_path=str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="give one of them"):
        Trainer(load_config(None, [f"model.path={tmp_path / 'model'}"]), tmp_path / "run", policy_path=str(tmp_path))
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_trained_policy_is_model_path_or_the_resolved_one(tmp_path):
    from gapo.rl.trainer import trained_policy

    cfg = Config()
    cfg.model.path = str(tmp_path)
    assert trained_policy(cfg, None) == trained_policy(cfg, str(tmp_path)) == str(tmp_path)
    resolved, path = with_policy(Config(), progress=False)  # "low": shipped, nothing built
    assert trained_policy(resolved, path) == path


def test_building_a_base_policy_says_so_first(monkeypatch, tmp_path, capsys):
    from gapo.policy.base_policy import get_base_policy

    _no_pretraining(monkeypatch, tmp_path)
    with pytest.raises(AssertionError, match="was built"):
        get_base_policy("medium", progress=True)
    assert "[gapo] base policy 'medium' is not cached: training it now" in capsys.readouterr().err


def test_gapo_train_refuses_a_taken_folder_before_building_a_base_policy(monkeypatch, tmp_path, capsys):
    from gapo.cli import main

    _no_pretraining(monkeypatch, tmp_path)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["train", "--out", str(out), "model.base_preset=medium", "train.progress=false"]) == 2
    assert "exists" in capsys.readouterr().err and not (tmp_path / "cache").exists()
