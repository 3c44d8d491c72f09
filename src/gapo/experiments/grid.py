"""``gapo compare``: a grid of methods × regimes × seeds, each cell a trainer run.

    gapo compare --config configs/grid.yaml --out runs/grid        # run (resumable)
    gapo compare --quick                                           # the CI-sized grid
    gapo compare --config configs/grid.yaml --out runs/grid --report-only
    gapo compare --config configs/grid.yaml --out runs/grid --retry-failed

A grid YAML names ``methods`` (keys of ``METHODS``, or new ones under ``method_defs``),
``regimes`` (keys of ``REGIMES``, or new ones under ``regime_defs``), ``seeds`` and ``common``
overrides (``section.key: value``) applied identically to every cell, so every method gets the
same compute: rollout batches, prompts × group size, mini-batches, epochs, evaluation. A regime
may list a subset of the grid's ``methods``; ``order: regime`` runs every seed of a regime
before the next one (default ``seed``: seed k of every cell before seed k+1); a ``dose`` block
adds the dose-response report (:mod:`gapo.experiments.dose`, ``configs/dose-response.yaml``).

Cells live in ``<out>/<regime>/<method>/seed<k>`` and run in child processes
(:mod:`gapo.experiments.cell`, ``workers`` at a time, one torch thread each). A cell with
``done.json`` is skipped; one with a checkpoint is resumed; a cell that crashes or produces NaN
gets ``failed.json`` (error and log tail; the full log is ``seed<k>.log`` next to the folder) and
the others go on. Failed cells are not retried unless ``gapo compare --retry-failed``.

Every cell of a regime starts from the same base policy and is evaluated on the same held-out
problems with the same sampling seed, so the pre-training evaluation is computed once per
regime (``<out>/<regime>/base_eval.json``) and reused by every cell.

The report over finished cells is :func:`gapo.experiments.report.grid_report`.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from tqdm import tqdm

from gapo import tasks
from gapo.core.checks import unknown
from gapo.rl.config import Config, set_key, to_dict
from gapo.rl.config_io import diff
from gapo.rl.run_dir import atomic_write, refuse_inside_run
from gapo.rl.run_lock import RunLock

if TYPE_CHECKING:
    from gapo.policy.pretrain import PretrainConfig

# gapo.policy.base_policy and .pretrain import torch (and transformers): they are imported where a
# base policy is needed, so that a cell process (gapo.experiments.cell, which imports this module)
# that fails or is skipped before its training does so without them
__all__ = [
    "METHODS",
    "BASELINE_OF",
    "REGIMES",
    "QUICK_GRID",
    "load_grid",
    "methods_of",
    "grid_cells",
    "regime_task",
    "pretrain_config",
    "cell_config",
    "cell_dir",
    "cell_file",
    "write_json",
    "run_grid",
]

# --------------------------------------------------------------------------------- methods
# Every method is a set of config overrides on top of the grid's ``common`` ones. All but GRPO
# use Dr.GRPO advantages, so the clipping rules are compared with everything else equal.
_FIXED = {"algo.loss": "ppo", "algo.eps_schedule": "fixed", "algo.advantage": "drgrpo", "algo.advantage_params": {}}
# GSPO width and focal gamma for the tiny model: the sweep in configs/sweep-gspo-focal.yaml, same rule
# for both (highest held-out pass@1; the sweep could not separate them, RESULTS.md). Asymmetric
# GSPO and GAPO-seq use (w, 5/3 w), the ratio of the GSPO paper's 3e-3/5e-3.
GSPO_SYM = 3e-2
GSPO_ASYM = (3e-2, 5e-2)
FOCAL_GAMMA = 0.5
METHODS: dict[str, dict] = {
    "grpo": {**_FIXED, "algo.advantage": "grpo", "algo.eps_low": 0.2, "algo.eps_high_max": 0.2},
    "drgrpo": {**_FIXED, "algo.eps_low": 0.2, "algo.eps_high_max": 0.2},
    "dapo": {**_FIXED, "algo.eps_low": 0.2, "algo.eps_high_max": 0.28},  # clip-higher only
    "gspo_sym": {**_FIXED, "algo.loss": "gspo", "algo.eps_low": GSPO_SYM, "algo.eps_high_max": GSPO_SYM},
    "gspo_asym": {**_FIXED, "algo.loss": "gspo", "algo.eps_low": GSPO_ASYM[0], "algo.eps_high_max": GSPO_ASYM[1]},
    "fgrpo": {
        **_FIXED,
        "algo.advantage": "focal",
        "algo.advantage_params": {"gamma": FOCAL_GAMMA, "base": "drgrpo"},
        "algo.eps_low": 0.2,
        "algo.eps_high_max": 0.2,
    },
    "passk": {
        **_FIXED,
        "algo.advantage": "passk",
        "algo.advantage_params": {"k": 4},
        "algo.eps_low": 0.2,
        "algo.eps_high_max": 0.2,
    },
    "gapo": {**_FIXED, "algo.eps_schedule": "linear", "algo.eps_low": 0.2, "algo.eps_high_max": 0.28},
    "gapo_seq": {
        **_FIXED,
        "algo.loss": "gspo",
        "algo.eps_schedule": "linear",
        "algo.eps_low": GSPO_ASYM[0],
        "algo.eps_high_max": GSPO_ASYM[1],
    },
    "gapo_log": {**_FIXED, "algo.eps_schedule": "log", "algo.eps_low": 0.2, "algo.eps_high_max": 0.28},
}
# the fixed-clipping counterpart each GAPO variant is compared with (paired by seed)
BASELINE_OF = {"gapo": "drgrpo", "gapo_log": "drgrpo", "gapo_seq": "gspo_asym"}

# --------------------------------------------------------------------------------- regimes
# A regime is a base policy (an embedded preset name or PretrainConfig fields) plus the RL task.
ARITHMETIC_TASK = {"digits": 2, "ops": "+-*"}
REGIMES: dict[str, dict] = {
    "low": {"base": "low"},  # RL task: the preset's (4-number Countdown, numbers 1-10)
    "high": {"base": "high"},  # 2-number Countdown, numbers 1-30 (the `high` preset's RL task)
    "three": {"base": "three"},  # 3-number Countdown from a base trained mostly on 2-number instances
    # the `low` recipe on a ~5.1M-parameter model (preset `medium`): the scale point
    "medium": {"base": "medium"},
    "arithmetic": {
        "base": {
            "name": "arithmetic",
            "task": "arithmetic",
            "sft_mix": [[ARITHMETIC_TASK, 1.0]],
            "rl_task": ARITHMETIC_TASK,
            "model_preset": "tiny",
            "pool_size": 3000,
            "batch_size": 64,
            "max_steps": 400,
            "time_budget_s": None,
            "lr": 3e-3,
            "warmup_steps": 50,
        },
        "task": {"name": "arithmetic", "params": ARITHMETIC_TASK},
    },
}

# `gapo compare --quick`'s grid ships inside the package (found through importlib.resources, so an
# installed wheel has it); configs/grid-quick.yaml is the user-facing copy, tested to be equal.
# A Path: the package is installed as files (setuptools wheels are), which load_grid reads.
QUICK_GRID = Path(str(importlib.resources.files("gapo.experiments") / "data" / "grid-quick.yaml"))


# --------------------------------------------------------------------------------- grid
def load_grid(path: str | Path | dict) -> dict:
    """Read and check a grid: every method and regime known, every cell's config valid."""
    if isinstance(path, dict):
        g = dict(path)
    else:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"grid file {str(p)!r} does not exist")
        try:
            g = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:  # one error line naming the file and the line, not a traceback
            mark = getattr(e, "problem_mark", None)
            at = f", line {mark.line + 1}" if mark is not None else ""
            raise ValueError(f"grid file {str(p)!r}{at}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
        if not isinstance(g, dict):
            raise ValueError(
                f"grid file {str(p)!r}: must be a mapping of grid keys (methods, regimes, seeds, "
                f"common, ...), got {type(g).__name__}"
            )
    allowed = {
        "name",
        "methods",
        "regimes",
        "seeds",
        "common",
        "method_defs",
        "regime_defs",
        "workers",
        "out",
        "report_dir",
        "figures_dir",
        "baseline",
        "roles",
        "scale",
        "order",
        "dose",
        "cell_s",
    }
    for k in g:
        if k not in allowed:
            raise ValueError(f"unknown grid key {k!r}; accepted: {sorted(allowed)}")
    methods = {**METHODS, **{k: dict(v or {}) for k, v in (g.get("method_defs") or {}).items()}}
    regimes = {**REGIMES, **{k: dict(v or {}) for k, v in (g.get("regime_defs") or {}).items()}}
    g.setdefault("methods", list(METHODS))
    g.setdefault("regimes", ["low", "three", "high"])  # configs/grid.yaml's
    g.setdefault("seeds", [0, 1, 2, 3, 4])
    g.setdefault("common", {})
    g.setdefault("workers", 2)
    if isinstance(g["seeds"], int):
        g["seeds"] = list(range(g["seeds"]))
    g.setdefault("order", "seed")
    if g["order"] not in ("seed", "regime"):
        raise ValueError(
            f"grid key 'order' is {g['order']!r}; accepted: 'seed' (every cell's seed k before "
            "seed k+1) or 'regime' (every seed of a regime before the next regime)"
        )
    for m in g["methods"]:
        if m not in methods:
            raise unknown("method", m, methods)
    for r in g["regimes"]:
        if r not in regimes:
            raise unknown("regime", r, regimes)
    g["_methods"] = {m: methods[m] for m in g["methods"]}
    g["_regimes"] = {r: regimes[r] for r in g["regimes"]}
    for r in g["regimes"]:
        _check_regime(r, regimes[r])
        for m in regimes[r].get("methods") or []:
            if m not in g["methods"]:
                raise unknown(f"method (regime {r!r}: its methods must be among the grid's)", m, g["methods"])
        for m in methods_of(g, r):
            cell_config(g, r, m, g["seeds"][0], base_path="<base policy>")  # validates
    if g.get("dose") is not None:  # a dose-response block: checked before anything runs
        from gapo.experiments.dose import dose_spec

        dose_spec(g)
    return g


def methods_of(grid: dict, regime: str) -> list[str]:
    """The grid's methods run in ``regime`` (a regime may list a subset under ``methods``)."""
    sub = grid["_regimes"][regime].get("methods")
    return [m for m in grid["methods"] if not sub or m in sub]


def grid_cells(grid: dict) -> list[tuple[str, str, int]]:
    """All ``(regime, method, seed)`` cells, seed-major (partial results cover every method), or
    regime-major with ``order: regime`` (partial results are whole regimes, in the listed order)."""
    if grid.get("order") == "regime":
        return [(r, m, s) for r in grid["regimes"] for s in grid["seeds"] for m in methods_of(grid, r)]
    return [(r, m, s) for s in grid["seeds"] for r in grid["regimes"] for m in methods_of(grid, r)]


def _check_regime(name: str, spec: dict) -> None:
    from gapo.policy.base_policy import PRESETS
    from gapo.policy.pretrain import PretrainConfig

    base = spec.get("base")
    if isinstance(base, str):
        if base not in PRESETS:
            raise unknown(f"base-policy preset (regime {name!r})", base, PRESETS)
    elif isinstance(base, dict):
        bad = set(base) - set(PretrainConfig.__dataclass_fields__)
        if bad:
            raise ValueError(f"regime {name!r}: unknown base fields {sorted(bad)}")
        if base.get("task", "countdown") not in tasks.names():
            raise unknown(f"task (regime {name!r})", base["task"], tasks.names())
    else:
        raise ValueError(f"regime {name!r} needs 'base': a preset name or PretrainConfig fields")
    t = spec.get("task")
    if t is not None and t.get("name", "countdown") not in tasks.names():
        raise unknown(f"task (regime {name!r})", t.get("name"), tasks.names())


def pretrain_config(spec: dict) -> PretrainConfig:
    """The regime's base policy: a preset's ``PretrainConfig``, or one built from the regime's fields."""
    from gapo.policy.base_policy import resolve
    from gapo.policy.pretrain import PretrainConfig

    base = spec["base"]
    if isinstance(base, str):
        return resolve(base)
    b = dict(base)
    b["sft_mix"] = tuple((dict(p), float(w)) for p, w in b.get("sft_mix", PretrainConfig.sft_mix))
    for k in ("betas",):
        if k in b:
            b[k] = tuple(b[k])
    for p, _ in b["sft_mix"]:
        if "num_range" in p:
            p["num_range"] = tuple(p["num_range"])
    return PretrainConfig(**b)


def regime_task(spec: dict) -> dict:
    """The regime's RL task, ``{"name", "params"}``: its ``task``, else its base policy's."""
    t = spec.get("task")
    if t is not None:
        return {"name": t.get("name", "countdown"), "params": dict(t.get("params") or {})}
    pc = pretrain_config(spec)
    return {"name": pc.task, "params": dict(pc.rl_task)}


def cell_config(grid: dict, regime: str, method: str, seed: int, *, base_path: str, model_files: bool = True) -> Config:
    """The validated trainer ``Config`` of one cell (``model_files``: see ``Config.validate``)."""
    cfg = Config()
    task = regime_task(grid["_regimes"][regime])
    overrides = {
        "model.path": base_path,
        "task.name": task["name"],
        "task.params": task["params"],
        "train.progress": False,
    }
    overrides.update(grid["common"])
    overrides.update(grid["_regimes"][regime].get("overrides") or {})
    overrides.update(grid["_methods"][method])
    overrides["train.seed"] = seed
    for k, v in overrides.items():
        try:
            set_key(cfg, k, json.loads(json.dumps(v)) if isinstance(v, (dict, list)) else v)
        except ValueError as e:
            raise ValueError(f"cell {regime}/{method}/seed{seed}: {e}") from None
    try:
        return cfg.validate(model_files=model_files)
    except ValueError as e:
        raise ValueError(f"cell {regime}/{method}/seed{seed}: {e}") from None


def cell_dir(out: Path, regime: str, method: str, seed: int) -> Path:
    """The cell's run folder (the trainer owns it)."""
    return Path(out) / regime / method / f"seed{seed}"


def cell_file(cdir: Path, ext: str) -> Path:
    """``<regime>/<method>/seed<k>.json`` (the cell's spec) and ``.log`` sit next to the run folder,
    so the trainer owns the folder itself (it may delete it to start over)."""
    return cdir.with_name(f"{cdir.name}.{ext}")


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1, default=str)
    atomic_write(path, lambda tmp: tmp.write_text(text))


