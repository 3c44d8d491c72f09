"""Bad inputs through the CLI as a careless user types them: exit 2, one line that names the
cause, no traceback, nothing written."""

import re
import shutil

import pytest

from gapo.cli import main

BASE = ["task.params.n_numbers=2", "task.params.num_range=[1,10]", "train.prompts=4", "train.group_size=4",
        "train.mini_batches=2", "train.progress=false", "eval.problems=2", "eval.samples=2", "train.steps=1"]


@pytest.fixture
def policy_copy(easy_policy, tmp_path):
    dst = tmp_path / "policy"
    shutil.copytree(easy_policy, dst)
    return dst


@pytest.mark.parametrize("damage, match", [
    (lambda p: (p / "gapo_policy.json").write_text("{not json"), r"gapo_policy.json' is corrupt"),
    (lambda p: (p / "gapo_policy.json").write_text("[1, 2]"), r"gapo_policy.json' is corrupt"),
    (lambda p: (p / "config.json").write_text("{"), r"cannot load a model config"),
    (lambda p: (p / "tokenizer.json").unlink(), r"no tokenizer.json"),
    (lambda p: (p / "model.safetensors").write_bytes(b"\0" * 100), r"cannot load a causal LM"),
])
def test_damaged_model_folder_names_the_cause(policy_copy, tmp_path, capsys, damage, match):
    damage(policy_copy)
    assert main(["train", "--out", str(tmp_path / "run"), "--model", str(policy_copy), *BASE]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, match", [
    (["eval", "--n", "0"], "argument --n: must be an integer >= 1, got 0"),
    (["eval", "--problems", "-3"], "argument --problems: must be an integer >= 1"),
    (["eval", "--threads", "two"], "argument --threads: must be an integer >= 1, got 'two'"),
    (["demo", "--steps", "0"], "argument --steps: must be an integer >= 1"),
    (["pretrain", "--eval", "-1"], "argument --eval: must be an integer >= 0"),
    (["train", "--resume"], "--resume needs --out"),
    (["train", "--allow-change", "--out", "x"], "--allow-change only applies with --resume"),
    (["train", "--out", "x", "stray"], "override 'stray' must look like section.key=value"),
    (["train", "--out", "x", "train.steps=1", "--bogus"], "unrecognized arguments: --bogus"),
    (["train", "--out", "x", "task.params={n_numbers:", "3}"], "quote an override whose value has spaces"),
    (["train", "--task", "countdown:3"], "takes no ':' argument"),
])
def test_bad_arguments_are_clear(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_overrides_may_follow_flags(easy_policy, tmp_path):
    out = tmp_path / "r"
    assert main(["train", "train.steps=1", "--out", str(out), f"model.path={easy_policy}", *BASE[:-1]]) == 0
    assert "steps: 1" in (out / "config.yaml").read_text()
