"""``gapo compare``: a grid of methods × regimes × seeds, each cell a trainer run; and its report.

    gapo compare --config configs/grid.yaml --out runs/grid        # run (resumable)
    gapo compare --quick                                           # the CI-sized grid
    gapo compare --config configs/grid.yaml --out runs/grid --report-only

A grid YAML names ``methods`` (keys of ``METHODS``, or new ones under ``method_defs``),
``regimes`` (keys of ``REGIMES``, or new ones under ``regime_defs``), ``seeds`` and ``common``
overrides (``section.key: value``) applied identically to every cell, so every method gets the
same compute: rollout batches, prompts × group size, mini-batches, epochs, evaluation.

Cells live in ``<out>/<regime>/<method>/seed<k>`` and run in child processes (``workers`` at a
time, one torch thread each). A cell with ``done.json`` is skipped; one with a checkpoint is
resumed; a cell that crashes or produces NaN gets ``failed.json`` (error and log tail; the full
log is ``seed<k>.log`` next to the folder) and the others go on. Failed cells are not retried unless
``python -m gapo.experiments.grid --retry-failed``.

Every cell of a regime starts from the same base policy and is evaluated on the same held-out
problems with the same sampling seed, so the pre-training evaluation is computed once per
regime (``<out>/<regime>/base_eval.json``) and reused by every cell.

The report (``report`` below, also ``--report-only``) reads finished cells and writes
``summary.json``, ``cells.csv``, ``tables.md`` and PNG figures: mean and 95% t-interval over
seeds of held-out pass@k, coverage, first-move entropy, token entropy, clip fractions (overall
and per group-success count ``c``), wall-clock per step, and paired (same seed) differences of
each method against the fixed-clipping baseline.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from gapo.core.checks import unknown

__all__ = ["METHODS", "REGIMES", "load_grid", "run_grid", "report", "main"]

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
    "fgrpo": {**_FIXED, "algo.advantage": "focal", "algo.advantage_params": {"gamma": FOCAL_GAMMA, "base": "drgrpo"},
              "algo.eps_low": 0.2, "algo.eps_high_max": 0.2},
    "passk": {**_FIXED, "algo.advantage": "passk", "algo.advantage_params": {"k": 4},
              "algo.eps_low": 0.2, "algo.eps_high_max": 0.2},
    "gapo": {**_FIXED, "algo.eps_schedule": "linear", "algo.eps_low": 0.2, "algo.eps_high_max": 0.28},
    "gapo_seq": {**_FIXED, "algo.loss": "gspo", "algo.eps_schedule": "linear", "algo.eps_low": GSPO_ASYM[0],
                 "algo.eps_high_max": GSPO_ASYM[1]},
    "gapo_log": {**_FIXED, "algo.eps_schedule": "log", "algo.eps_low": 0.2, "algo.eps_high_max": 0.28},
}
# the fixed-clipping counterpart each GAPO variant is compared with (paired by seed)
BASELINE_OF = {"gapo": "drgrpo", "gapo_log": "drgrpo", "gapo_seq": "gspo_asym"}

# --------------------------------------------------------------------------------- regimes
# A regime is a base policy (an embedded preset name or PretrainConfig fields) plus the RL task.
ARITHMETIC_TASK = {"digits": 2, "ops": "+-*"}
REGIMES: dict[str, dict] = {
    "low": {"base": "low"},  # RL task: the preset's (4-number Countdown, numbers 1-10)
    "high": {"base": "high"},  # 2-number Countdown (the `high` preset)
    "arithmetic": {
        "base": {"name": "arithmetic", "task": "arithmetic", "sft_mix": [[ARITHMETIC_TASK, 1.0]],
                 "rl_task": ARITHMETIC_TASK, "model_preset": "tiny", "pool_size": 3000, "batch_size": 64,
                 "max_steps": 400, "time_budget_s": None, "lr": 3e-3, "warmup_steps": 50},
        "task": {"name": "arithmetic", "params": ARITHMETIC_TASK},
    },
}

QUICK_GRID = Path(__file__).resolve().parents[3] / "configs" / "grid-quick.yaml"


# --------------------------------------------------------------------------------- grid
def load_grid(path: str | Path | dict) -> dict:
    """Read and check a grid: every method and regime known, every cell's config valid."""
    import yaml

    if isinstance(path, dict):
        g = dict(path)
    else:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"grid file {str(p)!r} does not exist")
        g = yaml.safe_load(p.read_text()) or {}
    allowed = {"name", "methods", "regimes", "seeds", "common", "method_defs", "regime_defs", "workers",
               "out", "report_dir", "figures_dir", "baseline", "roles"}
    for k in g:
        if k not in allowed:
            raise ValueError(f"unknown grid key {k!r}; accepted: {sorted(allowed)}")
    methods = {**METHODS, **{k: dict(v or {}) for k, v in (g.get("method_defs") or {}).items()}}
    regimes = {**REGIMES, **{k: dict(v or {}) for k, v in (g.get("regime_defs") or {}).items()}}
    g.setdefault("methods", list(METHODS))
    g.setdefault("regimes", ["low", "high", "arithmetic"])
    g.setdefault("seeds", [0, 1, 2, 3, 4])
    g.setdefault("common", {})
    g.setdefault("workers", 2)
    if isinstance(g["seeds"], int):
        g["seeds"] = list(range(g["seeds"]))
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
    return g


