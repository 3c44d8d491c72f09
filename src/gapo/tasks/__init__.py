"""Verifiable tasks. ``get(name, **params)`` returns a task object with

- ``generate(split, n, seed) -> list[Problem]`` (train/eval splits disjoint by construction),
- ``score(problem, completion) -> float`` (a verifier; never raises on bad completions),
- ``first_move(completion) -> Hashable | None``.

Task modules are imported lazily so that ``import gapo.tasks`` stays cheap.
"""

from __future__ import annotations

import difflib
import importlib

# name -> "module:factory"; a factory takes keyword params and returns a task.
_REGISTRY: dict[str, str] = {
    "countdown": "gapo.tasks.countdown:CountdownTask",
    "arithmetic": "gapo.tasks.arithmetic:ArithmeticTask",
    "math": "gapo.tasks.math:MathTask",
    "rg": "gapo.tasks.rg:ReasoningGymTask",
    "humaneval": "gapo.tasks.code:HumanEvalTask",
    "mbpp": "gapo.tasks.code:MBPPTask",
    "data": "gapo.tasks.data:DataTask",  # any dataset, scored by --reward (gapo.tasks.custom)
}


def register(name: str, target: str) -> None:
    """Register a task factory given as ``"module:attr"``."""
    _REGISTRY[name] = target


def names() -> list[str]:
    return sorted(_REGISTRY)


def factory(name: str):
    """The class (or callable) that builds task ``name``; unknown names raise ``ValueError``."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown task {name!r}; known tasks: {names()}.{hint}")
    module, attr = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), attr)


def get(name: str, **params):  # the registry's dispatch: the task's own parameters, checked by it
    """Build the task ``name`` with its parameters (``task.params``: a field of one of the task's
    parameter groups may be given on its own, ``split="test"`` for ``splits={"split": "test"}``,
    :func:`gapo.tasks.base.nest_group_fields`); unknown names raise ``ValueError``."""
    make = factory(name)
    if getattr(make, "param_groups", None):
        from gapo.tasks.base import nest_group_fields

        params = nest_group_fields(make, params)
    return make(**params)


def build(name: str, params: dict):
    """``get(name, **params)`` for a run: a constructor error (bad params, a missing or
    malformed dataset, a missing optional package) is a ``ValueError`` naming the task and params."""
    try:
        return get(name, **params)
    except ImportError as e:
        raise ValueError(f"task {name!r} needs an optional package: {e}") from None
    except (TypeError, ValueError, KeyError, OSError) as e:
        msg = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
        raise ValueError(f"task {name!r} with task.params={params}: {msg}") from None
