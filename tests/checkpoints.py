"""Checkpoints the tests build locally (no hub): a pretrained-instruct-shaped Qwen2 model, made by
the same builder as the GPU check (``benchmarks/gpu_check.py``) at its small ``test`` shape."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from gpu_check import CHAT_TEMPLATE, build  # noqa: E402

__all__ = ["CHAT_TEMPLATE", "build_instruct_checkpoint"]


def build_instruct_checkpoint(path, *, seed=0):
    """A ~0.1M-parameter Qwen2ForCausalLM with a byte-level BPE tokenizer, ChatML specials
    (``<|im_start|>``, ``<|im_end|>`` as EOS, ``<|endoftext|>`` as padding) and a chat template."""
    build(Path(path), "test", seed=seed)
    return path
