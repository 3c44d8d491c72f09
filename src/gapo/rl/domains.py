"""The domain of every config value, and the checks of dict-valued params against what the
component accepts (docs/design.md §8). ``gapo.rl.config.Config.validate`` applies them.

Nothing here imports torch at module level (the names come from ``gapo.rl.names``): a bad value
is reported before the heavy libraries load. Only a device other than the CPU needs torch.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
import typing
from pathlib import Path

from gapo import tasks
from gapo.rl import names
from gapo.rl.config_io import coerce
from gapo.tasks.base import group_params

__all__ = [
    "DOMAINS",
    "advantage_params",
    "check_advantage_params",
    "task_params",
    "check_params",
    "check_model_path",
    "check_task_files",
    "check_device",
]


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
        bad = (lo is not None and (v <= lo if lo_open else v < lo)) or (
            hi is not None and (v >= hi if hi_open else v > hi)
        )
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
    if v is None:  # unset: Config.validate derives it
        return None
    if isinstance(v, str):
        return None if v in ("group", "batch") else f"must be [R_min, R_max], 'group' or 'batch', got {v!r}"
    lo, hi = v
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        return f"must be [R_min, R_max] with finite R_min < R_max, 'group' or 'batch', got {list(v)}"
    return None


_ROWS = _num(1, 2**20, integer=True)


def _micro_batch_size(v):
    if v is None or v == "auto" or _ROWS(v) is None:
        return None
    return f"must be 'auto', an integer >= 1 and <= {2**20} or none, got {v!r}"


def _stop_strings(v):
    if not isinstance(v, list) or any(not isinstance(s, str) or not s for s in v):
        return f'must be a list of non-empty strings (e.g. ["</answer>"]), got {v!r}'
    return None


_INT_MAX = 2**31 - 1  # anything larger is a typo, and would overflow torch's index types
DOMAINS = {
    "task.train_size": _num(1, _INT_MAX, integer=True),
    "task.scoring_workers": _num(0, 256, integer=True),
    "reward.timeout_s": _num(0, 86400, lo_open=True),
    "task.max_prompt_tokens": _num(1, 2**20, integer=True, optional=True),
    "log.samples_every": _num(0, 2**31 - 1, integer=True),
    "model.threads": _num(1, 1024, integer=True, optional=True),
    "sampling.temperature": _num(0, 100, lo_open=True),
    "sampling.top_p": _num(0, 1, lo_open=True),
    "sampling.max_new_tokens": _num(1, 2**20, integer=True, optional=True),
    "sampling.stop": _stop_strings,
    "sampling.top_k": _num(0, _INT_MAX, integer=True),
    "sampling.min_p": _num(0, 1),
    "sampling.repetition_penalty": _num(0, 100, lo_open=True),
    "algo.eps_low": _num(0, 1, hi_open=True),
    "algo.eps_high_max": _num(0, 100),
    "algo.reward_range": _reward_range,
    "algo.clip_ratio_c": _num(1, None, lo_open=True, optional=True),
    "algo.kl_coef": _num(0),
    "algo.entropy_coef": _num(0),
    "algo.max_refill_rounds": _num(0, 1000, integer=True),
    "algo.overlong_buffer": _num(0, 2**20, integer=True),
    "algo.overlong_penalty": _num(0),
    "algo.top_entropy_quantile": _num(0, 1, lo_open=True),
    "optim.lr": _num(0, 1, lo_open=True),
    "optim.weight_decay": _num(0),
    "optim.betas": _pair(_num(0, 1, hi_open=True), "two values"),
    "optim.warmup_steps": _num(0, _INT_MAX, integer=True),
    "optim.grad_clip": _num(0, None, lo_open=True),
    "train.steps": _num(0, _INT_MAX, integer=True),
    "train.prompts": _num(1, 65536, integer=True),
    "train.group_size": _num(2, 1024, integer=True),
    "train.mini_batches": _num(1, 2**20, integer=True),
    "train.epochs": _num(1, 10_000, integer=True),
    "train.micro_batch_size": _micro_batch_size,
    "log.samples": _num(0, 4096, integer=True),
    "train.seed": _num(0, 2**63 - 1, integer=True),
    "train.checkpoint_every": _num(0, _INT_MAX, integer=True),
    "train.keep_checkpoints": _num(0, 10_000, integer=True),
    "eval.every": _num(0, _INT_MAX, integer=True),
    "eval.problems": _num(0, 100_000, integer=True),
    "eval.samples": _num(1, 4096, integer=True),
    "eval.temperature": _num(0, 100, lo_open=True),
    "eval.top_p": _num(0, 1, lo_open=True),
    "eval.seed": _num(0, 2**63 - 1, integer=True),
}


def advantage_params(name: str) -> set[str] | None:
    """The keyword parameters estimator ``name`` accepts (focal: its own plus its base's): read from
    the functions' signatures when ``gapo.core.advantages`` is loaded (estimators registered at run
    time included), else from ``gapo.rl.names.ADVANTAGE_PARAMS`` (tested to agree)."""
    live = names.registry("ADVANTAGES")
    if live is None:
        if name not in names.ADVANTAGE_PARAMS:
            return None
        out = set(names.ADVANTAGE_PARAMS[name])
        if name == "focal":
            out |= {n for b, ps in names.ADVANTAGE_PARAMS.items() if b != "focal" for n in ps}
        return out
    fn = live.get(name)
    if fn is None:
        return None
    out = _keyword_names(fn, keyword_only=True) - {"reward_range"}
    if name == "focal":  # focal passes the rest on to its base estimator
        out |= {n for b in live if b != "focal" for n in _keyword_names(live[b], keyword_only=True)}
    return out


def check_advantage_params(key: str, name: str, params: dict, group_size: int) -> None:
    """The values of ``algo.advantage_params`` for estimator ``name`` (their names are checked by
    :func:`check_params`), against the rollout group size ``G``: passk's ``k`` is an integer in
    ``[1, G]`` (its default 4 included: pass@k of a group of G < k is undefined), grpo's ``eps``
    a finite number >= 0 and ``std`` unbiased | population, focal's ``gamma`` >= 0 and ``base``
    another estimator (whose own params are checked the same way). Errors here, not at the
    first step after the run folder was written."""
    if name == "focal":
        base = params.get("base", "drgrpo")
        gamma = params.get("gamma", 1.0)
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not math.isfinite(gamma) or gamma < 0:
            raise ValueError(f"{key}: focal's gamma must be a finite number >= 0, got {gamma!r}")
        choices = [n for n in names.known("ADVANTAGES") if n != "focal"]
        if base not in choices:
            close = difflib.get_close_matches(str(base), choices, n=2)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"{key}: focal's base must be another advantage estimator, one of {choices}, got {base!r}.{hint}"
            )
        # the rest goes to the base, which takes only its own (gapo.core.advantages rejects others)
        own = advantage_params(base)
        extra = sorted(set(params) - {"gamma", "base"} - (own if own is not None else set(params)))
        if extra:
            raise ValueError(
                f"{key}: {extra[0]!r} is not a parameter of focal's base estimator {base!r}; "
                f"focal takes gamma, base and {base}'s own: {sorted(own) or 'none'}"
            )
        name = base
    if name == "passk":
        k = params.get("k", names.PASSK_DEFAULT_K)
        given = "k" in params
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{key}: passk's k must be an integer >= 1, got {k!r}")
        if k > group_size:
            what = f"k={k}" if given else f"default k={k}"
            raise ValueError(
                f"{key}: passk's {what} exceeds the group size train.group_size={group_size} "
                f"(pass@k needs k <= G rollouts per prompt); set algo.advantage_params={{k: "
                f"{min(group_size, names.PASSK_DEFAULT_K)}}} or raise train.group_size to >= {k}"
            )
    if name == "grpo":
        eps = params.get("eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise ValueError(f"{key}: grpo's eps must be a finite number >= 0, got {eps!r}")
        std = params.get("std", "unbiased")
        if std not in ("unbiased", "population"):
            raise ValueError(f"{key}: grpo's std must be 'unbiased' or 'population', got {std!r}")


def task_params(name: str) -> set[str] | None:
    """The constructor parameters of task ``name`` (walking up ``**kwargs`` to the base class),
    with the fields of its parameter groups (:func:`gapo.tasks.base.group_params`)."""
    try:
        cls = tasks.factory(name)
    except ImportError:  # the task's extra is missing: its own error comes when it is built
        return None
    return _keyword_names(cls) | (set(group_params(cls)) if isinstance(cls, type) else set())


def check_task_param_types(key: str, name: str, params: dict) -> None:
    """Each entry of ``task.params`` has the type its task's constructor declares (``int``,
    ``float``, ``str``, ``bool``, tuples of them, ``X | None``): ``n_numbers=abc`` is an error here,
    not an exception from inside the task."""
    try:
        cls = tasks.factory(name)
    except ImportError:
        return
    hints = dict(group_params(cls)) if isinstance(cls, type) else {}
    for c in cls.__mro__:
        if "__init__" in vars(c):
            try:
                hints = {**typing.get_type_hints(c.__init__), **hints}
            except Exception:  # noqa: BLE001 - an annotation that cannot be resolved: nothing to check against
                pass
    for k, v in params.items():
        tp = hints.get(k)
        if tp is None or tp is inspect.Parameter.empty:
            continue
        try:
            coerce(v, tp, f"{key}.{k}")
        except ValueError as e:
            raise ValueError(f"{e} (task {name!r})") from None
        except TypeError:  # an annotation coerce does not know (e.g. Callable): not checked
            continue


def _keyword_names(obj, *, keyword_only: bool = False) -> set[str]:
    names: set[str] = set()
    kinds = (
        (inspect.Parameter.KEYWORD_ONLY,)
        if keyword_only
        else (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
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


def check_model_path(key: str, path: str | None) -> None:
    """``model.path`` names a Hugging Face model folder (with ``config.json``) or is shaped like a
    hub id (``org/name``); the same rule as ``gapo.policy.model.load_policy``, checked before the
    model (and torch) load. Whether the folder holds a causal LM is checked when it loads."""
    if path is None:
        return
    name = str(path)
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ValueError(f"{key}: model path {name!r} is not a directory")
        if not (local / "config.json").is_file():
            raise ValueError(f"{key}: model path {name!r} has no config.json; it is not a Hugging Face model folder")
        return
    if not name or name.count("/") > 1 or name.startswith((".", "/", "~")):
        raise ValueError(f"{key}: model path {name!r} does not exist")


def check_task_files(key: str, name: str, params: dict) -> None:
    """A dataset path in ``task.params.path`` exists (gapo reads local files only); reading and
    checking its rows is the task's constructor's job, when the run builds it."""
    path = params.get("path")
    if isinstance(path, str) and path and not Path(path).expanduser().exists():
        raise ValueError(
            f"{key}: dataset {path!r} not found (no such file or folder) for task {name!r}; gapo reads local files only"
        )


# torch's device types (c10 DeviceType names) plus common out-of-tree backends; anything else is
# a typo, reported without importing torch
_DEVICE_TYPES = frozenset(
    {
        "cpu",
        "cuda",
        "mps",
        "xpu",
        "hip",
        "hpu",
        "mtia",
        "xla",
        "meta",
        "npu",
        "maia",
        "ipu",
        "privateuseone",
        "ve",
        "fpga",
        "lazy",
        "vulkan",
        "mkldnn",
        "opengl",
        "opencl",
        "ideep",
    }
)


def check_device(key: str, device: str) -> None:
    """The device parses and exists on this machine. ``cpu`` is answered without torch; any
    other device needs torch to ask the backend (so ``Config.validate`` checks it last)."""
    if isinstance(device, str) and re.fullmatch(r"cpu(:0)?", device):
        return
    m = re.fullmatch(r"([a-z_]+)(:\d+)?", device) if isinstance(device, str) else None
    if m is None or m.group(1) not in _DEVICE_TYPES:  # answered without loading torch
        raise ValueError(f"{key}: {device!r} is not a device name (cpu, cuda, cuda:1, mps, xpu)")
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
