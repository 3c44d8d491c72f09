"""Mixed precision: ``model.dtype`` is the compute dtype of the forward passes (autocast);
weights, gradients and the optimiser state stay float32.

Why autocast rather than bf16 weights: an AdamW step of lr·update on a bf16 weight is lost
whenever it is smaller than half a bf16 ulp (8 mantissa bits: ~0.4% of the weight), which is
the common case at RL learning rates (1e-6), so bf16 weights need an fp32 master copy anyway;
autocast keeps the one fp32 copy and casts per operation. Old log-probs keep their exact meaning:
they are recomputed under the same autocast as the training forward, so before the first step
the ratio is exactly 1 and the first mini-batch's reuse (docs/design.md §4.3) stays exact.
float16 adds a gradient scaler (its range is too narrow for small gradients).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["DTYPES", "autocast", "grad_scaler"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, dtype: str):
    """The context for a forward pass in ``dtype`` on ``device`` (a no-op for float32)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def grad_scaler(device: torch.device, dtype: str) -> torch.amp.GradScaler | None:
    """A loss scaler for float16 (None otherwise)."""
    return torch.amp.GradScaler(device.type) if dtype == "float16" else None
