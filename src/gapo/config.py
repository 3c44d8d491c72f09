"""Run configuration: one dataclass per component, loaded from YAML plus ``key=value`` overrides.

    gapo train --config run.yaml algo.eps_schedule=linear algo.eps_high=0.28 train.steps=50

Unknown keys and wrong types are rejected with the key, the accepted values and close matches;
impossible combinations (``G < 2``, mini-batches that do not divide the batch, …) are rejected
by ``Config.validate`` before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Config", "load_config", "apply_overrides", "to_dict", "from_dict"]


@dataclass
class TaskConfig:
    name: str = "countdown"  # a gapo.tasks name: countdown, arithmetic, math, rg, humaneval, mbpp
    params: dict = field(default_factory=dict)  # passed to gapo.tasks.get(name, **params)
    train_size: int = 20000  # at most this many distinct training problems (pool = min(this, prompts × steps))
    scoring_workers: int = 0  # >0: score in a process pool (slow verifiers)


@dataclass
class ModelConfig:
    path: str | None = None  # local HF checkpoint or hub id; None: the embedded base policy
    base_preset: str = "low"  # embedded base policy preset when path is None (low | high)
    device: str = "cpu"
    threads: int | None = None  # torch threads; None: 1 on CPU (measured fastest on 2 cores)


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the task's max_completion_len + 1 (EOS)


@dataclass
class AlgoConfig:
    advantage: str = "drgrpo"  # drgrpo | grpo | rloo | passk | focal
    advantage_params: dict = field(default_factory=dict)  # e.g. {eps: 1e-6}, {k: 4}, {gamma: 1, base: drgrpo}
    loss: str = "ppo"  # ppo (token ratio) | gspo (sequence ratio) | cispo
    eps_schedule: str = "fixed"  # fixed | linear (GAPO Eq. 11) | log (GAPO exact form)
    eps_low: float = 0.2
    eps_high: float = 0.2  # the constant (fixed) or GAPO's ε_high_max (linear/log)
    reward_range: tuple[float, float] = (0.0, 1.0)
    clip_ratio_c: float | None = None  # dual clip for A < 0 (verl default 3.0)
    agg: str = "token-mean"
    kl_coef: float = 0.0  # reference-policy KL penalty in the loss
    kl_estimator: str = "k3"  # k1 | k3
    entropy_coef: float = 0.0  # entropy bonus
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups and refill
    max_refill_rounds: int = 3
    old_logp: str = "recompute"  # recompute (full forward before updates) | sampler (reuse sampling log-probs)


@dataclass
class OptimConfig:
    lr: float = 5e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 100  # rollout batches
    prompts: int = 16  # P prompts per rollout batch
    group_size: int = 8  # G rollouts per prompt
    mini_batches: int = 4  # optimiser steps per epoch over the rollout batch
    epochs: int = 1
    seed: int = 0
    checkpoint_every: int = 50  # steps; 0 disables periodic checkpoints (the last one is always saved)
    progress: bool = True


@dataclass
class EvalConfig:
    every: int = 25  # steps; 0: only before and after training
    problems: int = 64
    samples: int = 16  # n samples per problem (unbiased pass@k for k = 1, 2, 4, …, n)
    temperature: float = 1.0
    seed: int = 1234


@dataclass
class LogConfig:
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "gapo"


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> "Config":
        """Reject impossible combinations before any work is done."""
        from gapo import tasks
        from gapo._checks import unknown
        from gapo.advantages import ADVANTAGES
        from gapo.aggregation import AGG_MODES
        from gapo.clipping import EPS_SCHEDULES
        from gapo.losses import LOSSES

        a, t = self.algo, self.train
        if self.task.name not in tasks.names():
            raise unknown("task", self.task.name, tasks.names())
        for kind, name, known in (("advantage estimator", a.advantage, ADVANTAGES), ("policy loss", a.loss, LOSSES),
                                  ("eps schedule", a.eps_schedule, EPS_SCHEDULES), ("aggregation mode", a.agg, AGG_MODES),
                                  ("kl estimator", a.kl_estimator, ("k1", "k3")),
                                  ("old_logp source", a.old_logp, ("recompute", "sampler"))):
            if name not in known:
                raise unknown(kind, name, known)
        if t.group_size < 2:
            raise ValueError(f"train.group_size must be >= 2 (GRPO needs a group baseline), got {t.group_size}")
        if t.prompts < 1 or t.steps < 0 or t.epochs < 1 or t.mini_batches < 1:
            raise ValueError("train.prompts, train.epochs and train.mini_batches must be >= 1, train.steps >= 0")
        batch = t.prompts * t.group_size
        if batch % t.mini_batches:
            raise ValueError(f"train.mini_batches={t.mini_batches} does not divide the rollout batch "
                             f"prompts × group_size = {t.prompts} × {t.group_size} = {batch}")
        if not 0 <= a.eps_low < 1 or a.eps_high < 0:
            raise ValueError(f"need 0 <= algo.eps_low < 1 and algo.eps_high >= 0, got {a.eps_low}, {a.eps_high}")
        if a.eps_schedule != "fixed" and a.eps_high < a.eps_low:
            raise ValueError(f"GAPO schedule {a.eps_schedule!r} needs algo.eps_high (ε_high_max) >= algo.eps_low")
        if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
            raise ValueError(f"algo.clip_ratio_c must be > 1, got {a.clip_ratio_c}")
        if a.loss == "cispo" and a.clip_ratio_c is not None:
            raise ValueError("algo.clip_ratio_c (dual clip) is not defined for the cispo loss")
        if self.eval.samples < 1 or self.eval.problems < 0:
            raise ValueError("eval.samples must be >= 1 and eval.problems >= 0")
        if self.optim.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.optim.lr}")
        if self.sampling.temperature <= 0:
            raise ValueError("sampling.temperature must be > 0 for RL (log-probs of a greedy policy are undefined)")
        if self.model.path is None:
            from gapo.pretrain import PRESETS
            if self.model.base_preset not in PRESETS:
                raise unknown("base-policy preset", self.model.base_preset, PRESETS)
        return self


# ------------------------------------------------------------------------------ (de)serialisation
def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def _section_types(cls) -> dict:
    return typing.get_type_hints(cls)


def _coerce(value, tp, key: str):
    """Coerce ``value`` (from YAML or a ``key=value`` string) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # X | None
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
            return None
        for a in args:
            if a is not type(None):
                try:
                    return _coerce(value, a, key)
                except ValueError:
                    pass
        raise ValueError(f"{key}: cannot interpret {value!r} as {tp}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"{key}: expected {tp.__name__}, got {value!r}")
        try:
            out = tp(value) if not isinstance(value, str) else tp(float(value)) if tp is float else int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: expected {tp.__name__}, got {value!r}") from None
        if tp is int and isinstance(value, float) and value != int(value):
            raise ValueError(f"{key}: expected int, got {value!r}")
        return out
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            import yaml
            value = yaml.safe_load(value)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args))
    if tp is dict or origin is dict:
        if isinstance(value, str):
            import yaml
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _unknown_key(key: str, known) -> ValueError:
    close = difflib.get_close_matches(key, known, n=3)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return ValueError(f"unknown config key {key!r}; accepted: {sorted(known)}.{hint}")