def methods_of(grid: dict, regime: str) -> list[str]:
    """The grid's methods run in ``regime`` (a regime may list a subset under ``methods``)."""
    sub = grid["_regimes"][regime].get("methods")
    return [m for m in grid["methods"] if not sub or m in sub]


def grid_cells(grid: dict) -> list[tuple[str, str, int]]:
    """All ``(regime, method, seed)`` cells, seed-major (partial results cover every method)."""
    return [(r, m, s) for s in grid["seeds"] for r in grid["regimes"] for m in methods_of(grid, r)]


def _check_regime(name: str, spec: dict) -> None:
    from gapo import tasks
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


def pretrain_config(spec: dict):
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
    t = spec.get("task")
    if t is not None:
        return {"name": t.get("name", "countdown"), "params": dict(t.get("params") or {})}
    pc = pretrain_config(spec)
    return {"name": pc.task, "params": dict(pc.rl_task)}


def cell_config(grid: dict, regime: str, method: str, seed: int, *, base_path: str):
    """The validated trainer ``Config`` of one cell."""
    from gapo.rl.config import Config, set_key

    cfg = Config()
    task = regime_task(grid["_regimes"][regime])
    overrides = {"model.path": base_path, "task.name": task["name"], "task.params": task["params"],
                 "train.progress": False}
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
        return cfg.validate()
    except ValueError as e:
        raise ValueError(f"cell {regime}/{method}/seed{seed}: {e}") from None


def cell_dir(out: Path, regime: str, method: str, seed: int) -> Path:
    return Path(out) / regime / method / f"seed{seed}"


# --------------------------------------------------------------------------------- one cell (child)
def _prepare_regime(out: Path, regime: str, spec_json: str, eval_json: str) -> int:
    """Child: build (or fetch) the regime's base policy and evaluate it once."""
    import torch

    from gapo import tasks
    from gapo.rl.evaluate import evaluate
    from gapo.policy.model import load_policy
    from gapo.policy.base_policy import get_base_policy

    torch.set_num_threads(1)
    spec, ev = json.loads(spec_json), json.loads(eval_json)
    rdir = Path(out) / regime
    path = get_base_policy(pretrain_config(spec), progress=False)
    t = regime_task(spec)
    task = tasks.get(t["name"], **t["params"])
    model, tok = load_policy(path)
    res = {}
    if ev["problems"]:
        problems = task.generate("eval", ev["problems"], ev["seed"])
        res = evaluate(model, tok, task, problems, n=ev["samples"], temperature=ev["temperature"],
                       max_new_tokens=ev["max_new_tokens"] or task.max_completion_len + 1, seed=ev["seed"])
        res.update(kind="eval", step=0)
    _write_json(rdir / "base_eval.json", {"policy": str(path), "eval_cfg": ev, "eval": res})
    return 0


