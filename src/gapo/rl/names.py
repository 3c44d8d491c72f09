"""The names config validation checks against, importable without torch or transformers.

The registries themselves hold functions and tensors (``gapo.core.advantages.ADVANTAGES``,
``gapo.core.losses.LOSSES``, ``gapo.policy.base_policy.PRESETS``, …), and importing them costs
seconds of CPU (torch, transformers). A config typo must be reported in well under a second
(docs/design.md §8), so ``gapo.rl.config`` validates against the names listed here;
``tests/rl/test_config.py`` checks that every list equals its registry. When a registry's module
is already imported, :func:`known` answers from the registry itself, so an entry registered at
run time (``ADVANTAGES["mine"] = fn``) is accepted.
"""

from __future__ import annotations

import sys

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_PARAMS",
    "PASSK_DEFAULT_K",
    "LOSSES",
    "EPS_SCHEDULES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "DTYPES",
    "BASE_PRESETS",
    "LR_SCHEDULES",
    "known",
]

ADVANTAGES = ("drgrpo", "grpo", "rloo", "passk", "focal")  # gapo.core.advantages.ADVANTAGES
# each estimator's own keyword parameters (focal also passes its base's on)
ADVANTAGE_PARAMS = {"drgrpo": (), "grpo": ("eps", "std"), "rloo": (), "passk": ("k",), "focal": ("gamma", "base")}
PASSK_DEFAULT_K = 4  # gapo.core.advantages.passk's default k
LOSSES = ("ppo", "gspo", "cispo")  # gapo.core.losses.LOSSES
EPS_SCHEDULES = ("fixed", "linear", "log")  # gapo.core.clipping.EPS_SCHEDULES
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")  # gapo.core.losses.KL_ESTIMATORS
DTYPES = ("float32", "bfloat16", "float16")  # gapo.policy.precision.DTYPES
BASE_PRESETS = ("low", "high", "three", "medium")  # gapo.policy.base_policy.PRESETS
LR_SCHEDULES = ("constant", "linear", "cosine")  # gapo.rl.optimizer.LR_SCHEDULES

# list name -> (module, attribute) of the registry it mirrors
_REGISTRY = {
    "ADVANTAGES": ("gapo.core.advantages", "ADVANTAGES"),
    "LOSSES": ("gapo.core.losses", "LOSSES"),
    "EPS_SCHEDULES": ("gapo.core.clipping", "EPS_SCHEDULES"),
    "AGG_MODES": ("gapo.core.aggregation", "AGG_MODES"),
    "KL_ESTIMATORS": ("gapo.core.losses", "KL_ESTIMATORS"),
    "DTYPES": ("gapo.policy.precision", "DTYPES"),
    "BASE_PRESETS": ("gapo.policy.base_policy", "PRESETS"),
    "LR_SCHEDULES": ("gapo.rl.optimizer", "LR_SCHEDULES"),
}


def registry(name: str):
    """The live registry behind list ``name`` if its module is already imported, else None
    (never imports it: that is what this module avoids)."""
    module, attr = _REGISTRY[name]
    mod = sys.modules.get(module)
    return getattr(mod, attr, None) if mod is not None else None


def known(name: str) -> tuple[str, ...]:
    """The accepted names of list ``name``: the registry's own when loaded, else the list here."""
    live = registry(name)
    return tuple(live) if live is not None else globals()[name]
