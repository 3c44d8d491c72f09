"""The embedded base policies: presets, the cache, the shipped copy, and the one function that
decides which policy and which RL task a run uses (docs/design.md §9).

Presets pick a supervised mix and the RL task on which the base pass rate lands in a regime
(measured values next to ``PRESETS``):

- ``low``:  SFT on 3-number Countdown plus 30% 4-number instances; RL on 4-number instances
  with at least two canonical solutions (numbers 1–10): base pass@1 ≈ 4%, pass@8 ≈ 24%.
- ``high``: SFT on 2-number instances (numbers 1–30) plus 30% 3-number ones (1–10), 200 steps;
  RL on 2-number instances: base pass@1 ≈ 65% (pass@8 ≈ 96%) on 211 distinct held-out instances.
- ``three``: the same mix trained to 600 steps; RL on 3-number instances: base pass@1 ≈ 7%.
- ``medium``: the ``low`` recipe on the ``small`` model (~5.1M parameters instead of 0.86M), for
  the scale trend; built on first use (``gapo pretrain --preset medium``).

The cache key is a hash of every field that affects the weights (task mix, model size,
optimisation, budgets, seed, library format version); the RL task, name and description are
not part of it, so presets that differ only in their RL task share one cached policy. Built policies live in
``$GAPO_CACHE/base/<key>`` (default ``~/.cache/gapo/base/<key>``), written to a temporary folder
and renamed into place, so a crash never leaves a half-written policy that looks valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil
import sys
import time
from pathlib import Path

from gapo.policy.model import save_policy
from gapo.policy.pretrain import PretrainConfig, jsonable, pretrain

__all__ = [
    "PRESETS",
    "resolve",
    "resolve_policy",
    "ResolvedPolicy",
    "base_task_params",
    "get_base_policy",
    "cache_dir",
    "shipped_dir",
]

# Calibrated on 2 shared CPU cores (one torch thread); pass rates at temperature 1.0 on 200
# held-out (eval-split) problems x 8 samples, see the commit that set them.
# the `low` and `medium` presets: 3-number Countdown plus 30% 4-number instances, RL on 4-number
# instances with at least two canonical solutions
_LOW_MIX = ((dict(n_numbers=3, num_range=(1, 10)), 0.7), (dict(n_numbers=4, num_range=(1, 10)), 0.3))
_LOW_TASK = dict(n_numbers=4, num_range=(1, 10), min_solutions=2)
# the `high` and `three` presets: 2-number Countdown over 1-30 (its 20% eval split held out) plus
# 30% 3-number instances
_TWO_THREE_MIX = (
    (dict(n_numbers=2, num_range=(1, 30), eval_fraction=0.2), 0.7),
    (dict(n_numbers=3, num_range=(1, 10)), 0.3),
)
PRESETS: dict[str, PretrainConfig] = {
    # 600 steps x 64 (~226 CPU-s on one thread): 4-number (>=2 solutions) pass@1 0.039,
    # pass@8 0.24; plain 4-number 0.025 / 0.15.
    "low": PretrainConfig(
        name="low",
        sft_mix=_LOW_MIX,
        rl_task=_LOW_TASK,
        description="RL on 4-number Countdown (numbers 1-10, >= 2 solutions); base pass@1 ~4%",
    ),
    # 200 steps x 64 (~39 CPU-s on one thread), step-limited: on 200 held-out instances x 16
    # samples, 2-number (numbers 1-30, eval split 20%: 211 held-out instances) pass@1 0.647,
    # pass@8 0.959 -- far from converged, so RL has room to sharpen. (The same mix at 600 steps,
    # preset `three`, reaches 0.877 there, and RL did not raise it at any calibrated learning
    # rate: RESULTS.md, "Calibration"; at 300 steps 0.826.)
    "high": PretrainConfig(
        name="high",
        sft_mix=_TWO_THREE_MIX,
        rl_task=dict(n_numbers=2, num_range=(1, 30), eval_fraction=0.2),
        max_steps=200,
        time_budget_s=None,
        description="RL on 2-number Countdown (numbers 1-30, 211 held-out instances); base pass@1 ~65%",
    ),
    # The same mix, 600 steps (~77 CPU-s): 3-number (1-10) pass@1 0.073, pass@8 0.355 on 200
    # held-out instances x 16 -- a low pass rate on a task the model saw a little of (30% of its
    # SFT). (A 0.85/0.15 mix gave 0.030: too few 3-number successes to learn from.)
    "three": PretrainConfig(
        name="three",
        sft_mix=_TWO_THREE_MIX,
        rl_task=dict(n_numbers=3, num_range=(1, 10)),
        time_budget_s=None,
        description="RL on 3-number Countdown (numbers 1-10) from a mostly 2-number base; base pass@1 ~7%",
    ),
    # The `low` recipe on a model six times larger ("small": hidden 256, 6 layers, ~5.1M
    # parameters): the scale point of RESULTS.md. Built on first use, not shipped (20 MB).
    "medium": PretrainConfig(
        name="medium",
        sft_mix=_LOW_MIX,
        rl_task=_LOW_TASK,
        model_preset="small",
        time_budget_s=None,
        description="the `low` recipe on a ~5.1M-parameter model (RL on 4-number Countdown, >= 2 solutions)",
    ),
}


def resolve(preset: str | PretrainConfig) -> PretrainConfig:
    if isinstance(preset, PretrainConfig):
        return preset
    if preset not in PRESETS:
        close = difflib.get_close_matches(str(preset), PRESETS, n=2)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown base-policy preset {preset!r}; known presets: {sorted(PRESETS)}.{hint}")
    return PRESETS[preset]


def base_task_params(model_path, task_name: str, task_params: dict | None, base_preset) -> dict | None:
    """The RL task params a run takes from its base-policy preset: with the embedded base policy
    (``model_path`` None) on Countdown and no params given, a copy of the preset's ``rl_task``;
    otherwise None (the run's own params stand). The one place this is decided."""
    if model_path is None and task_name == "countdown" and not task_params:
        return dict(resolve(base_preset).rl_task)
    return None


def cache_root() -> Path:
    root = os.environ.get("GAPO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "gapo"


def cache_dir(preset: str | PretrainConfig) -> Path:
    return cache_root() / "base" / resolve(preset).cache_key()


@dataclasses.dataclass(frozen=True)
class ResolvedPolicy:
    """What a run's policy resolves to (:func:`resolve_policy`): the weights' ``path``, and the
    RL ``task_params`` the embedded preset defines when the run gave none (None: keep the run's).
    The caller applies it; nothing here changes a configuration (docs/design.md §3.2)."""

    path: str
    task_params: dict | None = None


def resolve_policy(
    model_path, base_preset, *, task_name: str, task_params: dict | None, progress: bool = True
) -> ResolvedPolicy:
    """The policy of a run: ``model_path`` when set, else the embedded base policy of
    ``base_preset`` (cached, shipped or built now), whose preset also defines the RL task's
    params unless the run set them (:func:`base_task_params`). The one place this is decided, for
    the trainer, the CLI and the grid alike; a pure function of its arguments and the cache."""
    params = base_task_params(model_path, task_name, task_params, base_preset)
    if model_path is not None:
        return ResolvedPolicy(str(model_path), params)
    return ResolvedPolicy(str(get_base_policy(base_preset, progress=progress)), params)


def shipped_dir(preset: str | PretrainConfig) -> Path | None:
    """The copy of a preset's base policy shipped inside the package (``gapo/assets/base/<key>``),
    if there is one. The ``low`` preset ships (3.4 MB) so that ``gapo demo`` starts at once; it
    is exactly what ``get_base_policy("low", rebuild=True)`` produces (step-limited, seeded),
    up to floating-point differences between CPUs."""
    d = Path(__file__).parents[1] / "assets" / "base" / resolve(preset).cache_key()
    return d if (d / "config.json").is_file() else None


def get_base_policy(
    preset: str | PretrainConfig = "low", *, rebuild: bool = False, progress: bool = True, log=None
) -> Path:
    """Path of the base policy for ``preset``: the user's cache, else the copy shipped with gapo,
    else trained now and cached (``progress``: a progress bar; ``log(line)``: plain progress
    lines, e.g. into a log file; see ``gapo.policy.pretrain.pretrain``).

    Load it with ``gapo.policy.model.load_policy(path)``. ``rebuild=True`` trains anew and replaces
    the cached copy atomically.
    """
    cfg = resolve(preset)
    final = cache_dir(cfg)
    if final.is_dir() and (final / "config.json").is_file() and not rebuild:
        return final
    if not rebuild and (shipped := shipped_dir(cfg)) is not None:
        return shipped
    if progress:  # minutes of work: said before the bar starts, and where the result is kept
        print(
            f"[gapo] base policy {cfg.name!r} is not cached: training it now, once (cached in {final})", file=sys.stderr
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    try:
        t0 = time.perf_counter()
        model, tok, stats = pretrain(cfg, progress=progress, log=log)
        stats["build_s"] = round(time.perf_counter() - t0, 2)
        extra = {"pretrain_config": jsonable(dataclasses.asdict(cfg)), "cache_key": cfg.cache_key(), "stats": stats}
        save_policy(model, tok, tmp, extra=extra)
        if final.exists():  # rebuild, or another process finished first
            trash = final.parent / f".old-{final.name}-{os.getpid()}-{time.time_ns()}"
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                trash = None
            os.rename(tmp, final)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        else:
            try:
                os.rename(tmp, final)
            except OSError:  # lost a race to another process: use theirs
                if not (final / "config.json").is_file():
                    raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
