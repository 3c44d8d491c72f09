"""Input validation shared by the pure math modules: clear ``ValueError``s, never a silent NaN.

torch is imported inside the tensor checks, not at the top: ``unknown`` and ``check_reward_range``
serve config validation, which runs before torch is loaded (docs/design.md §8)."""

from __future__ import annotations

import difflib
import math
import numbers
import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch loads inside the tensor checks
    import torch


def unknown(kind: str, name: str, known: Iterable[str]) -> ValueError:
    """A ValueError for an unknown registry name, listing the known names and close matches."""
    known = sorted(known)
    close = difflib.get_close_matches(str(name), known, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}; known: {known}.{hint}")


def as_int(x) -> int | None:
    """``x`` as an int (Python or NumPy integers, not bools or floats), else ``None``."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def is_real(x) -> bool:
    """A real number (int, float, NumPy scalars), not a bool or a string."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_rewards(rewards: torch.Tensor, group_size: int) -> None:
    """Rewards are a finite 1-D tensor whose length is a multiple of ``group_size >= 2``."""
    import torch

    if not isinstance(rewards, torch.Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 (a group needs a baseline), got {group_size!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"rewards has B={rewards.numel()} rows, not divisible by group_size={group_size}")
    if not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten()[:5].tolist()
        raise ValueError(f"rewards contain NaN/inf at rows {bad}")


REWARD_RANGE_MODES = ("group", "batch")


_FLOAT32_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny, without importing torch here


def check_reward_range(reward_range) -> tuple[float, float] | str:
    """``reward_range`` is ``(R_min, R_max)`` with finite ``R_max > R_min`` (returned as floats),
    or ``"group"`` / ``"batch"`` (returned as is): the range taken from each group's own rewards,
    or from the whole batch's (see :func:`reward_bounds`)."""
    if isinstance(reward_range, str):
        if reward_range in REWARD_RANGE_MODES:
            return reward_range
        close = difflib.get_close_matches(reward_range, REWARD_RANGE_MODES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"reward_range must be (R_min, R_max) or one of {list(REWARD_RANGE_MODES)}, got {reward_range!r}.{hint}"
        )
    try:
        lo, hi = (float(v) for v in reward_range)
    except (TypeError, ValueError):
        raise ValueError(
            f"reward_range must be (R_min, R_max) or one of {list(REWARD_RANGE_MODES)}, got {reward_range!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"reward_range must be (R_min, R_max) with R_max > R_min, got {reward_range!r}")
    if hi - lo < _FLOAT32_TINY:  # 1 / width overflows float32: the rescaled rewards would be inf and NaN
        raise ValueError(
            f"reward_range's width R_max - R_min must be at least {_FLOAT32_TINY:.3g} (float32's smallest "
            f"normal number), got {reward_range!r}"
        )
    return lo, hi


def reward_bounds(grouped: torch.Tensor, reward_range) -> tuple:
    """``(R_min, R_max)`` for rewards of shape ``(P, G)`` (one group per row) under ``reward_range``:
    two floats for a tuple; for ``"group"`` two ``(P, 1)`` tensors, each group's own min and max;
    for ``"batch"`` two 0-d tensors, the min and max over every reward of the batch."""
    rr = check_reward_range(reward_range)
    if rr == "group":
        return grouped.amin(1, keepdim=True), grouped.amax(1, keepdim=True)
    if rr == "batch":
        return grouped.amin(), grouped.amax()
    return rr


def check_eps(eps_low, eps_high) -> None:
    """Clip widths: ``eps_low`` in [0, 1) and ``eps_high`` >= 0, each a number or a finite tensor."""
    import torch

    if isinstance(eps_low, torch.Tensor):
        if not torch.isfinite(eps_low).all() or (eps_low < 0).any() or (eps_low >= 1).any():
            raise ValueError("eps_low tensor must be finite and in [0, 1)")
    elif not 0.0 <= float(eps_low) < 1.0:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low!r}")
    if isinstance(eps_high, torch.Tensor):
        if not torch.isfinite(eps_high).all() or (eps_high < 0).any():
            raise ValueError("eps_high tensor must be finite and >= 0")
    elif not float(eps_high) >= 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high!r}")


def check_same_shape(tensors: dict[str, torch.Tensor]) -> None:
    """The tensors of ``tensors`` (name -> tensor) share one shape; else a ValueError naming each shape."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")
