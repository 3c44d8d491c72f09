"""The README's "Your own model" command runs as written: a local Qwen2 checkpoint on a GSM8K
folder as it ships (``main/train-00000-of-00001.parquet``, ``main/test-…``), with only the model,
dataset and run paths swapped for ones built here, the device set to CPU and the sizes shrunk."""

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


def readme_command() -> list[str]:
    """argv of the first ```bash block under "## Your own model" (after ``gapo``)."""
    text = README.read_text()
    section = text.split("\n## Your own model\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["gapo", "train"], argv
    return argv[1:]


def gsm8k_folder(root: Path) -> Path:
    """GSM8K's layout and columns: question, answer (worked solution, final answer after ####)."""
    def rows(lo, hi):
        return [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have now?",
                 "answer": f"He has {i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3} apples.\n#### {2 * i + 3:,}"}
                for i in range(lo, hi)]
    main_dir = root / "gsm8k" / "main"
    main_dir.mkdir(parents=True)
    pd.DataFrame(rows(0, 60)).to_parquet(main_dir / "train-00000-of-00001.parquet")
    pd.DataFrame(rows(1000, 1010)).to_parquet(main_dir / "test-00000-of-00001.parquet")
    return main_dir


def adapt(argv: list[str], *, out: Path, model: str, data: Path) -> list[str]:
    out_argv, i, seen = [], 0, set()
    while i < len(argv):
        tok = argv[i]
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


def test_readme_your_own_model_command_runs(tmp_path, capsys):
    argv = readme_command()
    assert "task.params.split=train" in argv and "--task" in argv
    model = str(build_instruct_checkpoint(tmp_path / "Qwen2.5-0.5B-Instruct"))
    run = tmp_path / "runs" / "qwen-gsm8k"
    argv = adapt(argv, out=run, model=model, data=gsm8k_folder(tmp_path))
    assert main(argv + ["train.progress=false"]) == 0, capsys.readouterr().err
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
