"""One RL step of TRL's GRPOTrainer on CPU, for comparison with gapo's own trainer.

    python benchmarks/bench_trl_step.py [--steps 5 --threads 1 2 --num-iterations 1 2]

Setup (matches the embedded-size policy of docs/design.md §9): a 1.06M-parameter Qwen2 (hidden 128,
intermediate 512, 4 layers, 4 heads, untied head) with random weights and a 22-token character
vocabulary; 8 prompts × 8 generations = 64 completions of up to 16 tokens per step, sampled with
``model.generate`` (no vLLM); token-level loss (``loss_type="dapo"``), no KL (``beta=0``), fp32,
Adam. One *step* is one batch: generate + score + ``num_iterations`` optimiser steps on it (with
``num_iterations=2`` TRL also recomputes the behaviour log-probs, as GRPO with μ > 1 must).

Reported per configuration: median step time, median generation time (inside the step),
completion tokens per second (generated tokens / step time), peak RSS, and the median process
CPU time per step (all threads; on a shared machine it moves less than wall time does). The first step is a
warm-up and not counted. ``main`` runs each configuration in a fresh process so that peak RSS
and thread settings do not leak between them; ``run_trl`` is importable for ``bench_step.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ALPHABET = "0123456789+-*/()= "  # 18 characters + 4 specials = 22 tokens


def _prompts(n: int) -> list[dict]:
    return [{"prompt": f"{(7 * i) % 90 + 10}+{(13 * i) % 90 + 10}="} for i in range(n)]


# Model shapes. "tiny" is the benchmark's original size (the embedded policy of docs/design.md §9);
# "5m" and "30m" give the same character tokenizer a larger vocabulary (single CJK / Hangul
# characters appended to the alphabet, one token each) and are Qwen2-shaped with grouped-query
# attention and tied embeddings. With V = 8192 or 32000 a random model samples EOS with p ≈ 1/V per
# token, so completions practically always run to the length limit in both systems.
SHAPES = {
    "tiny": dict(
        vocab=22,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        max_position_embeddings=128,
    ),
    "5m": dict(
        vocab=8192,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=512,
    ),
    "30m": dict(
        vocab=32000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=512,
    ),
}


def _filler(n: int) -> str:
    # n single characters outside the alphabet and the specials (CJK ideographs, then Hangul syllables)
    chars = [chr(c) for c in range(0x4E00, 0xA000)] + [chr(c) for c in range(0xAC00, 0xD7A4)]
    if n > len(chars):
        raise ValueError(f"at most {len(chars) + 22} tokens, got {n + 22}")
    return "".join(chars[:n])


def reward_fn(shape: str):
    """The reward of ``shape``: ``"1" in completion`` at the tiny vocabulary; with a large
    vocabulary (where digits are rarely sampled) the parity of the characters' code points,
    which gives mixed groups (≈ 50% success)."""
    if shape == "tiny":
        return lambda c: float("1" in c)
    return lambda c: float(sum(map(ord, c)) % 2)


def build_policy(seed: int = 0, shape: str = "tiny"):
    """The benchmark's policy of ``shape`` (``SHAPES``): a Qwen2 with random weights from
    ``seed`` and the character tokenizer. Both systems start from exactly this."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gapo.policy.model import build_tokenizer

    kw = dict(SHAPES[shape])
    vocab = kw.pop("vocab")
    tok = build_tokenizer(ALPHABET + _filler(vocab - 22))
    assert len(tok) == vocab, (len(tok), vocab)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            **kw,
        )
    ).float()
    return model, tok


def flops_per_step(
    shape: str, n_params: int, prompt_len: int, completion_tokens: float, rows: int = 64, mu: int = 1
) -> dict:
    """Nominal FLOPs of one step's work (the same for both systems, whatever either skips): 2·N per
    prompt and generated token of sampling (every row's prompt counted), 6·N per trained token
    (a completion token, the ones with a loss) for each of the μ updates, plus attention: 4·d
    per query–key pair and layer forward, × 3 with backward. The update's forward and backward
    through the prompt positions is not counted (≤ 5% at 128 tokens). ``N`` counts every weight
    used in a matrix multiply (the input embedding lookup is free: with tied embeddings ``N`` is
    all parameters; untied ones exclude the embedding table)."""
    c = SHAPES[shape]
    n = n_params - (0 if c["tie_word_embeddings"] else c["vocab"] * c["hidden_size"])
    P, T = prompt_len, completion_tokens / rows  # T: mean completion length
    L = P + T
    per_pair = 4 * c["hidden_size"] * c["num_hidden_layers"]
    sample = 2 * n * rows * L + per_pair * rows * L * (L + 1) / 2
    update = mu * (6 * n * rows * T + 3 * per_pair * rows * (T * P + T * (T + 1) / 2))
    return {"n_flop_params": n, "sample_flops": sample, "update_flops": update, "step_flops": sample + update}


