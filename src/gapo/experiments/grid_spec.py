"""A ``gapo compare`` grid's spec: its methods, regimes and cells, checked before anything runs.

A grid YAML names ``methods`` (keys of ``METHODS``, or new ones under ``method_defs``),
``regimes`` (keys of ``REGIMES``, or new ones under ``regime_defs``), ``seeds`` and ``common``
overrides (``section.key: value``) applied identically to every cell, so every method gets the
same compute: rollout batches, prompts × group size, mini-batches, epochs, evaluation. A regime
may list a subset of the grid's ``methods``; ``order: regime`` runs every seed of a regime
before the next one (default ``seed``: seed k of every cell before seed k+1); a ``dose`` block
adds the dose-response report (:mod:`gapo.experiments.dose`, ``configs/dose-response.yaml``),
checked here with the rest of the grid.

A cell ``(regime, method, seed)`` is one trainer run with :func:`cell_config`; its run folder is
:func:`cell_dir`, its spec and log sit next to it (:func:`cell_file`). Running a grid is
:mod:`gapo.experiments.grid`; the regimes' base policies are :mod:`gapo.experiments.grid_bases`.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gapo import tasks
from gapo.core.checks import unknown
from gapo.rl.config import Config, set_key
from gapo.rl.run_dir import atomic_write

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
    "dose_spec",
    "methods_of",
    "grid_cells",
    "regime_task",
    "pretrain_config",
    "cell_config",
    "cell_dir",
    "cell_file",
    "write_json",
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
_GRID_KEYS = frozenset(
    {
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
)


def load_grid(path: str | Path | dict) -> dict:
    """Read and check a grid: every method and regime known, every cell's config valid, the
    ``dose`` block (if any) consistent with the grid."""
    g = dict(path) if isinstance(path, dict) else _read_grid_file(Path(path))
    for k in g:
        if k not in _GRID_KEYS:
            raise ValueError(f"unknown grid key {k!r}; accepted: {sorted(_GRID_KEYS)}")
    methods = {**METHODS, **{k: dict(v or {}) for k, v in (g.get("method_defs") or {}).items()}}
    regimes = {**REGIMES, **{k: dict(v or {}) for k, v in (g.get("regime_defs") or {}).items()}}
    _set_defaults(g)
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
        dose_spec(g)
    return g


def _read_grid_file(p: Path) -> dict:
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
    return g


def _set_defaults(g: dict) -> None:
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


# --------------------------------------------------------------------------------- dose block
# read by gapo.experiments.dose; checked with the grid, before any cell runs
_DOSE_DEFAULTS = {
    "reference": "drgrpo",
    "comparisons": [["gapo", "drgrpo"], ["gapo", "dapo"]],
    "keys": ["after/pass@1", "after/pass@8", "after/pass@64"],
    "width": None,
    "bootstrap": 2000,
    "alpha": 0.05,
}


def dose_spec(grid: dict) -> dict:
    """The grid's ``dose`` block with defaults, checked against the grid (methods, regimes, keys)."""
    raw = grid.get("dose") or {}
    if not isinstance(raw, dict):
        raise ValueError("grid key 'dose' must be a mapping")
    bad = set(raw) - set(_DOSE_DEFAULTS)
    if bad:
        raise ValueError(f"unknown key(s) {sorted(bad)} under 'dose'; accepted: {sorted(_DOSE_DEFAULTS)}")
    spec = {**_DOSE_DEFAULTS, **raw}
    ms = set(grid["methods"])
    for pair in spec["comparisons"]:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2) or not set(pair) <= ms:
            raise ValueError(f"dose.comparisons: {pair!r} is not a pair of the grid's methods {sorted(ms)}")
    if spec["reference"] not in ms:
        raise ValueError(f"dose.reference {spec['reference']!r} is not one of the grid's methods {sorted(ms)}")
    for k in spec["keys"]:
        if not isinstance(k, str) or not k.startswith(("after/", "before/", "train/")):
            raise ValueError(f"dose.keys: {k!r} is not a summary key (after/<metric>, train/<key>)")
    w = spec["width"]
    if w is not None:
        for k in ("regime", "at"):
            if w.get(k) not in grid["regimes"]:
                raise ValueError(f"dose.width.{k}: {w.get(k)!r} is not one of the grid's regimes")
        for p in w.get("pairs") or []:
            if len(p) != 3 or not set(p[:2]) <= ms:
                raise ValueError(f"dose.width.pairs: {p!r} is not [method, against, width] of the grid's methods")
    return spec


# --------------------------------------------------------------------------------- cells
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
