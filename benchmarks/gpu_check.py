"""GPU check: a randomly initialised model of Qwen2.5-0.5B's shape through ``gapo train``.

    bash benchmarks/gpu_check.sh                 # on a machine with one CUDA GPU (≈ 5 min)
    python benchmarks/gpu_check.py --shape tiny --device cpu --steps 1   # the same path, small (a test)

The model is built from Qwen2.5-0.5B's config values alone (no download) and saved with a
byte-level BPE tokenizer trained here on Countdown text with a ChatML chat template. Then 3 RL
steps of Countdown run in bf16 with gradient checkpointing, once with full fine-tuning and once
with LoRA, and the script prints, per run: median step time, completion tokens/s of sampling,
and peak GPU memory. A random model earns no reward, so these are cost figures, not learning. A
third run (``trl_data``) is a TRL user's data and reward as they have them: ``--task data:PATH``
on conversational prompt-only rows (a system turn, a worked exchange, the question last) with a
TRL-style batched reward ``reward(prompts, completions, answer, **kwargs)`` (docs/from-trl.md).
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

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-0.5B's architecture (its config.json values); "tiny" keeps the shape family for a CPU test
SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=512,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    # the tests' checkpoint (tests/checkpoints.py): ~0.1M parameters, vocabulary = the tokenizer's
    "test": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=None,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build(path: Path, shape: str, *, seed: int = 0) -> None:
    """A random Qwen2 of ``SHAPES[shape]`` and a byte-level BPE tokenizer with ChatML specials and
    a chat template, saved to ``path`` (no download)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [
        f"{a} {b} {c} > {a * b + c}: {a}*{b}={a * b},{a * b}+{c}={a * b + c}"
        for a in range(1, 11)
        for b in range(1, 11)
        for c in range(1, 11)
    ] + ["system user assistant"] * 10
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=specials[1:]
    )
    tok.chat_template = CHAT_TEMPLATE
    dims = dict(SHAPES[shape], vocab_size=SHAPES[shape]["vocab_size"] or len(tok))
    cfg = Qwen2Config(**dims, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    print(f"built {shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters at {path}", flush=True)


COUNTDOWN = ["task.params.n_numbers=3", "task.params.num_range=[1,10]"]
# what every gapo run on the GPU shares (here and gpu_vs_trl.py's gapo side)
COMMON = [
    "model.gradient_checkpointing=true",
    "algo.eps_schedule=linear",
    "algo.eps_high_max=0.28",
    "optim.lr=1e-6",
    "eval.problems=0",
    "train.progress=false",
    "train.checkpoint_every=0",
]
TRL_REWARD = """
def reward(prompts, completions, answer, **kwargs):  # TRL's form: batched, conversational
    assert all(p[0]["role"] == "system" and p[-1]["role"] == "user" for p in prompts), prompts[0]
    return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]
"""


def trl_data(folder: Path) -> list[str]:
    """The ``trl_data`` run's task: TRL's conversational rows in a JSONL file and the reward above."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Answer with a number only."},
                {"role": "user", "content": "1 + 1?"},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": f"{a} + {b}?"},
            ],
            "answer": str(a + b),
        }
        for a in range(1, 11)
        for b in range(1, 11)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "trl_reward.py").write_text(TRL_REWARD)
    return ["--task", f"data:{folder / 'data.jsonl'}", "--reward", f"{folder / 'trl_reward.py'}:reward"]


def run(
    model: Path, out: Path, device: str, steps: int, extra: list[str], max_new_tokens: int = 64, task=COUNTDOWN
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "gapo.cli",
        "train",
        "--out",
        str(out),
        "--model",
        str(model),
        *task,
        f"train.steps={steps}",
        "train.prompts=16",
        "train.group_size=8",
        "train.mini_batches=4",
        "train.micro_batch_size=16",
        f"sampling.max_new_tokens={max_new_tokens}",
        f"model.device={device}",
        "model.dtype=bfloat16",
        *COMMON,
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tr = [r for r in recs if r["kind"] == "train"]
    tok_s = [r["rollout/response_len"] * 16 * 8 / max(r["time/sample_s"], 1e-9) for r in tr]
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "step_s": round(statistics.median(r["time/step_s"] for r in tr), 3),
        "sample_tok_s": round(statistics.median(tok_s), 1),
        "peak_gpu_gb": max((r.get("memory/peak_gpu_gb", 0.0) for r in tr), default=0.0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="completion tokens per rollout (default 64)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "model"
        build(model, a.shape)
        results = {}
        lora = ["model.lora={r: 16, alpha: 32, target_modules: all-linear}"]
        for name, extra, task in (
            ("full", [], COUNTDOWN),
            ("lora", lora, COUNTDOWN),
            ("trl_data", [], trl_data(Path(d) / "trl")),
        ):
            results[name] = run(model, Path(d) / name, a.device, a.steps, extra, a.max_new_tokens, task)
            print(name, json.dumps(results[name]), flush=True)
    print("gpu_check " + " ".join(f"{n}_{k}={v}" for n, r in results.items() for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