def run_trl(
    n_steps: int,
    threads: int,
    num_iterations: int,
    *,
    warmup: int = 1,
    seed: int = 0,
    shape: str = "tiny",
    max_tokens: int = 16,
    gradient_checkpointing: bool | None = None,
) -> dict:
    """Time ``n_steps`` GRPO steps (after ``warmup``) of TRL's GRPOTrainer; returns a dict of results.

    Step 0 is timed from the start of the training loop (``on_train_begin``), so with ``warmup=0``
    it includes the loop's one-off setup. ``gradient_checkpointing=None`` keeps GRPOConfig's default
    (``True`` in TRL 1.16: each decoder layer's forward is recomputed in backward)."""
    if n_steps < 1 or warmup < 0:
        raise ValueError(f"need n_steps >= 1 and warmup >= 0, got n_steps={n_steps}, warmup={warmup}")
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    model, tok = build_policy(seed, shape)
    reward = reward_fn(shape)
    n_params = sum(p.numel() for p in model.parameters())

    prompts_per_step, group = 8, 8
    total = warmup + n_steps
    gen_times: list[float] = []
    gen_tokens: list[int] = []
    step_ends: list[float] = []
    cpu_ends: list[float] = []  # process CPU time: less sensitive than wall time to a busy machine

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_times.append(time.perf_counter() - t0)
            gen_tokens.append(int(out["completion_mask"].sum()))
            return out

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # the start of step 0
            step_ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

        def on_step_end(self, args, state, control, **kw):
            step_ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=10**6,
            seed=seed,
            per_device_train_batch_size=prompts_per_step * group,
            num_generations=group,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=num_iterations,
            max_steps=total * num_iterations,
            max_completion_length=max_tokens,
            temperature=1.0,
            loss_type="dapo",
            importance_sampling_level="token",
            beta=0.0,
            learning_rate=1e-5,
            dataloader_num_workers=0,
            **({} if gradient_checkpointing is None else {"gradient_checkpointing": gradient_checkpointing}),
        )
        trainer = Timed(
            model=model,
            reward_funcs=lambda completions, **kw: [reward(c) for c in completions],
            args=args,
            train_dataset=Dataset.from_list(_prompts(64)),
            processing_class=tok,
            callbacks=[Clock()],
        )
        t_start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t_start

    k = num_iterations
    # step_ends[0] is the start of training, step_ends[j + 1] the end of optimiser step j. Step c spans
    # optimiser steps c·k … c·k+k−1: it starts when step c−1's last one ends (step 0: at the start).
    step_s = [step_ends[c * k + k] - step_ends[c * k] for c in range(warmup, total)]
    cpu_s = [cpu_ends[c * k + k] - cpu_ends[c * k] for c in range(warmup, total)]
    toks = gen_tokens[warmup:total]
    med = statistics.median(step_s)
    return {
        "engine": f"trl {__import__('trl').__version__}",
        "threads": threads,
        "num_iterations": num_iterations,
        "shape": shape,
        "max_tokens": max_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "n_steps": n_steps,
        "n_params": n_params,
        "completions_per_step": prompts_per_step * group,
        "step_s_median": med,
        "step_s": step_s,
        "cpu_s_median": statistics.median(cpu_s),
        "gen_s_median": statistics.median(gen_times[warmup:total]),
        "completion_tokens_per_step": statistics.median(toks),
        "completion_tokens_per_s": statistics.median(t / s for t, s in zip(toks, step_s)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # whole process, Linux KB
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="measured steps per configuration (after 1 warm-up)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--num-iterations", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES), help="model shape (SHAPES)")
    ap.add_argument("--max-tokens", type=int, default=16, help="completion tokens at most")
    ap.add_argument("--one", action="store_true", help="run a single configuration here and print JSON")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_trl(a.steps, a.threads[0], a.num_iterations[0], shape=a.shape, max_tokens=a.max_tokens)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(
        f"{'threads':>7} {'mu':>3} {'step_s':>8} {'cpu_s':>7} {'gen_s':>7} {'tok/step':>8} {'tok/s':>8} {'rss_MB':>7}"
    )
    for mu in a.num_iterations:
        for th in a.threads:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    "--steps",
                    str(a.steps),
                    "--threads",
                    str(th),
                    "--num-iterations",
                    str(mu),
                    "--shape",
                    a.shape,
                    "--max-tokens",
                    str(a.max_tokens),
                ],
                env={**env, "OMP_NUM_THREADS": str(th)},
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{th:>7} {mu:>3} {r['step_s_median']:>8.3f} {r['cpu_s_median']:>7.3f} {r['gen_s_median']:>7.3f} "
                f"{r['completion_tokens_per_step']:>8.0f} {r['completion_tokens_per_s']:>8.0f} "
                f"{r['peak_rss_mb']:>7.0f}",
                flush=True,
            )
    print(
        f"# {r['engine']}, {r['n_params'] / 1e6:.2f}M-parameter Qwen2, {r['completions_per_step']} completions "
        f"of <= {a.max_tokens} tokens per step, median of {a.steps} steps after 1 warm-up"
    )


if __name__ == "__main__":
    main()
