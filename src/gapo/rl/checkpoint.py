"""The model side of a run's checkpoint and of its ``policy/`` folder (docs/design.md §5.3).

A checkpoint holds the *trainable* state: with LoRA the adapters only (the base weights stay
where ``model.path`` points), otherwise the whole state dict. ``policy/`` is the final model as
a Hugging Face folder (with LoRA: merged, with the adapter beside it), its marker naming the
step it is from. The file-level rules (atomic writes, locking, the space for one checkpoint) are
``gapo.rl.run_dir``'s, the space for the kept ones :func:`check_room`'s; the trainer decides when
each is written.

Kept checkpoints (``train.keep_checkpoints = N > 1``, TRL's ``save_total_limit``): after
``checkpoint.pt`` is written, it is hard-linked (no second copy; a copy where the filesystem has
no hard links) as ``checkpoints/step-<s>.pt``, and only then are the kept ones beyond the newest
``N`` deleted. So the run holds the checkpoints of its last ``N`` checkpointed steps (the newest
is ``checkpoint.pt`` itself), ``gapo export RUN --step s`` reads any of them, and the space check
before the run starts asks room for the ``N`` (less those already on disk). ``N`` of 0 or 1
keeps ``checkpoint.pt`` only; a resume that lowers ``N`` deletes the extra ones at its first
checkpoint.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from gapo.policy import lora
from gapo.policy.model import read_marker, save_policy
from gapo.rl.disk_space import free_bytes, mb, space_note

__all__ = [
    "trainable_state",
    "size",
    "load_trainable",
    "policy_written",
    "write_policy",
    "KEPT_DIR",
    "kept",
    "check_room",
    "save",
]

KEPT_DIR = "checkpoints"
_KEPT = re.compile(r"step-(\d+)\.pt")


def checkpoint_bytes(model_state: dict, trainable: list) -> int:
    """The size of a checkpoint, estimated: the saved weights at their dtype, plus AdamW's two
    moments (float32, like the trained weights) per trainable parameter, plus 5% and 1 MB for
    the RNG states, the data order and pickling."""
    import torch

    weights = sum(t.numel() * t.element_size() for t in model_state.values() if isinstance(t, torch.Tensor))
    moments = sum(2 * p.numel() * 4 for p in trainable)
    return int((weights + moments) * 1.05) + 2**20


def trainable_state(model) -> dict:
    """What a checkpoint keeps of ``model``: LoRA's adapters, or the whole state dict."""
    return lora.adapter_state(model) if lora.is_lora(model) else model.state_dict()


def size(model) -> int:
    """The estimated bytes of one checkpoint of ``model`` (:func:`checkpoint_bytes`)."""
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


# ------------------------------------------------------------------ kept checkpoints
def kept(run_dir: Path) -> dict[int, Path]:
    """``step -> checkpoints/step-<step>.pt`` of the run's kept checkpoints, oldest first."""
    folder = Path(run_dir) / KEPT_DIR
    if not folder.is_dir():
        return {}
    found = {int(m.group(1)): p for p in folder.iterdir() if (m := _KEPT.fullmatch(p.name)) and p.is_file()}
    return dict(sorted(found.items()))


def _on_disk(run_dir: Path) -> int:
    """Distinct checkpoint files of a run (``checkpoint.pt`` is the newest kept one's link)."""
    files = [Path(run_dir) / "checkpoint.pt", *kept(run_dir).values()]
    return len({(st.st_dev, st.st_ino) for p in files if p.is_file() and (st := p.stat())})


def check_room(folder, one: int, keep: int, *, resume: bool, key: str = "train.keep_checkpoints") -> None:
    """Before anything is written: room for one checkpoint of ``one`` bytes (``folder.check_space``),
    and with ``keep > 1`` for the ``keep`` checkpoints the run will hold, less those a resumed run
    has on disk (an ``--overwrite``'s old run stays until the first checkpoint: not counted); an
    ``OSError`` (ENOSPC) naming ``key`` otherwise."""
    more = keep - (_on_disk(folder.path) if resume else 0)
    if keep <= 1 or more <= 1:
        folder.check_space(one)
        return
    free = free_bytes(folder.path)
    if free is not None and free < more * one:
        raise OSError(
            errno.ENOSPC,
            f"not enough free space for run folder {str(folder.path)!r}: {key}={keep} keeps {keep} checkpoints "
            f"of about {mb(one)}, {more} more than are there now ({mb(more * one)}); {mb(free)} are free. "
            f"Lower {key}, free some space or choose another --out; nothing was changed",
        )


def save(folder, state: dict, *, need: int, keep: int) -> None:
    """``state`` to ``checkpoint.pt`` (``folder.save_checkpoint``: atomic, synced); then, with
    ``keep > 1``, kept as ``checkpoints/step-<step>.pt`` and the kept ones beyond the newest
    ``keep`` deleted (with ``keep <= 1``, all of them): never before the new one is on disk. The
    link is safe because ``save_checkpoint`` renames a new file over ``checkpoint.pt`` (a write
    into the old file would change the kept one with it)."""
    folder.save_checkpoint(state, need)
    run_dir, step = Path(folder.path), state["step"]
    if keep > 1:
        target = run_dir / KEPT_DIR / f"step-{step}.pt"
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(exist_ok=True)
            tmp.unlink(missing_ok=True)
            try:
                os.link(folder.checkpoint, tmp)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(folder.checkpoint, tmp)
            os.replace(tmp, target)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OSError(
                e.errno,
                f"cannot keep the checkpoint of step {step} as {str(target)!r}: {e.strerror or e}; "
                f"{space_note(run_dir, need)}. {str(folder.checkpoint)!r} (step {step}) is intact",
            ) from None
    old = list(kept(run_dir).values())
    for path in old[: max(len(old) - keep, 0)] if keep > 1 else old:
        path.unlink(missing_ok=True)
