"""A model out of any run: ``gapo export RUN [--step N] [--out DIR] [--dtype keep|float32|bfloat16] [--merge-lora]``.

A run folder holds these models (docs/real-models.md):

- ``policy/``: the final policy, written when the run reached ``train.steps`` (its step is in
  ``policy/gapo_policy.json``);
- ``checkpoint.pt``: the last checkpoint (periodic ones overwrite it; a run stopped by Ctrl-C or
  SIGTERM writes it before exiting). It holds float32 master weights whatever ``model.dtype`` was
  (``model.dtype`` is the autocast compute dtype; the optimiser steps float32 weights), or, with
  LoRA, only the adapters, the base model staying where ``model.path`` points;
- with ``train.keep_checkpoints=N > 1``, ``checkpoints/step-<s>.pt``: the last ``N`` checkpoints
  (``gapo.rl.checkpoint``).

``export`` writes a plain Hugging Face folder (``save_pretrained``: weights, ``config.json``,
``generation_config.json``, the tokenizer with its chat template) from the latest model, or
from the one at ``--step N`` (an error naming the steps there are). ``--dtype keep`` (the
default) saves in the base model's dtype (a bfloat16 checkpoint in, bfloat16 out, not the
float32 of the master weights); ``float32`` / ``bfloat16`` / ``float16`` as asked. A LoRA run
exports its adapter (a peft folder whose ``base_model_name_or_path`` is the base model) unless
``--merge-lora`` asks for the merged model. The same loader gives
``gapo eval RUN`` its model (:func:`load_run_model`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch

from gapo.policy import lora
from gapo.policy.model import load_policy, read_marker, save_policy
from gapo.rl.checkpoint import kept
from gapo.rl.resume import trained_config
from gapo.rl.run_dir import refuse_inside_run, require_run

__all__ = ["RunModels", "load_run_model", "export", "EXPORT_DTYPES"]

EXPORT_DTYPES = ("keep", "float32", "bfloat16", "float16")


class RunModels:
    """What a run folder holds: ``policy_step`` (None: no ``policy/``), ``ckpt_step`` (None: no
    checkpoint, or an unreadable one beside an intact ``policy/``, with a note) and ``config``, the
    config the run was trained with (the checkpoint's; ``config.yaml`` without one). ``checkpoint.pt``
    is read once: the step, the config and the weights a caller gets come from that one read (a
    run that checkpoints meanwhile replaces the file by a rename), and ``policy/``'s step and
    weights from one folder (:func:`load_run_model` checks that it was not swapped in between)."""

    def __init__(self, run: str | Path):
        self.folder = require_run(run)
        p = self.folder.path
        self.config = self.folder.saved_config()
        self.policy = p / "policy"
        self.policy_step = None
        self.has_policy = (self.policy / "config.json").is_file()
        if self.has_policy:
            self.policy_ino = os.stat(self.policy).st_ino
            step = ((read_marker(self.policy) or {}).get("extra") or {}).get("step")
            self.policy_step = step if isinstance(step, int) else (self.config.get("train") or {}).get("steps")
        self._state = None
        self.ckpt_step = None
        self.config_source = f"{str(self.folder.config)!r} (the run has no checkpoint)"
        self.edits: dict[str, tuple] = {}  # config.yaml's hand edits: key -> (checkpoint's, config.yaml's)
        if self.folder.checkpoint.is_file():
            self._read_checkpoint()
        self.kept = kept(p)  # step -> checkpoints/step-<step>.pt (train.keep_checkpoints)
        if not self.has_policy and self.ckpt_step is None:
            raise ValueError(
                f"run {str(p)!r} has no model yet: neither policy/ nor checkpoint.pt (it stopped "
                "before its first checkpoint)"
            )

    def state(self, step: int | None = None) -> dict:
        """``checkpoint.pt``'s state, or that of the kept checkpoint of ``step``."""
        if step is not None and step != self.ckpt_step and step in self.kept:
            try:
                return torch.load(self.kept[step], map_location="cpu", weights_only=False)
            except Exception as e:  # noqa: BLE001 - zip/pickle errors of a truncated file, of many kinds
                raise ValueError(f"cannot read the run's model: {str(self.kept[step])!r} is unreadable ({e})") from None
        return self._state  # read once, with the folder (_read_checkpoint)

    def _read_checkpoint(self) -> None:
        try:
            self._state = self.folder.load_checkpoint("cpu")
        except ValueError as e:
            if not self.has_policy:
                raise ValueError(str(e).replace("cannot resume: ", "cannot read the run's model: ")) from None
            self.config_source = f"{str(self.folder.config)!r} (checkpoint.pt is unreadable)"
            print(
                f"[gapo] note: {str(self.folder.checkpoint)!r} is unreadable (it may be truncated); using the "
                f"final policy in {str(self.policy)!r} (step {self.policy_step}) and {str(self.folder.config)!r}",
                file=sys.stderr,
            )
            return
        self.ckpt_step = self._state["step"]
        try:
            trained, self.edits = trained_config(self.folder, self._state)
        except ValueError as e:
            raise ValueError(str(e).replace("cannot resume: ", "cannot read the run's config: ")) from None
        if trained is not None:
            self.config = trained
            self.config_source = f"the one inside {str(self.folder.checkpoint)!r}"

    def steps(self) -> list[int]:
        return sorted({s for s in (self.policy_step, self.ckpt_step, *self.kept) if s is not None})

    def pick(self, step: int | None) -> str:
        """``"policy"`` or ``"checkpoint"``: the latest (a tie goes to ``policy/``), or the one at ``step``."""
        if step is None:
            if self.ckpt_step is None or (self.has_policy and (self.policy_step or 0) >= self.ckpt_step):
                return "policy"
            return "checkpoint"
        if self.has_policy and step == self.policy_step:
            return "policy"
        if step == self.ckpt_step or step in self.kept:
            return "checkpoint"
        have = ", ".join(
            ([f"the final policy (step {self.policy_step})"] if self.has_policy else [])
            + ([f"the last checkpoint (step {self.ckpt_step})"] if self.ckpt_step is not None else [])
            + ([f"kept checkpoints (steps {', '.join(map(str, self.kept))})"] if self.kept else [])
        )
        raise ValueError(
            f"run {str(self.folder.path)!r} has no model at step {step}: it holds {have}. A run keeps "
            "its last train.keep_checkpoints checkpoints (default 1: periodic checkpoints overwrite it)"
        )

    def checkpoint_step(self, step: int | None) -> int | None:
        """The step of the checkpoint ``pick(step)`` chose."""
        return self.ckpt_step if step is None else step

    def eval_config(self, *, allow_change: bool) -> dict:
        """The config ``gapo eval RUN`` starts from, checked as ``--resume`` checks it: the one the
        run was trained with, which a hand edit of ``config.yaml`` contradicts. An edit is an error
        naming the keys, unless ``allow_change``: then ``config.yaml``'s values are used (and
        :attr:`config_source` says so)."""
        if not self.edits:
            return self.config
        keys = ", ".join(f"{k} (run: {a!r}, config.yaml: {b!r})" for k, (a, b) in self.edits.items())
        if not allow_change:
            raise ValueError(
                f"{str(self.folder.config)!r} differs from the config the run was trained with (inside "
                f"{str(self.folder.checkpoint)!r}): {keys}; it was edited after the run started, and "
                "--resume refuses it too. Put the run's values back to evaluate the run as it was trained, "
                "or pass --allow-change to evaluate with config.yaml's (key=value overrides apply to either)"
            )
        self.config_source = f"{str(self.folder.config)!r}, edited after the run started ({keys}; --allow-change)"
        return self.folder.saved_config()

    @property
    def is_lora(self) -> bool:
        return bool((self.config.get("model") or {}).get("lora"))

    def base_path(self) -> str:
        """The model the run started from (the checkpoint's record, else the saved config's)."""
        if self.ckpt_step is not None and self.state().get("policy_path"):
            return str(self.state()["policy_path"])
        path = (self.config.get("model") or {}).get("path")
        if path is None:
            from gapo.policy.base_policy import get_base_policy

            return str(get_base_policy((self.config.get("model") or {}).get("base_preset", "low"), progress=False))
        return str(path)


def _base_dtype(path: str) -> torch.dtype:
    """The dtype a model folder's ``config.json`` declares (``dtype`` / ``torch_dtype``), else float32."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return torch.float32
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return getattr(torch, str(name).replace("torch.", ""), torch.float32) if isinstance(name, str) else torch.float32


def load_run_model(
    run: str | Path | RunModels, step: int | None = None, device: str = "cpu", *, keep_lora: bool = False
):
    """``(model, tokenizer, info)`` of a run's final policy or checkpoint (see the module docstring);
    float32 weights. ``run``: a run folder, or its :class:`RunModels` (whose one read of the
    checkpoint the model then comes from). ``keep_lora``: a LoRA run's model stays a peft model
    (adapters unmerged); otherwise it is the merged plain model. ``info``: ``source``, ``step``,
    ``base``, ``config``, ``lora``."""
    rm = run if isinstance(run, RunModels) else RunModels(run)
    source = rm.pick(step)
    base = rm.base_path()
    info = {
        "source": source,
        "base": base,
        "config": rm.config,
        "lora": rm.is_lora,
        "step": rm.policy_step if source == "policy" else rm.checkpoint_step(step),
    }
    if source == "policy":
        adapter = rm.policy / "adapter"
        if keep_lora and rm.is_lora and adapter.is_dir():
            from peft import PeftModel  # lazy: the optional [lora] extra

            model, tok = load_policy(base, device, dtype=torch.float32)
            model = PeftModel.from_pretrained(model, str(adapter))
            _, tok = load_policy(rm.policy, device, dtype=torch.float32)  # the tokenizer the run saved
            _same_policy(rm)
            return model.eval(), tok, info
        model, tok = load_policy(rm.policy, device, dtype=torch.float32)
        _same_policy(rm)
        return model, tok, info
    state = rm.state(step)
    try:
        model, tok = load_policy(base, device, dtype=torch.float32)
    except ValueError as e:
        raise ValueError(f"the checkpoint of {str(rm.folder.path)!r} needs its base model at {base!r}: {e}") from None
    where = f"the checkpoint of step {info['step']} in {str(rm.folder.path)!r}"
    try:
        if rm.is_lora:
            model = lora.apply_lora(model, (rm.config.get("model") or {}).get("lora") or {})
            res = model.load_state_dict(state["model"], strict=False)
            if res.unexpected_keys or set(lora.adapter_state(model)) - set(state["model"]):
                raise ValueError("its adapters do not match the run's model.lora")
            if not keep_lora:
                model = model.merge_and_unload()
        else:
            model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        raise ValueError(f"{where} does not fit the base model at {base!r} ({str(e).splitlines()[0]})") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return model.to(device).eval(), tok, info


def _same_policy(rm: RunModels) -> None:
    """``policy/`` is still the folder whose step was read (a run swaps a new one in by a rename)."""
    try:
        same = os.stat(rm.policy).st_ino == rm.policy_ino
    except OSError:
        same = False
    if not same:
        raise ValueError(
            f"{str(rm.policy)!r} was replaced while it was read (its run wrote a new final policy); run the "
            "command again"
        )


def export(
    run: str | Path,
    out: str | Path | None = None,
    *,
    step: int | None = None,
    dtype: str = "keep",
    merge_lora: bool = False,
) -> tuple[Path, dict]:
    """Write the run's model to ``out`` (default ``<RUN>-step<N>`` beside the run folder: outside it, so
    that ``--overwrite`` of the run does not take it along) as a plain Hugging Face
    folder; returns ``(out, info)``. Nothing is written when anything is wrong (an existing
    non-empty ``out``, an ``out`` inside a run folder, a step the run does not hold, an unknown
    dtype). The folder's name and the weights come from one read of the run (:class:`RunModels`)."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"--dtype: must be one of {list(EXPORT_DTYPES)}, got {dtype!r}")
    if out is not None:
        refuse_inside_run(out, "--out")
    rm = RunModels(run)
    if merge_lora and not rm.is_lora:
        raise ValueError(
            f"--merge-lora: run {str(rm.folder.path)!r} did not train LoRA adapters (model.lora is "
            "empty); its export is the full model already"
        )
    chosen = rm.policy_step if rm.pick(step) == "policy" else rm.checkpoint_step(step)
    out = Path(out) if out is not None else rm.folder.path.with_name(f"{rm.folder.path.name}-step{chosen}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not empty; choose another folder or remove it")
    keep_lora = rm.is_lora and not merge_lora
    model, tok, info = load_run_model(rm, step, "cpu", keep_lora=keep_lora)
    target = _base_dtype(info["base"]) if dtype == "keep" else getattr(torch, dtype)
    model = model.to(target)
    info.update(dtype=str(target).replace("torch.", ""), adapter=keep_lora)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        extra = {"run": str(rm.folder.path), "step": info["step"], "source": info["source"]}
        if keep_lora:  # a peft adapter folder (adapter_config.json names the base) and the tokenizer
            tmp.mkdir(parents=True)
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            (tmp / "gapo_export.json").write_text(json.dumps(extra, indent=2))
        else:
            save_policy(model, tok, tmp, extra=extra)
        if out.exists():
            out.rmdir()
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, out)
    except OSError as e:
        raise OSError(e.errno, f"cannot write the export to {str(out)!r}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, info
