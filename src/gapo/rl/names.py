"""The names config validation checks against, importable without torch or transformers.

The registries themselves hold functions and tensors (``gapo.core.advantages.ADVANTAGES``,
``gapo.core.losses.LOSSES``, ``gapo.policy.base_policy.PRESETS``, …), and importing them costs
seconds of CPU (torch, transformers). A config typo must be reported in well under a second
(docs/design.md §8), so ``gapo.rl.config`` validates against the names listed here;
``tests/rl/test_config.py`` checks that every list equals its registry. When a registry's module
is already imported, :func:`known` answers from the registry itself, so an entry registered at
run time (``ADVANTAGES["mine"] = fn``) is accepted.

``TRL_NAMES`` is TRL's ``GRPOConfig`` (with the ``TrainingArguments`` a GRPO user sets) against
gapo's keys: the one table behind the unknown-key hint (``algo.beta`` -> ``algo.kl_coef``) and
docs/from-trl.md (a test keeps the two, and the table and TRL's own fields, in step).
"""

from __future__ import annotations

import sys

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_PARAMS",
    "PASSK_DEFAULT_K",
    "LOSSES",
    "EPS_SCHEDULES",
    "BOUND_SCHEDULES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "DTYPES",
    "BASE_PRESETS",
    "LR_SCHEDULES",
    "TRL_NAMES",
    "known",
    "trl_hint",
]

ADVANTAGES = ("drgrpo", "grpo", "rloo", "passk", "focal")  # gapo.core.advantages.ADVANTAGES
# each estimator's own keyword parameters (focal also passes its base's on)
ADVANTAGE_PARAMS = {"drgrpo": (), "grpo": ("eps", "std"), "rloo": (), "passk": ("k",), "focal": ("gamma", "base")}
PASSK_DEFAULT_K = 4  # gapo.core.advantages.passk's default k
LOSSES = ("ppo", "gspo", "cispo", "sapo", "cegppo", "clip_cov", "kl_cov")  # gapo.core.losses.LOSSES
EPS_SCHEDULES = ("fixed", "linear", "log")  # gapo.core.clipping.EPS_SCHEDULES
BOUND_SCHEDULES = ("bapo", "dcpo")  # gapo.core.adaptive_bounds.BOUND_SCHEDULES
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")  # gapo.core.losses.KL_ESTIMATORS
DTYPES = ("float32", "bfloat16", "float16")  # gapo.policy.precision.DTYPES
BASE_PRESETS = ("low", "high", "three", "medium")  # gapo.policy.base_policy.PRESETS
LR_SCHEDULES = ("constant", "linear", "cosine")  # gapo.rl.optimizer.LR_SCHEDULES

# list name -> (module, attribute) of the registry it mirrors
_REGISTRY = {
    "ADVANTAGES": ("gapo.core.advantages", "ADVANTAGES"),
    "LOSSES": ("gapo.core.losses", "LOSSES"),
    "EPS_SCHEDULES": ("gapo.core.clipping", "EPS_SCHEDULES"),
    "BOUND_SCHEDULES": ("gapo.core.adaptive_bounds", "BOUND_SCHEDULES"),
    "AGG_MODES": ("gapo.core.aggregation", "AGG_MODES"),
    "KL_ESTIMATORS": ("gapo.core.losses", "KL_ESTIMATORS"),
    "DTYPES": ("gapo.policy.precision", "DTYPES"),
    "BASE_PRESETS": ("gapo.policy.base_policy", "PRESETS"),
    "LR_SCHEDULES": ("gapo.rl.optimizer", "LR_SCHEDULES"),
}


def registry(name: str):
    """The live registry behind list ``name`` if its module is already imported, else None
    (never imports it: that is what this module avoids)."""
    module, attr = _REGISTRY[name]
    mod = sys.modules.get(module)
    return getattr(mod, attr, None) if mod is not None else None


def known(name: str) -> tuple[str, ...]:
    """The accepted names of list ``name``: the registry's own when loaded, else the list here."""
    live = registry(name)
    return tuple(live) if live is not None else globals()[name]


# ------------------------------------------------------------------ TRL's names
_VLLM = "gapo samples with the policy itself; vLLM serves the verl adapter (docs/scale-out.md)"
_VLLM_IS = "no sampler/trainer mismatch: the policy samples itself (algo.old_logp=sampler reuses its log-probs)"
_OWN_DECODER = "gapo samples with its own KV-cache decoder"
_LOSSES = "no such loss (algo.loss: ppo, gspo, cispo, sapo, cegppo, clip_cov, kl_cov)"
_REF = "the KL reference is the starting policy, frozen"
_ADAPTIVE = "algo.entropy_coef is a constant"

