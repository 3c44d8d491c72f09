"""gapo: GAPO (Group Adaptive Clipping Policy Optimization, arXiv 2609.00444) and its baselines.

Layers (docs/design.md §3), imports pointing down only:

    core/          pure math: clipping (ε schedules), losses, aggregation, advantages, metrics
    exec/          the execution runtime: the code sandbox, the judge, the scoring pool
    tasks/         verifiable tasks (over exec/)
    policy/        model loading, sampling, the embedded base policies
    machine/       tuning the machine, not RL: the CPU thread default, the glibc allocator
    rl/            config, rollout, trainer (the only state), run folders, evaluation
    experiments/   the methods × regimes × seeds grid, statistics, claims, report
    integrations/  verl and TRL adapters over core/
    cli/           the command line, one module per command

The public API is re-exported here lazily (``gapo.gapo_eps_high``, ``gapo.policy_loss``, …), so
``import gapo`` and ``gapo --help`` import no heavy library.
"""

from __future__ import annotations

import importlib

__version__ = "0.3.0"

# name -> module that defines it
_API = {
    "gapo_eps_high": "gapo.core.clipping",
    "eps_high_for": "gapo.core.clipping",
    "success_weight": "gapo.core.clipping",
    "EPS_SCHEDULES": "gapo.core.clipping",
    "policy_loss": "gapo.core.losses",
    "cispo_loss": "gapo.core.losses",
    "ClipBounds": "gapo.core.surrogate",
    "LOSSES": "gapo.core.losses",
    "agg_loss": "gapo.core.aggregation",
    "compute_advantages": ("gapo.core.advantages", "compute"),
    "ADVANTAGES": "gapo.core.advantages",
    "success_count": "gapo.core.advantages",
    "pass_at_k": "gapo.core.metrics",
    "clip_stats_by_c": "gapo.core.metrics",
    "Config": "gapo.rl.config",
    "load_config": "gapo.rl.config",
    "Trainer": "gapo.rl.trainer",
    "with_policy": "gapo.rl.trainer",  # a Trainer of the embedded base policy needs it first
    "load_policy": "gapo.policy.model",
    "SamplingParams": "gapo.policy.sampling",
    "get_base_policy": "gapo.policy.base_policy",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'gapo' has no attribute {name!r}")
    module, attr = target if isinstance(target, tuple) else (target, name)
    return getattr(importlib.import_module(module), attr)
