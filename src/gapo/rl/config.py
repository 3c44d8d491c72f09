"""Run configuration: one dataclass per component, loaded from YAML plus ``key=value`` overrides.

    gapo train --config run.yaml algo.eps_schedule=linear algo.eps_high_max=0.28 train.steps=50

Unknown keys and wrong types are rejected with the key, the accepted values and close matches;
every numeric field has a domain (``DOMAINS``: finite, sign, range), dict-valued params are
checked against what the component accepts, and impossible combinations (``G < 2``, mini-batches
that do not divide the batch, …) are rejected by ``Config.validate`` before any work starts.
YAML files must be UTF-8 without duplicate keys. Messages name the key and, for a key read from a
file, the file and line: ``optim.lr (run.yaml:4): must be a finite number > 0, got nan``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path

# Nothing imported here loads torch or transformers (a test checks it): a config error is
# reported in a fraction of a second, before the heavy libraries and the model load. The
# registries' names come from gapo.rl.names (tested to equal the registries).
from gapo import tasks
from gapo.core.checks import unknown
from gapo.core.method_params import (
    BOUND_PARAMS,
    LOSS_PARAMS,
    check_bound_params,
    check_loss_params,
    defaults_text,
    method_problem,
)
from gapo.policy.chat import CHAT_MODES, check_chat_template_kwargs
from gapo.policy.lora import check_lora
from gapo.rl.config_io import coerce, diff, parse_value, read_yaml
from gapo.rl.domains import (
    DOMAINS,
    advantage_params,
    check_advantage_params,
    check_device,
    check_model_path,
    check_params,
    check_task_files,
    check_task_param_types,
    task_params,
)
from gapo.rl.names import known, trl_hint
from gapo.tasks.custom import DEFAULT_RANGE, absolute_spec, check_reward_config, combined_range

__all__ = ["Config", "load_config", "apply_overrides", "to_dict", "from_dict", "diff", "DOMAINS"]


def option(default, help: str):
    """A config key: its default and its one-line help, the one source of ``gapo config`` and
    docs/config.md (a dict or list default is copied for each instance)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TaskConfig:
    """The task: where prompts come from, how they are rendered and scored."""

    name: str = option("countdown", "a gapo.tasks name: countdown, arithmetic, math, data, rg, humaneval, mbpp")
    params: dict = option({}, "the task's own parameters, passed to gapo.tasks.get(name, **params) (docs/tasks.md)")
    train_size: int = option(20000, "at most this many distinct training problems (pool = min(this, prompts × steps))")
    scoring_workers: int = option(0, ">0: score in a process pool of this many workers (slow verifiers)")
    chat: bool | str = option(
        "auto", "prompts through the tokenizer's chat template: auto (if it has one) | true | false"
    )
    system_prompt: str | None = option(None, "a system turn before the task's prompt (chat templates only)")
    chat_template_kwargs: dict = option({}, "chat template variables, e.g. {enable_thinking: false}")
    max_prompt_tokens: int | None = option(None, "drop prompts longer than this (tokens, after the chat template)")


@dataclass
class RewardConfig:
    """Rewards of your own (gapo.tasks.custom) beside or instead of the task's verifier."""

    funcs: list[str] = option(
        [],
        "module.path:function | path/to/file.py:function | task (the task's own verifier); empty: the "
        "task's verifier; --reward (repeatable) sets this list",
    )
    weights: list[float] | None = option(None, "one per function (default 1 each); R = the weighted sum")
    ranges: list[tuple[float, float]] | None = option(
        None, "one [lo, hi] per function (default [0, 1] each): checked on every value; they give R's range"
    )
    timeout_s: float = option(
        10.0,
        "seconds per completion before the worker running the functions is killed (reward 0, counted in "
        "reward/n_timeout); a batched function gets this times its batch's size",
    )


