"""A pretrained-instruct-shaped checkpoint through the trainer: chat prompts, precision, memory
options and LoRA, on a Qwen2-architecture model with a byte-level BPE tokenizer and a Qwen-style
chat template, all built here (no hub)."""

import json
import os

import pytest
import torch

import timing  # tests/timing.py: timeouts that say they are timeouts
from checkpoints import CHAT_TEMPLATE, build_instruct_checkpoint  # tests/checkpoints.py (tests/ is on sys.path)
from gapo.policy.chat import PromptEncoder
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer
from gapo.tasks.base import Problem


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return str(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct")))


def _cfg(model, *extra):
    return load_config(
        None,
        [
            f"model.path={model}",
            "task.params.n_numbers=2",
            "task.params.num_range=[1,10]",
            "task.train_size=64",
            "train.prompts=4",
            "train.group_size=4",
            "train.mini_batches=2",
            "train.progress=false",
            "eval.problems=0",
            "sampling.max_new_tokens=12",
            "train.checkpoint_every=0",
            "optim.lr=1e-3",
            *extra,
        ],
    )


def _samples(run):
    return [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ prompts
def test_chat_template_builds_the_prompt(instruct, tmp_path):
    Trainer(_cfg(instruct, "train.steps=1", "log.samples=3"), tmp_path / "r").fit()
    rows = _samples(tmp_path / "r")
    assert len(rows) == 3 and rows[0]["step"] == 1
    p = rows[0]["prompt"]
    assert p.startswith("<|im_start|>user\n") and p.endswith("<|im_end|>\n<|im_start|>assistant\n"), p
    assert isinstance(rows[0]["completion"], str) and rows[0]["reward"] in (0.0, 1.0)


def test_system_prompt_and_chat_false(instruct, tmp_path):
    from gapo.policy.model import load_policy

    _, tok = load_policy(instruct)
    enc = PromptEncoder(tok, chat="auto", system_prompt="Answer briefly.")
    problem = Problem("2 3 > 6:", None)
    text = enc.text(problem)
    assert text == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n2 3 > 6:<|im_end|>\n<|im_start|>assistant\n"
    )
    assert enc.ids(problem) == tok(text, add_special_tokens=False).input_ids
    raw = PromptEncoder(tok, chat=False)
    assert raw.text(problem) == "2 3 > 6:" and raw.ids(problem) == tok("2 3 > 6:").input_ids
    with pytest.raises(ValueError, match="system_prompt needs a chat template"):
        PromptEncoder(tok, chat=False, system_prompt="x")


def test_embedded_policy_keeps_raw_prompts(easy_policy, tmp_path):
    Trainer(
        load_config(
            None,
            [
                f"model.path={easy_policy}",
                "task.params.n_numbers=2",
                "task.params.num_range=[1,10]",
                "train.prompts=4",
                "train.group_size=4",
                "train.mini_batches=2",
                "train.steps=1",
                "train.progress=false",
                "eval.problems=0",
                "train.checkpoint_every=0",
            ],
        ),
        tmp_path / "r",
    ).fit()
    row = _samples(tmp_path / "r")[0]
    assert "<|im_start|>" not in row["prompt"] and row["prompt"].endswith(":")
    with pytest.raises(ValueError, match="no chat template"):
        Trainer(
            load_config(None, [f"model.path={easy_policy}", "task.chat=true", "train.progress=false"]), tmp_path / "r2"
        )


# ------------------------------------------------------------------ precision and memory
def _one_step_params(model, tmp_path, name, *extra, forwards=None):
    tr = Trainer(_cfg(model, "train.steps=1", "train.mini_batches=1", *extra), tmp_path / name)
    if forwards is not None:  # record the rows of every forward pass of the update
        inner = tr._logprobs
        tr._logprobs = lambda m, batch, rows=None: (
            forwards.append(None if rows is None else rows.numel()),
            inner(m, batch, rows),
        )[1]
    rec = tr.train_step()
    return {n: p.detach().clone() for n, p in tr.model.named_parameters()}, rec, tr


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_same_update(instruct, tmp_path, agg):
    """Splitting each mini-batch into micro-batches of 3 rows (16 = 3+3+3+3+3+1) changes nothing
    but float rounding: same parameters after the step, same loss."""
    extra = [
        f"algo.agg={agg}",
        "algo.kl_coef=0.05",
        "algo.entropy_coef=0.01",
        "algo.eps_schedule=linear",
        "algo.eps_high_max=0.28",
    ]
    sizes_full, sizes_micro = [], []
    full, rec_full, _ = _one_step_params(instruct, tmp_path, "full", *extra, forwards=sizes_full)
    micro, rec_micro, _ = _one_step_params(
        instruct, tmp_path, "micro", *extra, "train.micro_batch_size=3", forwards=sizes_micro
    )
    assert 16 in sizes_full and max(s for s in sizes_micro if s) == 3  # the split really happened
    assert sorted(s for s in sizes_micro if s)[-6:] == [1, 3, 3, 3, 3, 3]
    for n in full:
        assert torch.allclose(full[n], micro[n], atol=1e-6, rtol=1e-5), n
    assert rec_micro["loss/total"] == pytest.approx(rec_full["loss/total"], abs=1e-6)
    assert rec_micro["optim/grad_norm"] == pytest.approx(rec_full["optim/grad_norm"], rel=1e-5)


def test_auto_micro_batches_split_where_the_logits_exceed_the_budget(instruct, tmp_path, monkeypatch):
    """``train.micro_batch_size=auto`` (the default) keeps a mini-batch whole while its float32
    logits fit ``update.AUTO_MICRO_BATCH_BYTES``, and with a budget of 3 rows' logits gives the
    update of ``train.micro_batch_size=3``, bit for bit (the same rollout: the same seed)."""
    from gapo.rl import update

    seen, real = [], update.micro_batch_rows
    monkeypatch.setattr(update, "micro_batch_rows", lambda *a: seen.append(a) or real(*a))
    sizes_whole, sizes_auto, sizes_three = [], [], []
    _one_step_params(instruct, tmp_path, "whole", forwards=sizes_whole)
    assert 16 in sizes_whole  # one mini-batch of 16 rows, one forward
    (size, width, vocab) = seen[0]
    from transformers import AutoConfig

    assert size == "auto" and vocab == AutoConfig.from_pretrained(instruct).vocab_size and width > 0
    monkeypatch.setattr(update, "AUTO_MICRO_BATCH_BYTES", 3 * 4 * width * vocab + 1)
    auto, rec_auto, _ = _one_step_params(instruct, tmp_path, "auto", forwards=sizes_auto)
    three, rec_three, _ = _one_step_params(
        instruct, tmp_path, "three", "train.micro_batch_size=3", forwards=sizes_three
    )
    assert sizes_auto == sizes_three and max(s for s in sizes_auto if s) == 3, sizes_auto
    assert all(torch.equal(auto[n], three[n]) for n in auto)
    assert rec_auto["loss/total"] == rec_three["loss/total"]


def test_gradient_checkpointing_gives_the_same_update(instruct, tmp_path):
    plain, _, _ = _one_step_params(instruct, tmp_path, "plain")
    ckpt, _, tr = _one_step_params(instruct, tmp_path, "ckpt", "model.gradient_checkpointing=true")
    assert tr.model.is_gradient_checkpointing
    for n in plain:
        assert torch.allclose(plain[n], ckpt[n], atol=1e-6), n


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_keeps_fp32_weights_and_exact_old_logprobs(instruct, tmp_path, dtype):
    tr = Trainer(_cfg(instruct, "train.steps=1", f"model.dtype={dtype}"), tmp_path / dtype)
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    batch = tr._rollout()
    rows = torch.arange(batch.rewards.numel())
    with torch.no_grad():
        old, _ = tr._logprobs(tr.model, batch, rows)
    new, _ = tr._logprobs(tr.model, batch, rows)  # the training forward, with autograd
    assert old.dtype == torch.float32 and torch.equal(old, new.detach())  # ratio exactly 1 before a step
    rec = tr.train_step()
    assert torch.isfinite(torch.tensor(rec["loss/total"]))


# ------------------------------------------------------------------ LoRA
LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"


def test_lora_trains_adapters_only_and_the_reference_is_the_base(instruct, tmp_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(instruct)
    # the entropy bonus moves the adapters even when a random policy earns no reward
    tr = Trainer(
        _cfg(instruct, "train.steps=2", LORA, "algo.kl_coef=0.1", "algo.entropy_coef=0.01", "train.mini_batches=1"),
        tmp_path / "lora",
    )
    assert tr.ref_model is None  # no second copy: the reference is the base with adapters disabled
    rec = tr.train_step()
    assert rec["loss/kl_ref"] == 0.0  # LoRA's B starts at 0: policy == base before the first step
    rec = tr.train_step()
    assert rec["loss/kl_ref"] > 0.0
    sd = dict(tr.model.named_parameters())
    changed = [n for n, p in sd.items() if "lora_" in n]
    assert changed and all(p.requires_grad for n, p in sd.items() if "lora_" in n)
    plain = {k.replace("base_model.model.", "", 1).replace(".base_layer", ""): v for k, v in sd.items()}
    for n, p in base.named_parameters():  # every base weight unchanged
        assert torch.equal(p, plain[n].detach()), n


def test_lora_checkpoint_holds_the_adapter_and_resumes_exactly(instruct, tmp_path):
    from gapo.policy.model import load_policy

    straight = Trainer(_cfg(instruct, "train.steps=2", LORA), tmp_path / "a")
    straight.fit()
    first = Trainer(_cfg(instruct, "train.steps=2", LORA), tmp_path / "b")
    first.fit(stop_after=1)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert state["model"] and all("lora_" in k for k in state["model"])  # the adapter only
    resumed = Trainer(_cfg(instruct, "train.steps=2", LORA), tmp_path / "b", resume=True)
    resumed.fit()
    a = dict(straight.model.named_parameters())
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, a[n]), n
    assert (tmp_path / "a" / "policy" / "adapter" / "adapter_config.json").is_file()
    merged, tok = load_policy(tmp_path / "a" / "policy")  # the merged model loads as a plain checkpoint
    assert not hasattr(merged, "peft_config")
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>"  # the tokenizer survives the save


@pytest.mark.parametrize(
    "bad, match",
    [
        ("model.lora={rank: 4}", r"model.lora .*unknown entries \['rank'\]"),
        ("model.lora={r: 0}", r"model.lora .*: r must be an integer >= 1"),
        ("model.lora={r: 4, dropout: 1.5}", r"model.lora .*: dropout must be a number in \[0, 1\)"),
        ("model.dtype=bf16", r"model.dtype .*unknown dtype 'bf16'.*bfloat16"),
        ("task.chat=maybe", r"task.chat .*auto, true or false"),
        ("train.micro_batch_size=0", r"train.micro_batch_size .*'auto', an integer >= 1"),
        ("train.micro_batch_size=half", r"train.micro_batch_size .*'auto', an integer >= 1 .* got 'half'"),
    ],
)
def test_bad_real_model_options_are_clear(bad, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [bad])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_sampler_matches_model_forward_under_autocast(instruct, dtype):
    """gapo's KV-cached fast path and the model's own forward draw the same tokens with the same
    log-probs, in float32 and under bf16 autocast; the log-probs come back as float32."""
    from gapo.policy.model import load_policy
    from gapo.policy.precision import autocast
    from gapo.policy.sampling import DecodeOptions, SamplingParams, sample

    model, tok = load_policy(instruct, dtype=torch.float32)
    prompts = [tok("2 3 > 6:").input_ids] * 4 + [tok("7 1 4 > 28:").input_ids] * 4
    runs = []
    for fast in (True, False):
        with autocast(torch.device("cpu"), dtype):
            runs.append(
                sample(
                    model,
                    prompts,
                    params=SamplingParams(max_new_tokens=8, eos_token_id=tok.eos_token_id),
                    generator=torch.Generator().manual_seed(0),
                    pad_token_id=tok.pad_token_id,
                    options=DecodeOptions(fast=fast),
                )
            )
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].logp, runs[1].logp) and runs[0].logp.dtype == torch.float32


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu_at_a_tiny_shape(monkeypatch, capsys):
    """benchmarks/gpu_check.py is the one prepared GPU check; its path (build a Qwen2-shaped
    model from config values, bf16 + gradient checkpointing, with and without LoRA) must work
    before a GPU session spends device time on it. At the script's smallest shape (``test``: the
    tests' own ~0.1M checkpoint, vocabulary from the tokenizer) with 16 completion tokens instead
    of 64 (the same path). The script's ``main`` runs here and so do its three ``gapo train``
    children (full, LoRA, a TRL user's data with a batched reward; ``gapo.cli.main`` with the
    command line the script built): a fresh interpreter
    costs ~11 s of CPU in imports alone (the script's own and each child's used to: 33 s of CPU
    in all). The script starting from its command line is checked with ``--help``, and
    ``python -m gapo.cli train`` in a fresh interpreter by tests/rl/test_run_lock.py and others."""
    import math
    import os
    import re
    import subprocess
    import sys
    import types
    from pathlib import Path

    from gapo.cli import main as gapo_main

    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / "gpu_check.py"
    out = timing.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60, quiet_s=1)
    assert out.returncode == 0 and "--max-new-tokens" in out.stdout, out.stderr[-2000:]

    sys.path.insert(0, str(script.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(script.parent))
    runs = []

    def train(cmd, *, check, env):  # the script's ``subprocess.run`` of ``python -m gapo.cli train ...``
        assert cmd[:4] == [sys.executable, "-m", "gapo.cli", "train"] and check, cmd
        assert str(root / "src") in env["PYTHONPATH"].split(os.pathsep), env["PYTHONPATH"]
        runs.append(cmd)
        if rc := gapo_main(cmd[3:]):
            raise subprocess.CalledProcessError(rc, cmd)

    monkeypatch.setattr(gpu_check, "subprocess", types.SimpleNamespace(run=train))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # model.threads: null reads it, as in a child
    argv = ["--shape", "test", "--device", "cpu", "--steps", "1", "--max-new-tokens", "16"]
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            assert gpu_check.main() == 0
    finally:
        torch.set_num_threads(threads)
    assert len(runs) == 3 and any(a.startswith("model.lora=") for a in runs[1]), runs
    assert any(a.startswith("data:") for a in runs[2]) and any(a.endswith("trl_reward.py:reward") for a in runs[2])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(re.findall(r"(\w+)=(\S+)", last))
    assert last.startswith("gpu_check ") and set(fields) == {
        f"{run}_{k}"
        for run in ("full", "lora", "trl_data")
        for k in ("wall_s", "step_s", "sample_tok_s", "peak_gpu_gb")
    }, last
    for run in ("full", "lora", "trl_data"):
        assert all(math.isfinite(float(fields[f"{run}_{k}"])) for k in ("step_s", "sample_tok_s")), last
        assert float(fields[f"{run}_step_s"]) > 0 and float(fields[f"{run}_peak_gpu_gb"]) == 0.0, last  # CPU


def test_report_shows_what_the_model_wrote(instruct, tmp_path, capsys):
    from gapo.cli import main

    Trainer(_cfg(instruct, "train.steps=2", "log.samples=2"), tmp_path / "r").fit()
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "r, step 2 (" in out and "<|im_start|>assistant" in out and "completion:" in out
    assert "What the model wrote" in (tmp_path / "rep" / "report.md").read_text()


@pytest.mark.slow
def test_gpu_vs_trl_script_runs_on_cpu_at_the_test_shape(tmp_path):
    """benchmarks/gpu_vs_trl.py (issue 37's GPU side-by-side, run by gpu_check.sh) on its whole
    path before a GPU session spends device time on it: the model built once, the TRL-format data
    and batched reward written, gapo's ``gapo train`` and TRL's ``GRPOTrainer`` children in fresh
    processes, full and LoRA, the ratios on the last line. Here at the tests' ``test`` shape on the
    CPU in float32, one step of 4 tokens (the GPU run: bf16 at Qwen2.5-0.5B's shape)."""
    import math
    import re
    import sys
    from pathlib import Path

    pytest.importorskip("trl")
    pytest.importorskip("peft")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_vs_trl.py"
    argv = ["--shape", "test", "--device", "cpu", "--dtype", "float32", "--steps", "1", "--warmup", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    out = timing.run(
        [sys.executable, str(script), *argv, "--max-new-tokens", "4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        quiet_s=40,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    fields = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    assert lines[-1].startswith("gpu_vs_trl ") and set(fields) == {
        f"{m}_{k}" for m in ("full", "lora") for k in ("step_time", "peak_mem")
    }, lines[-1]
    for m in ("full", "lora"):
        assert math.isfinite(float(fields[f"{m}_step_time"])) and float(fields[f"{m}_step_time"]) > 0, lines[-1]
        assert math.isnan(float(fields[f"{m}_peak_mem"])), lines[-1]  # no GPU memory on a CPU
        runs = [json.loads(x.split(" ", 2)[2]) for x in lines if x.startswith(f"{m} ")]
        assert len(runs) == 2 and all(r["step_s"] > 0 and r["sample_s"] > 0 for r in runs), lines