def _run_cell(cdir: Path) -> int:
    """Child: train one cell from ``cell.json``; ``done.json`` on success, ``failed.json`` on error."""
    import torch

    from gapo.rl.config import from_dict
    from gapo.rl.trainer import Trainer

    cdir = Path(cdir)
    spec = json.loads(_cell_file(cdir, "json").read_text())
    torch.set_num_threads(1)
    base_eval = spec.get("base_eval")

    class CellTrainer(Trainer):
        def evaluate(self, *, progress=False):
            if self.step == 0 and base_eval:  # same policy, problems and seed for every cell
                return dict(base_eval)
            return super().evaluate(progress=progress)

    t0 = time.time()
    try:
        cfg = from_dict(spec["config"]).validate()
        resume = (cdir / "checkpoint.pt").is_file()
        tr = CellTrainer(cfg, cdir, resume=resume, overwrite=not resume)  # no checkpoint: start over
        res = tr.fit()
        if res["stopped"]:
            return 130
        recs = [json.loads(x) for x in (cdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        bad = [r["step"] for r in recs if any(isinstance(v, str) and v in ("nan", "inf", "-inf") for v in r.values())]
        if bad:
            raise FloatingPointError(f"non-finite metrics at steps {bad[:5]}")
        final = {k: v for k, v in (res["eval"] or {}).items() if k != "eval/correct"}
        _write_json(cdir / "done.json", {"step": res["step"], "wall_s": time.time() - t0, "eval": final,
                                         "resumed": resume})
        ck = cdir / "checkpoint.pt"  # the run is finished: the checkpoint is only disk weight now
        ck.unlink(missing_ok=True)
        return 0
    except Exception as e:  # noqa: BLE001 - recorded, the grid goes on
        _write_json(cdir / "failed.json", {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                                           "wall_s": time.time() - t0})
        traceback.print_exc()
        return 1


def _cell_file(cdir: Path, ext: str) -> Path:
    """``<regime>/<method>/seed<k>.json`` (the cell's spec) and ``.log`` sit next to the run folder,
    so the trainer owns the folder itself (it may delete it to start over)."""
    return cdir.with_name(f"{cdir.name}.{ext}")


def _write_json(path: Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------- the pool
def _eval_cfg(grid: dict, regime: str) -> dict:
    cfg = cell_config(grid, regime, methods_of(grid, regime)[0], grid["seeds"][0], base_path="x")
    return {"problems": cfg.eval.problems, "samples": cfg.eval.samples, "temperature": cfg.eval.temperature,
            "seed": cfg.eval.seed, "max_new_tokens": cfg.sampling.max_new_tokens}


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log, "a")
    p = subprocess.Popen([sys.executable, "-m", "gapo.experiments.grid", *argv], stdout=fh, stderr=subprocess.STDOUT, env=env)
    p._log = fh  # type: ignore[attr-defined]
    return p


def _pool(jobs: list[tuple[str, list[str], Path, callable]], workers: int, say) -> None:
    """Run ``(name, argv, log, on_exit(rc))`` jobs, at most ``workers`` at a time."""
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < workers:
                name, argv, log, on_exit = pending.pop(0)
                running.append((name, _spawn(argv, log), on_exit, time.time()))
            time.sleep(0.2)
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


def run_grid(grid: dict, out: str | Path, *, retry_failed: bool = False, say=print) -> dict:
    """Run every unfinished cell of ``grid`` under ``out``; returns counts of done/failed/skipped.

    SIGTERM or SIGINT (which a shell's background job would otherwise ignore) stop the grid
    cleanly: running cells checkpoint and the next invocation resumes them."""
    if threading.current_thread() is not threading.main_thread():
        return _run_grid(grid, out, retry_failed=retry_failed, say=say)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run_grid(grid, out, retry_failed=retry_failed, say=say)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _run_grid(grid: dict, out: str | Path, *, retry_failed: bool = False, say=print) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # 1. base policies and base evaluations (one job per regime, in parallel)
    prep = []
    for r in grid["regimes"]:
        ev = _eval_cfg(grid, r)
        be = out / r / "base_eval.json"
        if be.is_file() and json.loads(be.read_text()).get("eval_cfg") == ev:
            continue
        argv = ["--prepare", str(out), r, json.dumps(grid["_regimes"][r]), json.dumps(ev)]
        prep.append((r, argv, out / r / "prepare.log",
                     lambda rc, dt, r=r: f"[{time.time() - t0:6.0f}s] regime {r}: base policy "
                                         f"{'ready' if rc == 0 else f'FAILED (rc={rc}, see prepare.log)'} ({dt:.0f}s)"))
    _pool(prep, grid["workers"], say)
    bases = {}
    for r in grid["regimes"]:
        be = out / r / "base_eval.json"
        if not be.is_file():
            raise RuntimeError(f"regime {r}: base policy could not be prepared; see {out / r / 'prepare.log'}")
        bases[r] = json.loads(be.read_text())
    # 2. cells, seed-major so that partial results cover every method
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
        from gapo.rl.config import to_dict

        _write_json(_cell_file(d, "json"), {"regime": r, "method": m, "seed": s, "config": to_dict(cfg),
                                      "base_eval": bases[r]["eval"] or None})

        def on_exit(rc, dt, d=d, name=f"{r}/{m}/seed{s}"):
            if rc == 0:
                stats["done"] += 1
                return f"[{time.time() - t0:6.0f}s] {name}: done ({dt:.0f}s)"
            if rc == 130:
                return f"[{time.time() - t0:6.0f}s] {name}: interrupted (resumes next time)"
            stats["failed"] += 1
            if not (d / "failed.json").is_file():  # killed before it could say why
                log = _cell_file(d, "log")
                tail = log.read_text()[-4000:] if log.is_file() else ""
                _write_json(d / "failed.json", {"error": f"exit code {rc}", "log_tail": tail, "wall_s": dt})
            err = json.loads((d / "failed.json").read_text())["error"]
            return f"[{time.time() - t0:6.0f}s] {name}: FAILED ({err}); log: {_cell_file(d, 'log')}"

        jobs.append((f"{r}/{m}/{s}", ["--cell", str(d)], _cell_file(d, "log"), on_exit))
    say(f"{len(cells)} cells: {len(jobs)} to run, {stats['skipped']} already finished or failed; "
        f"{grid['workers']} workers")
    _pool(jobs, grid["workers"], say)
    stats["wall_s"] = time.time() - t0
    return stats


# --------------------------------------------------------------------------------- statistics
# two-sided 95% Student t quantiles t_{0.975, df}
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975)
    return next((_T975[k] for k in keys if k >= df), 1.96)


def mean_ci(xs: list[float]) -> dict:
    """Mean and 95% t-interval half-width over seeds (``ci`` is NaN with one value)."""
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return {"mean": float("nan"), "ci": float("nan"), "n": 0}
    m = sum(xs) / n
    if n == 1:
        return {"mean": m, "ci": float("nan"), "n": 1}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return {"mean": m, "ci": t975(n - 1) * sd / math.sqrt(n), "n": n}


# --------------------------------------------------------------------------------- report
TRAIN_KEYS = ("clip/frac_high_pos", "loss/clipfrac", "policy/entropy", "time/step_s", "time/update_s",
              "rollout/pass_rate", "loss/approx_kl")


def load_cell(d: Path) -> dict | None:
    if not (d / "done.json").is_file():
        return None
    from gapo.rl.run_dir import load_run

    run = load_run(d)
    done = json.loads((d / "done.json").read_text())
    tr, ev = run["train"], run["eval"]
    import yaml

    cfg = yaml.safe_load((d / "config.yaml").read_text())
    out = {"train": tr, "eval": ev, "done": done, "G": cfg["train"]["group_size"]}
    last = ev[-1] if ev else {}
    first = ev[0] if ev else {}
    s = {}
    for k, v in last.items():
        if k.startswith("eval/") and isinstance(v, (int, float)):
            s[f"after/{k[5:]}"] = v
    for k, v in first.items():
        if k.startswith("eval/") and isinstance(v, (int, float)):
            s[f"before/{k[5:]}"] = v
    for k in TRAIN_KEYS:
        vals = [r[k] for r in tr if isinstance(r.get(k), (int, float))]
        if vals:
            s[f"train/{k}"] = sum(vals) / len(vals)
    # late-training token entropy (last quarter of the steps)
    ents = [r["policy/entropy"] for r in tr if isinstance(r.get("policy/entropy"), (int, float))]
    if ents:
        q = ents[-max(1, len(ents) // 4):]
        s["train/entropy_late"] = sum(q) / len(q)
    # clip stats per c: token-weighted over training
    pos_by_c: dict[int, list[float]] = {}
    for r in tr:
        for k, v in r.items():
            if k.startswith("clip/frac_high_by_c/"):
                c = int(k.rsplit("/", 1)[1])
                w = r.get(f"clip/tokens_pos_by_c/{c}", 0.0)
                acc = pos_by_c.setdefault(c, [0.0, 0.0])
                acc[0] += v * w
                acc[1] += w
    for c, (num, den) in pos_by_c.items():
        if den:
            s[f"clip_by_c/{c}"] = num / den
    for prefix, name in (("clip/ratio_dev_by_c/", "dev_by_c"), ("clip/eps_high_by_c/", "eps_by_c"),
                         ("clip/adv_by_c/", "adv_by_c")):
        acc: dict[int, list[float]] = {}
        for r in tr:
            for k, v in r.items():
                if k.startswith(prefix) and isinstance(v, (int, float)):
                    acc.setdefault(int(k[len(prefix):]), []).append(v)
        for c, vs in acc.items():
            s[f"{name}/{c}"] = sum(vs) / len(vs)
    out["summary"] = s
    return out


def report(grid: dict, out: str | Path, report_dir: str | Path | None = None, figures_dir: str | Path | None = None,
           say=print) -> Path:
    """Aggregate finished cells into ``summary.json``, ``cells.csv``, ``tables.md`` and figures."""
    out = Path(out)
    rdir = Path(report_dir or grid.get("report_dir") or out / "report")
    fdir = Path(figures_dir or grid.get("figures_dir") or rdir)
    rdir.mkdir(parents=True, exist_ok=True)
    fdir.mkdir(parents=True, exist_ok=True)
    cells, rows, failed = {}, [], []
    for r, m, s in sorted(grid_cells(grid), key=lambda x: (grid["regimes"].index(x[0]), grid["methods"].index(x[1]), x[2])):
        if True:
            if True:
                d = cell_dir(out, r, m, s)
                if (d / "failed.json").is_file():
                    failed.append({"cell": f"{r}/{m}/seed{s}", **{k: v for k, v in json.loads(
                        (d / "failed.json").read_text()).items() if k == "error"}})
                c = load_cell(d)
                if c is None:
                    continue
                cells[(r, m, s)] = c
                rows.append({"regime": r, "method": m, "seed": s, **c["summary"]})
    if not rows:
        raise ValueError(f"no finished cells under {str(out)!r}")
    keys = sorted({k for row in rows for k in row} - {"regime", "method", "seed"})
    with open(rdir / "cells.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["regime", "method", "seed", *keys])
        w.writeheader()
        for row in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
    agg: dict = {}
    for r in grid["regimes"]:
        for m in grid["methods"]:
            rs = [row for row in rows if row["regime"] == r and row["method"] == m]
            if rs:
                agg.setdefault(r, {})[m] = {k: mean_ci([row.get(k) for row in rs]) for k in keys}
    # paired differences (same seed) against the baseline
    base = grid.get("baseline", "drgrpo")
    paired: dict = {}
    for r in grid["regimes"]:
        for m in grid["methods"]:
            b = BASELINE_OF.get(m, base)
            if m == b:
                continue
            for k in keys:
                diffs = [cells[(r, m, s)]["summary"].get(k, float("nan")) - cells[(r, b, s)]["summary"].get(k, float("nan"))
                         for s in grid["seeds"] if (r, m, s) in cells and (r, b, s) in cells]
                if diffs:
                    paired.setdefault(r, {}).setdefault(m, {"vs": b})[k] = mean_ci(diffs)
    claims = _claims(grid, cells)
    summary = {"grid": grid.get("name"), "seeds": grid["seeds"], "regimes": grid["regimes"], "methods": grid["methods"],
               "n_cells_done": len(rows), "n_cells_total": len(grid_cells(grid)),
               "failed": failed, "aggregate": agg, "paired": paired, "claims": claims,
               "common": grid["common"], "method_defs": {m: grid["_methods"][m] for m in grid["methods"]}}
    _write_json(rdir / "summary.json", summary)
    md = _tables_md(summary, rows)
    figs = _figures(grid, cells, agg, fdir)
    rel = os.path.relpath(fdir, rdir)
    md += "\n## Figures\n\n" + "\n".join(f"![{f}]({rel}/{f})" for f in figs) + "\n"
    (rdir / "tables.md").write_text(md)
    say(f"report: {rdir / 'tables.md'} ({len(rows)} finished cells, {len(failed)} failed)")
    return rdir / "tables.md"


# The claims of issue 4 item 5 as paired (same seed) comparisons: (claim, regime, method, against, key).
# Where a regime or method is missing from the grid the comparison is skipped.
CLAIM_TESTS = [
    ("1 pass@1 (low)", "low", "gapo", "drgrpo", "after/pass@1"),
    ("1 pass@1 (low)", "low", "gapo", "grpo", "after/pass@1"),
    ("1 pass@1 (low)", "low", "gapo", "dapo", "after/pass@1"),
    ("1 pass@1 (low)", "low", "gapo_seq", "gspo_asym", "after/pass@1"),
    ("1 pass@1 (arithmetic)", "arithmetic", "gapo", "drgrpo", "after/pass@1"),
    ("1 pass@1 (arithmetic)", "arithmetic", "gapo", "dapo", "after/pass@1"),
    ("1 pass@1 (arithmetic)", "arithmetic", "gapo_seq", "gspo_asym", "after/pass@1"),
    ("2 pass@k (low)", "low", "gapo", "drgrpo", "after/pass@8"),
    ("2 pass@k (low)", "low", "gapo", "drgrpo", "after/pass@64"),
    ("2 pass@k (low)", "low", "gapo", "dapo", "after/pass@64"),
    ("2 pass@k (low)", "low", "gapo_seq", "gspo_asym", "after/pass@64"),
    ("2 pass@k (arithmetic)", "arithmetic", "gapo", "drgrpo", "after/pass@8"),
    ("2 pass@k (arithmetic)", "arithmetic", "gapo", "drgrpo", "after/pass@64"),
    ("2 pass@k (arithmetic)", "arithmetic", "gapo_seq", "gspo_asym", "after/pass@64"),
    ("3 vs shaping (low)", "low", "gapo", "fgrpo", "after/pass@1"),
    ("3 vs shaping (low)", "low", "gapo", "fgrpo", "after/pass@64"),
    ("3 vs shaping (low)", "low", "gapo", "passk", "after/pass@1"),
    ("3 vs shaping (low)", "low", "gapo", "passk", "after/pass@64"),
    ("3 vs shaping (arithmetic)", "arithmetic", "gapo", "fgrpo", "after/pass@1"),
    ("3 vs shaping (arithmetic)", "arithmetic", "gapo", "fgrpo", "after/pass@64"),
    ("3 vs shaping (arithmetic)", "arithmetic", "gapo", "passk", "after/pass@1"),
    ("3 vs shaping (arithmetic)", "arithmetic", "gapo", "passk", "after/pass@64"),
    ("5 stability (high)", "high", "gapo", "drgrpo", "after/pass@1"),
    ("5 stability (high)", "high", "gapo", "drgrpo", "after/pass@64"),
    ("5 stability (high)", "high", "gapo", "drgrpo", "train/entropy_late"),
    ("5 stability (high)", "high", "gapo_seq", "gspo_asym", "after/pass@1"),
    ("6 coverage (low)", "low", "gapo", "drgrpo", "after/coverage"),
    ("6 coverage (low)", "low", "gapo", "drgrpo", "after/first_move_entropy"),
    # the lead from configs/grid-long.yaml (GAPO-seq − GSPO-asym coverage +4.6 [+2.0, +7.1]), retested
    ("6 coverage (low)", "low", "gapo_seq", "gspo_asym", "after/coverage"),
    ("6 coverage (low)", "low", "gapo_seq", "gspo_asym", "after/first_move_entropy"),
    ("6 coverage (high)", "high", "gapo", "drgrpo", "after/coverage"),
    ("6 coverage (high)", "high", "gapo", "drgrpo", "after/first_move_entropy"),
    ("7 overhead", "*", "gapo", "drgrpo", "train/time/update_s"),
    ("7 overhead", "*", "gapo_seq", "gspo_asym", "train/time/update_s"),
]


def _claims(grid: dict, cells: dict) -> list[dict]:
    """Paired differences for ``CLAIM_TESTS``, the mechanism test (claim 4) and improvement over
    the base policy (after − before) per method."""
    out = []
    seeds = grid["seeds"]

    def diff(r, a, b, key):
        return [cells[(r, a, s)]["summary"].get(key, float("nan")) - cells[(r, b, s)]["summary"].get(key, float("nan"))
                for s in seeds if (r, a, s) in cells and (r, b, s) in cells]

    roles = grid.get("roles") or {}  # e.g. {low: cd-low}: which regime plays the claim's "low"/"high"
    for claim, r, a, b, key in CLAIM_TESTS:
        for reg in (grid["regimes"] if r == "*" else [roles.get(r, r)]):
            d = diff(reg, a, b, key)
            if d:
                out.append({"claim": claim, "regime": reg, "method": a, "vs": b, "key": key, **mean_ci(d)})
    # claim 4: clip share of A>0 tokens in low-c groups (c <= G/4) minus high-c groups (c >= 3G/4)
    for reg in grid["regimes"]:
        for m in grid["methods"]:
            vals = []
            for s in seeds:
                c = cells.get((reg, m, s))
                if not c:
                    continue
                G = c["G"]
                byc = {int(k.split("/")[1]): v for k, v in c["summary"].items() if k.startswith("clip_by_c/")}
                if not byc:
                    continue
                lo = [v for k, v in byc.items() if k <= max(1, G // 4)]
                hi = [v for k, v in byc.items() if k >= 3 * G // 4 and k < G]
                if lo and hi:
                    vals.append(sum(lo) / len(lo) - sum(hi) / len(hi))
            if vals:
                out.append({"claim": "4 mechanism: clip(low c) - clip(high c)", "regime": reg, "method": m, "vs": "",
                            "key": "clip_by_c", **mean_ci(vals)})
        for m, b in BASELINE_OF.items():
            for c in range(1, 3):
                d = diff(reg, m, b, f"clip_by_c/{c}")
                if d:
                    out.append({"claim": "4 mechanism: GAPO lowers low-c clipping", "regime": reg, "method": m, "vs": b,
                                "key": f"clip_by_c/{c}", **mean_ci(d)})
                d = diff(reg, m, b, f"dev_by_c/{c}")
                if d:
                    out.append({"claim": "4 mechanism: GAPO lets low-c ratios move further", "regime": reg, "method": m,
                                "vs": b, "key": f"dev_by_c/{c}", **mean_ci(d)})
    # RL improves on the base policy at all? (after - before)
    for reg in grid["regimes"]:
        for m in grid["methods"]:
            for key in ("pass@1", "pass@64"):
                d = [cells[(reg, m, s)]["summary"].get(f"after/{key}", float("nan")) -
                     cells[(reg, m, s)]["summary"].get(f"before/{key}", float("nan")) for s in seeds if (reg, m, s) in cells]
                if d:
                    out.append({"claim": "RL vs base", "regime": reg, "method": m, "vs": "base", "key": key, **mean_ci(d)})
    return out


def verdict(d: dict) -> str:
    """Sign of a paired difference by its 95% CI: '+' (CI above 0), '−' (below 0), '0' (contains 0)."""
    if d["n"] < 2 or not math.isfinite(d["ci"]):
        return "n<2"
    lo, hi = d["mean"] - d["ci"], d["mean"] + d["ci"]
    return "+" if lo > 0 else "−" if hi < 0 else "0"


def _fmt(d: dict | None, pct: bool = False) -> str:
    if not d or d["n"] == 0:
        return "–"
    f = 100.0 if pct else 1.0
    if d["n"] == 1 or not math.isfinite(d["ci"]):
        return f"{d['mean'] * f:.2f}"
    return f"{d['mean'] * f:.2f} ± {d['ci'] * f:.2f}"


def _tables_md(summary: dict, rows: list[dict]) -> str:
    agg, paired = summary["aggregate"], summary["paired"]
    lines = [f"# grid `{summary['grid']}`: {summary['n_cells_done']}/{summary['n_cells_total']} cells finished", "",
             "Mean ± 95% t-interval half-width over seeds. pass@k, coverage and clip fractions in %.", ""]
    main_cols = [("after/pass@1", "pass@1", True), ("after/pass@8", "pass@8", True), ("after/pass@64", "pass@64", True),
                 ("after/coverage", "coverage", True), ("after/first_move_entropy", "1st-move H", False),
                 ("train/entropy_late", "token H (late)", False), ("train/clip/frac_high_pos", "clip A>0", True),
                 ("train/time/step_s", "s/step", False), ("train/time/update_s", "update s/step", False)]
    for r, by_m in agg.items():
        base = next(iter(by_m.values()))
        lines += [f"## regime `{r}`", ""]
        bcols = [("before/pass@1", True), ("before/pass@8", True), ("before/pass@64", True), ("before/coverage", True),
                 ("before/first_move_entropy", False)]
        lines.append("base policy: " + ", ".join(f"{k[7:]} = {_fmt(base.get(k), p)}" for k, p in bcols if k in base))
        lines.append("")
        cols = [c for c in main_cols if any(c[0] in v for v in by_m.values())]
        lines.append("| method | n | " + " | ".join(c[1] for c in cols) + " |")
        lines.append("|---|---|" + "---|" * len(cols))
        for m, v in by_m.items():
            n = max(x["n"] for x in v.values())
            lines.append(f"| {m} | {n} | " + " | ".join(_fmt(v.get(k), p) for k, _, p in cols) + " |")
        lines.append("")
        if r in paired:
            lines += ["Paired differences (method − baseline, same seed):", ""]
            pcols = [c for c in main_cols[:7] if any(c[0] in v for v in paired[r].values())]
            lines.append("| method | vs | " + " | ".join(f"Δ {c[1]}" for c in pcols) + " |")
            lines.append("|---|---|" + "---|" * len(pcols))
            for m, v in paired[r].items():
                lines.append(f"| {m} | {v['vs']} | " + " | ".join(_fmt(v.get(k), p) for k, _, p in pcols) + " |")
            lines.append("")
        # clip by c
        cs = sorted({int(k.split("/")[1]) for v in by_m.values() for k in v if k.startswith("clip_by_c/")})
        if cs:
            lines += ["Clipped share of positive-advantage tokens (%) by c (correct rollouts in the group):", ""]
            lines.append("| method | " + " | ".join(f"c={c}" for c in cs) + " |")
            lines.append("|---|" + "---|" * len(cs))
            for m, v in by_m.items():
                lines.append(f"| {m} | " + " | ".join(_fmt(v.get(f"clip_by_c/{c}"), True) for c in cs) + " |")
            lines += ["", "Mean |ρ−1| by c:", ""]
            lines.append("| method | " + " | ".join(f"c={c}" for c in cs) + " |")
            lines.append("|---|" + "---|" * len(cs))
            for m, v in by_m.items():
                lines.append(f"| {m} | " + " | ".join(
                    f"{v[f'dev_by_c/{c}']['mean']:.4f}" if v.get(f"dev_by_c/{c}", {}).get("n") else "–" for c in cs) + " |")
            lines.append("")
    if summary.get("claims"):
        lines += ["## Claims (issue 4 item 5): paired differences, mean ± 95% t-interval; sign by the CI", "",
                  "| claim | regime | method | vs | measure | Δ | 95% CI | n | sign |", "|---|---|---|---|---|---|---|---|---|"]
        for c in summary["claims"]:
            lo, hi = c["mean"] - c["ci"], c["mean"] + c["ci"]
            lines.append(f"| {c['claim']} | {c['regime']} | {c['method']} | {c['vs']} | {c['key']} | {c['mean']:.4f} | "
                         f"[{lo:.4f}, {hi:.4f}] | {c['n']} | {verdict(c)} |")
        between = [c for c in summary["claims"] if c["vs"] not in ("", "base")]
        lines += [f"{len(between)} between-method intervals above; at 95% about {len(between) / 20:.1f} of them "
                  "would exclude zero by chance alone, so a lone '+' or '−' is a lead, not a finding.", ""]
    if summary["failed"]:
        lines += ["## failed cells", ""] + [f"- {f['cell']}: {f.get('error', '')}" for f in summary["failed"]] + [""]
    return "\n".join(lines)


def _figures(grid: dict, cells: dict, agg: dict, fdir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    regimes = [r for r in grid["regimes"] if r in agg]
    methods = grid["methods"]
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}

    # pass@k curves (after) per regime, with the base policy
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 4), squeeze=False)
    for ax, r in zip(axes[0], regimes):
        by_m = agg[r]
        any_m = next(iter(by_m.values()))
        ks = sorted(int(k.split("@")[1]) for k in any_m if k.startswith("after/pass@"))
        bks = [k for k in ks if f"before/pass@{k}" in any_m]
        ax.plot(bks, [any_m[f"before/pass@{k}"]["mean"] for k in bks], "k--", marker="o", label="base")
        for m, v in by_m.items():
            ax.errorbar(ks, [v[f"after/pass@{k}"]["mean"] for k in ks],
                        yerr=[v[f"after/pass@{k}"]["ci"] if math.isfinite(v[f"after/pass@{k}"]["ci"]) else 0 for k in ks],
                        color=colors[m], marker=".", capsize=2, label=m, lw=1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{r}: held-out pass@k after RL")
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@k (mean, 95% CI)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    names.append(_save(fig, fdir, "passk.png"))

    # clip share of A>0 tokens and mean |rho-1| per c: fixed vs GAPO variants
    pairs = [(b, g) for g, b in BASELINE_OF.items() if g in methods and b in methods]
    show = list(dict.fromkeys(m for p in pairs for m in p)) or methods[:2]
    for key, fname, ylabel in (("clip_by_c", "clip_by_c.png", "clipped share of A>0 tokens"),
                               ("dev_by_c", "ratio_dev_by_c.png", "mean |ρ−1|")):
        fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 3.6), squeeze=False)
        for ax, r in zip(axes[0], regimes):
            here = [m for m in show if m in agg[r]]
            width = 0.8 / max(len(here), 1)
            for i, m in enumerate(here):
                v = agg[r].get(m, {})
                cs = sorted(int(k.split("/")[1]) for k in v if k.startswith(f"{key}/"))
                mean = [v[f"{key}/{c}"]["mean"] for c in cs]
                ci = [v[f"{key}/{c}"]["ci"] if math.isfinite(v[f"{key}/{c}"]["ci"]) else 0 for c in cs]
                top = 1.0 if key == "clip_by_c" else math.inf  # intervals cut at the possible range
                yerr = [[min(e, y) for y, e in zip(mean, ci)], [min(e, top - y) for y, e in zip(mean, ci)]]
                ax.bar([c + (i - (len(here) - 1) / 2) * width for c in cs], mean, yerr=yerr,
                       width=width, color=colors[m], label=m, capsize=1)
            ax.set_title(r)
            ax.set_xlabel("c = correct rollouts in the group")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel(ylabel)
        fig.tight_layout()
        names.append(_save(fig, fdir, fname))

    # curves over training: eval pass@1, token entropy (seed means)
    for key, kind, fname, ylabel in (("eval/pass@1", "eval", "pass1_curve.png", "held-out pass@1"),
                                     ("policy/entropy", "train", "entropy.png", "token entropy (nats)"),
                                     ("clip/frac_high_pos", "train", "clipfrac.png", "clipped share of A>0 tokens")):
        fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 3.6), squeeze=False)
        for ax, r in zip(axes[0], regimes):
            for m in methods:
                runs = [cells[(r, m, s)][kind] for s in grid["seeds"] if (r, m, s) in cells]
                if not runs:
                    continue
                steps = sorted({x["step"] for run in runs for x in run if key in x})
                ys = []
                for st in steps:
                    vals = [x[key] for run in runs for x in run if x["step"] == st and isinstance(x.get(key), (int, float))]
                    ys.append(sum(vals) / len(vals) if vals else float("nan"))
                if kind == "train":
                    from gapo.experiments.report import _smooth
                    ys = _smooth(ys, 5)
                ax.plot(steps, ys, color=colors[m], label=m, lw=1, marker="." if kind == "eval" else None)
            ax.set_title(r)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(ylabel)
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        names.append(_save(fig, fdir, fname))

    # coverage and first-move entropy before / after
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, key, ylabel in ((axes[0], "coverage", "share of distinct solutions found"),
                            (axes[1], "first_move_entropy", "first-move entropy (nats)")):
        width = 0.8 / (len(methods) + 1)
        for j, r in enumerate(regimes):
            v0 = next(iter(agg[r].values())).get(f"before/{key}")
            if v0:
                ax.bar(j - 0.4 + width / 2, v0["mean"], width=width, color="k", label="base" if j == 0 else None)
            for i, m in enumerate(methods):
                v = agg[r].get(m, {}).get(f"after/{key}")
                if v:
                    ax.bar(j - 0.4 + (i + 1.5) * width, v["mean"], width=width, color=colors[m],
                           yerr=v["ci"] if math.isfinite(v["ci"]) else 0, capsize=1, label=m if j == 0 else None)
        ax.set_xticks(range(len(regimes)), regimes)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    names.append(_save(fig, fdir, "coverage.png"))

    # wall clock per step
    fig, ax = plt.subplots(figsize=(max(6, len(methods)), 3.6))
    width = 0.8 / max(len(regimes), 1)
    for j, r in enumerate(regimes):
        for i, m in enumerate(methods):
            v = agg[r].get(m, {}).get("train/time/update_s")
            if v:
                ax.bar(i + (j - (len(regimes) - 1) / 2) * width, v["mean"], width=width, color=f"C{j}",
                       yerr=v["ci"] if math.isfinite(v["ci"]) else 0, capsize=1, label=r if i == 0 else None)
    ax.set_xticks(range(len(methods)), methods, rotation=30, fontsize=8)
    ax.set_ylabel("update wall-clock per step (s)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    names.append(_save(fig, fdir, "time_per_step.png"))
    return names


def _save(fig, fdir: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(fdir / name, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return name


# --------------------------------------------------------------------------------- entry points
def main(args) -> int:
    """``gapo compare`` (see cli.py): ``args.config``, ``args.quick``, ``args.out``, ``args.report_only``."""
    if args.quick and args.config:
        raise ValueError("give either --quick or --config, not both")
    path = QUICK_GRID if args.quick or not args.config else args.config
    grid = load_grid(path)
    out = Path(getattr(args, "out", None) or grid.get("out") or "runs/compare")
    if not getattr(args, "report_only", False):
        stats = run_grid(grid, out, retry_failed=getattr(args, "retry_failed", False),
                         say=lambda s: print(s, flush=True))
        print(f"grid: {stats['done']} cells run, {stats['failed']} failed, {stats['skipped']} skipped "
              f"of {stats['total']} in {stats['wall_s']:.0f}s")
    report(grid, out, getattr(args, "report_dir", None), getattr(args, "figures_dir", None))
    return 0


def _cli(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gapo.experiments.grid")
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--config")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--retry-failed", action="store_true")
    ap.add_argument("--report-dir")
    ap.add_argument("--figures-dir")
    a = ap.parse_args(argv)
    if a.cell:
        return _run_cell(Path(a.cell))
    if a.prepare:
        return _prepare_regime(Path(a.prepare[0]), a.prepare[1], a.prepare[2], a.prepare[3])
    try:
        return main(a)
    except ValueError as e:
        print(f"gapo compare: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_cli())
