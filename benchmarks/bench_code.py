"""Scoring throughput of the code task: HumanEval's canonical solutions in the sandbox.

    python benchmarks/bench_code.py [--reps 3 --workers 2 --wrong-every 4]

Each repetition scores the 164 canonical solutions plus every ``--wrong-every``-th problem with
the body replaced by ``return None`` (as tests/test_code_task.py does) on the bounded sandbox
pool, checks that exactly the canonical ones pass, and reports completions/s; the last line is
the median over repetitions: ``completions_per_s=<x> cpu_ms_per_completion=<y>`` (CPU time of
the sandbox processes and of this process, user + system, from ``getrusage``: robust to a shared, loaded
machine, unlike the wall-clock rate). To compare two versions of gapo, run it alternately with
``PYTHONPATH`` pointing at each source tree (machine load drifts).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from gapo.exec import sandbox
from gapo.tasks.code import CodeScoring, HumanEvalTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="default: usable cores")
    ap.add_argument("--wrong-every", type=int, default=4)
    args = ap.parse_args()
    task = HumanEvalTask(scoring=CodeScoring(timeout_s=10.0, memory_mb=512))
    problems = task.problems()
    wrong_problems = problems[:: args.wrong_every]
    batch = problems + wrong_problems
    completions = [p.meta["canonical_solution"] for p in problems] + ["    return None\n"] * len(wrong_problems)
    print(f"isolation: {sandbox.capabilities().describe()}; {len(batch)} completions per rep")
    rates, cpus = [], []
    for rep in range(args.reps):
        t0 = time.monotonic()
        c0, s0 = (resource.getrusage(w) for w in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF))
        verdicts = task.verdicts(batch, completions, workers=args.workers)
        dt = time.monotonic() - t0
        c1, s1 = (resource.getrusage(w) for w in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF))
        cpu = sum(b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime for a, b in ((c0, c1), (s0, s1)))
        cpus.append(1000 * cpu / len(batch))
        rewards = [v.reward for v in verdicts]
        expected = [1.0] * len(problems) + [0.0] * len(wrong_problems)
        if rewards != expected:
            bad = [p.meta["task_id"] for p, r, e in zip(batch, rewards, expected) if r != e]
            raise SystemExit(f"wrong verdicts: {bad}")
        rates.append(len(batch) / dt)
        print(f"rep {rep}: {dt:.2f} s, {rates[-1]:.1f} completions/s, {cpus[-1]:.1f} ms CPU each")
    print(f"completions_per_s={statistics.median(rates):.1f} cpu_ms_per_completion={statistics.median(cpus):.1f}")


if __name__ == "__main__":
    main()
