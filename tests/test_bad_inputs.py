"""Bad inputs through the CLI as a careless user types them: exit 2, one line that names the
cause, no traceback, nothing written."""

import argparse
import re
import shutil

import pytest

from gapo.cli import main

BASE = [
    "task.params.n_numbers=2",
    "task.params.num_range=[1,10]",
    "train.prompts=4",
    "train.group_size=4",
    "train.mini_batches=2",
    "train.progress=false",
    "eval.problems=2",
    "eval.samples=2",
    "train.steps=1",
]


@pytest.fixture
def policy_copy(easy_policy, tmp_path):
    dst = tmp_path / "policy"
    shutil.copytree(easy_policy, dst)
    return dst


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda p: (p / "gapo_policy.json").write_text("{not json"), r"gapo_policy.json' is corrupt"),
        (lambda p: (p / "gapo_policy.json").write_text("[1, 2]"), r"gapo_policy.json' is corrupt"),
        (lambda p: (p / "config.json").write_text("{"), r"cannot load a model config"),
        (lambda p: (p / "tokenizer.json").unlink(), r"no tokenizer.json"),
        (lambda p: (p / "model.safetensors").write_bytes(b"\0" * 100), r"cannot load a causal LM"),
    ],
)
def test_damaged_model_folder_names_the_cause(policy_copy, tmp_path, capsys, damage, match):
    damage(policy_copy)
    assert main(["train", "--out", str(tmp_path / "run"), "--model", str(policy_copy), *BASE]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv, match",
    [
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
    ],
)
def test_bad_arguments_are_clear(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "text, match",
    [
        ("cells: [\n", r"grid file '.*grid.yaml', line 2: not valid YAML"),
        ("- a\n- b\n", r"grid file '.*grid.yaml': must be a mapping of grid keys"),
    ],
)
def test_a_malformed_grid_file_is_one_error(tmp_path, capsys, text, match):
    f = tmp_path / "grid.yaml"
    f.write_text(text)
    assert main(["compare", "--config", str(f), "--out", str(tmp_path / "cells")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(match, err), err
    assert not (tmp_path / "cells").exists()


def test_overrides_may_follow_flags(easy_policy, tmp_path):
    out = tmp_path / "r"
    assert main(["train", "train.steps=1", "--out", str(out), f"model.path={easy_policy}", *BASE[:-1]]) == 0
    assert "steps: 1" in (out / "config.yaml").read_text()


# ------------------------------------------------------------------ model-dependent checks, before --out
@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    from checkpoints import build_instruct_checkpoint  # tests/checkpoints.py

    return build_instruct_checkpoint(tmp_path_factory.mktemp("instruct"))


CHAT_ARGS = [
    "task.params.n_numbers=2",
    "task.params.num_range=[1,10]",
    "train.prompts=4",
    "train.group_size=4",
    "train.mini_batches=2",
    "train.progress=false",
    "eval.problems=2",
    "eval.samples=2",
    "train.steps=1",
    "sampling.max_new_tokens=8",
]


def _with_template(src, dst, template):
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").write_text(template)
    return dst


@pytest.mark.parametrize(
    "template, extra, match",
    [
        (
            "{% for m in messages %}{{ m.content }",
            [],
            r"cannot render the prompt \(line 1 of the template\): "
            r"TemplateSyntaxError",
        ),
        (
            "{{ raise_exception('only system turns') }}",
            [],
            r"cannot render the prompt: TemplateError: only system turns",
        ),
        ("{% if false %}x{% endif %}", [], r"renders nothing"),
        (
            "{% for m in messages %}<|im_start|>{{ m.role }}\n<|im_end|>{% endfor %}",
            [],
            r"renders a conversation without the user message's content",
        ),
        (
            "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
            ["task.system_prompt=Be brief."],
            r"without the system message's content",
        ),
        (
            "{% for m in messages %}{% if m.role == 'system' %}{{ m.undefined_attr.x }}{% endif %}{{ m.content }}"
            "{% endfor %}",
            ["task.system_prompt=Be brief."],
            r"cannot render the prompt: UndefinedError",
        ),
    ],
)
def test_chat_template_errors_name_the_template_before_out(instruct, tmp_path, capsys, template, extra, match):
    model = _with_template(instruct, tmp_path / "model", template)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--model", str(model), *CHAT_ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert re.search(match, err), err
    assert str(model / "chat_template.jinja") in err  # names the file to fix
    assert not out.exists()


def test_a_working_template_still_trains(instruct, tmp_path):
    assert (
        main(
            [
                "train",
                "--out",
                str(tmp_path / "run"),
                "--model",
                str(instruct),
                *CHAT_ARGS,
                "task.system_prompt=Be brief.",
            ]
        )
        == 0
    )


def _bert(path, cls_name, tokenizer_from, **config):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, **config
    )
    getattr(transformers, cls_name)(cfg).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / f, path / f)
    return path