# TRL name -> (gapo key, or None where gapo has none, and a note: how the values map, or why there is none).
# A "key" starting with "--" is a command-line option.
TRL_NAMES: dict[str, tuple[str | None, str]] = {
    # GRPOConfig: the model
    "model_init_kwargs": (None, "gapo loads model.path itself; model.dtype is the compute dtype, weights stay float32"),
    "trust_remote_code": (None, "only architectures transformers ships load; a checkpoint's own code is never run"),
    "router_aux_loss_coef": (None, "no MoE load-balancing loss is added"),
    "disable_dropout": (None, "dropout is the checkpoint's (its config.json's *dropout fields)"),
    "cast_lm_head_to_fp32": (None, "weights are float32 always; model.dtype is only the autocast compute dtype"),
    # GRPOConfig: the data
    "remove_unused_columns": (None, "a dataset's columns reach --reward functions as keyword fields; none is dropped"),
    "num_generations": ("train.group_size", ""),
    "num_generations_eval": ("eval.samples", "samples per held-out problem"),
    "max_completion_length": ("sampling.max_new_tokens", ""),
    "ds3_gather_for_generation": (None, "no DeepSpeed: one machine; clusters run the verl adapter (docs/scale-out.md)"),
    "shuffle_dataset": (None, "the training pool is always visited in reshuffled passes (train.seed)"),
    "pad_to_multiple_of": (None, "completions are padded to the batch's longest"),
    # GRPOConfig: generation
    "generation_batch_size": ("train.prompts", "TRL counts completions: generation_batch_size = prompts × group_size"),
    "steps_per_generation": ("train.mini_batches", "optimiser steps per epoch over one rollout batch"),
    "temperature": ("sampling.temperature", ""),
    "top_p": ("sampling.top_p", ""),
    "top_k": ("sampling.top_k", "rollouts only: evaluation samples without it (TRL's uses it too)"),
    "min_p": ("sampling.min_p", "TRL's none (off) is 0; rollouts only, as top_k"),
    "repetition_penalty": ("sampling.repetition_penalty", "rollouts only, as top_k"),
    "generation_kwargs": (None, "sampling.stop takes stop strings; no other generate() option is offered"),
    "chat_template_kwargs": ("task.chat_template_kwargs", ""),
    "cache_implementation": (None, _OWN_DECODER),
    "use_transformers_continuous_batching": (None, _OWN_DECODER),
    "transformers_continuous_batching_config": (None, _OWN_DECODER),
    "use_transformers_paged": (None, _OWN_DECODER),
    # GRPOConfig: vLLM
    **dict.fromkeys(
        (
            "use_vllm",
            "vllm_mode",
            "vllm_model_impl",
            "vllm_enable_sleep_mode",
            "vllm_structured_outputs_regex",
            "vllm_server_base_url",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_server_timeout",
            "vllm_group_port",
            "vllm_gpu_memory_utilization",
            "vllm_max_model_length",
            "vllm_tensor_parallel_size",
        ),
        (None, _VLLM),
    ),
    **dict.fromkeys(
        (
            "vllm_importance_sampling_correction",
            "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max",
            "vllm_importance_sampling_clip_min",
            "vllm_importance_sampling_cap",
        ),
        (None, _VLLM_IS),
    ),
    # GRPOConfig: the loss
    "beta": ("algo.kl_coef", ""),
    "num_iterations": ("train.epochs", ""),
    "epsilon": ("algo.eps_low", ""),
    "epsilon_high": ("algo.eps_high_max", "the constant upper width (eps_schedule=fixed), GAPO's largest otherwise"),
    "delta": ("algo.clip_ratio_c", "TRL's two-sided bound δ is the dual clip's C: the same loss for δ > 1 + ε"),
    "importance_sampling_level": ("algo.loss", "token is ppo, sequence is gspo"),
    "loss_type": (
        "algo.agg",
        "dapo (bnpo on one device) is token-mean, grpo seq-mean-token-mean, dr_grpo seq-mean-token-sum-norm; "
        "cispo and sapo are algo.loss=cispo, algo.loss=sapo",
    ),
    "scale_rewards": ("algo.advantage", "group (True) is grpo, none (False) drgrpo, gapo's default; batch has none"),
    "reward_weights": ("reward.weights", ""),
    "multi_objective_aggregation": (None, "the weighted sum is normalised by the estimator (TRL's sum_then_normalize)"),
    "mask_truncated_completions": ("algo.mask_truncated", "rollout/frac_truncated is the masked rows' share"),
    "entropy_coef": ("algo.entropy_coef", ""),
    **dict.fromkeys(
        ("use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
        (None, _ADAPTIVE),
    ),
    **dict.fromkeys(("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"), (None, _REF)),
    "sapo_temperature_pos": ("algo.loss_params", "algo.loss=sapo with algo.loss_params.tau_pos"),
    "sapo_temperature_neg": ("algo.loss_params", "algo.loss=sapo with algo.loss_params.tau_neg"),
    **dict.fromkeys(("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg"), (None, _LOSSES)),
    "vespo_lambda_neg": (None, _LOSSES),
    "top_entropy_quantile": ("algo.top_entropy_quantile", ""),
    "off_policy_mask_threshold": (None, "no off-policy sequence masking"),
    "use_bias_correction_kl": (None, "the KL term is algo.kl_estimator's (k1, k3), without an importance weight"),
    "max_tool_calling_iterations": (None, "single-turn completions, no tools"),
    # GRPOConfig: logging
    "log_completions": ("log.samples_every", "samples.jsonl: log.samples rows a step; to the trackers every N steps"),
    "num_completions_to_print": ("log.samples", "rows per step"),
    "log_multimodal": (None, "text only"),
    "log_unique_prompts": (None, "the log.samples rows are the batch's first rollouts"),
    "log_completions_hub_repo": (None, "nothing is pushed to the Hub; samples.jsonl is in the run folder"),
    # TrainingArguments a GRPO user sets
    "learning_rate": ("optim.lr", ""),
    "lr_scheduler_type": ("optim.schedule", "constant_with_warmup is constant; linear and cosine as in transformers"),
    "lr_scheduler_kwargs": (None, "the cosine is half a period (num_cycles 0.5), down to 0"),
    "warmup_steps": ("optim.warmup_steps", "gapo's warm-up starts at lr/W, not 0 (docs/from-trl.md)"),
    "warmup_ratio": ("optim.warmup_steps", "in steps: warmup_ratio × train.steps"),
    "weight_decay": ("optim.weight_decay", ""),
    "adam_beta1": ("optim.betas", "[beta1, beta2]"),
    "adam_beta2": ("optim.betas", "[beta1, beta2]"),
    "adam_epsilon": (None, "AdamW's eps is torch's default, 1e-8"),
    "max_grad_norm": ("optim.grad_clip", ""),
    "optim": (None, "the optimiser is AdamW; section optim holds its settings"),
    "per_device_train_batch_size": ("train.micro_batch_size", "rows per forward/backward"),
    "gradient_accumulation_steps": ("train.micro_batch_size", "a mini-batch is accumulated over its micro-batches"),
    "max_steps": ("train.steps", "RL steps (rollout batches), each train.epochs × train.mini_batches updates"),
    "num_train_epochs": ("train.steps", "gapo counts rollout batches; the pool is task.train_size problems"),
    "seed": ("train.seed", ""),
    "data_seed": ("train.seed", "one seed for data and sampling"),
    "bf16": ("model.dtype", "bfloat16"),
    "fp16": ("model.dtype", "float16"),
    "use_cpu": ("model.device", "cpu"),
    "gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "torch_compile": (None, "not offered"),
    "logging_steps": (None, "every step is one line of metrics.jsonl"),
    "report_to": ("log.wandb", "or log.tensorboard"),
    "project": ("log.wandb_project", ""),
    "run_name": (None, "W&B names the run; the run folder is --out"),
    "output_dir": ("--out", "a command-line option"),
    "resume_from_checkpoint": ("--resume", "a command-line option: continues from the run folder's checkpoint"),
    "save_steps": ("train.checkpoint_every", ""),
    "save_strategy": ("train.checkpoint_every", "0: only at the end"),
    "save_total_limit": ("train.keep_checkpoints", ""),
    "eval_strategy": ("eval.every", "0: only before and after training"),
    "eval_steps": ("eval.every", ""),
    "per_device_eval_batch_size": (None, "an evaluation samples eval.samples completions of each problem together"),
    "push_to_hub": (None, "gapo export RUN writes a Hugging Face folder to upload"),
}


def trl_hint(key: str) -> str | None:
    """What an unknown config key that is TRL's name (bare or under any section: its last dotted
    part) is in gapo: ``" Did you mean algo.kl_coef? (TRL's beta)"``, or why gapo has none; None
    for a name TRL does not have."""
    name = key.rsplit(".", 1)[-1]
    if name not in TRL_NAMES:
        return None
    target, note = TRL_NAMES[name]
    if target is None:
        return f" TRL's {name} has no gapo equivalent: {note}. See docs/from-trl.md."
    return f" Did you mean {target}? (TRL's {name}{': ' + note if note else ''})"