@dataclass
class ModelConfig:
    """The policy: which weights, on which device, in which precision."""

    path: str | None = option(None, "local Hugging Face checkpoint folder or hub id; none: the embedded base policy")
    base_preset: str = option("low", "the embedded base policy's preset when path is none: low | high | three | medium")
    device: str = option("cpu", "a torch device: cpu, cuda, cuda:1, mps, xpu")
    threads: int | None = option(None, "torch threads; none on CPU: measured once per machine (gapo.machine.threads)")
    malloc_tuning: bool = option(True, "on CPU: keep per-step activations in glibc's heap (gapo.machine.allocator)")
    dtype: str = option(
        "float32", "float32 | bfloat16 | float16: autocast compute dtype; weights and optimiser stay float32"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory, more time)")
    lora: dict = option({}, "{r, alpha, dropout, target_modules}: train LoRA adapters only (peft)")


@dataclass
class SamplingConfig:
    """How training's rollouts are sampled (evaluation has its own temperature and top_p, and no
    top-k, min-p or repetition penalty: it samples the policy as it is)."""

    # every key is a gapo.policy.sampling.SamplingParams field: the trainer passes them all
    temperature: float = option(1.0, "sampling temperature of the rollouts")
    top_p: float = option(1.0, "nucleus sampling: the smallest set of tokens with this much probability")
    max_new_tokens: int | None = option(None, "completion length cap; none: the task's max_completion_len + 1 (EOS)")
    stop: list[str] = option([], "stop strings: a completion ends at the first (cut before it)")
    top_k: int = option(0, "top-k sampling: only the k most likely tokens may be drawn; 0: off")
    min_p: float = option(0.0, "min-p sampling: only tokens with at least min_p × the top token's probability; 0: off")
    repetition_penalty: float = option(
        1.0, "CTRL penalty on ids already in the prompt or completion: > 1 fewer repeats, < 1 more; 1: off"
    )


@dataclass
class AlgoConfig:
    """The algorithm: advantage estimator, loss, clip widths, regularisers.

    ``eps_high_max`` is the configured upper width under every schedule: the constant ``ε_high`` of
    every rollout under ``fixed`` (PPO/GRPO's ε_high), GAPO's largest ``ε_high(i)`` (the lone success
    of a hard group) under ``linear``/``log``. One key for both, so a fixed-vs-GAPO comparison
    changes only ``eps_schedule`` (docs/design.md §2.1, §2.5). gapo 0.1's ``algo.eps_high`` is
    refused with a message naming ``algo.eps_high_max``, in a saved run's config.yaml too."""

    advantage: str = option("drgrpo", "the advantage estimator: drgrpo | grpo | rloo | passk | focal")
    advantage_params: dict = option(
        {}, "the estimator's own parameters, e.g. {eps: 1e-6}, {k: 4}, {gamma: 1, base: drgrpo}"
    )
    loss: str = option(
        "ppo", "ppo (token ratio) | gspo (sequence ratio) | cispo | sapo | cegppo | clip_cov | kl_cov (§2.13)"
    )
    loss_params: dict = option({}, "the loss's own parameters; unset ones the paper's: " + defaults_text(LOSS_PARAMS))
    eps_schedule: str = option(
        "fixed",
        "the clip widths: fixed | linear (GAPO's Eq. 11) | log (GAPO's exact form) | bapo (per batch) | "
        "dcpo (per token) (§2.13)",
    )
    eps_schedule_params: dict = option({}, "bapo's, dcpo's own; unset ones the paper's: " + defaults_text(BOUND_PARAMS))
    eps_low: float = option(0.2, "the lower clip width: the ratio is clipped at 1 − eps_low")
    eps_high_max: float = option(0.2, "the upper width: the constant (fixed), GAPO's maximum (linear, log)")
    reward_range: tuple[float, float] | str | None = option(
        None, "[R_min, R_max] | group | batch; none: derived from the rewards' ranges (docs/design.md §2.7)"
    )
    clip_ratio_c: float | None = option(None, "the dual clip's constant for A < 0 (verl's default 3.0); none: off")
    agg: str = option(
        "token-mean",
        "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm",
    )
    kl_coef: float = option(0.0, "coefficient of the reference-policy KL penalty in the loss")
    kl_estimator: str = option("k3", "the KL estimator: k1 | k3")
    entropy_coef: float = option(0.0, "coefficient of the entropy bonus")
    dynamic_sampling: bool = option(False, "DAPO: drop groups whose rewards are all equal and sample more to refill")
    max_refill_rounds: int = option(
        3,
        "with dynamic_sampling: at most this many extra sampling rounds per step (then zero-variance "
        "groups fill the rest)",
    )
    old_logp: str = option(
        "recompute", "recompute (a full forward before the updates) | sampler (reuse the sampling log-probs)"
    )
    mask_truncated: bool = option(
        False,
        "rollouts cut by max_new_tokens (rollout/frac_truncated) leave the loss; they stay in their groups' "
        "advantages (TRL's mask_truncated_completions)",
    )
    overlong_buffer: int = option(
        0,
        "DAPO's soft overlong penalty: the last this many tokens before the completion cap ramp the reward "
        "down to -overlong_penalty (verl's overlong_buffer.len); 0: off",
    )
    overlong_penalty: float = option(
        1.0, "the overlong term at the cap, subtracted from the reward the advantages see (verl's penalty_factor)"
    )
    top_entropy_quantile: float = option(
        1.0, "the surrogate over the top q of response tokens by entropy, per micro-batch (TRL's); 1: all"
    )


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = option(5e-5, "AdamW's learning rate (after the warm-up)")
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay")
    betas: tuple[float, float] = option((0.9, 0.999), "AdamW's (beta1, beta2)")
    warmup_steps: int = option(0, "linear warm-up over the first RL steps (the schedule steps once per RL step)")
    schedule: str = option(
        "constant", "the decay after the warm-up: constant | linear | cosine (transformers' semantics)"
    )
    grad_clip: float = option(1.0, "the gradients' global norm is clipped to this")


