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
``import gapo`` and ``gapo --help`` import no heavy library. The flat module paths of gapo 0.1
(``gapo.clipping``, ``gapo.trainer``, …) still import, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.2.0"

# name -> module that defines it
_API = {
    "gapo_eps_high": "gapo.core.clipping",
    "eps_high_for": "gapo.core.clipping",
    "success_weight": "gapo.core.clipping",
    "EPS_SCHEDULES": "gapo.core.clipping",
    "policy_loss": "gapo.core.losses",
    "cispo_loss": "gapo.core.losses",
    "ClipBounds": "gapo.core.losses",
    "LOSSES": "gapo.core.losses",
    "agg_loss": "gapo.core.aggregation",
    "compute_advantages": ("gapo.core.advantages", "compute"),
    "ADVANTAGES": "gapo.core.advantages",
    "success_count": "gapo.core.advantages",
    "group_success_count": "gapo.core.advantages",  # deprecated: success_count's 0.2 name (warns when called)
    "pass_at_k": "gapo.core.metrics",
    "clip_stats_by_c": "gapo.core.metrics",
    "Config": "gapo.rl.config",
    "load_config": "gapo.rl.config",
    "Trainer": "gapo.rl.trainer",
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


# gapo 0.1's flat modules -> where they live now
_MOVED = {
    "gapo.clipping": "gapo.core.clipping",
    "gapo.losses": "gapo.core.losses",
    "gapo.aggregation": "gapo.core.aggregation",
    "gapo.advantages": "gapo.core.advantages",
    "gapo.metrics": "gapo.core.metrics",
    "gapo._checks": "gapo.core.checks",
    "gapo.model": "gapo.policy.model",
    "gapo.sampling": "gapo.policy.sampling",
    "gapo.pretrain": "gapo.policy.pretrain",
    "gapo.config": "gapo.rl.config",
    "gapo.trainer": "gapo.rl.trainer",
    "gapo.evaluate": "gapo.rl.evaluate",
    "gapo.scoring": "gapo.exec.scoring",
    "gapo.sandbox": "gapo.exec.sandbox",
    "gapo.compare": "gapo.experiments.grid",
    "gapo.report": "gapo.experiments.report",
    # 0.2: the execution runtime left tasks/ for exec/
    **{
        f"gapo.tasks.{m}": f"gapo.exec.{m}"
        for m in ("sandbox", "sandbox_ns", "sandbox_boot", "sandbox_proc", "judge", "scoring", "scoring_pool")
    },
    # 0.2: machine tuning left rl/ for machine/
    "gapo.rl.threads": "gapo.machine.threads",
    "gapo.rl.allocator": "gapo.machine.allocator",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import gapo.clipping`` gives ``gapo.core.clipping`` itself (one module object, so state
    and monkeypatches are shared), with a DeprecationWarning naming the new path, attributed to
    the line that imported the old one.

    The import system sets ``module.__spec__`` to the old path's spec after ``create_module``
    returns; ``exec_module`` puts the module's own spec back, so ``importlib.reload`` and anything
    else reading ``__spec__`` still sees ``gapo.core.clipping`` (tests/test_import_shim.py)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = _MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed",
            DeprecationWarning,
            stacklevel=_importer_stacklevel(),
        )
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the real spec, restored by exec_module
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


def _importer_stacklevel() -> int:
    """The ``stacklevel`` of the code that imported the old path (an ``import`` statement or
    ``importlib.import_module``), so the default filters show the warning to it. ``warnings``
    does not count the import system's ``_bootstrap`` frames; the others are counted here."""
    frame, level = sys._getframe(2), 2  # the caller of create_module
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if name != importlib.__file__:
                return level
            level += 1
        frame = frame.f_back
    return 2


sys.meta_path.append(_MovedModules())
