"""LoRA adapters through ``peft`` (``model.lora = {r, alpha, dropout, target_modules}``).

Only the adapters train; the reference policy of a KL term is the same network with the
adapters disabled (the base model, as TRL does), so no second copy of the weights is held.
Checkpoints hold the adapter weights only; the final ``policy/`` folder holds the merged model
(loadable anywhere) and the adapter itself in ``policy/adapter``.
"""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path

__all__ = ["check_lora", "apply_lora", "is_lora", "adapter_state", "reference", "merged"]

LORA_KEYS = ("r", "alpha", "dropout", "target_modules")


def check_lora(key: str, spec: dict) -> None:
    """``spec`` is empty (no LoRA) or names only known keys with values in their domains."""
    if not spec:
        return
    unknown = [k for k in spec if k not in LORA_KEYS]
    if unknown:
        raise ValueError(
            f"{key}: unknown entries {unknown}; accepted: {list(LORA_KEYS)} "
            "(e.g. model.lora={r: 16, alpha: 32, dropout: 0.05, target_modules: all-linear})"
        )
    r = spec.get("r", 16)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"{key}: r must be an integer >= 1, got {r!r}")
    alpha = spec.get("alpha", 2 * r)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"{key}: alpha must be a finite number > 0, got {alpha!r}")
    dropout = spec.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"{key}: dropout must be a number in [0, 1), got {dropout!r}")
    tm = spec.get("target_modules", "all-linear")
    if not (isinstance(tm, str) or (isinstance(tm, list) and tm and all(isinstance(x, str) for x in tm))):
        raise ValueError(f"{key}: target_modules must be 'all-linear' or a list of module names, got {tm!r}")


def apply_lora(model, spec: dict):
    """``model`` wrapped with fresh LoRA adapters (peft ``get_peft_model``)."""
    try:
        from peft import LoraConfig, get_peft_model  # lazy: peft is the optional [lora] extra
    except ImportError as e:
        raise ValueError(f"model.lora needs peft: pip install 'gapo[lora]' ({e})") from None
    r = spec.get("r", 16)
    cfg = LoraConfig(
        r=r,
        lora_alpha=spec.get("alpha", 2 * r),
        lora_dropout=spec.get("dropout", 0.0),
        target_modules=spec.get("target_modules", "all-linear"),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as e:  # e.g. target modules not found in the model
        raise ValueError(f"model.lora: {e}") from None


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def adapter_state(model) -> dict:
    """The trainable (adapter) tensors of a LoRA model's state dict."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k in trainable}


def reference(model):
    """Context in which ``model`` computes the reference policy: adapters off for LoRA."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def merged(model):
    """A plain ``transformers`` model with the adapters merged in (a copy; ``model`` is unchanged)."""
    return copy.deepcopy(model).merge_and_unload()


def save_adapter(model, path: Path) -> None:
    model.save_pretrained(str(path))