@dataclass
class TrainConfig:
    """The loop: how many steps, how big a rollout batch, how it is split into updates."""

    steps: int = option(100, "rollout batches")
    prompts: int = option(16, "P, prompts per rollout batch")
    group_size: int = option(8, "G, rollouts per prompt")
    mini_batches: int = option(4, "optimiser steps per epoch over the rollout batch")
    micro_batch_size: int | str | None = option(
        "auto",
        "rows per forward/backward inside a mini-batch (the same gradient); auto: as many as keep their "
        "float32 logits within 256 MiB (a real vocabulary splits, a character one stays whole); none: all",
    )
    epochs: int = option(1, "passes over each rollout batch")
    seed: int = option(0, "the run's random seed (the training pool and its order, sampling)")
    checkpoint_every: int = option(50, "steps; 0 disables periodic checkpoints (the last one is always saved)")
    keep_checkpoints: int = option(
        1, "the last N checkpoints kept in checkpoints/ (gapo export --step); 0, 1: only the latest"
    )
    progress: bool = option(True, "progress bars on the terminal")


@dataclass
class EvalConfig:
    """Held-out evaluation: before training, every few steps and after."""

    every: int = option(25, "steps; 0: only before and after training")
    problems: int = option(64, "held-out problems per evaluation; 0: no evaluation")
    samples: int = option(16, "n samples per problem (unbiased pass@k for k = 1, 2, 4, …, n)")
    temperature: float = option(1.0, "evaluation's sampling temperature (its own, not sampling.temperature)")
    top_p: float = option(
        1.0, "evaluation's own, like temperature; sampling.max_new_tokens and sampling.stop apply too"
    )
    seed: int = option(
        1234, "the evaluation's seed: the same held-out problems and sampling stream at every evaluation"
    )


