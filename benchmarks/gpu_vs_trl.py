"""gapo and TRL's ``GRPOTrainer`` side by side on identical work, on one GPU (issue 37, item 4).

    bash benchmarks/gpu_check.sh          # gpu_check.py, then this script (about 8 minutes on one H200)
    python benchmarks/gpu_vs_trl.py --shape test --device cpu --dtype float32 --steps 1 --warmup 0   # small, a test

The model is ``gpu_check.build``'s: a random Qwen2 of Qwen2.5-0.5B's shape (its 151,936-entry
tied head; no download) with a ChatML byte-level BPE tokenizer, saved once and loaded by both
systems in float32. The work, the same for both, in a fresh process per run:

- data: 100 conversational prompt-only rows (TRL's format: ``{"prompt": [{"role": "user", ...}]}``),
  rendered by the tokenizer's chat template; 16 prompts × 8 completions per rollout batch, at
  most ``--max-new-tokens`` (64) tokens, temperature 1, no top-p;
- reward: one TRL-style batched function, ``reward(prompts, completions, **kwargs)``, the parity of
  the completion's code points (a random model earns it about half the time, so groups are mixed
  and no row is skipped for a zero advantage); gapo takes the same file through ``--reward``;
- update: 4 optimiser steps per rollout batch, each on 32 completions in 2 micro-batches of 16
  (TRL: ``per_device_train_batch_size=16``, ``gradient_accumulation_steps=2``,
  ``steps_per_generation=8``; gapo: ``train.mini_batches=4``, ``train.micro_batch_size=16``), AdamW
  lr 1e-6, token-mean loss (TRL ``loss_type="dapo"``), no KL, bf16 autocast over float32 weights
  (TRL ``bf16=True``; gapo ``model.dtype=bfloat16``), gradient checkpointing in both;
- ``full`` fine-tuning and ``lora`` (r = 16, alpha = 32, every linear layer; TRL through peft's
  ``LoraConfig``, gapo through ``model.lora``).

gapo runs GAPO's adaptive upper bound, TRL its fixed ε = 0.2 (the bounds change no work). A step
is one rollout batch and its 4 optimiser steps; ``--warmup`` steps are dropped, the median of the
next ``--steps`` is kept, with the sampling time and peak GPU memory (``max_memory_allocated``).
The runs alternate (gapo first for full, TRL first for LoRA). The last line is
``gpu_vs_trl full_step_time=<gapo/trl> full_peak_mem=<gapo/trl> lora_step_time=… lora_peak_mem=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from gpu_check import COMMON, build  # noqa: E402  (the model builder and the shared overrides)

PROMPTS, GROUP, MINI, MICRO = 16, 8, 4, 16
LORA = {"r": 16, "alpha": 32}
REWARD = """
def reward(prompts, completions, **kwargs):  # TRL's form: batched, conversational
    return [float(sum(map(ord, c[0]["content"])) % 2) for c in completions]
