"""Checkpoints the tests build locally (no hub): a pretrained-instruct-shaped Qwen2 model, made by
the same builder as the GPU check (``benchmarks/gpu_check.py``) at its small ``test`` shape; and
the settings of the tiny Countdown run that tests of run folders train (``train_run``; the
session's finished one is tests/conftest.py's ``finished_run``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from gpu_check import CHAT_TEMPLATE, build  # noqa: E402

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_SYSTEM",
    "QWEN_TEMPLATE",
    "RUN_BASE",
    "build_instruct_checkpoint",
    "small_instruct_config",
    "train_run",
]

# A Qwen-style ChatML template: the default system turn when the conversation has none, and
# Qwen3's enable_thinking switch (tests of conversational prompts and chat_template_kwargs)
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# 4 prompts x 4 rollouts of 2-number Countdown, no evaluation, no periodic checkpoint
RUN_BASE = [
    "task.name=countdown",
    "task.params.n_numbers=2",
    "task.params.num_range=[1,10]",
    "task.train_size=300",
    "train.prompts=4",
    "train.group_size=4",
    "train.mini_batches=2",
    "train.progress=false",
    "eval.problems=4",
    "eval.samples=2",
    "eval.every=0",
    "train.checkpoint_every=0",
]


def build_instruct_checkpoint(path, *, seed=0):
    """A ~0.1M-parameter Qwen2ForCausalLM with a byte-level BPE tokenizer, ChatML specials
    (``<|im_start|>``, ``<|im_end|>`` as EOS, ``<|endoftext|>`` as padding) and a chat template."""
    build(Path(path), "test", seed=seed)
    return path


def train_run(run, policy, *extra, flags=()):
    """``gapo train --out run [flags] model.path=policy RUN_BASE extra``, in this process; its exit code."""
    from gapo.cli import main

    return main(["train", "--out", str(run), *flags, f"model.path={policy}", *RUN_BASE, *extra])


# 2 prompts x 2 rollouts of 2-number Countdown on the instruct checkpoint, no evaluation: the
# smallest trainer run (tests of checkpoints, trackers, schedules); a later override wins
SMALL_INSTRUCT_RUN = [
    "task.params.n_numbers=2",
    "task.params.num_range=[1,10]",
    "task.train_size=64",
    "train.prompts=2",
    "train.group_size=2",
    "train.mini_batches=1",
    "train.progress=false",
    "eval.problems=0",
    "sampling.max_new_tokens=6",
]


def small_instruct_config(model, *extra):
    """The config of ``SMALL_INSTRUCT_RUN`` on the checkpoint ``model``, then ``extra`` overrides."""
    from gapo.rl.config import load_config

    return load_config(None, [f"model.path={model}", *SMALL_INSTRUCT_RUN, *extra])