@dataclass
class LogConfig:
    """What a run records besides metrics.jsonl (docs/run-folders.md)."""

    tensorboard: bool = option(False, "TensorBoard event files in RUN/tb/")
    wandb: bool = option(False, "log to Weights & Biases (its local files in RUN/wandb/)")
    wandb_project: str = option("gapo", "the W&B project")
    samples: int = option(
        4, "rows of each rollout batch kept in samples.jsonl (prompt text, completion, reward); 0: none"
    )
    samples_every: int = option(10, "steps; those rows also go to TensorBoard (text) / W&B (a table); 0: never")


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self, *, model_files: bool = True) -> Config:
        """Reject out-of-domain values and impossible combinations before any work is done.

        ``model_files=False`` skips whether ``model.path`` exists (everything else is checked): a
        resumed grid compares a finished or started cell's config whose base folder was on another
        machine and is rebuilt, and checked by its weights, after this comparison.

        Two phases (docs/design.md §8). Here, without torch, transformers or the model: keys,
        types, domains, names, dict-valued params (passk's k against G), files (``model.path``,
        a dataset path), cross-field rules; the device last (anything but the CPU asks torch).
        Checks that need the model (its architecture is a causal LM, the chat template renders
        the prompt, ``sampling.max_new_tokens`` within its context, a probe of the reward) run
        when the trainer has loaded it, still before the run folder is touched.
        """
        where = self._where
        for key, check in DOMAINS.items():
            sec, name = key.split(".")
            problem = check(getattr(getattr(self, sec), name))
            if problem:
                raise ValueError(f"{where(key)}: {problem}")
        self._settle_rewards()
        self._check_names()
        self._check_params()
        self._check_combinations()
        self._check_chat()
        self._check_model(model_files)
        # last: a device other than the CPU needs torch to ask its backend
        check_device(where("model.device"), self.model.device)
        return self

    def _check_names(self) -> None:
        """Every registry name known (the task, the algorithm's choices, the LR schedule)."""
        where, a = self._where, self.algo
        if self.task.name not in tasks.names():
            raise ValueError(f"{where('task.name')}: {unknown('task', self.task.name, tasks.names())}")
        for key, kind, name, accepted in (
            ("algo.advantage", "advantage estimator", a.advantage, known("ADVANTAGES")),
            ("algo.loss", "policy loss", a.loss, known("LOSSES")),
            ("algo.eps_schedule", "eps schedule", a.eps_schedule, known("EPS_SCHEDULES") + known("BOUND_SCHEDULES")),
            ("algo.agg", "aggregation mode", a.agg, known("AGG_MODES")),
            ("algo.kl_estimator", "kl estimator", a.kl_estimator, known("KL_ESTIMATORS")),
            ("algo.old_logp", "old_logp source", a.old_logp, ("recompute", "sampler")),
            ("optim.schedule", "learning-rate schedule", self.optim.schedule, known("LR_SCHEDULES")),
        ):
            if name not in accepted:
                raise ValueError(f"{where(key)}: {unknown(kind, name, accepted)}")

    def _check_params(self) -> None:
        """The dict-valued params (passk's k against G), the task's parameter types and files."""
        where, a = self._where, self.algo
        check_params(where("algo.advantage_params"), a.advantage_params, advantage_params(a.advantage))
        check_advantage_params(where("algo.advantage_params"), a.advantage, a.advantage_params, self.train.group_size)
        # a loss registered at run time (LOSSES["mine"] = fn) has no table entry: it takes no params
        problem = check_loss_params(a.loss, a.loss_params) if a.loss in LOSS_PARAMS or a.loss_params else None
        if problem:
            raise ValueError(f"{where('algo.loss_params')}: {problem}")
        if a.eps_schedule in BOUND_PARAMS:
            problem = check_bound_params(a.eps_schedule, a.eps_schedule_params)
        elif a.eps_schedule_params:
            problem = f"eps_schedule {a.eps_schedule!r} takes no parameters (bapo and dcpo do)"
        if problem:
            raise ValueError(f"{where('algo.eps_schedule_params')}: {problem}")
        check_params(where("task.params"), self.task.params, task_params(self.task.name))
        check_task_param_types("task.params", self.task.name, self.task.params)
        check_task_files(where("task.params.path"), self.task.name, self.task.params)

    def _check_combinations(self) -> None:
        """The batch splits into mini-batches; GAPO's widths are ordered; the loss, its bounds and
        the dual clip go together (``core.method_params.method_problem``)."""
        where, a, t = self._where, self.algo, self.train
        batch = t.prompts * t.group_size
        if batch % t.mini_batches:
            raise ValueError(
                f"{where('train.mini_batches')}: {t.mini_batches} does not divide the rollout batch "
                f"prompts × group_size = {t.prompts} × {t.group_size} = {batch}"
            )
        if a.eps_schedule in ("linear", "log") and a.eps_high_max < a.eps_low:
            raise ValueError(
                f"{where('algo.eps_high_max')}: GAPO schedule {a.eps_schedule!r} needs "
                f"algo.eps_high_max >= algo.eps_low ({a.eps_low}), got {a.eps_high_max}"
            )
        self._check_overlong()
        problem = method_problem(a.loss, a.eps_schedule, a.clip_ratio_c)
        if problem:
            key, why = problem
            raise ValueError(f"{where(key)}: {why}")

    def _check_overlong(self) -> None:
        """DAPO's buffer sits below a set completion cap (the task's own is checked by the trainer),
        and its term is not binary: passk, which needs binary rewards, cannot see it."""
        a, cap = self.algo, self.sampling.max_new_tokens
        if not a.overlong_buffer:
            return
        if cap is not None and a.overlong_buffer >= cap:
            raise ValueError(
                f"{self._where('algo.overlong_buffer')}: {a.overlong_buffer} must be below the completion cap "
                f"sampling.max_new_tokens={cap}"
            )
        if "passk" in (a.advantage, a.advantage_params.get("base")):
            raise ValueError(
                f"{self._where('algo.overlong_buffer')}: the overlong term makes the rewards non-binary, and "
                "the passk advantage needs binary rewards; set algo.overlong_buffer=0 or another estimator"
            )

    def _check_chat(self) -> None:
        where = self._where
        if self.task.chat not in CHAT_MODES:
            raise ValueError(f"{where('task.chat')}: must be auto, true or false, got {self.task.chat!r}")
        check_chat_template_kwargs(where("task.chat_template_kwargs"), self.task.chat_template_kwargs)
        if self.task.chat is False and self.task.chat_template_kwargs:
            raise ValueError(f"{where('task.chat_template_kwargs')}: needs a chat template, and task.chat=false")

    def _check_model(self, model_files: bool) -> None:
        """dtype, LoRA, the checkpoint folder (``model_files``), or the embedded base policy's preset."""
        where = self._where
        if self.model.dtype not in known("DTYPES"):
            raise ValueError(f"{where('model.dtype')}: {unknown('dtype', self.model.dtype, known('DTYPES'))}")
        check_lora(where("model.lora"), self.model.lora)
        if model_files:
            check_model_path(where("model.path"), self.model.path)
        if self.model.path is None:
            if self.model.base_preset not in known("BASE_PRESETS"):
                raise ValueError(
                    f"{where('model.base_preset')}: "
                    f"{unknown('base-policy preset', self.model.base_preset, known('BASE_PRESETS'))}"
                )
            if self.task.name != "countdown":
                raise ValueError(
                    f"{where('task.name')}: the embedded base policy is a Countdown model; set "
                    f"model.path (--model) to a checkpoint for task {self.task.name!r}"
                )

    def _settle_rewards(self) -> None:
        """``reward.*`` checked, and what follows from them settled, so that the saved config says
        what runs: each spec as ``gapo.tasks.custom.absolute_spec`` records it (a file by its
        absolute path, a module found only in this folder by its file's), and an unset
        ``algo.reward_range`` derived: R's range (``combined_range``; ``[0, 1]``, the verifiers',
        without ``reward.funcs``). A fixed range must hold R's (docs/design.md §2.7)."""
        r, a = self.reward, self.algo
        check_reward_config(r.funcs, r.weights, r.ranges, task=self.task.name)
        try:
            r.funcs = [absolute_spec(s) for s in r.funcs]
        except ValueError as e:
            raise ValueError(f"{self._where('reward.funcs')}: {e}") from None
        if isinstance(a.reward_range, str):
            return
        if not r.funcs:
            a.reward_range = a.reward_range or DEFAULT_RANGE
            return
        lo, hi = combined_range(r.funcs, r.weights, r.ranges)
        ws = r.weights if r.weights is not None else [1] * len(r.funcs)
        rs = r.ranges if r.ranges is not None else [DEFAULT_RANGE] * len(r.funcs)
        how = (
            f"reward.weights [{', '.join(f'{w:.12g}' for w in ws)}] over ranges "
            f"{', '.join(f'[{x:.12g}, {y:.12g}]' for x, y in rs)}"
            f"{'' if r.ranges is not None else ' (the default; reward.ranges declares others)'} "
            f"give R in [{lo:.12g}, {hi:.12g}]"
        )
        if a.reward_range is None:
            a.reward_range = (lo, hi)
            if getattr(self, "_sources", None) is None:
                object.__setattr__(self, "_sources", {})
            self._sources["algo.reward_range"] = f"derived: {how}"
            return
        tol = 1e-9 * max(1.0, abs(lo), abs(hi))  # the derivation's rounding
        if a.reward_range[0] > lo + tol or a.reward_range[1] < hi - tol:
            raise ValueError(
                f"{self._where('algo.reward_range')}: {list(a.reward_range)} does not hold the combined "
                f"reward: {how}; set algo.reward_range=[{lo:.12g}, {hi:.12g}], or leave it unset to have it "
                "derived, or declare the terms' ranges (reward.ranges)"
            )

    def _where(self, key: str) -> str:
        """``key`` plus the file and line it was read from, when it came from a YAML file."""
        src = getattr(self, "_sources", {}).get(key)
        return f"{key} ({src})" if src else key


