"""What it costs that a user's reward runs in a worker process (gapo.tasks.custom, gapo.exec.scoring).

    python benchmarks/bench_reward_worker.py [--n 128 --reps 15]

One batch of ``--n`` completions (a step's rollouts: 16 prompts x 8) of the arithmetic task,
scored by a reward of one's own three ways, interleaved in one process (A B C, then the order
rotates every repetition, so all three see the same machine load):

- ``in_process``: the function called in this process under the SIGALRM guard, one completion at
  a time: what ``task.scoring_workers=0`` did before rewards moved to a worker (it could not stop
  a reward that swallows the alarm, exits, or starts children);
- ``worker``: ``score_batch`` as the trainer calls it now: the same function in the pool of one,
  one job per completion, with the hard deadline;
- ``worker_batched``: the same reward in TRL's form (``completions`` -> a list), one job per batch.

Two rewards: ``light`` (a regex format check, microseconds: the overhead shows whole) and
``heavy`` (about 1 ms of Python per completion, as a parser or a small checker takes). Reported
per path and reward: the median over the repetitions of the wall time per completion, and the
ratios of the medians to ``in_process``. Then the one-off costs: ``with_rewards`` (a worker
spawned, the module imported and the parameters checked there; median of 3, each after the pool
was closed) and a timeout's price (a completion killed at its hard deadline: the batch's wall
time past the deadline itself, i.e. the replacement worker's start and re-import before the next
completion). The last line is ``ratio light=<r> light_batched=<r> heavy=<r> heavy_batched=<r>``
(worker / in_process medians).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gapo import tasks  # noqa: E402
from gapo.exec.scoring import SHARED, score_batch  # noqa: E402
from gapo.exec.scoring_pool import score_guarded  # noqa: E402
from gapo.tasks.custom import with_rewards  # noqa: E402

REWARDS = textwrap.dedent("""
    import re, signal, time
    FORMAT = re.compile(r"^<think>.*?</think>\\s*<answer>(.*?)</answer>$", re.S)

    def light(prompt, completion, **fields):
        m = FORMAT.match(completion)
        return 1.0 if m and m.group(1).strip() else 0.0

    def light_batched(completions, **kwargs):
        return [light(None, c) for c in completions]

    def heavy(prompt, completion, **fields):
        end = time.process_time() + 0.001  # about 1 ms of CPU, as a small parser takes
        while time.process_time() < end:
            pass
        return light(prompt, completion)

    def heavy_batched(completions, **kwargs):
        return [heavy(None, c) for c in completions]

    def hang(prompt, completion, **fields):  # deaf to the soft alarm: only the hard kill stops it
        if completion == "hang":
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                pass
        return 0.0
""")


def in_process(task, problems, completions, timeout_s):
    soft = 0.9 * timeout_s
    return [score_guarded(task, p, c, soft)[0] for p, c in zip(problems, completions)]


def in_worker(task, problems, completions, timeout_s):
    return score_batch(task, problems, completions, timeout_s=timeout_s)[0]


def one_offs(path: Path, base, problems) -> tuple[float, float]:
    """(median seconds of with_rewards from a closed pool, seconds a hard kill adds to a batch)."""
    starts = []
    for _ in range(3):
        SHARED.close()
        t0 = time.perf_counter()
        task = with_rewards(base, [f"{path}:light"], probe=problems[0])
        starts.append(time.perf_counter() - t0)
    hang = with_rewards(base, [f"{path}:hang"], probe=problems[0])
    score_batch(hang, problems[:1], ["warm"], timeout_s=1.0)
    t0 = time.perf_counter()
    score_batch(hang, problems[:2], ["hang", "next"], timeout_s=1.0)
    killed = time.perf_counter() - t0 - 1.0
    del task
    return statistics.median(starts), killed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=128, help="completions per batch")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    base = tasks.get("arithmetic")
    problems = base.generate("train", args.n, 0)
    good = "<think>12*3 is 36</think> <answer>36</answer>"
    completions = [good if i % 2 else good.replace("<answer>", "") + " " * (i % 7) for i in range(args.n)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench_rewards.py"
        path.write_text(REWARDS)
        kinds = {
            "light": (with_rewards(base, [f"{path}:light"]), with_rewards(base, [f"{path}:light_batched"])),
            "heavy": (with_rewards(base, [f"{path}:heavy"]), with_rewards(base, [f"{path}:heavy_batched"])),
        }
        times: dict = {}
        for rep in range(args.reps):
            for kind, (single, batched) in kinds.items():
                runs = [("in_process", in_process, single), ("worker", in_worker, single)]
                runs.append(("worker_batched", in_worker, batched))
                runs = runs[rep % 3 :] + runs[: rep % 3]
                values = set()
                for name, fn, task in runs:
                    t0 = time.perf_counter()
                    values.add(tuple(fn(task, problems, completions, 10.0)))
                    times.setdefault((kind, name), []).append((time.perf_counter() - t0) / args.n)
                assert len(values) == 1, f"{kind}: the three paths disagree"
        start_s, kill_s = one_offs(path, base, problems)
    SHARED.close()
    print(f"{args.n} completions per batch, {args.reps} repetitions; median wall time per completion:")
    print(f"{'reward':8} {'path':16} {'us/completion':>14} {'vs in_process':>14}")
    ratios = {}
    for kind in kinds:
        ref = statistics.median(times[(kind, "in_process")])
        for name in ("in_process", "worker", "worker_batched"):
            med = statistics.median(times[(kind, name)])
            ratios[(kind, name)] = med / ref
            print(f"{kind:8} {name:16} {med * 1e6:14.1f} {med / ref:14.2f}")
    print(f"with_rewards (spawn a worker, import, check), median of 3: {start_s * 1e3:.0f} ms")
    print(f"a hard kill at the deadline adds {kill_s * 1e3:.0f} ms to its batch (a new worker, the re-import)")
    print(
        f"ratio light={ratios[('light', 'worker')]:.2f} light_batched={ratios[('light', 'worker_batched')]:.2f} "
        f"heavy={ratios[('heavy', 'worker')]:.2f} heavy_batched={ratios[('heavy', 'worker_batched')]:.2f}"
    )


if __name__ == "__main__":
    main()
