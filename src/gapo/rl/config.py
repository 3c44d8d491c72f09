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

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

__all__ = ["Config", "load_config", "apply_overrides", "to_dict", "from_dict", "diff", "DOMAINS"]


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
    eps_high_max: float = 0.2  # the upper width: the constant (fixed), GAPO's maximum (linear/log)
    reward_range: tuple[float, float] | str = (0.0, 1.0)  # (R_min, R_max) | group | batch
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
        """Reject out-of-domain values and impossible combinations before any work is done.

        Checks that need the model (``sampling.max_new_tokens`` within its context) run when the
        trainer has loaded it, still before the run folder is touched.
        """
        from gapo import tasks
        from gapo.core.checks import unknown
        from gapo.core.advantages import ADVANTAGES
        from gapo.core.aggregation import AGG_MODES
        from gapo.core.clipping import EPS_SCHEDULES
        from gapo.core.losses import LOSSES

        where = self._where
        for key, check in DOMAINS.items():
            sec, name = key.split(".")
            problem = check(getattr(getattr(self, sec), name))
            if problem:
                raise ValueError(f"{where(key)}: {problem}")
        a, t = self.algo, self.train
        if self.task.name not in tasks.names():
            raise ValueError(f"{where('task.name')}: {unknown('task', self.task.name, tasks.names())}")
        for key, kind, name, known in (
                ("algo.advantage", "advantage estimator", a.advantage, ADVANTAGES),
                ("algo.loss", "policy loss", a.loss, LOSSES),
                ("algo.eps_schedule", "eps schedule", a.eps_schedule, EPS_SCHEDULES),
                ("algo.agg", "aggregation mode", a.agg, AGG_MODES),
                ("algo.kl_estimator", "kl estimator", a.kl_estimator, ("k1", "k3")),
                ("algo.old_logp", "old_logp source", a.old_logp, ("recompute", "sampler"))):
            if name not in known:
                raise ValueError(f"{where(key)}: {unknown(kind, name, known)}")
        check_params(where("algo.advantage_params"), a.advantage_params, advantage_params(a.advantage))
        check_params(where("task.params"), self.task.params, task_params(self.task.name))
        batch = t.prompts * t.group_size
        if batch % t.mini_batches:
            raise ValueError(f"{where('train.mini_batches')}: {t.mini_batches} does not divide the rollout batch "
                             f"prompts × group_size = {t.prompts} × {t.group_size} = {batch}")
        if a.eps_schedule != "fixed" and a.eps_high_max < a.eps_low:
            raise ValueError(f"{where('algo.eps_high_max')}: GAPO schedule {a.eps_schedule!r} needs "
                             f"algo.eps_high_max >= algo.eps_low ({a.eps_low}), got {a.eps_high_max}")
        if a.loss == "cispo" and a.clip_ratio_c is not None:
            raise ValueError(f"{where('algo.clip_ratio_c')}: the dual clip is not defined for the cispo loss; "
                             "leave it unset (none)")
        check_device(where("model.device"), self.model.device)
        if self.model.path is None:
            from gapo.policy.base_policy import PRESETS
            if self.model.base_preset not in PRESETS:
                raise ValueError(f"{where('model.base_preset')}: {unknown('base-policy preset', self.model.base_preset, PRESETS)}")
            if self.task.name != "countdown":
                raise ValueError(f"{where('task.name')}: the embedded base policy is a Countdown model; set "
                                 f"model.path (--model) to a checkpoint for task {self.task.name!r}")
        return self

    def _where(self, key: str) -> str:
        """``key`` plus the file and line it was read from, when it came from a YAML file."""
        src = getattr(self, "_sources", {}).get(key)
        return f"{key} ({src})" if src else key