# ------------------------------------------------------------------------------ (de)serialisation
def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def _section_types(cls) -> dict:
    return typing.get_type_hints(cls)


def _unknown_key(key: str, known=None) -> ValueError:
    """An unknown ``section.key``: the close matches first (over every key, so a misspelt section
    is caught too; for a name of TRL's GRPOConfig, bare or under any section, the gapo key it is),
    then only the keys of that section, or the sections when it has none."""
    known = sorted(known if known is not None else _all_keys())
    sec, _, rest = key.partition(".")
    close = difflib.get_close_matches(key, known, n=3)
    if sec not in _section_names():  # a misspelt section: match the section, then the key within it
        near = difflib.get_close_matches(sec, _section_names(), n=1)
        if near:
            inside = [k for k in known if k.startswith(near[0] + ".")]
            close = (
                [k for k in inside if k == f"{near[0]}.{rest}"]
                or difflib.get_close_matches(f"{near[0]}.{rest}", inside, n=3)
                or [f"section {near[0]!r}"]
            )
    hint = trl_hint(key) or (f" Did you mean {' or '.join(close)}?" if close else "")
    own = [k.split(".", 1)[1] for k in known if k.split(".", 1)[0] == sec]
    if own:
        listing = f"the keys of section {sec!r} are: {', '.join(own)}"
    else:
        listing = f"there is no section {sec!r}; the sections are: {', '.join(_section_names())}"
    return ValueError(f"unknown config key {key!r}.{hint} {listing[0].upper() + listing[1:]}.")