# --------------------------------------------------------------------------------- the pool
# A job is (name, argv of ``python -m gapo.experiments.cell``, log file, on_exit(rc, seconds) -> message).
Job = tuple[str, list[str], Path, Callable[[int, float], str]]


def _eval_cfg(grid: dict, regime: str) -> dict:
    cfg = cell_config(grid, regime, methods_of(grid, regime)[0], grid["seeds"][0], base_path="x")
    ev = {
        "problems": cfg.eval.problems,
        "samples": cfg.eval.samples,
        "temperature": cfg.eval.temperature,
        "seed": cfg.eval.seed,
        "max_new_tokens": cfg.sampling.max_new_tokens,
    }
    # what else the cells' own evaluations sample with (rl.evaluate.eval_params), recorded only when
    # set: a base evaluation recorded before these keys existed (at their defaults) still matches
    if cfg.eval.top_p != 1.0:
        ev["top_p"] = cfg.eval.top_p
    if cfg.sampling.stop:
        ev["stop"] = list(cfg.sampling.stop)
    return ev


def base_eval_cfg(grid: dict, regime: str) -> dict:
    """What a regime's ``base_eval.json`` must record as its ``eval_cfg`` to be reused: the
    evaluation's settings and the base policy's identity (a regime whose base or task changed must
    not reuse another policy's evaluation, or path). As it reads back from JSON (tuples as lists)."""
    spec = grid["_regimes"][regime]
    ev = {**_eval_cfg(grid, regime), "base_key": pretrain_config(spec).cache_key(), "task": regime_task(spec)}
    return json.loads(json.dumps(ev))


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
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


