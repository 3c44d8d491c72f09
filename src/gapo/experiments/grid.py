"""``gapo compare``: a grid of methods × regimes × seeds, each cell a trainer run.

    gapo compare --config configs/grid.yaml --out runs/grid        # run (resumable)
    gapo compare --quick                                           # the CI-sized grid
    gapo compare --config configs/grid.yaml --out runs/grid --report-only
    gapo compare --config configs/grid.yaml --out runs/grid --retry-failed

The grid YAML (methods, regimes, seeds, ``common`` overrides) is read and checked by
:mod:`gapo.experiments.grid_spec`. A grid runs in two phases: every regime's base policy and its
base evaluation (:mod:`gapo.experiments.grid_bases`), then the cells.

Cells live in ``<out>/<regime>/<method>/seed<k>`` and run in child processes
(:mod:`gapo.experiments.cell`, through :mod:`gapo.experiments.pool`, ``workers`` at a time, one
torch thread each). A cell with ``done.json`` is skipped; one with a checkpoint is resumed; a
cell that crashes or produces NaN gets ``failed.json`` (error and log tail; the full log is
``seed<k>.log`` next to the folder) and the others go on. Failed cells are not retried unless
``gapo compare --retry-failed``. A finished or started cell is reused only if this grid would
run it the same way (same config, same base policy).

The report over finished cells is :func:`gapo.experiments.report.grid_report`.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from gapo.experiments.grid_bases import prepare_regimes, was_run
from gapo.experiments.grid_spec import cell_config, cell_dir, cell_file, grid_cells, pretrain_config, write_json
from gapo.experiments.pool import above, run_jobs
from gapo.rl.config import to_dict
from gapo.rl.config_io import diff
from gapo.rl.run_dir import refuse_inside_run
from gapo.rl.run_lock import RunLock

__all__ = ["run_grid", "estimate_line"]


# --------------------------------------------------------------------------------- running a grid
def run_grid(grid: dict, out: str | Path, *, retry_failed: bool = False, say=print) -> dict:
    """Run every unfinished cell of ``grid`` under ``out``; returns counts of done/failed/skipped.

    SIGTERM or SIGINT (which a shell's background job would otherwise ignore) stop the grid
    cleanly: running cells checkpoint and the next invocation resumes them."""
    if threading.current_thread() is not threading.main_thread():
        return _run_grid(grid, Path(out), retry_failed, say)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run_grid(grid, Path(out), retry_failed, say)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _run_grid(grid: dict, out: Path, retry_failed: bool, say) -> dict:
    # one `gapo compare` per grid folder (locked as a run folder is, once it exists); each cell's own
    # run folder is locked by its child process too
    refuse_inside_run(out, "grid folder")
    lock = RunLock(out, what="grid folder")
    if out.is_dir():
        lock.acquire()
    try:
        _check_finished_cells(grid, out)
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        t0 = time.time()
        bases = prepare_regimes(grid, out, t0, say)
        stats = _run_cells(grid, out, bases, t0, retry_failed, say)
        stats["wall_s"] = time.time() - t0
        return stats
    finally:
        lock.release()


def _run_cells(grid: dict, out: Path, bases: dict[str, dict], t0: float, retry_failed: bool, say) -> dict:
    """Phase 2: the cells, seed-major so that partial results cover every method."""
    stats = {"done": 0, "failed": 0, "skipped": 0, "total": len(grid_cells(grid))}
    jobs = _cell_jobs(grid, out, bases, t0, retry_failed, stats)
    n = stats["total"]
    say(f"{n} cells: {len(jobs)} to run, {stats['skipped']} already finished or failed; {grid['workers']} workers")
    if jobs:
        say(estimate_line(len(jobs), grid["workers"], *_cell_seconds(grid, out)))
    bar = tqdm(
        total=n,
        initial=n - len(jobs),
        desc="cells",
        unit="cell",
        dynamic_ncols=True,
        disable=None if jobs else True,
    )  # on a terminal; the per-cell lines go to logs either way
    try:

        def counted(on_exit):
            def f(rc, dt):
                line = on_exit(rc, dt)
                bar.update(1)
                return line

            return f

        jobs = [(name, a, log, counted(e)) for name, a, log, e in jobs]
        run_jobs(jobs, grid["workers"], above(bar, say))
    finally:
        bar.close()
    return stats


def _cell_jobs(grid: dict, out: Path, bases: dict[str, dict], t0: float, retry_failed: bool, stats: dict) -> list:
    """The jobs of the cells still to run, each with its spec written next to its folder; a
    finished cell, or a failed one without ``retry_failed``, is counted in ``stats`` instead."""
    jobs = []
    for r, m, s in grid_cells(grid):
        d = cell_dir(out, r, m, s)
        if (d / "done.json").is_file():
            stats["skipped"] += 1
            continue
        if (d / "failed.json").is_file():
            if not retry_failed:
                stats["skipped"] += 1
                stats["failed"] += 1
                continue
            (d / "failed.json").unlink()
        cfg = cell_config(grid, r, m, s, base_path=bases[r]["policy"])
        write_json(
            cell_file(d, "json"),
            {"regime": r, "method": m, "seed": s, "config": to_dict(cfg), "base_eval": bases[r]["eval"] or None},
        )
        on_exit = _on_cell_exit(d, f"{r}/{m}/seed{s}", stats, t0)
        jobs.append((f"{r}/{m}/{s}", ["--cell", str(d)], cell_file(d, "log"), on_exit))
    return jobs


def _cell_seconds(grid: dict, out: Path) -> tuple[float | None, str]:
    """``(seconds, where from)`` of one cell, for the estimate before a grid runs: the mean wall
    time of this grid folder's finished cells (``job_s``: start-up included; else the trainer's
    ``wall_s``), else the grid's ``cell_s`` (measured on the machine its config file names), else
    None."""
    walls = []
    for r, m, s in grid_cells(grid):
        f = cell_dir(out, r, m, s) / "done.json"
        if f.is_file():
            try:
                done = json.loads(f.read_text())
                w = done.get("job_s", done.get("wall_s"))
            except ValueError:
                continue
            if isinstance(w, (int, float)):
                walls.append(float(w))
    if walls:
        return sum(walls) / len(walls), f"the mean of the {len(walls)} finished cells here"
    if grid.get("cell_s"):
        return float(grid["cell_s"]), "the grid's cell_s"
    return None, ""


def estimate_line(n_jobs: int, workers: int, cell_s: float | None, source: str) -> str:
    """The line ``gapo compare`` prints before the cells run: cells × seconds per cell / workers."""
    if cell_s is None:
        return (
            "estimate: no cell time known yet (no finished cell here, no cell_s in the grid); "
            "the progress bar's ETA appears once the first cells finish"
        )
    total = n_jobs * cell_s / max(1, min(workers, n_jobs))
    return (
        f"estimate: {n_jobs} cells x ~{cell_s:.0f} s / {min(workers, n_jobs)} workers = about "
        f"{_minutes(total)} (from {source}; a busy machine takes longer, the bar's ETA follows the cells)"
    )


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _check_finished_cells(grid: dict, out: Path) -> None:
    """Before anything runs or is written: a finished or started cell is reused only if this
    grid would run it the same way (same config, same base policy); otherwise stop, naming the
    cells and the keys -- a changed ``common``, method or regime must not be mixed silently with
    runs made under the old one."""
    bad, changed_base = [], set()
    recorded = {
        r: json.loads(be.read_text()).get("eval_cfg", {}).get("base_key")
        for r in grid["regimes"]
        if (be := out / r / "base_eval.json").is_file()
    }
    for r, key in recorded.items():
        if key is not None and key != pretrain_config(grid["_regimes"][r]).cache_key():
            changed_base.add(r)  # an error only if one of its cells was run (below)
    used = set()
    for r, m, s in grid_cells(grid):
        d = cell_dir(out, r, m, s)
        spec = cell_file(d, "json")
        if not spec.is_file() or not was_run(d):
            continue
        used.add(r)
        old = json.loads(spec.read_text()).get("config") or {}
        # the recorded base folder may be gone (another machine): phase 1 rebuilds it and checks it
        # is the same base, so only the rest of the config is compared here
        base = (old.get("model") or {}).get("path") or ""
        new = to_dict(cell_config(grid, r, m, s, base_path=base, model_files=False))
        changed = {k: v for k, v in diff(old, new).items() if k != "train.progress"}
        if changed:
            keys = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(changed.items())[:4])
            bad.append(f"{r}/{m}/seed{s} ({keys})")
    changed_base &= used
    if changed_base:
        raise ValueError(
            f"the base policy of regime(s) {sorted(changed_base)} changed since cells under {str(out)!r} "
            "were run from it. Use another --out, or delete those regimes' folders to rerun them."
        )
    if bad:
        raise ValueError(
            f"{len(bad)} cell(s) under {str(out)!r} were run with another config than this grid's: "
            + "; ".join(bad[:5])
            + ". Use another --out, or delete those cells to rerun them."
        )


def _on_cell_exit(d: Path, name: str, stats: dict, t0: float) -> Callable[[int, float], str]:
    """Count a finished cell in ``stats`` and say how it ended; a cell killed before it could
    write ``failed.json`` gets one with its exit code and log tail."""

    def on_exit(rc: int, dt: float) -> str:
        if rc == 0:
            stats["done"] += 1
            try:  # the job's whole wall time (start-up included), for the next estimate (_cell_seconds)
                done = json.loads((d / "done.json").read_text())
                write_json(d / "done.json", {**done, "job_s": round(dt, 1)})
            except (OSError, ValueError):
                pass
            return f"[{time.time() - t0:6.0f}s] {name}: done ({dt:.0f}s)"
        if rc == 130:
            return f"[{time.time() - t0:6.0f}s] {name}: interrupted (resumes next time)"
        if rc == 75:  # cell.BUSY: another process holds its run folder; it wrote nothing
            stats["skipped"] += 1
            return (
                f"[{time.time() - t0:6.0f}s] {name}: skipped, its folder is in use by another process "
                f"(see {cell_file(d, 'log')})"
            )
        stats["failed"] += 1
        if not (d / "failed.json").is_file():  # killed before it could say why
            log = cell_file(d, "log")
            tail = log.read_text()[-4000:] if log.is_file() else ""
            write_json(d / "failed.json", {"error": f"exit code {rc}", "log_tail": tail, "wall_s": dt})
        err = json.loads((d / "failed.json").read_text())["error"]
        return f"[{time.time() - t0:6.0f}s] {name}: FAILED ({err}); log: {cell_file(d, 'log')}"

    return on_exit
