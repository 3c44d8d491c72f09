"""gapo export and gapo eval RUN on a locally built Qwen2 checkpoint (ChatML template): runs
stopped early (only checkpoint.pt), finished runs, LoRA runs; reloaded in plain transformers/peft."""

import json
import shutil

import pytest
import torch

from checkpoints import build_instruct_checkpoint  # tests/checkpoints.py (tests/ is on sys.path)
from gapo.cli import main
from gapo.rl.config import load_config
from gapo.rl.export import export, load_run_model
from gapo.rl.trainer import Trainer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return str(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct")))


@pytest.fixture(scope="module")
def instruct_bf16(instruct, tmp_path_factory):
    """The same checkpoint saved in bfloat16 (config.json says so), as real instruct models ship."""
    out = tmp_path_factory.mktemp("qwen2-bf16")
    m = transformers.AutoModelForCausalLM.from_pretrained(instruct)
    m.to(torch.bfloat16).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(instruct).save_pretrained(out)
    return str(out)


def _cfg(model, *extra):
    return load_config(
        None,
        [
            f"model.path={model}",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=64",
            "train.prompts=2",
            "train.group_size=4",
            "train.mini_batches=2",
            "train.progress=false",
            "eval.problems=0",
            "sampling.max_new_tokens=8",
            "train.checkpoint_every=0",
            "optim.lr=1e-2",
            "train.steps=5",
            *extra,
        ],
    )


def _varied_reward(where):
    """A reward that differs between rollouts (so the weights move; the random model's Countdown
    reward is all 0)."""
    f = where.parent / f"{where.name}_rewards.py"
    f.write_text("def varied(prompt, completion, **fields):\n    return min(len(completion), 16) / 16\n")
    return f"reward.funcs=[{f}:varied]"


def _stopped_run(model, path, *extra):
    """A run stopped after 2 of 5 steps (as by Ctrl-C): checkpoint.pt, no policy/."""
    tr = Trainer(_cfg(model, _varied_reward(path), *extra), path)
    tr.fit(stop_after=2)
    assert (path / "checkpoint.pt").is_file() and not (path / "policy").exists()
    return tr


def test_export_of_an_early_stopped_full_run_reloads_in_plain_transformers(instruct_bf16, tmp_path):
    tr = _stopped_run(instruct_bf16, tmp_path / "run")
    trained = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    base = transformers.AutoModelForCausalLM.from_pretrained(instruct_bf16).state_dict()
    assert any(not torch.equal(v.to(torch.bfloat16), base[k]) for k, v in trained.items())  # it trained
    out, info = export(tmp_path / "run")
    assert out == tmp_path / "run-step2" and info["source"] == "checkpoint" and info["step"] == 2
    m = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert m.dtype == torch.bfloat16  # the base model's dtype, not the float32 master weights
    for k, v in m.state_dict().items():
        assert torch.equal(v, trained[k].to(torch.bfloat16)), k
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert "<|im_start|>" in tok.chat_template and (out / "generation_config.json").is_file()
    # the checkpoint holds float32 master weights (by design: model.dtype is autocast); the export
    # is half its size
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    f32, _ = export(tmp_path / "run", tmp_path / "f32", dtype="float32")
    assert transformers.AutoModelForCausalLM.from_pretrained(f32).dtype == torch.float32
    assert sum(f.stat().st_size for f in f32.glob("*.safetensors")) > 1.8 * size


def test_export_step_choice_and_clear_errors(instruct, tmp_path, capsys):
    _stopped_run(instruct, tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert "no model at step 3" in err and "last checkpoint (step 2)" in err
    assert main(["export", str(tmp_path / "run"), "--merge-lora"]) == 2
    assert "did not train LoRA adapters" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "busy")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err and (tmp_path / "busy" / "x").is_file()
    assert main(["export", instruct]) == 2
    assert "not a gapo run folder" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run"), "--step", "2", "--out", str(tmp_path / "e")]) == 0
    assert "at step 2 (from its checkpoint)" in capsys.readouterr().out


def test_finished_run_exports_its_policy_and_step(instruct, tmp_path):
    tr = Trainer(_cfg(instruct, _varied_reward(tmp_path / "run")), tmp_path / "run")
    tr.fit()
    out, info = export(tmp_path / "run", tmp_path / "out")
    assert info["source"] == "policy" and info["step"] == 5
    m = transformers.AutoModelForCausalLM.from_pretrained(out)
    for k, v in m.state_dict().items():
        assert torch.equal(v, tr.model.state_dict()[k]), k
    _, info = export(tmp_path / "run", tmp_path / "out2", step=5)  # the checkpoint has step 5 too: the policy
    assert info["source"] == "policy"


def test_lora_run_exports_adapter_or_merged_model(instruct, tmp_path):
    peft = pytest.importorskip("peft")
    tr = _stopped_run(instruct, tmp_path / "run", "model.lora={r: 4, alpha: 8}")
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = tr.model(x).logits
    adapter, info = export(tmp_path / "run", tmp_path / "adapter")
    assert info["adapter"] and (adapter / "adapter_config.json").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == instruct
    base = transformers.AutoModelForCausalLM.from_pretrained(instruct)
    with torch.no_grad():
        got = peft.PeftModel.from_pretrained(base, adapter)(x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    merged, info = export(tmp_path / "run", tmp_path / "merged", merge_lora=True)
    assert not info["adapter"] and not (merged / "adapter_config.json").exists()
    with torch.no_grad():
        got = transformers.AutoModelForCausalLM.from_pretrained(merged)(x).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_missing_base_model_is_named(instruct, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(instruct, base)
    _stopped_run(str(base), tmp_path / "run")
    shutil.rmtree(base)
    with pytest.raises(ValueError, match="needs its base model at"):
        export(tmp_path / "run", tmp_path / "out")


def test_eval_from_a_run_folder_reuses_its_prompt_settings(instruct, tmp_path, capsys, monkeypatch):
    system = "Answer tersely."
    _stopped_run(instruct, tmp_path / "run", f"task.system_prompt={system}", "eval.problems=3", "eval.samples=2")
    seen = []
    import gapo.rl.evaluate as ev

    real = ev.evaluate

    def spy(model, tok, task, problems, **kw):
        seen.append(kw["encode"](problems[0]))  # PromptEncoder.ids takes the problem
        return real(model, tok, task, problems, **kw)

    monkeypatch.setattr(ev, "evaluate", spy)
    assert main(["eval", str(tmp_path / "run"), "--problems", "2", "--n", "2"]) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["eval/problems"] == 2
    tok = transformers.AutoTokenizer.from_pretrained(instruct)
    assert system in tok.decode(seen[0])  # the run's system prompt and chat template, not given again
    # an override changes them
    assert main(["eval", str(tmp_path / "run"), "--problems", "2", "--n", "2", "task.system_prompt=Be brief."]) == 0
    assert "Be brief." in tok.decode(seen[1]) and system not in tok.decode(seen[1])
    # --step names the checkpoint; the model evaluated is the run's, not its base
    model, _, info = load_run_model(tmp_path / "run", 2)
    base = transformers.AutoModelForCausalLM.from_pretrained(instruct)
    assert info["source"] == "checkpoint" and any(
        not torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values())
    )
    assert main(["eval", str(tmp_path / "run"), "--step", "4", "--problems", "2"]) == 2
    assert "no model at step 4" in capsys.readouterr().err
    # without --problems/--n: the run's own eval.problems and eval.samples (were 64 and 16 always)
    assert main(["eval", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["eval/problems"] == 3 and "eval/pass@2" in res and "eval/pass@4" not in res


def test_eval_names_what_it_expects(instruct, tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    assert main(["eval", str(tmp_path / "notarun")]) == 2
    err = capsys.readouterr().err
    assert "not a gapo run folder" in err and "--model" in err
    assert main(["eval", "--model", str(tmp_path / "notarun")]) == 2
    err = capsys.readouterr().err
    assert "has no config.json and is not a gapo run folder" in err
    assert main(["eval", "--step", "3"]) == 2
    assert "--step N needs a run folder" in capsys.readouterr().err


def test_a_stopped_run_extended_to_its_own_step_writes_its_policy(instruct, tmp_path, capsys):
    tr = _stopped_run(instruct, tmp_path / "run")
    want = {k: v.clone() for k, v in tr.model.state_dict().items()}
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--allow-change", "train.steps=2"]) == 0, (
        capsys.readouterr().err
    )
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "policy")
    for k, v in m.state_dict().items():
        assert torch.equal(v, want[k]), k
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2]  # no step taken
    # now it is finished: a second resume says so and points to gapo export
    assert main(["train", "--out", str(tmp_path / "run"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "is finished (step 2 of train.steps=2)" in err and "gapo export" in err


def test_eval_of_a_runs_policy_folder_is_the_run(instruct, tmp_path, capsys):
    Trainer(_cfg(instruct, _varied_reward(tmp_path / "run"), "train.steps=1"), tmp_path / "run").fit()
    assert main(["eval", str(tmp_path / "run" / "policy"), "--problems", "2", "--n", "1"]) == 0
    assert "evaluating" in capsys.readouterr().err
    assert main(["eval", instruct, "--problems", "2"]) == 2  # a model folder given as RUN: says to use --model
    assert "a model folder, not a run folder" in capsys.readouterr().err


# ------------------------------------------------------------------ exports are never lost or mislabelled
def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_an_export_inside_a_run_folder_is_refused(instruct, tmp_path, capsys):
    """`--overwrite` of the run would delete it with the run: refused at any depth, through a
    symlink too, before anything is read or written."""
    run = tmp_path / "run"
    _stopped_run(instruct, run)
    (tmp_path / "link").symlink_to(run)
    before = _files(run)
    for out in (run / "exported", run / "a" / "b" / "c", tmp_path / "link" / "x"):
        assert main(["export", str(run), "--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert f"is inside the gapo run folder {str(run)!r}" in err and "--overwrite" in err, err
        with pytest.raises(ValueError, match="is inside the gapo run folder"):
            export(run, out)
    assert _files(run) == before and sorted(q.name for q in tmp_path.iterdir()) == ["link", "run", "run_rewards.py"]


def test_an_export_names_its_folder_after_the_weights_it_wrote(instruct, tmp_path, monkeypatch):
    """The run checkpoints (step 3) just after the export has read checkpoint.pt (step 2): the name
    and the weights come from that one read (the old code read it twice: 'run-step2' held step 3)."""
    from gapo.rl.run_dir import RunFolder

    run = tmp_path / "run"
    _stopped_run(instruct, run)
    step2 = torch.load(run / "checkpoint.pt", weights_only=False)
    step3 = torch.load(run / "checkpoint.pt", weights_only=False)
    step3["step"] = 3
    for v in step3["model"].values():
        if v.is_floating_point():
            v.add_(1.0)
    real, reads = RunFolder.load_checkpoint, []

    def checkpoint_after_the_read(self, map_location):
        state = real(self, map_location)
        if not reads:
            torch.save(step3, tmp_path / "next.pt")
            (tmp_path / "next.pt").rename(self.checkpoint)  # as the trainer writes it: a rename
        reads.append(state["step"])
        return state

    monkeypatch.setattr(RunFolder, "load_checkpoint", checkpoint_after_the_read)
    out, info = export(run, dtype="float32")
    assert reads == [2] and out.name == "run-step2" and info["step"] == 2
    assert json.loads((out / "gapo_policy.json").read_text())["extra"]["step"] == 2
    got = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    for k, v in got.items():
        assert torch.equal(v, step2["model"][k]), k


def test_a_finished_run_with_a_damaged_checkpoint_exports_and_evaluates_its_policy(instruct, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(_cfg(instruct, _varied_reward(run), "train.steps=1"), run).fit()
    ck = run / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])  # truncated (a full disk, a copy cut short)
    assert main(["export", str(run), "--out", str(tmp_path / "e")]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "is unreadable" in err and "using the final policy" in err and "(step 1)" in err
    want = transformers.AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()
    for k, v in transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "e").state_dict().items():
        assert torch.equal(v, want[k]), k
    assert main(["eval", str(run), "--problems", "2", "--n", "1"]) == 0
    err = capsys.readouterr().err
    assert "using the final policy" in err and "(policy, step 1); config: " in err and "unreadable" in err
    assert main(["export", str(run), "--step", "0"]) == 2  # nothing else to fall back on: named
    assert "no model at step 0" in capsys.readouterr().err


def test_eval_checks_a_hand_edited_config_yaml_as_resume_does(instruct, tmp_path, capsys, monkeypatch):
    """The checkpoint's config is the run's: an edited config.yaml is an error naming the key
    (the old code evaluated with it silently), unless --allow-change; either way the output says
    which config it used."""
    import yaml

    import gapo.policy.chat as chat

    run = tmp_path / "run"
    _stopped_run(instruct, run, "task.system_prompt=Answer tersely.")
    seen, real = [], chat.PromptEncoder

    def spy(*a, **kw):  # the system prompt gapo eval encodes its prompts with
        seen.append(kw.get("system_prompt"))
        return real(*a, **kw)

    monkeypatch.setattr(chat, "PromptEncoder", spy)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["task"]["system_prompt"] = "Edited by hand."
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    args = ["eval", str(run), "--problems", "2", "--n", "1"]
    assert main(args) == 2 and seen == []
    err = capsys.readouterr().err
    assert "task.system_prompt (run: 'Answer tersely.', config.yaml: 'Edited by hand.')" in err, err
    assert "edited after the run started" in err and "--allow-change" in err and err.count("error:") == 1
    assert main([*args, "--allow-change"]) == 0
    err = capsys.readouterr().err
    assert "config: " in err and "edited after the run started" in err and "--allow-change" in err
    assert seen == ["Edited by hand."]
    assert main([*args, "task.system_prompt=Be brief."]) == 2  # an override does not hide the edit
    capsys.readouterr()
    saved["task"]["system_prompt"] = "Answer tersely."
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert main(args) == 0
    assert f"config: the one inside {str(run / 'checkpoint.pt')!r}" in capsys.readouterr().err
    assert seen == ["Edited by hand.", "Answer tersely."]


def test_a_policy_swapped_while_it_is_read_is_an_error(instruct, tmp_path):
    """policy/'s step is read first, its weights after: a run that writes a new final policy in
    between (a rename, as checkpoint.write_policy does) must not get the old step's name."""
    from gapo.rl.export import RunModels

    run = tmp_path / "run"
    Trainer(_cfg(instruct, _varied_reward(run), "train.steps=1"), run).fit()
    rm = RunModels(run)
    assert rm.pick(None) == "policy" and rm.policy_step == 1
    shutil.copytree(run / "policy", run / ".policy.new")
    (run / "policy").rename(run / ".policy.old")
    (run / ".policy.new").rename(run / "policy")  # the run swapped in another final policy
    with pytest.raises(ValueError, match="was replaced while it was read"):
        load_run_model(rm)
    load_run_model(RunModels(run))  # read again: fine
