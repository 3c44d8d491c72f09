"""Evaluation samples as configured: ``eval.temperature`` and ``eval.top_p`` (its own), and
training's ``sampling.stop`` and ``sampling.max_new_tokens`` (gapo.rl.evaluate.eval_params), in
``gapo eval`` and in the trainer's evaluations."""

import json

import pytest
import torch

import gapo.rl.evaluate as ev
from gapo import tasks
from gapo.cli import main
from gapo.policy.model import build_model, build_tokenizer, save_policy
from gapo.policy.sampling import SamplingParams
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer

TASK = ["task.name=countdown", "task.params.n_numbers=2", "task.params.num_range=[1,10]"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """An untrained micro Countdown policy: its samples differ from one another at top_p 1."""
    task = tasks.get("countdown", n_numbers=2, num_range=(1, 10))
    tok = build_tokenizer(task.alphabet)
    path = tmp_path_factory.mktemp("micro") / "policy"
    save_policy(build_model(len(tok), "micro", seed=0), tok, path)
    return str(path)


def _spy(monkeypatch, module):
    seen = []
    real = ev.evaluate

    def spy(*args, **kw):
        seen.append(kw["params"])
        return real(*args, **kw)

    monkeypatch.setattr(module, "evaluate", spy)
    return seen


def test_eval_params_maps_each_key():
    cfg = load_config(None, ["eval.temperature=0.5", "eval.top_p=0.25", 'sampling.stop=["</a>"]', "sampling.top_p=0.9"])
    assert ev.eval_params(cfg, 7, (3,)) == SamplingParams(7, 0.5, 0.25, (3,), ("</a>",))  # not sampling.top_p
    assert load_config(None, []).eval.top_p == 1.0


def _texts(monkeypatch) -> list[list[str]]:
    """Each ``sample`` call's decoded completions, as evaluation drew them."""
    calls = []
    real = ev.sample

    def spy(*args, **kw):
        out = real(*args, **kw)
        calls.append(out.texts(kw["tokenizer"]))
        return out

    monkeypatch.setattr(ev, "sample", spy)
    return calls


def test_gapo_eval_samples_at_eval_top_p(micro, monkeypatch, capsys):
    seen, texts = _spy(monkeypatch, ev), _texts(monkeypatch)
    base = ["eval", "--model", micro, "--problems", "3", "--n", "6", *TASK, "sampling.max_new_tokens=6"]
    assert main([*base, "eval.top_p=1e-6", 'sampling.stop=["="]']) == 0, capsys.readouterr().err
    json.loads(capsys.readouterr().out)
    assert seen[-1].top_p == 1e-6 and seen[-1].stop == ("=",) and seen[-1].max_new_tokens == 6
    # top_p tiny: only the most likely token is ever drawn, so a problem's 6 samples are one text
    narrow = texts[-1]
    assert len(narrow) == 18 and all(len(set(narrow[j : j + 6])) == 1 for j in range(0, 18, 6))
    assert main(base) == 0
    wide = texts[-1]
    assert seen[-1].top_p == 1.0 and all(len(set(wide[j : j + 6])) > 1 for j in range(0, 18, 6))  # top_p 1


def test_the_trainers_evaluation_samples_at_eval_top_p(micro, monkeypatch, tmp_path):
    import gapo.rl.trainer as trainer

    seen = _spy(monkeypatch, trainer)
    cfg = load_config(
        None,
        [
            f"model.path={micro}",
            *TASK,
            "task.train_size=50",
            "train.prompts=2",
            "train.group_size=2",
            "train.mini_batches=1",
            "train.progress=false",
            "eval.problems=2",
            "eval.samples=2",
            "eval.top_p=0.5",
            "eval.temperature=0.7",
            'sampling.stop=["="]',
            "sampling.max_new_tokens=5",
        ],
    )
    tr = Trainer(cfg, tmp_path / "run")
    try:
        with torch.no_grad():
            tr.evaluate()
    finally:
        tr.folder.release()
    assert seen[-1].top_p == 0.5 and seen[-1].temperature == 0.7
    assert seen[-1].stop == ("=",) and seen[-1].max_new_tokens == 5
