"""Page faults of gapo's step under glibc allocator settings, A/B interleaved (issue 37, BENCHMARKS.md 13.1).

    python benchmarks/malloc_probe.py [--settings current nommap] [--reps 3] [--tokens 32] [--warmup 1] [--steps 1]

Each (setting, rep) runs in a fresh process (mallopt is process-wide, and a process's memory
history is part of what is measured): ``bench_step.run_gapo`` runs bench_step's compute-bound
work (shape ``30m``, 8 × 8 rollouts, μ = 1, 1 torch thread) with ``--tokens`` completion tokens,
``--warmup`` steps and then ``--steps`` measured ones. Before the Trainer starts, the child calls
``tune_malloc`` (gapo's setting: "current") and then the setting's extra ``mallopt`` calls;
"glibc" is glibc's defaults (``GAPO_MALLOC_TUNING=0``). Around each measured ``train_step`` the child
reads ``getrusage`` (minor + major faults, user and system CPU seconds); at the end it reports
the process's peak RSS (``ru_maxrss``) and its RSS after the last step (``/proc/self/statm``).
The order of the settings alternates from rep to rep. Each step is bracketed by two ``getppid``
calls, so ``strace -f -e trace=getppid,mmap,munmap,brk`` shows which system calls a step makes.
Reported: per setting, the medians over the reps of the per-step means. CPU time and faults
are counted, not wall time, so a busy machine changes the figures little.

Which tensors are above the 32-MiB mmap threshold at any ``--tokens``: the head's logits chunks
(64 rows × 10 positions × 32000 float32 = 82 MB, with their softmax and product) and tensors of
the tied embedding's size (32000 × 512 float32 = 65.5 MB: its gradient, fresh after each
``zero_grad``, among them); at 128 tokens also the MLP's activations (64 × 135 × 1024 float32 =
35 MB). "thp_torch" sets ``THP_MEM_ALLOC_ENABLE=1`` for the child (torch's CPU allocator then
madvises its blocks of ≥ 2 MiB ``MADV_HUGEPAGE``; read once, at torch's first allocation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # <malloc.h>
# setting -> extra mallopt (param, value) pairs after tune_malloc; None: tune_malloc off
SETTINGS: dict[str, list[tuple[int, int]] | None] = {
    "glibc": None,
    "current": [],
    "nommap": [(M_MMAP_MAX, 0)],
    "nommap_trim1g": [(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**30)],
    "toppad256m": [(M_TOP_PAD, 256 * 2**20)],
    "thp_torch": [],
}
# setting -> environment read at start-up: torch's CPU allocator aligns blocks of >= 2 MiB to 2 MiB
# and madvises them MADV_HUGEPAGE (transparent huge pages: one fault per 2 MiB instead of 4 KiB)
ENVS = {"thp_torch": {"THP_MEM_ALLOC_ENABLE": "1"}}

CHILD = r"""
import ctypes, json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from bench_step import Work, run_gapo
from gapo.machine import allocator
from gapo.rl import trainer as trainer_mod
extra = json.loads(sys.argv[3])
if extra is not None:
    assert allocator.tune_malloc()
    for param, value in extra:
        assert ctypes.CDLL("libc.so.6").mallopt(param, value) == 1, (param, value)
steps, orig = [], trainer_mod.Trainer.train_step
def timed(self):
    os.getppid()  # a marker for strace -e getppid: where a step starts and ends
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    out = orig(self)
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    os.getppid()
    steps.append({"faults": u1.ru_minflt + u1.ru_majflt - u0.ru_minflt - u0.ru_majflt,
                  "sys_s": u1.ru_stime - u0.ru_stime, "user_s": u1.ru_utime - u0.ru_utime})
    return out
trainer_mod.Trainer.train_step = timed
warmup, n, tokens = (int(x) for x in sys.argv[4:7])
run_gapo(sys.argv[2], Work(n, warmup, "30m", tokens), 1, 1)
rss_after = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
print(json.dumps({"steps": steps[warmup:], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_after_mb": rss_after}))
"""


def run_child(policy: str, setting: str, warmup: int, steps: int, tokens: int) -> dict:
    """One fresh process under ``setting``; its per-step rusage, peak RSS and RSS after the steps."""
    extra = SETTINGS[setting]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GAPO_MALLOC_TUNING": "0" if extra is None else "1"}
    env.update(ENVS.get(setting, {}))
    args = [sys.executable, "-c", CHILD, str(HERE), policy, json.dumps(extra), str(warmup), str(steps), str(tokens)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    per_step = {k: statistics.fmean(s[k] for s in r["steps"]) for k in ("faults", "sys_s", "user_s")}
    rss = {"peak_rss_mb": r["peak_rss_mb"], "rss_after_mb": r["rss_after_mb"]}
    return {"setting": setting, **per_step, "faults_each": [s["faults"] for s in r["steps"]], **rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", default=["current", "nommap"], choices=sorted(SETTINGS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="completion tokens per rollout")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", help="append each process's result to this file (JSON lines)")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_step import make_policy

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        policy = str(Path(tmp) / "policy")
        make_policy(policy, 0, "30m")
        for rep in range(a.reps):
            order = a.settings if rep % 2 == 0 else a.settings[::-1]
            for s in order:
                r = {"rep": rep, "tokens": a.tokens, **run_child(policy, s, a.warmup, a.steps, a.tokens)}
                print(json.dumps(r), flush=True)
                rows.append(r)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(r) + "\n")
    keys = ("faults", "sys_s", "user_s", "peak_rss_mb", "rss_after_mb")
    print(f"{'setting':<14}" + "".join(f"{k:>14}" for k in keys))
    for s in a.settings:
        med = [statistics.median(r[k] for r in rows if r["setting"] == s) for k in keys]
        print(f"{s:<14}" + "".join(f"{v:>14.3f}" for v in med))


if __name__ == "__main__":
    main()
