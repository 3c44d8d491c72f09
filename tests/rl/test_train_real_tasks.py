"""`gapo train --task math:PATH | humaneval | rg:NAME --model PATH` runs the same trainer on a
local Hugging Face checkpoint (here: a micro Llama with a printable-ASCII character tokenizer)."""

import json
import string
import sys
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def ascii_policy(tmp_path_factory):
    from gapo.policy.model import build_model, build_tokenizer, save_policy

    tok = build_tokenizer(string.printable)
    model = build_model(len(tok), "micro", seed=0)
    return str(save_policy(model, tok, tmp_path_factory.mktemp("policy") / "p"))


@pytest.fixture(scope="module", autouse=True)
def _close_scoring_pools():
    """The trainers here run in this process: the scoring pool they start (task.scoring_workers) is
    the process-wide one, shared by this file's tests and closed (its workers reaped) at the end."""
    yield
    from gapo.exec.scoring import SHARED

    SHARED.close()


def _train(tmp_path, policy, task, *extra):
    """``gapo train --task TASK --model POLICY`` for one step, in this process (the command line is
    the same parser and trainer; a fresh interpreter would only add its imports: ~10 s of CPU for
    transformers). Its train and eval records."""
    from gapo.cli import main

    run = tmp_path / "run"
    argv = [
        "train",
        "--task",
        task,
        "--model",
        policy,
        "--out",
        str(run),
        "train.steps=1",
        "train.prompts=2",
        "train.group_size=2",
        "train.mini_batches=1",
        "sampling.max_new_tokens=24",
        "eval.problems=2",
        "eval.samples=2",
        "train.progress=false",
        *extra,
    ]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"], [r for r in recs if r["kind"] == "eval"]


def test_math_jsonl_with_scoring_pool(tmp_path, ascii_policy):
    train, evals = _train(
        tmp_path,
        ascii_policy,
        f"math:{FIXTURES / 'math_gsm8k.jsonl'}",
        "task.scoring_workers=2",
        "task.params.eval_fraction=0.3",
        "eval.problems=1",
    )
    assert train[-1]["step"] == 1
    # random weights: nothing is correct, and garbage completions are counted as unparsable
    assert train[-1]["rollout/reward"] == 0.0
    assert "reward/unparsable_frac" in train[-1]
    assert "eval/pass@1" in evals[-1]


@pytest.mark.slow
def test_humaneval_in_the_sandbox(tmp_path, ascii_policy):
    train, _ = _train(tmp_path, ascii_policy, "humaneval", "task.scoring_workers=2")
    assert train[-1]["step"] == 1 and train[-1]["rollout/reward"] == 0.0


def test_reasoning_gym_task(tmp_path, ascii_policy):
    pytest.importorskip("reasoning_gym")
    train, _ = _train(tmp_path, ascii_policy, "rg:basic_arithmetic", "task.params.size=200")
    assert train[-1]["step"] == 1


def test_unknown_task_is_a_clear_cli_error(tmp_path, ascii_policy):
    p = timing.run(
        [
            sys.executable,
            "-m",
            "gapo.cli",
            "train",
            "--task",
            "countdwn",
            "--model",
            ascii_policy,
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        quiet_s=3,
        what="a CLI error",
    )
    assert p.returncode == 2
    assert "unknown task 'countdwn'" in p.stderr and "countdown" in p.stderr


def test_unknown_config_key_is_a_clear_cli_error(tmp_path):
    p = timing.run(
        [sys.executable, "-m", "gapo.cli", "train", "--out", str(tmp_path / "r"), "algo.eps_hihg=0.3"],
        capture_output=True,
        text=True,
        timeout=600,
        quiet_s=3,
        what="a CLI error",
    )
    assert p.returncode == 2 and "algo.eps_hihg" in p.stderr and "algo.eps_high" in p.stderr
