"""``gapo config``: every key with its type, default and help from the config dataclasses (one
source, which docs/config.md is rendered from), and the resolved config as YAML a ``--config``
file reads back."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from gapo.cli import main
from gapo.cli.config import keys, render_markdown, render_text, yaml_value
from gapo.rl.config import Config, load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def test_docs_config_md_is_the_render_of_the_dataclasses():
    # edit a key's help in src/gapo/rl/config.py and this fails until docs/config.md is rendered again
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == render_markdown(), (
        "docs/config.md differs from the config dataclasses: gapo config --markdown > docs/config.md"
    )


def test_every_key_has_a_one_line_help_and_every_section_a_doc():
    for name, cls in SECTIONS.items():
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), f"{name}: no docstring"
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help", "")
            assert text.strip() and "\n" not in text, f"{name}.{f.name}: help {text!r}"


def test_every_key_is_listed_with_its_type_and_default():
    rows = {k: (tp, d) for sec in SECTIONS for k, tp, d, _ in keys(sec)}
    assert len(rows) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values())
    # hand-read from the dataclasses: YAML's spelling of each default, as an override writes it
    assert rows["optim.lr"] == ("float", "5.0e-05")
    assert rows["optim.betas"] == ("tuple[float, float]", "[0.9, 0.999]")
    assert rows["task.chat"] == ("bool | str", "auto")
    assert rows["model.path"] == ("str | None", "null")
    assert rows["reward.funcs"] == ("list[str]", "[]")
    assert rows["train.progress"] == ("bool", "true")
    md = render_markdown()
    for k in rows:
        assert f"| `{k}` |" in md, k
    assert "| `task.chat` | `bool \\| str` | `auto` |" in md  # a pipe inside a cell is escaped


def test_defaults_in_the_listing_are_the_defaults_a_config_gets():
    cfg = to_dict(Config())
    for sec in SECTIONS:
        for key, _, default, _ in keys(sec):
            assert yaml.safe_load(default) == yaml.safe_load(yaml_value(cfg[sec][key.split(".")[1]])), key


def test_a_mutable_default_is_not_shared():
    a, b = Config(), Config()
    a.task.params["x"] = 1
    a.sampling.stop.append("\n")
    assert b.task.params == {} and b.sampling.stop == [] and Config().task.params == {}


def test_gapo_config_lists_a_section(capsys):
    assert main(["config", "optim"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("optim: AdamW and its learning-rate schedule.\n  optim.lr: float = 5.0e-05\n      AdamW's")
    assert "train.steps" not in out and "optim.grad_clip: float = 1.0" in out
    assert main(["config"]) == 0
    everything = capsys.readouterr().out
    assert everything == render_text() and all(f"\n{sec}: " in "\n" + everything for sec in SECTIONS)


def test_gapo_config_prints_the_resolved_config_that_a_config_file_reads_back(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("train:\n  steps: 7\nalgo:\n  eps_schedule: linear\n")
    argv = ["config", "--config", str(tmp_path / "run.yaml"), "algo.eps_high_max=0.28", "--task", "countdown"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    d = yaml.safe_load(out)
    assert d["train"]["steps"] == 7 and d["algo"]["eps_schedule"] == "linear" and d["algo"]["eps_high_max"] == 0.28
    assert d["algo"]["reward_range"] == [0.0, 1.0]  # settled by validation: the saved config says what runs
    assert list(d) == list(SECTIONS)
    (tmp_path / "resolved.yaml").write_text(out)
    assert to_dict(load_config(tmp_path / "resolved.yaml")) == to_dict(
        load_config(tmp_path / "run.yaml", ["algo.eps_high_max=0.28"])
    )
    assert main(["config", "--yaml", "train", "train.steps=3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"train": {**to_dict(Config())["train"], "steps": 3}}


@pytest.mark.parametrize(
    "argv, match",
    [
        (["config", "algoo"], "unknown config section 'algoo'; known: ['algo', "),
        (["config", "algo", "optim"], "give at most one section, got ['algo', 'optim']"),
        (["config", "--markdown", "algo"], "--markdown renders every key's reference; give it alone"),
        (["config", "train.stpes=3"], "unknown config key 'train.stpes'. Did you mean train.steps or"),
        (["config", "--config", "bad.yaml"], "config file 'bad.yaml', line 2: unknown config key 'train.stpes'"),
        (["config", "optim.lr=nan"], "optim.lr (command line): must be a finite number"),  # validated too
    ],
)
def test_gapo_config_errors_name_what_is_wrong(argv, match, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("train:\n  stpes: 3\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gapo config: error: ") and match in err, err