def _pool(jobs: list[Job], workers: int, say, tick: Callable[[], None] | None = None) -> None:
    """Run ``(name, argv, log, on_exit(rc, seconds))`` jobs, at most ``workers`` at a time;
    ``tick()`` runs every 0.2 s while they do (a progress bar's refresh)."""
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < workers:
                name, argv, log, on_exit = pending.pop(0)
                running.append((name, _spawn(argv, log), on_exit, time.time()))
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
        bases = _prepare_regimes(grid, out, t0, say)
        stats = _run_cells(grid, out, bases, t0, retry_failed, say)
        stats["wall_s"] = time.time() - t0
        return stats
    finally:
        lock.release()


def weights_sha256(policy: Path | str) -> str | None:
    """sha256 over a policy folder's ``*.safetensors`` files (sorted by name), or None if it has none."""
    files = sorted(Path(policy).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _base_still_there(rec: dict) -> bool:
    """A ``base_eval.json`` record's policy is on this machine, and (where the record has its
    digest) with the same weights."""
    path = Path(rec.get("policy", ""))
    if not (path / "config.json").is_file():
        return False
    want = rec.get("weights_sha256")
    return want is None or weights_sha256(path) == want


def _same_base(old: dict, new: dict) -> bool:
    """Whether a rebuilt base is the one an earlier ``base_eval.json`` recorded: the same weights
    digest where both have one, else the same evaluation, value for value (its timings aside)."""
    if old.get("weights_sha256") and new.get("weights_sha256"):
        return old["weights_sha256"] == new["weights_sha256"]

    def values(rec):
        return {k: v for k, v in (rec.get("eval") or {}).items() if not k.startswith("time/")}

    return values(old) == values(new)


def _was_run(cdir: Path) -> bool:
    """The cell finished or checkpointed: its config and its base are fixed from then on (a started
    cell resumes from weights trained on that base)."""
    return (cdir / "done.json").is_file() or (cdir / "checkpoint.pt").is_file()


def _trained_from(regime_dir: Path) -> bool:
    """Some cell under the regime's folder was run (any method or seed, in this grid or not)."""
    return any(_was_run(d) for d in regime_dir.glob("*/seed*"))


def _prepare_regimes(grid: dict, out: Path, t0: float, say) -> dict[str, dict]:
    """Phase 1: every regime's base policy and base evaluation (one job per regime, in parallel,
    skipped where ``base_eval.json`` matches and its policy is still there); returns each regime's
    ``base_eval.json``. A base rebuilt for a regime that has finished or started cells must be the
    one they trained from (pretraining is reproducible on one machine type, not across all): if it
    is not, the old record is put back and nothing runs."""
    from gapo.policy.base_policy import cache_dir, shipped_dir

    prep, before = [], {}
    for r in grid["regimes"]:
        spec = grid["_regimes"][r]
        ev = base_eval_cfg(grid, r)
        be = out / r / "base_eval.json"
        if be.is_file():
            rec = json.loads(be.read_text())
            if rec.get("eval_cfg") == ev:
                if _base_still_there(rec):
                    continue
                if _trained_from(out / r):
                    before[r] = rec  # rebuilt below, then checked against the base those cells used
        argv = ["--prepare", str(out), r, json.dumps(grid["_regimes"][r]), json.dumps(ev)]
        prep.append(
            (
                r,
                argv,
                out / r / "prepare.log",
                lambda rc, dt, r=r: (
                    f"[{time.time() - t0:6.0f}s] regime {r}: base policy "
                    f"{'ready' if rc == 0 else f'FAILED (rc={rc}, see prepare.log)'} ({dt:.0f}s)"
                ),
            )
        )
        cfg = pretrain_config(spec)
        if (cache_dir(cfg) / "config.json").is_file() or shipped_dir(cfg) is not None:
            say(f"regime {r}: base policy {cfg.name!r} is cached; evaluating it on {ev['problems']} problems")
        else:
            budget = f", at most {cfg.time_budget_s / 60:.0f} min of CPU" if cfg.time_budget_s else ""
            say(
                f"regime {r}: building base policy {cfg.name!r} (up to {cfg.max_steps} SFT steps{budget}; "
                f"progress in {out / r / 'prepare.log'})"
            )
    bar = _PrepareBar([(r, log) for r, _, log, _ in prep]) if prep else None
    try:
        _pool(prep, grid["workers"], bar.wrap(say) if bar else say, tick=bar.refresh if bar else None)
    finally:
        if bar is not None:
            bar.close()
    bases = {}
    for r in grid["regimes"]:
        be = out / r / "base_eval.json"
        if not be.is_file():
            raise RuntimeError(f"regime {r}: base policy could not be prepared; see {out / r / 'prepare.log'}")
        bases[r] = json.loads(be.read_text())
    for r, old in before.items():
        if not _same_base(old, bases[r]):
            write_json(out / r / "base_eval.json", old)
            raise RuntimeError(
                f"regime {r}: the base policy rebuilt at {bases[r]['policy']} is not the one the finished or "
                f"started cells in {out / r} trained from (weights sha256 {bases[r].get('weights_sha256')}, recorded "
                f"{old.get('weights_sha256')}; base pass@1 {bases[r]['eval'].get('eval/pass@1')}, recorded "
                f"{(old.get('eval') or {}).get('eval/pass@1')}); resuming would mix two base policies. Put the "
                f"original weights at {old.get('policy')}, or run the grid into a new --out."
            )
    return bases


def _run_cells(grid: dict, out: Path, bases: dict[str, dict], t0: float, retry_failed: bool, say) -> dict:
    """Phase 2: the cells, seed-major so that partial results cover every method."""
    jobs, stats = [], {"done": 0, "failed": 0, "skipped": 0, "total": 0}
    cells = grid_cells(grid)
    stats["total"] = len(cells)
    for r, m, s in cells:
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
    say(
        f"{len(cells)} cells: {len(jobs)} to run, {stats['skipped']} already finished or failed; "
        f"{grid['workers']} workers"
    )
    if jobs:
        say(estimate_line(len(jobs), grid["workers"], *_cell_seconds(grid, out)))
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(jobs),
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

        jobs = [(n, a, log, counted(e)) for n, a, log, e in jobs]
        _pool(jobs, grid["workers"], _above(bar, say))
    finally:
        bar.close()
    return stats


def _above(bar, say):
    """``say`` that prints above a live tqdm bar instead of through it."""

    def f(line):
        with bar.external_write_mode():
            say(line)

    return f


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


class _PrepareBar:
    """One tqdm bar over the regimes' base-policy builds, moved by the ``N% done`` lines their
    children write to prepare.log (``gapo.policy.pretrain.pretrain``'s ``log``)."""

    _PCT = re.compile(rb"(\d+)% done")

    def __init__(self, logs: list[tuple[str, Path]]):
        self.logs, self.done, self.total = logs, 0, 100 * len(logs)  # percent points (a disabled bar counts nothing)
        self.bar = tqdm(
            total=100 * len(logs),
            desc="base policies",
            unit="%",
            dynamic_ncols=True,
            disable=None,
            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}]",
        )

    def refresh(self) -> None:
        done = 0
        for _, log in self.logs:
            try:
                with open(log, "rb") as f:
                    f.seek(max(0, os.path.getsize(log) - 4096))
                    hits = self._PCT.findall(f.read())
            except OSError:
                hits = []
            done += int(hits[-1]) if hits else 0
        if done > self.done:
            self.bar.update(done - self.done)
            self.done = done

    def wrap(self, say):
        return _above(self.bar, say)

    def close(self) -> None:
        self.bar.close()


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
        if not spec.is_file() or not _was_run(d):
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