@pytest.mark.parametrize(
    "cls_name, config, match",
    [
        ("BertModel", {}, r"holds a 'bert' model \(BertModel\), which is not a causal language model"),
        ("BertForMaskedLM", {}, r"holds a 'bert' model \(BertForMaskedLM\), which is not a causal language model"),
        ("BertLMHeadModel", {}, r"'bert' encoder \(BertLMHeadModel\) without is_decoder=true"),
    ],
)
def test_a_model_that_is_not_a_causal_lm_is_one_error_before_out(instruct, tmp_path, capsys, cls_name, config, match):
    model = _bert(tmp_path / "bert", cls_name, instruct, **config)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--model", str(model), *CHAT_ARGS]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert re.search(match, err), err
    assert str(model) in err
    assert not out.exists()


def test_passk_k_above_the_group_size_is_an_error_before_out(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(out),
                "algo.advantage=passk",
                "algo.advantage_params={k: 5}",
                "train.group_size=4",
                "train.mini_batches=2",
            ]
        )
        == 2
    )
    assert "passk's k=5 exceeds the group size train.group_size=4" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "reward", ["1", True, b"1", [1.0], None, "np.str_", "np.bool_", "np.array_str", "torch.bool"], ids=repr
)
def test_a_reward_that_is_not_a_real_number_is_rejected_before_out(easy_policy, tmp_path, capsys, monkeypatch, reward):
    import numpy as np
    import torch

    from gapo.tasks.countdown import CountdownTask

    value = (
        {
            "np.str_": np.str_("1"),
            "np.bool_": np.bool_(True),
            "np.array_str": np.array("1"),
            "torch.bool": torch.tensor(True),
        }.get(reward, reward)
        if isinstance(reward, str)
        else reward
    )
    monkeypatch.setattr(CountdownTask, "score", lambda self, problem, completion: value)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--model", easy_policy, *BASE]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(
        r"task 'countdown', problem 0 .*: reward .* is not a number; rewards must be finite real "
        r"numbers",
        err,
    ), err
    assert not out.exists()


def test_the_tasks_reward_as_a_reward_term_must_be_a_number_too(easy_policy, tmp_path, capsys, monkeypatch):
    from gapo.tasks.countdown import CountdownTask

    monkeypatch.setattr(CountdownTask, "score", lambda self, problem, completion: "1")
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--model", easy_policy, "--reward", "task", *BASE]) == 2
    err = capsys.readouterr().err
    assert "reward 'task' returned '1' (a str, not a number)" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("value", [1, 0.5, "np.float32", "np.int64", "np.array", "torch.float"])
def test_real_number_rewards_of_any_library_are_accepted(value):
    import numpy as np
    import torch

    from gapo.exec.scoring import check_reward

    v = (
        {
            "np.float32": np.float32(0.5),
            "np.int64": np.int64(1),
            "np.array": np.array(0.5),
            "torch.float": torch.tensor(0.5),
        }.get(value, value)
        if isinstance(value, str)
        else value
    )
    r = check_reward(type("T", (), {"name": "t"})(), [], 0, v)
    assert isinstance(r, float) and r == float(v)


# ------------------------------------------------------------------ help that helps
def _subcommands():
    from gapo.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("cmd", sorted(_subcommands()))
def test_every_option_has_a_help_line_with_its_default(cmd, capsys):
    p = _subcommands()[cmd]
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"gapo {cmd} {action.dest}: no help"
        if action.option_strings:
            text = p.formatter_class(prog="x")._get_help_string(action)
            assert "default" in text, f"gapo {cmd} {'/'.join(action.option_strings)}: help names no default: {text!r}"
    p.print_help()
    out = capsys.readouterr().out
    assert "examples:" in out and f"gapo {cmd}" in out.split("examples:")[1]


def test_examples_fit_their_command():
    from gapo.cli import command_modules

    commands = command_modules()
    # eval reads the task, model, sampling and eval sections, not the training algorithm's keys
    assert commands["eval"].OVERRIDE_EXAMPLE.split(".")[0] in ("eval", "sampling", "task", "model")
    for line in commands["eval"].EXAMPLES.splitlines()[1:]:
        assert not re.search(r"\b(algo|optim|train)\.", line), line
    for cmd, mod in commands.items():
        assert all(line.strip().startswith(f"gapo {cmd}") for line in mod.EXAMPLES.splitlines()[1:]), cmd


def test_every_base_policy_preset_is_listed_in_help_and_readme(capsys):
    from pathlib import Path

    from gapo.rl.names import BASE_PRESETS

    _subcommands()["pretrain"].print_help()
    pretrain = capsys.readouterr().out
    _subcommands()["train"].print_help()
    train = capsys.readouterr().out
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `gapo pretrain"))
    for preset in BASE_PRESETS:
        assert preset in pretrain and preset in train, preset
        assert preset in row, f"README's gapo pretrain row does not list preset {preset!r}: {row}"
