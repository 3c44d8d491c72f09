"""The optimiser of the trainer (docs/design.md §4.1, §4.2): AdamW with a learning-rate schedule,
the backward pass through float16's gradient scaler, and the clipped optimiser step.

The scheduler steps once per RL step; step ``s`` (0-based) trains with ``lr · f(s)``. With
``W = optim.warmup_steps`` and ``N = train.steps``, ``f`` is ``(s + 1) / W`` while ``s < W``, then
(``optim.schedule``; transformers' ``get_*_schedule_with_warmup`` at the same ``s``):

- ``constant``: ``1``;
- ``linear``: ``max(0, (N − s) / max(1, N − W))``;
- ``cosine``: ``max(0, ½ · (1 + cos(π · (s − W) / max(1, N − W))))`` (half a cosine period).

From ``s = W`` on, ``f`` is transformers' factor bit for bit; the warm-up is transformers' shifted
by one step (its first step trains at ``lr / W``, transformers' at 0), so that no RL step, with
its rollouts, is spent at learning rate 0. Without warm-up the whole schedule is transformers'.
The factor is a function of the configuration, not saved state, so a resume with another
``optim.schedule`` or ``train.steps`` (``--allow-change``) follows the new schedule from the
step it resumes at.

The step clips the global gradient norm to ``optim.grad_clip``
(``torch.nn.utils.clip_grad_norm_``); a non-finite norm is an error naming the step, except under
float16's scaler, which skips that step and lowers its scale.
"""

from __future__ import annotations

import math

import torch

__all__ = ["LR_SCHEDULES", "lr_factor", "build", "backward", "step", "apply_changes"]


def _constant(s: int, *, warmup_steps: int, total_steps: int) -> float:
    return 1.0


def _linear(s: int, *, warmup_steps: int, total_steps: int) -> float:
    return max(0.0, float(total_steps - s) / float(max(1, total_steps - warmup_steps)))


def _cosine(s: int, *, warmup_steps: int, total_steps: int) -> float:
    progress = float(s - warmup_steps) / float(max(1, total_steps - warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


# the decay after the warm-up, by optim.schedule (mirrored in gapo.rl.names.LR_SCHEDULES)
LR_SCHEDULES = {"constant": _constant, "linear": _linear, "cosine": _cosine}


def lr_factor(schedule: str, s: int, *, warmup_steps: int, total_steps: int) -> float:
    """``f(s)``, the factor of the learning rate at scheduler step ``s`` (module docstring)."""
    if s < warmup_steps:
        return (s + 1) / warmup_steps
    return LR_SCHEDULES[schedule](s, warmup_steps=warmup_steps, total_steps=total_steps)


def build(model: torch.nn.Module, o, device: torch.device, *, total_steps: int):
    """``(optimizer, scheduler)`` for the trainable parameters of ``model`` from ``cfg.optim``;
    ``total_steps`` is ``train.steps`` (the ``N`` of the linear and cosine schedules)."""
    # the fused kernel: the same AdamW update, ~4x faster than the per-tensor loop on CPU
    fused = {"fused": True} if device.type in ("cpu", "cuda") else {}
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr,
        betas=o.betas,
        weight_decay=o.weight_decay,
        **fused,
    )

    # a plain function, not a callable object: LambdaLR's state_dict would save an object's fields
    # and a resume would bring back the old schedule instead of the configured one
    def factor(s: int) -> float:
        return lr_factor(o.schedule, s, warmup_steps=o.warmup_steps, total_steps=total_steps)

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


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
    """After a resume with changed ``optim.*`` keys or ``train.steps``: the restored optimiser
    state holds the old values, so the new learning rate (at the new schedule's factor for the
    current step), betas and weight decay are written into every parameter group."""
    sched.base_lrs = [o.lr for _ in opt.param_groups]
    factor = sched.lr_lambdas[0](sched.last_epoch)
    for g in opt.param_groups:
        g.update(initial_lr=o.lr, lr=o.lr * factor, betas=o.betas, weight_decay=o.weight_decay)
    sched._last_lr = [g["lr"] for g in opt.param_groups]
