"""The optimiser of the trainer (docs/design.md §4.1, §4.2): AdamW with a linear warm-up, the
backward pass through float16's gradient scaler, and the clipped optimiser step.

The learning rate at scheduler step ``s`` is ``lr · min(1, (s + 1) / warmup_steps)`` (``lr``
without warm-up). The step clips the global gradient norm to ``optim.grad_clip``
(``torch.nn.utils.clip_grad_norm_``); a non-finite norm is an error naming the step, except under
float16's scaler, which skips that step and lowers its scale.
"""

from __future__ import annotations

import torch

__all__ = ["build", "backward", "step", "apply_changes"]


def build(model: torch.nn.Module, o, device: torch.device):
    """``(optimizer, scheduler)`` for the trainable parameters of ``model`` from ``cfg.optim``."""
    # the fused kernel: the same AdamW update, ~4x faster than the per-tensor loop on CPU
    fused = {"fused": True} if device.type in ("cpu", "cuda") else {}
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr,
        betas=o.betas,
        weight_decay=o.weight_decay,
        **fused,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps else 1.0
    )
    return opt, sched


def backward(loss: torch.Tensor, scaler) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def step(model: torch.nn.Module, opt, scaler, grad_clip: float, *, step: int) -> float:
    """Clip the gradient norm and step; returns the norm before clipping. ``step`` (1-based) names
    the RL step in the error a non-finite norm raises."""
    if scaler is not None:
        scaler.unscale_(opt)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    elif not torch.isfinite(grad_norm):
        raise FloatingPointError(f"non-finite gradient norm at step {step}; lower optim.lr or check the rewards")
    else:
        opt.step()
    return float(grad_norm)


def apply_changes(opt, sched, o) -> None:
    """After a resume with changed ``optim.*`` keys: the restored optimiser state holds the old
    values, so the new learning rate (at the schedule's current factor), betas and weight decay
    are written into every parameter group."""
    sched.base_lrs = [o.lr for _ in opt.param_groups]
    factor = sched.lr_lambdas[0](sched.last_epoch)
    for g in opt.param_groups:
        g.update(initial_lr=o.lr, lr=o.lr * factor, betas=o.betas, weight_decay=o.weight_decay)
    sched._last_lr = [g["lr"] for g in opt.param_groups]
