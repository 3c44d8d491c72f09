"""Worker of tests/integrations/test_trl_ddp.py: GAPOTrainer on 2 CPU processes (gloo).

Each rank records, in order, what GAPO computed from the gathered rewards and, for every loss
micro-batch, the tensors its per-``c`` sums come from, plus the pooled ``clip/*_by_c`` values at
every ``log``; it saves them to ``OUT/rank{r}.pt``.

Usage: ``python THIS OUT``. The launch is torchrun's (``--standalone --nproc_per_node 2``) in
miniature, after one import of torch, transformers and TRL instead of one per process (torchrun's
own agent would be a third): this process forks the two ranks before anything runs, then holds
the rendezvous store on a port the OS picks (port 0: nothing to race for), and each rank gets
torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``, …), from which accelerate sets up the gloo process group itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from pathlib import Path

import torch
from test_trl import ALPHABET, SPECIALS, _char_tokenizer, _dataset, has_a  # the single-process tests' policy parts
from transformers import Qwen2Config, Qwen2ForCausalLM

from gapo.integrations.trl import GAPOConfig, GAPOTrainer

WORLD = 2


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
    tok = _char_tokenizer(work)
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
    data = _dataset(16)
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


def _rank(rank: int, port_pipe: int, out: str, run_id: str) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
    except (OSError, AttributeError):  # no libc prctl (not Linux)
        pass
    code = 0
    try:
        port = int(os.read(port_pipe, 32))  # the store is up
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            ROLE_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(WORLD),
            GROUP_WORLD_SIZE="1",
            ROLE_WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            TORCHELASTIC_RUN_ID=run_id,
        )
        main(out)
    except BaseException:  # noqa: BLE001 - any failure of the rank is its exit status
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def launch(out: str) -> int:
    """Forks the ranks, starts the store, waits: 0 if every rank exited 0 (a failed rank stops the rest)."""
    assert threading.active_count() == 1, threading.enumerate()  # fork copies this thread only
    assert not torch.distributed.is_initialized()
    pipes, pids, run_id = [], [], uuid.uuid4().hex
    for rank in range(WORLD):
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _rank(rank, r, out, run_id)
        os.close(r)
        pipes.append(w)
        pids.append(pid)
    # the agent's store (torchrun --standalone binds port 0 too); the ranks connect as clients
    store = torch.distributed.TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)
    for w in pipes:
        os.write(w, str(store.port).encode())
        os.close(w)
    status = 0
    alive = set(pids)
    while alive:
        pid, st = os.wait()
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(st)
        if code != 0 and status == 0:
            status = code
            print(f"rank with pid {pid} exited with {code}; stopping the others", file=sys.stderr)
            for other in alive:
                os.kill(other, signal.SIGKILL)
    return status


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1]))
