"""Each method's own parameters: names, the papers' defaults, domains, and which combinations a
loss accepts. Pure Python, no torch: ``gapo.rl.config`` checks a config against these tables
before the heavy libraries load (docs/design.md §8), and the losses and bound schedules read
their defaults from here (one place).

- ``LOSS_PARAMS``: each policy loss's own parameters (``algo.loss_params``), ``gapo.core.losses``
  and ``gapo.core.rival_losses``; ``check_loss_params`` / ``resolve_params``.
- ``BOUND_PARAMS``: each bound schedule's parameters (``algo.eps_schedule_params``),
  ``gapo.core.adaptive_bounds``; ``check_bound_params`` / ``resolve_bound_params``.
- ``USES_BOUNDS``: whether a loss reads the clip widths (SAPO's soft gate and KL-Cov have none);
  ``DUAL_CLIP``: whether it takes the dual clip's ``clip_ratio_c``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from gapo.core.checks import is_real, unknown

__all__ = [
    "LOSS_PARAMS",
    "check_loss_params",
    "resolve_params",
    "BOUND_PARAMS",
    "check_bound_params",
    "resolve_bound_params",
    "USES_BOUNDS",
    "DUAL_CLIP",
    "method_problem",
    "defaults_text",
]


# each loss's own parameters and their defaults (the papers' / verl's; see gapo.core.rival_losses)
LOSS_PARAMS: dict[str, dict[str, float]] = {
    "ppo": {},
    "gspo": {},
    "cispo": {},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    "cegppo": {"beta_low": 0.75, "beta_high": 1.0},
    "clip_cov": {"ratio": 2e-4, "lb": 1.0, "ub": 5.0},
    "kl_cov": {"ratio": 2e-4, "coef": 1.0},
}


# parameter -> (domain in words, test); a loss's own parameters are finite real numbers
_PARAM_DOMAINS = {
    "tau_pos": ("> 0", lambda v: v > 0),
    "tau_neg": ("> 0", lambda v: v > 0),
    "beta_low": (">= 0", lambda v: v >= 0),
    "beta_high": (">= 0", lambda v: v >= 0),
    "ratio": ("in (0, 1]", lambda v: 0 < v <= 1),
    "lb": ("a finite number below ub", lambda v: True),
    "ub": ("a finite number above lb", lambda v: True),
    "coef": (">= 0", lambda v: v >= 0),
}


def check_loss_params(loss: str, params: dict) -> str | None:
    """None when ``params`` (name -> value; a subset of ``LOSS_PARAMS[loss]``, the rest default) are
    valid for ``loss``, else a message naming the bad parameter, its domain and the accepted names."""
    if loss not in LOSS_PARAMS:
        return str(unknown("policy loss", loss, LOSS_PARAMS))
    accepted = LOSS_PARAMS[loss]
    names = ", ".join(accepted) or "none"
    bad = sorted(set(params) - set(accepted))
    if bad:
        return f"unknown parameter(s) {bad} for loss {loss!r}; accepted: {names}"
    for k, v in params.items():
        domain, ok = _PARAM_DOMAINS[k]
        if not (is_real(v) and math.isfinite(v) and ok(v)):
            return f"loss {loss!r}: parameter {k} must be {domain}, got {v!r} (accepted: {names})"
    merged = {**accepted, **params}
    if "lb" in merged and not merged["lb"] < merged["ub"]:
        return f"loss {loss!r}: parameter lb must be below ub, got lb={merged['lb']!r}, ub={merged['ub']!r}"
    return None


def resolve_params(loss: str, params: dict) -> dict[str, float]:
    """``LOSS_PARAMS[loss]`` updated with ``params``: a keyword the loss does not take is a
    ``TypeError`` (a wrong call, as Python's own), a value out of its domain a ``ValueError``
    (:func:`check_loss_params`'s message)."""
    extra = sorted(set(params) - set(LOSS_PARAMS.get(loss, params)))
    if extra:
        own = ", ".join(LOSS_PARAMS[loss]) or "none"
        raise TypeError(f"the {loss} loss got unexpected keyword argument(s) {extra}; its own parameters: {own}")
    msg = check_loss_params(loss, params)
    if msg is not None:
        raise ValueError(msg)
    return {**LOSS_PARAMS[loss], **{k: float(v) for k, v in params.items()}}


# whether a loss reads the clip widths eps_low/eps_high (SAPO's gate and KL-Cov have none) ...
USES_BOUNDS = {
    "ppo": True,
    "gspo": True,
    "cispo": True,
    "cegppo": True,
    "clip_cov": True,
    "sapo": False,
    "kl_cov": False,
}
# ... and whether it accepts the dual clip's clip_ratio_c (the others raise a ValueError)
DUAL_CLIP = {
    "ppo": True,
    "gspo": True,
    "cispo": False,
    "cegppo": False,
    "clip_cov": False,
    "sapo": False,
    "kl_cov": False,
}


# ------------------------------------------------------------------ bound schedules
BOUND_PARAMS: dict[str, dict[str, float]] = {
    "bapo": {"rho_0": 0.5, "b_minus": 0.9, "b_plus": 3.0, "delta_1": 0.05, "delta_2": 0.05},
    "dcpo": {"r_max": 10.0},
}

# param -> (test, its domain in words); every param is also a finite real number
_DOMAINS: dict[str, tuple[Callable[[float], bool], str]] = {
    "rho_0": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
    "b_minus": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    "b_plus": (lambda v: v >= 1.0, ">= 1"),
    "delta_1": (lambda v: v > 0.0, "> 0"),
    "delta_2": (lambda v: v > 0.0, "> 0"),
    "r_max": (lambda v: v >= 1.0, ">= 1"),
}


def check_bound_params(name: str, params: Mapping[str, object]) -> str | None:
    """None if ``params`` suit the bound schedule ``name``; else a message naming the schedule or
    parameter at fault, its domain and the accepted names."""
    if name not in BOUND_PARAMS:
        return str(unknown("bound schedule", name, BOUND_PARAMS))
    accepted = sorted(BOUND_PARAMS[name])
    for key, v in params.items():
        if key not in BOUND_PARAMS[name]:
            return str(unknown(f"{name} bound param", key, accepted))
        test, domain = _DOMAINS[key]
        if not (is_real(v) and math.isfinite(v) and test(float(v))):
            return f"{name} bound param {key} must be a finite number {domain}, got {v!r} (params: {accepted})"
    return None


def resolve_bound_params(name: str, params: Mapping[str, object]) -> dict[str, float]:
    """``BOUND_PARAMS[name]`` updated by ``params``, checked; a ValueError with the message else."""
    msg = check_bound_params(name, params)
    if msg is not None:
        raise ValueError(msg)
    return {k: float(v) for k, v in {**BOUND_PARAMS[name], **params}.items()}


# ------------------------------------------------------------------ combinations
def method_problem(loss: str, eps_schedule: str, clip_ratio_c: float | None) -> tuple[str, str] | None:
    """``(config key, why)`` when a loss, a width schedule and the dual clip do not go together;
    None when they do. Every schedule adapts widths, so a loss that reads none (``USES_BOUNDS``)
    takes only ``fixed``; BAPO's balance and DCPO's bounds are per token, so they need a
    token-ratio loss; the dual clip only where the loss defines it (``DUAL_CLIP``)."""
    if loss not in USES_BOUNDS:  # an unknown name is reported by the name check
        return None
    if eps_schedule != "fixed" and not USES_BOUNDS[loss]:
        return "algo.eps_schedule", (
            f"{eps_schedule!r} adapts the clip widths, and the {loss} loss has none ({_NO_BOUNDS[loss]}); "
            "use eps_schedule=fixed"
        )
    if eps_schedule in BOUND_PARAMS and loss == "gspo":
        return "algo.eps_schedule", (
            f"{eps_schedule!r} sets bounds from token-level quantities (the token ratio, the old token "
            "probability), and gspo clips one sequence ratio; use a token-ratio loss (ppo, cispo, cegppo, clip_cov)"
        )
    if clip_ratio_c is not None and not DUAL_CLIP[loss]:
        return "algo.clip_ratio_c", f"the dual clip is not defined for the {loss} loss; leave it unset (none)"
    return None


_NO_BOUNDS = {"sapo": "a soft sigmoid gate replaces the clip", "kl_cov": "a KL penalty on chosen tokens, no clip"}


def defaults_text(table: dict[str, dict[str, float]]) -> str:
    """``name {param: default, ...}`` for each entry of a parameter table that has parameters (the
    config reference's help of ``algo.loss_params`` and ``algo.eps_schedule_params``)."""
    return " | ".join(f"{k} {{{', '.join(f'{n}: {v:g}' for n, v in ps.items())}}}" for k, ps in table.items() if ps)