"""


def write_data(folder: Path) -> tuple[Path, Path]:
    rows = [{"prompt": [{"role": "user", "content": f"{a} + {b}?"}]} for a in range(1, 11) for b in range(1, 11)]
    data, reward = folder / "data.jsonl", folder / "reward.py"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward.write_text(REWARD)
    return data, reward


def run_gapo(a, model: Path, data: Path, reward: Path, out: Path, mode: str) -> dict:
    cmd = [sys.executable, "-m", "gapo.cli", "train", "--out", str(out), "--model", str(model)]
    cmd += ["--task", f"data:{data}", "--reward", f"{reward}:reward"]
    cmd += [
        f"train.steps={a.warmup + a.steps}",
        f"train.prompts={PROMPTS}",
        f"train.group_size={GROUP}",
        f"train.mini_batches={MINI}",
        f"train.micro_batch_size={MICRO}",
        f"sampling.max_new_tokens={a.max_new_tokens}",
        f"model.device={a.device}",
        f"model.dtype={a.dtype}",
        *COMMON,
    ]
    if mode == "lora":
        cmd.append(f"model.lora={{r: {LORA['r']}, alpha: {LORA['alpha']}, target_modules: all-linear}}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tr = [r for r in recs if r["kind"] == "train"][a.warmup :]
    return {
        "step_s": statistics.median(r["time/step_s"] for r in tr),
        "sample_s": statistics.median(r["time/sample_s"] for r in tr),
        "peak_gpu_gb": max(r.get("memory/peak_gpu_gb", 0.0) for r in tr),
    }


def run_trl(a, model_path: Path, data: Path, reward_file: Path, mode: str) -> dict:
    """One TRL run in this process (``--one trl``)."""
    import importlib.util

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.set_verbosity_error()
    spec = importlib.util.spec_from_file_location("bench_reward", reward_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    per_step = MINI  # optimiser steps per rollout batch
    gen_s: list[float] = []
    ends: list[float] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_s.append(time.perf_counter() - t0)
            return out

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    peft_config = None
    if mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=LORA["r"], lora_alpha=LORA["alpha"], target_modules="all-linear", task_type="CAUSAL_LM"
        )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=a.device == "cpu",
            bf16=a.dtype == "bfloat16",
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=10**6,
            per_device_train_batch_size=MICRO,
            gradient_accumulation_steps=PROMPTS * GROUP // MINI // MICRO,
            steps_per_generation=PROMPTS * GROUP // MICRO,
            num_generations=GROUP,
            num_iterations=1,
            max_steps=(a.warmup + a.steps) * per_step,
            max_completion_length=a.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            loss_type="dapo",
            beta=0.0,
            learning_rate=1e-6,
            gradient_checkpointing=True,
            dataloader_num_workers=0,
        )
        trainer = Timed(
            model=model,
            reward_funcs=mod.reward,
            args=args,
            train_dataset=Dataset.from_list([json.loads(x) for x in data.read_text().splitlines()]),
            processing_class=AutoTokenizer.from_pretrained(model_path),
            peft_config=peft_config,
            callbacks=[Clock()],
        )
        trainer.train()
    steps = [ends[(c + 1) * per_step] - ends[c * per_step] for c in range(a.warmup, a.warmup + a.steps)]
    cuda = a.device.startswith("cuda")
    return {
        "step_s": statistics.median(steps),
        "sample_s": statistics.median(gen_s[a.warmup : a.warmup + a.steps]),
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
    }


def trl_child(a, model: Path, data: Path, reward: Path, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--one", mode, "--model", str(model), "--data", str(data), "--reward", str(reward)]
    cmd += ["--device", a.device, "--dtype", a.dtype, "--steps", str(a.steps), "--warmup", str(a.warmup)]
    cmd += ["--max-new-tokens", str(a.max_new_tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="steps dropped before them")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    ap.add_argument("--one", choices=["full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--reward", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_trl(a, a.model, a.data, a.reward, a.one)))
        return 0
    ratios = []
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "model"
        build(model, a.shape)
        data, reward = write_data(Path(d))
        for i, mode in enumerate(a.modes):
            res = {}
            for system in ("gapo", "trl") if i % 2 == 0 else ("trl", "gapo"):
                if system == "gapo":
                    res[system] = run_gapo(a, model, data, reward, Path(d) / f"gapo-{mode}", mode)
                else:
                    res[system] = trl_child(a, model, data, reward, mode)
                print(mode, system, json.dumps(res[system]), flush=True)
            g, t = res["gapo"], res["trl"]
            mem = g["peak_gpu_gb"] / t["peak_gpu_gb"] if t["peak_gpu_gb"] else float("nan")
            ratios += [f"{mode}_step_time={g['step_s'] / t['step_s']:.3f}", f"{mode}_peak_mem={mem:.3f}"]
            print(
                f"{mode}: gapo / trl step time {g['step_s'] / t['step_s']:.3f}, sampling "
                f"{g['sample_s'] / t['sample_s']:.3f}, peak GPU memory {mem:.3f}",
                flush=True,
            )
    print("gpu_vs_trl " + " ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
