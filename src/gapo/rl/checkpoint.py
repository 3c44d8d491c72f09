"""The model side of a run's checkpoint and of its ``policy/`` folder (docs/design.md §5.3).

A checkpoint holds the *trainable* state: with LoRA the adapters only (the base weights stay
where ``model.path`` points), otherwise the whole state dict. ``policy/`` is the final model as
a Hugging Face folder (with LoRA: merged, with the adapter beside it), its marker naming the
step it is from. The file-level rules (atomic writes, locking, the space check) are
``gapo.rl.run_dir``'s; the trainer decides when each is written.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from gapo.policy import lora
from gapo.policy.model import read_marker, save_policy
from gapo.rl.run_dir import checkpoint_bytes, space_note

__all__ = ["trainable_state", "size", "load_trainable", "policy_written", "write_policy"]


def trainable_state(model) -> dict:
    """What a checkpoint keeps of ``model``: LoRA's adapters, or the whole state dict."""
    return lora.adapter_state(model) if lora.is_lora(model) else model.state_dict()


def size(model) -> int:
    """The estimated bytes of one checkpoint of ``model`` (``run_dir.checkpoint_bytes``)."""
    return checkpoint_bytes(trainable_state(model), [p for p in model.parameters() if p.requires_grad])


def load_trainable(model, opt, sched, state: dict, *, ckpt_path: Path, policy_path) -> None:
    """Load a checkpoint's model, optimiser and scheduler state; one that does not fit the model
    (other weights, other adapters) is a ValueError naming the checkpoint and the model."""
    try:
        if lora.is_lora(model):  # the adapters; the base weights come from the checkpoint on disk
            missing = set(lora.adapter_state(model)) - set(state["model"])
            if missing or model.load_state_dict(state["model"], strict=False).unexpected_keys:
                raise ValueError(f"the checkpoint's adapters do not match model.lora (missing {sorted(missing)[:3]})")
        else:
            model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ValueError(
            f"cannot resume: {str(ckpt_path)!r} does not fit the model at {str(policy_path)!r} ({e})"
        ) from None


def policy_written(run_dir: Path, step: int) -> bool:
    """Whether ``run_dir/policy/`` holds the model of ``step`` (a run stopped early and resumed
    with ``train.steps`` at its own step has none yet: fit() then writes it, taking no step)."""
    policy = Path(run_dir) / "policy"
    if not (policy / "config.json").is_file():
        return False
    written = ((read_marker(policy) or {}).get("extra") or {}).get("step")
    return not isinstance(written, int) or written == step


def write_policy(run_dir: Path, model, tok, step: int, *, ckpt_bytes: int, ckpt_path: Path) -> Path:
    """``run_dir/policy/`` written beside and swapped in, so a failed write keeps the previous
    one; a full disk is one OSError naming the folder, the space needed and the intact
    checkpoint of ``step``."""
    run_dir = Path(run_dir)
    final = run_dir / "policy"
    tmp = run_dir / f".policy.{os.getpid()}.tmp"
    old = run_dir / f".policy.{os.getpid()}.old"
    try:
        extra = {"step": step}  # which step this is (gapo export / eval --step)
        if lora.is_lora(model):  # the merged model, loadable anywhere, and the adapter beside it
            save_policy(lora.merged(model), tok, tmp, extra=extra)
            lora.save_adapter(model, tmp / "adapter")
        else:
            save_policy(model, tok, tmp, extra=extra)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
    except Exception as e:  # a full disk: OSError, or safetensors'/torch's own error types
        if old.exists() and not final.exists():
            os.rename(old, final)
        if not isinstance(e, (OSError, RuntimeError)) and type(e).__name__ != "SafetensorError":
            raise
        raise OSError(
            getattr(e, "errno", None) or errno.EIO,
            f"cannot write the policy to {str(final)!r}: "
            f"{getattr(e, 'strerror', None) or e}; {space_note(run_dir, ckpt_bytes)}. The "
            f"checkpoint of step {step} is intact ({str(ckpt_path)!r})",
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final
