"""A TRL user's data as they have it: ``gapo train --task data:PATH`` on a JSONL file in TRL's
prompt-only formats (a ``prompt`` column holding conversations, few-shot turns and the question
last, beside standard string rows, and an ``answer`` column), with a Qwen2-style local
checkpoint (tests/checkpoints.py, no hub) whose template puts a default system turn before a
conversation without one and reads Qwen3's ``enable_thinking``. The model reads each
conversation whole, in training (``samples.jsonl``), in the run's evaluation and in
``gapo eval RUN``; and TRL's walk-through reward, ``reward(prompts, completions, **kwargs)``,
trains and evaluates on it unchanged."""

from __future__ import annotations

import json

import pytest

from checkpoints import (  # tests/checkpoints.py (tests/ is on sys.path under pytest)
    DEFAULT_SYSTEM,
    QWEN_TEMPLATE,
    build_instruct_checkpoint,
)
from gapo.cli import main
from gapo.rl import evaluate as evaluate_module

SYSTEM = "Answer with a number only."
REWARDS = """
def exact(prompt, completion, answer, **fields):  # the row's `prompt` column: the first argument wins
    return 1.0 if completion.strip() == answer else 0.0
"""


def rows() -> list[dict]:
    """TRL's conversational prompt-only rows (system, one worked exchange, the question), and a
    few standard ones."""
    out = []
    for a in range(1, 9):
        for b in (2, 5):
            few_shot = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "1 + 1?"},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": f"{a} + {b}?"},
            ]
            out.append({"prompt": few_shot, "answer": str(a + b)})
    return out + [{"prompt": f"{a} + 3 =", "answer": str(a + 3)} for a in range(1, 5)]


def rendered(row: dict, thinking_off: bool = True) -> str:
    """The prompt text the model should read for ``row``: TRL's apply_chat_template, by hand."""
    msgs = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
    head = "" if msgs[0]["role"] == "system" else f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return head + body + "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if thinking_off else "")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct"))
    (path / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    return path


def test_conversational_dataset_trains_and_evaluates_whole(qwen, tmp_path, capsys, monkeypatch):
    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (tmp_path / "rewards.py").write_text(REWARDS)
    texts = {rendered(r) for r in rows()}
    seen = []  # the prompts every evaluation samples from, decoded
    inner = evaluate_module.sample

    def spy(model, prompts, *args, **kwargs):
        seen.extend(prompts)
        return inner(model, prompts, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "sample", spy)
    run = tmp_path / "run"
    argv = [
        "train",
        "--out",
        str(run),
        "--task",
        f"data:{data}",
        "--reward",
        f"{tmp_path / 'rewards.py'}:exact",
        f"model.path={qwen}",
        "task.params.eval_fraction=0.3",
        "task.chat_template_kwargs.enable_thinking=false",
        "train.steps=1",
        "train.prompts=4",
        "train.group_size=2",
        "train.mini_batches=1",
        "train.progress=false",
        "train.checkpoint_every=0",
        "log.samples=8",
        "eval.problems=2",
        "eval.samples=1",
        "sampling.max_new_tokens=4",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8
    for s in samples:  # exactly a row's whole conversation as TRL renders it
        assert s["prompt"] in texts, s["prompt"]
    whole = [s["prompt"] for s in samples if s["prompt"].startswith(f"<|im_start|>system\n{SYSTEM}")]
    assert whole, [s["prompt"] for s in samples]  # the seed draws conversational rows among the 4
    assert all("<|im_start|>user\n1 + 1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n" in p for p in whole)
    assert all(DEFAULT_SYSTEM not in p for p in whole)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen)
    evals = [tok.decode(p) for p in seen]
    assert len(evals) == 4 and all(e in texts for e in evals), evals  # 2 problems, before and after
    assert main(["eval", str(run), "--problems", "2", "--n", "1", "sampling.max_new_tokens=4"]) == 0
    assert [tok.decode(p) for p in seen[4:]] == evals[:2]  # gapo eval RUN: the same prompts, rendered alike


# TRL's walk-through reward, used unchanged: batched, conversational completions
TRL_REWARDS = """
def reward(prompts, completions, answer, **kwargs):
    for p in prompts:  # TRL's conversational prompts: the row's messages, whole
        assert isinstance(p, list) and p[0]["role"] == "system" and p[-1]["role"] == "user", p
    return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]
"""


def test_trl_walkthrough_batched_reward(qwen, tmp_path, capsys):
    """TRL's GRPO walk-through as a gapo run: a conversational dataset with a ``prompt`` column and
    a TRL reward function ``reward(prompts, completions, **kwargs) -> list[float]``, unchanged;
    it trains and evaluates (the run's evaluation, then ``gapo eval RUN``)."""
    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows() if isinstance(r["prompt"], list)))
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    run = tmp_path / "run"
    argv = [
        "train",
        "--out",
        str(run),
        "--task",
        f"data:{data}",
        "--reward",
        f"{tmp_path / 'trl_rewards.py'}:reward",
        f"model.path={qwen}",
        "task.params.eval_fraction=0.3",
        "train.steps=1",
        "train.prompts=2",
        "train.group_size=2",
        "train.mini_batches=1",
        "train.progress=false",
        "train.checkpoint_every=0",
        "eval.problems=2",
        "eval.samples=2",
        "sampling.max_new_tokens=4",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in metrics] == ["eval", "train", "eval"]
    assert all(r["eval/problems"] == 2 for r in metrics if r["kind"] == "eval")
    assert metrics[1]["reward/n_reward"] == 4  # the function scored the step's 2 × 2 completions
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith(f"<|im_start|>system\n{SYSTEM}") for s in samples)
    capsys.readouterr()
    assert main(["eval", str(run), "--problems", "2", "--n", "2", "sampling.max_new_tokens=4"]) == 0
    assert json.loads(capsys.readouterr().out)["eval/problems"] == 2


def test_evaluate_without_an_encoder_refuses_a_conversation(qwen, tmp_path):
    """``evaluate``'s default input is the raw prompt: for a conversational row that would be its
    last turn alone, so it is an error naming the row, before anything is sampled."""
    from gapo.policy.model import load_policy
    from gapo.policy.sampling import SamplingParams
    from gapo.rl.evaluate import evaluate
    from gapo.tasks.base import DataSplits
    from gapo.tasks.data import DataTask

    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()[-4:] + rows()[:1]))  # 4 standard rows, then one
    task = DataTask(data, splits=DataSplits(eval_fraction=0.0))
    model, tok = load_policy(str(qwen))
    problems = sorted(task.generate("train", 5, 0), key=lambda p: p.meta["line"])
    with pytest.raises(ValueError, match=r"trl\.jsonl:5: a conversational prompt .* needs a chat template"):
        evaluate(model, tok, task, problems, SamplingParams(2))
