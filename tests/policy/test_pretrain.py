"""Supervised pretraining: the loss falls, the cache is keyed, atomic and reused."""

import dataclasses
import json

import pytest
import torch

import gapo.policy.base_policy as pt
from gapo import tasks
from gapo.policy.base_policy import PRESETS, get_base_policy
from gapo.policy.model import load_policy, read_marker
from gapo.policy.pretrain import PretrainConfig, _Batcher, pretrain
from gapo.policy.sampling import SamplingParams
from gapo.rl.evaluate import EvalPlan, evaluate

torch.set_num_threads(1)

TINY = PretrainConfig(
    name="test",
    sft_mix=((dict(n_numbers=3, num_range=(1, 5)), 1.0),),
    rl_task=dict(n_numbers=3, num_range=(1, 5)),
    model_preset="micro",
    pool_size=100,
    batch_size=16,
    max_steps=40,
    time_budget_s=None,
    lr=1e-2,
    warmup_steps=5,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GAPO_CACHE", str(tmp_path))
    return tmp_path


def test_tiny_pretrain_lowers_the_loss():
    _, _, stats = pretrain(TINY, progress=False, log_every=1)
    losses = [loss for _, _, loss in stats["curve"]]
    assert stats["steps"] == TINY.max_steps
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, (first, last)


def test_batches_put_loss_on_completion_and_eos_only():
    from gapo.policy.model import build_tokenizer

    task = tasks.get("countdown", n_numbers=3, num_range=(1, 5))
    tok = build_tokenizer(task.alphabet)
    b = _Batcher(TINY, tok, seed=0)
    ids, mask = b.batch(8)
    for row, m in zip(ids.tolist(), mask.tolist()):
        text = tok.decode(row, skip_special_tokens=False).replace("<pad>", "")
        assert text.startswith("<bos>") and text.endswith("<eos>")
        prompt, completion = text[len("<bos>") : -len("<eos>")].split(":", 1)
        n_loss = sum(m)
        assert n_loss == len(completion) + 1  # every completion character and the EOS
        first = m.index(True)
        assert tok.decode(row[first : first + n_loss]) == completion + "<eos>"
        nums, target = prompt.split(">")
        assert (
            task.score(
                tasks.base.Problem(prompt + ":", int(target), {"numbers": tuple(map(int, nums.split()))}), completion
            )
            == 1.0
        )


def test_demonstrations_are_fresh_each_draw():
    from gapo.policy.model import build_tokenizer

    cfg = dataclasses.replace(TINY, pool_size=1)  # one problem, drawn again and again
    b = _Batcher(cfg, build_tokenizer("0123456789 +-*/=,>:"), seed=0)
    n_sol = b.pools[0][0].meta["n_solutions"]
    ids, _ = b.batch(32)
    assert len({tuple(r) for r in ids.tolist()}) > 1 or n_sol == 1


def test_cache_is_reused_and_rebuilt_atomically(cache, monkeypatch):
    calls = []
    real = pt.pretrain

    def counting(cfg, **kw):
        calls.append(cfg)
        return real(dataclasses.replace(cfg, max_steps=3), **kw)

    monkeypatch.setattr(pt, "pretrain", counting)
    path = get_base_policy(TINY, progress=False)
    assert len(calls) == 1
    assert path == cache / "base" / TINY.cache_key()
    assert [p.name for p in (cache / "base").iterdir()] == [path.name]  # no temp folders left
    marker = read_marker(path)
    assert marker["extra"]["cache_key"] == TINY.cache_key()
    assert marker["extra"]["stats"]["steps"] == 3
    model, tok = load_policy(path)
    assert tok("1 2 3>6:").input_ids[0] == tok.bos_token_id

    again = get_base_policy(TINY, progress=False)  # second call: no training
    assert again == path and len(calls) == 1
    # name / rl_task / description do not change the weights, so they share the cache
    assert get_base_policy(dataclasses.replace(TINY, name="other", rl_task={}), progress=False) == path
    assert len(calls) == 1

    (path / "sentinel").write_text("old")
    assert get_base_policy(TINY, rebuild=True, progress=False) == path
    assert len(calls) == 2 and not (path / "sentinel").exists()
    assert sorted(p.name for p in (cache / "base").iterdir()) == [path.name]


def test_failed_build_leaves_no_cache_entry(cache, monkeypatch):
    def boom(cfg, **kw):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(pt, "pretrain", boom)
    with pytest.raises(RuntimeError):
        get_base_policy(TINY, progress=False)
    assert not (cache / "base").exists() or list((cache / "base").iterdir()) == []


def test_cache_key_covers_training_fields():
    keys = {
        TINY.cache_key(),
        dataclasses.replace(TINY, seed=1).cache_key(),
        dataclasses.replace(TINY, lr=1e-3).cache_key(),
        dataclasses.replace(TINY, model_preset="tiny").cache_key(),
        dataclasses.replace(TINY, sft_mix=((dict(n_numbers=4, num_range=(1, 5)), 1.0),)).cache_key(),
    }
    assert len(keys) == 5
    assert dataclasses.replace(PRESETS["low"], rl_task={}, name="x").cache_key() == PRESETS["low"].cache_key()


def test_presets_are_valid_and_their_tasks_build():
    for name, cfg in PRESETS.items():
        assert cfg.name == name and cfg.max_steps >= 1
        for params, weight in cfg.sft_mix:
            assert weight > 0 and tasks.get(cfg.task, **params).generate("train", 2, seed=0)
        assert tasks.get(cfg.task, **cfg.rl_task).generate("eval", 2, seed=0)


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="known presets"):
        get_base_policy("lowe")