# ------------------------------------------------------------------------------ value domains
def _num(lo=None, hi=None, *, lo_open=False, hi_open=False, optional=False, integer=False):
    """A domain check: ``value -> None`` when accepted, else what is accepted and what was given."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")
    kind = "an integer" if integer else "a finite number"
    text = f"must be {kind}{' ' + ' and '.join(parts) if parts else ''}{' or none' if optional else ''}"

    def check(v):
        if v is None:
            return None if optional else f"{text}, got none"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"{text}, got {v!r}"
        bad = ((lo is not None and (v <= lo if lo_open else v < lo))
               or (hi is not None and (v >= hi if hi_open else v > hi)))
        return f"{text}, got {v!r}" if bad else None
    return check


def _pair(check, what: str):
    def pair(v):
        for x in v:
            problem = check(x)
            if problem:
                return f"{what}: each {problem}"
        return None
    return pair


def _reward_range(v):
    if isinstance(v, str):
        return None if v in ("group", "batch") else f"must be [R_min, R_max], 'group' or 'batch', got {v!r}"
    lo, hi = v
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        return f"must be [R_min, R_max] with finite R_min < R_max, 'group' or 'batch', got {list(v)}"
    return None


_INT_MAX = 2**31 - 1  # anything larger is a typo, and would overflow torch's index types
DOMAINS = {
    "task.train_size": _num(1, _INT_MAX, integer=True),
    "task.scoring_workers": _num(0, 256, integer=True),
    "model.threads": _num(1, 1024, integer=True, optional=True),
    "sampling.temperature": _num(0, 100, lo_open=True),
    "sampling.top_p": _num(0, 1, lo_open=True),
    "sampling.max_new_tokens": _num(1, 2**20, integer=True, optional=True),
    "algo.eps_low": _num(0, 1, hi_open=True),
    "algo.eps_high_max": _num(0, 100),
    "algo.reward_range": _reward_range,
    "algo.clip_ratio_c": _num(1, None, lo_open=True, optional=True),
    "algo.kl_coef": _num(0),
    "algo.entropy_coef": _num(0),
    "algo.max_refill_rounds": _num(0, 1000, integer=True),
    "optim.lr": _num(0, 1, lo_open=True),
    "optim.weight_decay": _num(0),
    "optim.betas": _pair(_num(0, 1, hi_open=True), "two values"),
    "optim.warmup_steps": _num(0, _INT_MAX, integer=True),
    "optim.grad_clip": _num(0, None, lo_open=True),
    "train.steps": _num(0, _INT_MAX, integer=True),
    "train.prompts": _num(1, 2**20, integer=True),
    "train.group_size": _num(2, 2**16, integer=True),
    "train.mini_batches": _num(1, 2**20, integer=True),
    "train.epochs": _num(1, 10_000, integer=True),
    "train.seed": _num(0, 2**63 - 1, integer=True),
    "train.checkpoint_every": _num(0, _INT_MAX, integer=True),
    "eval.every": _num(0, _INT_MAX, integer=True),
    "eval.problems": _num(0, 2**20, integer=True),
    "eval.samples": _num(1, 2**16, integer=True),
    "eval.temperature": _num(0, 100, lo_open=True),
    "eval.seed": _num(0, 2**63 - 1, integer=True),
}


def advantage_params(name: str) -> set[str] | None:
    """The keyword parameters estimator ``name`` accepts (focal: its own plus its base's)."""
    from gapo.core.advantages import ADVANTAGES

    fn = ADVANTAGES.get(name)
    if fn is None:
        return None
    out = _keyword_names(fn, keyword_only=True) - {"reward_range"}
    if name == "focal":  # focal passes the rest on to its base estimator
        out |= {n for b in ADVANTAGES if b != "focal" for n in _keyword_names(ADVANTAGES[b], keyword_only=True)}
    return out


def task_params(name: str) -> set[str] | None:
    """The constructor parameters of task ``name`` (walking up ``**kwargs`` to the base class)."""
    from gapo import tasks

    try:
        cls = tasks.factory(name)
    except ImportError:  # the task's extra is missing: its own error comes when it is built
        return None
    return _keyword_names(cls)


def _keyword_names(obj, *, keyword_only: bool = False) -> set[str]:
    import inspect

    names: set[str] = set()
    kinds = (inspect.Parameter.KEYWORD_ONLY,) if keyword_only else (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    targets = [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if isinstance(obj, type) else [obj]
    for fn in targets:
        params = inspect.signature(fn).parameters.values()
        names |= {p.name for p in params if p.kind in kinds and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def check_params(key: str, params: dict, accepted: set[str] | None) -> None:
    """Unknown entries of a dict-valued parameter are errors, with close matches."""
    if accepted is None:
        return
    for k in params:
        if k not in accepted:
            close = difflib.get_close_matches(str(k), accepted, n=3)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(f"{key}: unknown entry {k!r}; accepted: {sorted(accepted)}.{hint}")


def check_device(key: str, device: str) -> None:
    """The device parses and exists on this machine."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{key}: {device!r} is not a device name (cpu, cuda, cuda:1, mps): {e}") from None
    if d.type == "cpu":
        return
    backend = getattr(torch, d.type, None) if d.type != "mps" else torch.backends.mps
    available = bool(backend is not None and getattr(backend, "is_available", lambda: False)())
    if not available:
        raise ValueError(f"{key}: device {device!r} is not available on this machine; use model.device=cpu")
    count = getattr(backend, "device_count", lambda: 1)()
    if d.index is not None and d.index >= count:
        raise ValueError(f"{key}: device {device!r} does not exist; this machine has {count} {d.type} device(s)")


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
            value = _yaml(value)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args))
    if tp is dict or origin is dict:
        if isinstance(value, str):
            value = _yaml(value)
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


# keys renamed since gapo 0.1 -> their names now (one name per concept, docs/design.md §8)
RENAMED = {"algo.eps_high": "algo.eps_high_max"}


def set_key(cfg: Config, key: str, value) -> None:
    """Set ``section.field`` on ``cfg`` with type checking; ``task.params.x`` style keys set
    entries of dict fields."""
    if key in RENAMED:
        raise ValueError(f"config key {key!r} is now {RENAMED[key]!r} (renamed in gapo 0.2); "
                         f"write {RENAMED[key]}={value}")
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
            value = _yaml(value)
        target[".".join(parts[2:])] = value
        return
    setattr(section, parts[1], _coerce(value, hints[parts[1]], key))


def from_dict(d: dict, *, migrate: bool = False) -> Config:
    """A ``Config`` from nested dicts (``to_dict``'s inverse). ``migrate=True`` (a saved run's
    ``config.yaml``) maps renamed keys to their new names instead of rejecting them."""
    cfg = Config()
    if not isinstance(d, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(d).__name__}")
    for sec, body in d.items():
        if body is None:
            continue
        if not isinstance(body, dict):
            raise _unknown_key(str(sec), [f.name for f in dataclasses.fields(Config)])
        for k, v in body.items():
            key = f"{sec}.{k}"
            set_key(cfg, RENAMED.get(key, key) if migrate else key, v)
    return cfg


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like section.key=value")
        k, v = item.split("=", 1)
        set_key(cfg, k.strip(), v)
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader for which a repeated key in one mapping is an error, not a silent
    last-one-wins."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ValueError(f"line {line}: duplicate key {key!r} (first set at line {seen[key]})")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# YAML 1.1 reads ``1e-4`` (no dot) as a string; in a config that is always a number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _yaml(text: str):
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _key_lines(text: str) -> dict[str, int]:
    """``section.key -> line`` of a config file's two top levels (for messages)."""
    out: dict[str, int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        return out
    for sec_key, sec in root.value:
        out[str(sec_key.value)] = sec_key.start_mark.line + 1
        if isinstance(sec, yaml.MappingNode):
            for k, _ in sec.value:
                out[f"{sec_key.value}.{k.value}"] = k.start_mark.line + 1
    return out


def read_yaml(path: str | Path) -> tuple[dict, dict[str, int]]:
    """A YAML config file as ``(data, key -> line)``; errors name the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist" + (" (it is a folder)" if p.is_dir() else ""))
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"config file {str(p)!r}, line {line}: not UTF-8 text (byte {raw[e.start]:#04x} at "
                         f"offset {e.start}); save the file as UTF-8") from None
    try:
        data = _yaml(text)
        lines = _key_lines(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"config file {str(p)!r}{at}: not valid YAML: {e}") from None
    except ValueError as e:
        raise ValueError(f"config file {str(p)!r}, {e}") from None
    return (data if data is not None else {}), lines


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                base: dict | None = None) -> Config:
    """Defaults (or ``base``, a saved config dict), then the YAML file (optional), then
    ``key=value`` overrides; validated."""
    cfg = from_dict(base, migrate=True) if base is not None else Config()
    sources: dict[str, str] = {}
    if path is not None:
        data, lines = read_yaml(path)
        if not isinstance(data, dict):
            raise ValueError(f"config file {str(path)!r}: must be a mapping of sections (task, model, sampling, "
                             f"algo, optim, train, eval, log), got {type(data).__name__}")
        fresh = Config() if base is None else cfg
        for sec, body in data.items():
            at = f"config file {str(path)!r}, line {lines.get(str(sec), '?')}"
            if body is None:
                continue
            if not isinstance(body, dict):
                raise ValueError(f"{at}: {_unknown_key(str(sec), [f.name for f in dataclasses.fields(Config)])}")
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


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"algo": {"eps_low": 0.2}} -> {"algo.eps_low": 0.2}`` (dict-valued params flattened too)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            sub = flatten(v, key + ".")
            out.update(sub if sub else {key: {}})
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def diff(old: dict, new: dict) -> dict[str, tuple]:
    """Keys whose values differ between two config dicts: ``key -> (old, new)``."""
    a, b = flatten(old), flatten(new)
    missing = object()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing)}
