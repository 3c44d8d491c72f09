"""The child-process pool ``gapo compare`` runs its jobs in: ``python -m gapo.experiments.cell``
processes, at most ``workers`` at a time, each with one torch thread and its output in a log file.
A job is ``(name, argv, log, on_exit(rc, seconds) -> message)``; Ctrl-C or SIGTERM stops the
running children cleanly (each checkpoints and exits), so the next invocation resumes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["Job", "spawn", "run_jobs", "above"]

# A job is (name, argv of ``python -m gapo.experiments.cell``, log file, on_exit(rc, seconds) -> message).
Job = tuple[str, list[str], Path, Callable[[int, float], str]]


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    """Start ``python -m gapo.experiments.cell *argv`` with one thread, its output appended to ``log``."""
    # GAPO_GRID_PID: the child stops (checkpointing) when this process ends, even by kill -9 (cell.py)
    env = dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", GAPO_GRID_PID=str(os.getpid())
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log, "a")
    p = subprocess.Popen(
        [sys.executable, "-m", "gapo.experiments.cell", *argv], stdout=fh, stderr=subprocess.STDOUT, env=env
    )
    p._log = fh  # type: ignore[attr-defined]
    return p


def run_jobs(jobs: list[Job], workers: int, say, tick: Callable[[], None] | None = None) -> None:
    """Run ``(name, argv, log, on_exit(rc, seconds))`` jobs, at most ``workers`` at a time;
    ``tick()`` runs every 0.2 s while they do (a progress bar's refresh)."""
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < workers:
                name, argv, log, on_exit = pending.pop(0)
                running.append((name, spawn(argv, log), on_exit, time.time()))
            time.sleep(0.2)
            if tick is not None:
                tick()
            for item in list(running):
                name, p, on_exit, t0 = item
                if p.poll() is not None:
                    p._log.close()
                    running.remove(item)
                    say(on_exit(p.returncode, time.time() - t0))
    except KeyboardInterrupt:
        say("interrupted: running cells checkpoint and stop; rerun the same command to resume")
        for _, p, _, _ in running:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # the trainer finishes its step, checkpoints, exits
        for _, p, _, _ in running:
            p.wait()
        raise


def above(bar, say):
    """``say`` that prints above a live tqdm bar instead of through it."""

    def f(line):
        with bar.external_write_mode():
            say(line)

    return f