def _section_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


def _bad_section(sec: str, body) -> ValueError:
    """A top-level YAML entry that is not a mapping of keys: a known section written as a value,
    or an unknown name."""
    if sec in _section_names():
        example = f"{sec}.{dataclasses.fields(_section_types(Config)[sec])[0].name}"
        return ValueError(
            f"section {sec!r} must be a mapping of keys (like {example.split('.')[0]}: "
            f"{{{example.split('.')[1]}: ...}}), got {type(body).__name__} {body!r}"
        )
    close = difflib.get_close_matches(sec, _section_names(), n=2)
    hint = trl_hint(sec) or (f" Did you mean {' or '.join(close)}?" if close else "")
    return ValueError(f"unknown config section {sec!r}.{hint} The sections are: {', '.join(_section_names())}.")


def _all_keys() -> list[str]:
    sections = _section_types(Config)
    return [f"{name}.{f.name}" for name, cls in sections.items() for f in dataclasses.fields(cls)]


# keys renamed since gapo 0.1 -> their names now (one name per concept, docs/design.md §8)
RENAMED = {"algo.eps_high": "algo.eps_high_max"}


def set_key(cfg: Config, key: str, value) -> None:
    """Set ``section.field`` on ``cfg`` with type checking; ``task.params.x`` style keys set
    entries of dict fields."""
    if key in RENAMED:
        raise ValueError(
            f"config key {key!r} is now {RENAMED[key]!r} (renamed in gapo 0.2); write {RENAMED[key]}={value}"
        )
    parts = key.split(".")
    sections = {f.name: f for f in dataclasses.fields(Config)}
    if parts[0] not in sections or len(parts) < 2:
        raise _unknown_key(key)
    section = getattr(cfg, parts[0])
    hints = _section_types(type(section))
    if parts[1] not in hints:
        raise _unknown_key(key)
    if len(parts) > 2:
        if hints[parts[1]] is not dict and typing.get_origin(hints[parts[1]]) is not dict:
            head = ".".join(parts[:2])
            raise ValueError(f"config key {head!r} takes a value, not sub-keys ({key!r}); write {head}=VALUE")
        target = getattr(section, parts[1])
        if isinstance(value, str):
            value = parse_value(value, key)
        target[".".join(parts[2:])] = value
        return
    setattr(section, parts[1], coerce(value, hints[parts[1]], key))


