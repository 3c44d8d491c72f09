"""The README's "Your own model" commands run as written: a local Qwen2 checkpoint on a GSM8K
folder as it ships (``main/train-00000-of-00001.parquet``, ``main/test-…``), with the README's own
reward file (``my_rewards.py``), with only the model, dataset and run paths swapped for ones built
here, the device set to CPU and the sizes shrunk; then its ``gapo export`` and ``gapo eval RUN``
lines on that run, and the exported folder loaded by plain transformers."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("math_verify")
pd = pytest.importorskip("pandas")
pytest.importorskip("datasets")

from checkpoints import build_instruct_checkpoint  # noqa: E402  (tests/checkpoints.py; tests/ is on sys.path under pytest)
from gapo.cli import main  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
# the sizes shrunk for a test run (train.prompts × train.group_size stays divisible by train.mini_batches)
SHRINK = {"train.steps": "2", "train.prompts": "2", "sampling.max_new_tokens": "8", "eval.problems": "2"}


def _section() -> str:
    return README.read_text().split("\n## Your own model\n", 1)[1].split("\n## ", 1)[0]


def readme_command() -> list[str]:
    """argv of the first ```bash block under "## Your own model" (after ``gapo``)."""
    block = re.search(r"```bash\n(.*?)```", _section(), re.DOTALL).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["gapo", "train"], argv
    return argv[1:]


def readme_rewards() -> str:
    """The section's ```python block: the README's my_rewards.py."""
    return re.search(r"```python\n(.*?)```", _section(), re.DOTALL).group(1)


def readme_after() -> list[list[str]]:
    """argv of each line of the second ```bash block (gapo export, gapo eval)."""
    block = re.findall(r"```bash\n(.*?)```", _section(), re.DOTALL)[1]
    return [shlex.split(line)[1:] for line in block.strip().splitlines()]


def gsm8k_folder(root: Path) -> Path:
    """GSM8K's layout and columns: question, answer (worked solution, final answer after ####)."""

    def rows(lo, hi):
        return [
            {
                "question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have now?",
                "answer": f"He has {i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3} apples.\n#### {2 * i + 3:,}",
            }
            for i in range(lo, hi)
        ]

    main_dir = root / "gsm8k" / "main"
    main_dir.mkdir(parents=True)
    long = [{"question": f"Tom has {k} apple. " * 40 + "How many apples?", "answer": f"#### {k}"} for k in (1, 2, 3)]
    pd.DataFrame(rows(0, 60) + long).to_parquet(main_dir / "train-00000-of-00001.parquet")
    pd.DataFrame(rows(1000, 1010)).to_parquet(main_dir / "test-00000-of-00001.parquet")
    return main_dir


def adapt(argv: list[str], *, out: Path, model: str, data: Path, rewards: Path) -> list[str]:
    out_argv, i, seen = [], 0, set()
    while i < len(argv):
        tok = argv[i]
        if tok == "--reward":  # the README's file, written where the test runs
            value = argv[i + 1]
            if value.endswith(".py:" + value.rsplit(":", 1)[-1]):
                assert value.split(":")[0] == rewards.name, value
                value = f"{rewards}:{value.rsplit(':', 1)[1]}"
            out_argv += [tok, value]
            i += 2
            continue
        if tok in ("--out", "--model", "--task"):
            value = argv[i + 1]
            if tok == "--out":
                value = str(out)
            elif tok == "--model":
                value = model
            else:
                name, _, path = value.partition(":")
                assert name == "math" and path.endswith("gsm8k/main"), value
                value = f"math:{data}"
            out_argv += [tok, value]
            i += 2
            continue
        key, _, value = tok.partition("=")
        if key == "model.device":
            assert value == "cuda", tok
            value = "cpu"
        elif key in SHRINK:
            value = SHRINK[key]
        seen.add(key)
        out_argv.append(f"{key}={value}" if _ else tok)
        i += 1
    assert {"model.device", *SHRINK} <= seen, seen
    return out_argv


@pytest.mark.slow
def test_readme_your_own_model_command_runs(tmp_path, capsys, monkeypatch):
    argv = readme_command()
    assert "task.params.split=train" in argv and "--task" in argv
    for key in ("--reward", "reward.weights", "task.max_prompt_tokens", "sampling.stop"):
        assert any(a == key or a.startswith(key + "=") for a in argv), key
    model = str(build_instruct_checkpoint(tmp_path / "Qwen2.5-0.5B-Instruct"))
    run = tmp_path / "runs" / "qwen-gsm8k"
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(readme_rewards())
    argv = adapt(argv, out=run, model=model, data=gsm8k_folder(tmp_path), rewards=rewards)
    assert main(argv + ["train.progress=false"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    # task.max_prompt_tokens: the three long rows are dropped (said, and kept in events.jsonl)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    (f,) = [e for e in events if e["event"] == "filter_prompts"]
    assert f["train_dropped"] + f["eval_dropped"] == 3 and f["train_prompts"] + f["eval_prompts"] == 63, f
    assert f"dropped {f['train_dropped']} of {f['train_prompts']} training prompts" in err, err
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples
    system = next(a.split("=", 1)[1] for a in argv if a.startswith("task.system_prompt="))
    for s in samples:  # chat-templated, with the README's system prompt, the question from the parquet file
        p = s["prompt"]
        assert p.startswith(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nTom has "), p
        assert p.endswith("<|im_end|>\n<|im_start|>assistant\n") and "\\boxed{}" in p
        assert int(re.search(r"Tom has (\d+) ", p).group(1)) < 60  # from main/train (split=train)
        assert s["reward"] in (0.0, 1.0) and isinstance(s["completion"], str)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2]
    evals = [r for r in metrics if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and all(r["eval/problems"] == 2 for r in evals)
    train = [r for r in metrics if r["kind"] == "train"]
    for r in train:  # each term logged; R = 1·task + 0.1·boxed over every completion of the step
        assert {"reward/task", "reward/boxed", "reward/n_boxed"} <= set(r), sorted(r)
        assert r["rollout/reward"] == pytest.approx(r["reward/task"] + 0.1 * r["reward/boxed"], abs=1e-6)
    assert all(" apple. Tom has " not in s["prompt"] for s in samples)

    # the README's next lines: gapo export (bf16? the base's dtype) and gapo eval RUN, on this run
    export_argv, eval_argv = readme_after()
    assert export_argv[:2] == ["export", "runs/qwen-gsm8k"] and eval_argv[:2] == ["eval", "runs/qwen-gsm8k"]
    out = tmp_path / "qwen-gsm8k-rl"
    export_argv = [str(run) if a == "runs/qwen-gsm8k" else str(out) if a == "qwen-gsm8k-rl" else a for a in export_argv]
    assert main(export_argv) == 0, capsys.readouterr().err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and (out / "generation_config.json").is_file()
    import torch

    from gapo.policy.model import load_policy

    trained, _ = load_policy(run / "policy")
    for k, v in trained.state_dict().items():  # the base is float32: the export keeps float32, exactly
        assert torch.equal(m.state_dict()[k], v), k
    eval_argv = [str(run) if a == "runs/qwen-gsm8k" else a for a in eval_argv]
    eval_argv = [a for a in eval_argv if a not in ("--problems", "128", "--n", "8")] + [
        "--problems",
        "2",
        "--n",
        "2",
        "model.device=cpu",
        "sampling.max_new_tokens=8",
    ]
    capsys.readouterr()
    assert main(eval_argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["eval/problems"] == 2 and res["eval/n"] == 2
