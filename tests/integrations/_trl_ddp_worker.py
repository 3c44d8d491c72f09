"""Worker of tests/test_trl_ddp.py: GAPOTrainer on 2 CPU processes (torchrun, gloo).

Each rank records, in order, what GAPO computed from the gathered rewards and, for every loss
micro-batch, the tensors its per-``c`` sums come from, plus the pooled ``clip/*_by_c`` values at
every ``log``; it saves them to ``OUT/rank{r}.pt``. Usage: torchrun --nproc_per_node 2 THIS OUT
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from gapo.integrations.trl import GAPOConfig, GAPOTrainer

ALPHABET = "abcde+="
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def tokenizer(path: Path) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + list(ALPHABET))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.save(str(path / "tokenizer.json"))
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def has_a(completions, **kwargs):
    return [float("a" in c) for c in completions]


class Recording(GAPOTrainer):
    def __init__(self, *a, **kw):
        self.events = []
        super().__init__(*a, **kw)

    def compute_eps_high(self, rewards, group_size):
        eps = super().compute_eps_high(rewards, group_size)
        if self.model.training:
            self.events.append(("rewards", rewards.detach().cpu().clone(), group_size))
        return eps

    def _log_gapo_metrics(self, inputs, logps):
        super()._log_gapo_metrics(inputs, logps)
        keys = ("completion_mask", "old_per_token_logps", "advantages", "gapo_eps_high", "gapo_success_count")
        self.events.append(("mb", {"logps": logps.detach().cpu(), **{k: inputs[k].detach().cpu() for k in keys}}))

    def log(self, logs, start_time=None):
        if self.model.training:
            self.events.append(("log", self.gapo_clip_stats("train")))
        super().log(logs, start_time)


def main(out: str) -> None:
    work = Path(tempfile.mkdtemp())
    tok = tokenizer(work)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(SPECIALS) + len(ALPHABET),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=True,
        )
    )
    data = Dataset.from_list([{"prompt": ALPHABET[i % 5] + ALPHABET[(i + 1) % 5] + "="} for i in range(16)])
    args = GAPOConfig(
        output_dir=str(work / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        logging_steps=1,
        learning_rate=3e-2,
        max_steps=4,
        num_iterations=2,
        steps_per_generation=2,
        seed=0,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        eps_high_max=0.28,
        disable_tqdm=True,
        temperature=1.5,
    )
    trainer = Recording(model=model, reward_funcs=has_a, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save(
        {"rank": rank, "world": trainer.accelerator.num_processes, "events": trainer.events},
        Path(out) / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(sys.argv[1])