def _all_keys() -> list[str]:
    sections = _section_types(Config)
    return [f"{name}.{f.name}" for name, cls in sections.items() for f in dataclasses.fields(cls)]


def set_key(cfg: Config, key: str, value) -> None:
    """Set ``section.field`` on ``cfg`` with type checking; ``task.params.x`` style keys set
    entries of dict fields."""
    parts = key.split(".")
    sections = {f.name: f for f in dataclasses.fields(Config)}
    if parts[0] not in sections or len(parts) < 2:
        raise _unknown_key(key, _all_keys())
    section = getattr(cfg, parts[0])
    hints = _section_types(type(section))
    if parts[1] not in hints:
        raise _unknown_key(key, _all_keys())
    if len(parts) > 2:
        if hints[parts[1]] is not dict and typing.get_origin(hints[parts[1]]) is not dict:
            raise _unknown_key(key, _all_keys())
        target = getattr(section, parts[1])
        if isinstance(value, str):
            import yaml
            value = yaml.safe_load(value)
        target[".".join(parts[2:])] = value
        return
    setattr(section, parts[1], _coerce(value, hints[parts[1]], key))


def from_dict(d: dict) -> Config:
    cfg = Config()
    if not isinstance(d, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(d).__name__}")
    for sec, body in d.items():
        if body is None:
            continue
        if not isinstance(body, dict):
            raise _unknown_key(str(sec), [f.name for f in dataclasses.fields(Config)])
        for k, v in body.items():
            set_key(cfg, f"{sec}.{k}", v)
    return cfg


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like section.key=value")
        k, v = item.split("=", 1)
        set_key(cfg, k.strip(), v)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """YAML file (optional) then ``key=value`` overrides; validated."""
    import yaml

    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file {str(p)!r} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"config file {str(p)!r} is not valid YAML: {e}") from e
        cfg = from_dict(data)
    apply_overrides(cfg, overrides or [])
    return cfg.validate()
