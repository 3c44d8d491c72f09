"""glibc allocator tuning (gapo.rl.allocator): it removes the per-step page faults it is there to
remove, and it is off where asked. Each case runs in a fresh interpreter: mallopt is process-wide."""

import json
import os
import subprocess
import sys

import pytest

from gapo.rl import allocator

# Two RL steps of the embedded policy after a warm-up step: glibc's defaults trim each step's
# freed activations (heap top over 2 x its ~2 MB dynamic mmap threshold) and fault them back in
# on the next step.
PROBE = r"""
import json, resource, sys, tempfile
from pathlib import Path
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer
cfg = load_config(None, ["train.steps=3", "eval.problems=0", "train.progress=false", "train.checkpoint_every=0",
                         "model.threads=1", "model.malloc_tuning=" + sys.argv[1]])
tr = Trainer(cfg, Path(tempfile.mkdtemp()) / "run")
tr.train_step()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    tr.train_step()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0}))
"""

glibc = pytest.mark.skipif(allocator._libc() is None, reason="mallopt tuning is glibc-only")


def _faults(tuning: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, tuning], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "GAPO_MALLOC_TUNING": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])["faults"]


@glibc
def test_tuning_removes_the_per_round_page_faults():
    default, tuned = _faults("false"), _faults("true")
    # measured: 12-20 thousand faults with glibc's defaults, 1-3 thousand tuned
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
    trainer_mod.Trainer(load_config(None, [*base, "model.malloc_tuning=false"]), tmp_path / "off")
    assert calls == []
    trainer_mod.Trainer(load_config(None, base), tmp_path / "on")
    assert calls == [1]
