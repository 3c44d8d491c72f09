"""glibc allocator tuning (gapo.machine.allocator): it removes the per-step page faults it is there to
remove, and it is off where asked. Each setting runs in a fresh interpreter: mallopt is process-wide."""

import json
import os
import sys

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts
from gapo.machine import allocator

# Ten log-prob forward + backward passes of the same (64 x 24) batch through a tiny-benchmark-
# shaped Qwen2, after two warm-up passes: the allocation pattern of a CPU RL update. glibc's
# defaults trim each pass's freed activations (heap top over 2 x its ~2 MB dynamic mmap
# threshold) and fault them back in on the next.
PROBE = r"""
import json, resource, sys
import torch
torch.set_num_threads(1)
if sys.argv[1] == "true":
    from gapo.machine.allocator import tune_malloc
    assert tune_malloc()
from transformers import Qwen2Config, Qwen2ForCausalLM
from gapo.policy.logprobs import logprobs
torch.manual_seed(0)
m = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)).train()
ids = torch.randint(3, 32, (64, 24))
def one_pass():
    lp, _ = logprobs(m, ids, torch.ones_like(ids), 16, entropy_grad=False)
    lp.sum().backward()
    m.zero_grad(set_to_none=True)
one_pass(); one_pass()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    one_pass()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0}))
"""

glibc = pytest.mark.skipif(allocator._libc() is None, reason="mallopt tuning is glibc-only")


def _probe(tuning: str) -> dict:
    """One fresh interpreter per setting runs both probes: the page faults (``PROBE``), then two
    trainer steps (``STEPS``); mallopt is process-wide, and both probes run under the same one.
    One process instead of two per setting: each start (torch, transformers, gapo) costs more
    than the probes themselves."""
    out = timing.run(
        [sys.executable, "-c", PROBE + STEPS, tuning],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "GAPO_MALLOC_TUNING": "1"},
        timeout=900,
        quiet_s=40,
        what=f"the page-fault probe and two trainer steps (tuning={tuning})",
    )
    faults, steps = out.stdout.strip().splitlines()[-2:]
    return {"faults": json.loads(faults)["faults"], "steps": json.loads(steps)}


@pytest.fixture(scope="module")
def probes():
    return {t: _probe(t) for t in ("false", "true")}


@glibc
@pytest.mark.slow
def test_tuning_removes_the_per_round_page_faults(probes):
    default, tuned = probes["false"]["faults"], probes["true"]["faults"]
    # measured: 15-37 thousand faults with glibc's defaults, 1-3 thousand tuned (Python's own
    # arenas and first touches remain)
    assert default > 5_000, default
    assert tuned < default / 3, (tuned, default)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(allocator, "_done", None)
    monkeypatch.setenv("GAPO_MALLOC_TUNING", "0")
    assert allocator.tune_malloc() is False
    monkeypatch.setattr(allocator, "_done", None)  # the next trainer in this process may tune again


def test_trainer_respects_model_malloc_tuning(monkeypatch, tmp_path):
    from gapo.rl import trainer as trainer_mod
    from gapo.rl.config import load_config

    calls = []
    monkeypatch.setattr(trainer_mod, "tune_malloc", lambda: calls.append(1) or True)
    base = ["train.steps=1", "eval.problems=0", "train.progress=false", "train.prompts=2", "train.group_size=2"]
    cfg, policy = trainer_mod.with_policy(load_config(None, [*base, "model.malloc_tuning=false"]))
    trainer_mod.Trainer(cfg, tmp_path / "off", policy_path=policy)
    assert calls == []
    cfg, policy = trainer_mod.with_policy(load_config(None, base))
    trainer_mod.Trainer(cfg, tmp_path / "on", policy_path=policy)
    assert calls == [1]


STEPS = r"""
import json, sys, tempfile
from pathlib import Path
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer, with_policy
cfg, policy = with_policy(load_config(None, ["train.steps=2", "eval.problems=0", "train.progress=false",
                                             "train.checkpoint_every=0", "model.threads=1",
                                             "model.malloc_tuning=" + sys.argv[1]]))
tr = Trainer(cfg, Path(tempfile.mkdtemp()) / "run", policy_path=policy)
recs = [tr.train_step() for _ in range(2)]
print(json.dumps([{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs]))
"""


@glibc
@pytest.mark.slow
def test_tuning_changes_no_value(probes):
    # memory that comes back from the heap instead of fresh (zeroed) pages must not leak into a
    # result: two trainer steps give the same records, bit for bit, with and without the tuning
    a, b = probes["true"]["steps"], probes["false"]["steps"]
    assert len(a) == 2 and a == b