def from_dict(d: dict) -> Config:
    """A ``Config`` from nested dicts (``to_dict``'s inverse); a renamed key is an error naming
    its new name (``RENAMED``), in a saved run's ``config.yaml`` as on the command line."""
    cfg = Config()
    if not isinstance(d, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(d).__name__}")
    for sec, body in d.items():
        if body is None:
            continue
        if not isinstance(body, dict):
            raise _bad_section(str(sec), body)
        for k, v in body.items():
            key = f"{sec}.{k}"
            set_key(cfg, key, v)
    return cfg


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for item in overrides:
        if "=" not in item:
            raise ValueError(
                f"override {item!r} must look like section.key=value (quote an override whose value "
                "has spaces: 'task.params={a: 1, b: 2}')"
            )
        k, v = item.split("=", 1)
        set_key(cfg, k.strip(), v)
    return cfg


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, *, base: dict | None = None
) -> Config:
    """Defaults (or ``base``, a saved config dict), then the YAML file (optional), then
    ``key=value`` overrides; validated."""
    cfg = from_dict(base) if base is not None else Config()
    sources: dict[str, str] = {}
    if path is not None:
        data, lines = read_yaml(path)
        if not isinstance(data, dict):
            raise ValueError(
                f"config file {str(path)!r}: must be a mapping of sections (task, reward, model, sampling, "
                f"algo, optim, train, eval, log), got {type(data).__name__}"
            )
        fresh = Config() if base is None else cfg
        for sec, body in data.items():
            at = f"config file {str(path)!r}, line {lines.get(str(sec), '?')}"
            if body is None:
                continue
            if not isinstance(body, dict):
                raise ValueError(f"{at}: {_bad_section(str(sec), body)}")
            for k, v in body.items():
                try:
                    set_key(fresh, f"{sec}.{k}", v)
                except ValueError as e:
                    raise ValueError(f"config file {str(path)!r}, line {lines.get(f'{sec}.{k}', '?')}: {e}") from None
        cfg = fresh
        sources = {k: f"{Path(path).name}:{n}" for k, n in lines.items()}
    apply_overrides(cfg, overrides or [])
    for item in overrides or []:
        sources[item.split("=", 1)[0].strip()] = "command line"
    object.__setattr__(cfg, "_sources", sources)
    return cfg.validate()