def test_evaluate_counts_correct_samples():
    # A "model" stand-in is overkill; check the bookkeeping with the tiny trained policy:
    # pass@k is monotone in k and equals the unbiased estimator of the per-problem counts.
    from gapo.core.metrics import pass_at_k

    model, tok, _ = pretrain(dataclasses.replace(TINY, max_steps=10), progress=False)
    task = tasks.get("countdown", **TINY.rl_task)
    probs = task.generate("eval", 6, seed=0)
    r = evaluate(model, tok, task, probs, SamplingParams(task.max_completion_len + 1), EvalPlan(n=4, seed=1))
    r.pop("time/eval_s")
    assert r["eval/n"] == 4 and len(r["eval/correct"]) == 6
    assert r["eval/pass@1"] <= r["eval/pass@2"] <= r["eval/pass@4"]
    assert r["eval/pass@2"] == pytest.approx(sum(pass_at_k(4, c, 2) for c in r["eval/correct"]) / 6)
    again = evaluate(model, tok, task, probs, SamplingParams(task.max_completion_len + 1), EvalPlan(n=4, seed=1))
    again.pop("time/eval_s")
    assert r == again  # seeded
    json.dumps(r)


def test_pretrain_logs_progress_lines_with_the_schedules_progress():
    from gapo.policy.pretrain import schedule_progress

    lines = []
    cfg = dataclasses.replace(TINY, max_steps=6)
    _, _, stats = pretrain(cfg, progress=True, log_every=2, log=lines.append)
    assert lines[0] == "pretrain base (test): up to 6 steps of 16 examples"
    assert [ln.split(",")[1].strip() for ln in lines[1:4]] == ["33% done", "67% done", "100% done"]
    assert lines[-1].startswith("pretrain base (test): done, 100% done, 6 steps in")
    # a CPU budget that binds first moves the progress (and the bar) ahead of the step count
    budget = dataclasses.replace(TINY, max_steps=1000, time_budget_s=10.0)
    assert schedule_progress(100, 5.0, budget) == 0.5 and schedule_progress(900, 5.0, budget) == 0.9
    assert schedule_progress(10, 50.0, budget) == 1.0
