"""Rewards of your own: ``--reward module.path:function`` or ``--reward my_rewards.py:function``.

A reward function is called once per completion::

    def my_reward(prompt: str, completion: str, **fields) -> float | None: ...

- ``prompt``: the task's prompt text (the user turn, before any chat template);
- ``completion``: the decoded completion;
- ``fields``: the problem's fields. For ``data:PATH`` the dataset row's prompt column and its
  ``answer_fields`` columns, under their column names; for any other task ``answer`` (the task's
  reference answer, e.g. the gold of ``math:PATH``) and the problem's details (``math``:
  ``question``, ``solution``; ``countdown``: ``numbers``, ``target``, ...). A function may take
  ``**fields`` or name only the fields it uses (``def f(prompt, completion, answer)``); naming a
  field the task does not have is an error before the run.

It returns a number (``int``/``float``, numpy or 0-d tensor scalars; not a ``bool`` and not a
string such as ``"1"``), or ``None`` when it does not apply to this completion ("skip").

Several rewards (``--reward a:f --reward b:g reward.weights=[1, 0.5]``; default weight 1 each)
combine, per completion, with ``S`` the terms that did not return ``None`` and ``W = Σ_k w_k``::

    R = W · Σ_{k∈S} w_k r_k / Σ_{k∈S} w_k

the weighted sum when no term skips (``S`` = all); a skipped term is left out and the others'
weights renormalised, so R keeps the same scale (with terms on one range, a skipped format term
neither lowers nor raises the ceiling a completion can reach, which matters for GAPO's success
count ``c``, computed from R on ``algo.reward_range``: ``c = round(Σ_group (R − R_min)/(R_max −
R_min))``, docs/design.md §2.7). When every term skips (or only zero-weight terms answer) R = 0
and the completion counts as ``unparsable``.

Each term has a range, ``reward.ranges`` (one ``[lo, hi]`` per term; default ``[0, 1]``, the
built-in verifiers' range). A term's value outside its range is an error naming the term (checked
whenever ``algo.reward_range`` is fixed; under ``group``/``batch`` only for declared ranges).
:func:`combined_range` gives R's range over every pattern of skipped terms (the task's verifier
never skips); an unset ``algo.reward_range`` is that range, a fixed one must hold it.

The name ``task`` (``--reward task``) is the task's own verifier as one term; without it,
``--reward`` replaces the task's verifier. Each term is logged as ``reward/<name>`` (its mean over
the completions it scored, ``reward/n_<name>`` of them); ``<name>`` is the function's name, and
may not collide with the scoring statistics under ``reward/`` (``mean``, ``n``, a status).


The functions run where the built-in verifiers run (in the scoring pool's workers with
``task.scoring_workers > 0``), under the same timeouts: what travels to a worker is the spec
(module path or the file's absolute path, and the function's name), never the function object,
so each worker imports it itself. A module path is looked up on ``sys.path`` and then in the
directory the run started in; :func:`absolute_spec` records a module found only there by its
file's path, so a saved run finds it from any folder.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import numbers
import os
import sys

from gapo.exec.scoring import STATUSES

__all__ = [
    "RewardTerm",
    "RewardTask",
    "parse_spec",
    "absolute_spec",
    "check_reward_config",
    "combined_range",
    "DEFAULT_RANGE",
    "with_rewards",
    "BUILTIN",
    "problem_fields",
]

BUILTIN = "task"  # --reward task: the task's own verifier as one term
DEFAULT_RANGE = (0.0, 1.0)  # a term's range unless reward.ranges says otherwise: the built-in verifiers'
# what gapo.exec.scoring writes under reward/ for every batch (reward/n, reward/mean and, per status,
# reward/n_<s> and reward/<s>_frac, "ok" not counted); a term writes reward/<name> and
# reward/n_<name>, neither of which may be one of these
_COUNTED = [s for s in STATUSES if s != "ok"]
_RESERVED = frozenset({"mean", "n", *(f"n_{s}" for s in _COUNTED), *(f"{s}_frac" for s in _COUNTED)})

_DETAIL_KEYS = ("source", "line", "split")  # where a problem came from: not a field of the problem


def parse_spec(spec: str) -> tuple[str, str | None, bool]:
    """``(target, function, is_file)`` of ``module.path:function`` / ``path/to/file.py:function``;
    ``("task", None, False)`` for the built-in verifier. A malformed spec is a ``ValueError``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward {spec!r}: expected module.path:function or path/to/file.py:function")
    spec = spec.strip()
    if spec == BUILTIN:
        return BUILTIN, None, False
    target, sep, fn = spec.rpartition(":")
    if not sep or not target or not fn.isidentifier():
        raise ValueError(
            f"reward {spec!r}: expected module.path:function or path/to/file.py:function "
            f"(or {BUILTIN!r} for the task's own verifier)"
        )
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if not is_file and not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"reward {spec!r}: {target!r} is neither a module path (a.b.c) nor a .py file")
    return target, fn, is_file


def absolute_spec(spec: str, start_dir: str | None = None) -> str:
    """``spec`` as a saved config records it, so that ``gapo eval RUN``, ``--resume`` and the pool's
    workers find the same function from any folder: a file path made absolute (against
    ``start_dir``, default the current directory); a module found in ``start_dir`` and not
    elsewhere on ``sys.path`` (``my_rewards:fn`` beside the run) as its file's absolute path; any
    other spec as it is. Nothing is imported. A package module found only in ``start_dir`` is a
    ``ValueError``: as a file on its own its imports would break, so it must be made importable."""
    target, fn, is_file = parse_spec(spec)
    start = os.path.abspath(start_dir or os.getcwd())
    if is_file:
        return f"{os.path.normpath(os.path.join(start, os.path.expanduser(target)))}:{fn}"
    if fn is None:
        return BUILTIN
    top = target.split(".")[0]
    here = importlib.machinery.PathFinder.find_spec(top, [start])
    if here is None:
        return spec.strip()
    try:
        first = importlib.util.find_spec(top)  # sys.path's answer (sys.modules first): what an import gets
    except (ImportError, ValueError):
        first = None
    if first is not None and first.origin is not None and first.origin != here.origin:
        return spec.strip()  # another module of that name comes first on sys.path: the import uses it
    if "." in target or here.submodule_search_locations is not None or here.origin is None:
        raise ValueError(
            f"reward {spec!r}: package {top!r} is found only in {start!r}, the folder the run starts in; a "
            f"saved run must find it from any folder (gapo eval RUN, --resume): install it (pip install -e), "
            "or put its folder on PYTHONPATH"
        )
    return f"{here.origin}:{fn}"


def _load_file(path: str):
    name = "gapo_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path!r} as a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


class RewardTerm:
    """One reward function, by spec; the function itself is imported on first use in each process
    (it is not pickled)."""

    def __init__(self, spec: str, weight: float = 1.0, *, start_dir: str | None = None):
        self.target, self.fn_name, self.is_file = parse_spec(spec)
        if self.is_file:
            self.target = os.path.abspath(os.path.expanduser(self.target))
        self.spec = f"{self.target}:{self.fn_name}" if self.fn_name else BUILTIN
        self.name = BUILTIN if self.fn_name is None else self.fn_name
        self.weight = float(weight)
        self.start_dir = start_dir or os.getcwd()
        self._fn = None
        self._kwargs: tuple[bool, frozenset] | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fn"] = None
        return state

    @property
    def builtin(self) -> bool:
        return self.fn_name is None

    def resolve(self):
        """The function, imported now; every failure is a ``ValueError`` naming the file or module
        and the function."""
        if self._fn is not None or self.builtin:
            return self._fn
        what = f"reward {self.spec!r}"
        try:
            if self.is_file:
                if not os.path.isfile(self.target):
                    raise ValueError(f"{what}: no such file {self.target!r}")
                mod = _load_file(self.target)
            else:
                try:
                    mod = importlib.import_module(self.target)
                except ModuleNotFoundError as e:
                    if e.name != self.target.split(".")[0] or self.start_dir in sys.path:
                        raise
                    sys.path.append(self.start_dir)  # `gapo` (a console script) does not put the cwd on sys.path
                    mod = importlib.import_module(self.target)
        except ValueError:
            raise
        except ModuleNotFoundError as e:
            if not self.is_file and e.name is not None and self.target.startswith(e.name):
                raise ValueError(
                    f"{what}: cannot import module {self.target!r} ({e}; looked on sys.path and in {self.start_dir!r})"
                ) from None
            where = "file" if self.is_file else "module"
            raise ValueError(f"{what}: importing {where} {self.target!r} raised ModuleNotFoundError: {e}") from None
        except BaseException as e:  # noqa: BLE001 - the user's module failed while importing
            if isinstance(e, KeyboardInterrupt):
                raise
            where = "file" if self.is_file else "module"
            raise ValueError(f"{what}: importing {where} {self.target!r} raised {type(e).__name__}: {e}") from None
        fn = getattr(mod, self.fn_name, None)
        if fn is None:
            public = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_"))
            raise ValueError(
                f"{what}: {'file' if self.is_file else 'module'} {self.target!r} has no function "
                f"{self.fn_name!r} (callables there: {public[:20]})"
            )
        if not callable(fn):
            raise ValueError(f"{what}: {self.fn_name!r} in {self.target!r} is a {type(fn).__name__}, not a function")
        self._fn = fn
        return fn

    def _signature(self, fn) -> tuple[bool, frozenset, list[str]]:
        """(takes **fields, the field names it takes, the required ones besides prompt/completion)."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin or C callable: pass everything
            return True, frozenset(), []
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ValueError(
                f"reward {self.spec!r}: the function must take (prompt, completion, **fields); "
                f"its signature is {inspect.signature(fn)}"
            )
        rest = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        required = [p.name for p in rest if p.default is p.empty]
        return var_kw, frozenset(p.name for p in rest), required

    def check_fields(self, fields: dict) -> None:
        """The function's named parameters are fields of the problem (a ``ValueError`` otherwise)."""
        if self.builtin:
            return
        var_kw, names, required = self._signature(self.resolve())
        missing = [n for n in required if n not in fields]
        if missing:
            raise ValueError(
                f"reward {self.spec!r}: the function needs field(s) {missing} but the problems have "
                f"{sorted(fields)}; name only these, or take **fields"
            )

    def __call__(self, task, problem, completion: str):
        """``(value or None, status)``: the built-in verifier's (reward, status), or the function's value."""
        if self.builtin:
            from gapo.exec.scoring_pool import score_one

            out = score_one(task, problem, completion)
            return check_value(self.spec, out[0]), out[1]  # the task's reward: a real number too
        fn = self.resolve()
        if self._kwargs is None:
            var_kw, names, _ = self._signature(fn)
            self._kwargs = (var_kw, names)
        var_kw, names = self._kwargs
        fields = problem_fields(problem)
        if not var_kw:
            fields = {k: v for k, v in fields.items() if k in names}
        try:
            value = fn(problem.prompt, completion, **fields)
        except Exception as e:  # noqa: BLE001 - named here; gapo.exec.scoring stops the run with it
            raise ValueError(f"reward {self.spec!r} raised {type(e).__name__}: {e}") from e
        return check_value(self.spec, value), "ok"


def check_value(spec: str, value) -> float | None:
    """A reward function's return value as a float (or None: skip); anything else is a ``ValueError``
    naming the function: a bool, a string (even ``"1"``), NaN, ±inf, a list."""
    if value is None:
        return None
    kind = type(value).__name__
    if isinstance(value, bool) or kind in ("bool_", "bool"):
        raise ValueError(f"reward {spec!r} returned {value!r} (a bool); return a number such as 1.0 or 0.0")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"reward {spec!r} returned {value!r} (a {kind}, not a number); return a float or None")
    if isinstance(value, numbers.Real):
        out = float(value)
    elif hasattr(type(value), "__float__") and getattr(value, "ndim", 0) == 0:  # numpy / torch 0-d scalars
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"reward {spec!r} returned {value!r} (a {kind}); return a float or None") from None
    else:
        raise ValueError(f"reward {spec!r} returned {value!r} (a {kind}, not a number); return a float or None")
    if not math.isfinite(out):
        raise ValueError(f"reward {spec!r} returned {out}; rewards must be finite")
    return out


def problem_fields(problem) -> dict:
    """The fields a reward function sees for ``problem`` (see the module docstring)."""
    meta = getattr(problem, "meta", None) or {}
    if isinstance(meta.get("fields"), dict):  # data:PATH keeps the row's columns
        return dict(meta["fields"])
    out = {k: v for k, v in meta.items() if k not in _DETAIL_KEYS}
    out.setdefault("answer", problem.answer)
    return out


class RewardTask:
    """A task whose reward is the combination of ``terms`` (see the module docstring); everything
    else (problems, splits, first moves, lengths) is the wrapped task's."""

    def __init__(
        self,
        task,
        terms: list[RewardTerm],
        success_reward: float | None = None,
        *,
        ranges: list[tuple[float, float]] | None = None,
        declared: bool = False,
        bounds: tuple[float, float] | None = None,
    ):
        self.task = task
        self.terms = terms
        self.success_reward = success_reward  # evaluation counts a sample correct at R >= this (None: R > 0)
        self.name = task.name
        self.total_weight = sum(t.weight for t in terms)
        self.ranges = ranges  # each term's [lo, hi], checked on every value (None: unchecked)
        self.declared = declared  # the ranges are reward.ranges (else the default [0, 1])
        self.bounds = bounds  # the fixed algo.reward_range (None: group, batch)

    def __getattr__(self, attr):
        if attr in ("task", "__setstate__") or attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.task, attr)

    @property
    def reward_names(self) -> list[str]:
        return [t.name for t in self.terms]

    def warmup(self) -> None:
        """In a scoring worker, before any timed job: import the functions, warm the task up."""
        for t in self.terms:
            t.resolve()
        warm = getattr(self.task, "warmup", None)
        if warm is not None:
            warm()

    def score_detailed(self, problem, completion: str):
        """``(R, status, {name: value or None})``; status is the task term's, else ``ok``
        (``unparsable`` when every term skipped)."""
        parts: dict[str, float | None] = {}
        status = "ok"
        num = den = 0.0
        for k, t in enumerate(self.terms):
            value, st = t(self.task, problem, completion)
            if value is not None and self.ranges is not None:
                self._check_range(k, value)
            parts[t.name] = value
            if t.builtin:
                status = st
            if value is not None:
                num += t.weight * value
                den += t.weight
        if den == 0:
            return 0.0, "unparsable", parts
        return self._snap(self.total_weight * num / den), status, parts

    def _check_range(self, k: int, value: float) -> None:
        lo, hi = self.ranges[k]
        if lo <= value <= hi:
            return
        t = self.terms[k]
        where = (
            f"its range reward.ranges[{k}] = [{lo:g}, {hi:g}]"
            if self.declared
            else f"[{lo:g}, {hi:g}], a term's range when reward.ranges does not declare one (one [lo, hi] per reward)"
        )
        raise ValueError(f"reward {t.name!r} ({t.spec}) returned {value!r}, outside {where}")

    def _snap(self, r: float) -> float:
        """R at an end of the fixed range up to rounding (the terms summed in another order than
        the range was) is that end: a full success reaches R_max exactly (``rollout/pass_rate`` and
        evaluation count R >= R_max) and no R leaves the range by an ulp."""
        if self.bounds is None:
            return r
        lo, hi = self.bounds
        tol = 1e-9 * max(1.0, abs(lo), abs(hi))
        return hi if abs(r - hi) <= tol else lo if abs(r - lo) <= tol else r

    def score(self, problem, completion: str) -> float:
        return self.score_detailed(problem, completion)[0]

    def parse_ok(self, completion: str) -> bool:
        inner = getattr(self.task, "parse_ok", None)
        return True if inner is None else inner(completion)


def check_reward_config(funcs, weights, ranges=None, *, key: str = "reward", task: str | None = None) -> None:
    """``reward.funcs`` / ``reward.weights`` / ``reward.ranges`` before anything loads: their
    syntax, that a file named exists, that no name collides with a statistic under ``reward/``, and
    that a task without a verifier of its own (``data``) has a reward; nothing is imported here
    (that, and the probe, come when the task is built: :func:`with_rewards`)."""
    if not isinstance(funcs, (list, tuple)):
        raise ValueError(f"{key}.funcs: expected a list of module.path:function specs, got {funcs!r}")
    if task == "data" and (not funcs or BUILTIN in funcs):
        raise ValueError(
            f"{key}.funcs: task 'data' has no verifier of its own; give your reward with --reward "
            "module.path:function or --reward my_rewards.py:function"
            + (f" ({BUILTIN!r}, the task's verifier, does not exist for it)" if funcs else "")
        )
    names = []
    for s in funcs:
        target, fn, is_file = parse_spec(s)
        if is_file and not os.path.isfile(os.path.expanduser(target)):
            raise ValueError(f"{key}.funcs: reward {s!r}: no such file {os.path.abspath(os.path.expanduser(target))!r}")
        name = BUILTIN if fn is None else fn
        clash = [k for k in (name, f"n_{name}") if k in _RESERVED]
        if clash:
            raise ValueError(
                f"{key}.funcs: a reward function named {name!r} would be logged as reward/{name} and "
                f"reward/n_{name}, and reward/{clash[0]} is one of gapo's scoring statistics; rename the function"
            )
        if name in names:
            raise ValueError(
                f"{key}.funcs: two rewards named {name!r} ({funcs}); each is logged as "
                "reward/<function name>, so give them different names"
            )
        names.append(name)
    for name in names:  # `foo` logs reward/n_foo, which a term named `n_foo` logs too
        if f"n_{name}" in names:
            raise ValueError(
                f"{key}.funcs: rewards named {name!r} and 'n_{name}' would both be logged as "
                f"reward/n_{name} (the count of {name!r} and the mean of 'n_{name}'); rename one"
            )
    if weights is not None:
        _check_weights(funcs, weights, key)
    if ranges is not None:
        _check_ranges(funcs, ranges, key)


def _check_weights(funcs, weights, key: str) -> None:
    if not isinstance(weights, (list, tuple)):
        raise ValueError(f"{key}.weights: expected a list of numbers, one per reward, got {weights!r}")
    if not funcs:
        raise ValueError(f"{key}.weights: set but there are no rewards (--reward module:function, reward.funcs)")
    if len(weights) != len(funcs):
        raise ValueError(
            f"{key}.weights: {len(weights)} weight(s) for {len(funcs)} reward(s) {list(funcs)}; "
            "give one weight per reward"
        )
    for w in weights:
        if not _finite(w) or w < 0:
            raise ValueError(f"{key}.weights: each weight must be a finite number >= 0, got {w!r}")
    if not sum(weights) > 0:
        raise ValueError(f"{key}.weights: at least one weight must be > 0, got {list(weights)}")


def _check_ranges(funcs, ranges, key: str) -> None:
    if not isinstance(ranges, (list, tuple)):
        raise ValueError(f"{key}.ranges: expected a list of [lo, hi], one per reward, got {ranges!r}")
    if not funcs:
        raise ValueError(f"{key}.ranges: set but there are no rewards (--reward module:function, reward.funcs)")
    if len(ranges) != len(funcs):
        raise ValueError(
            f"{key}.ranges: {len(ranges)} range(s) for {len(funcs)} reward(s) {list(funcs)}; "
            "give one [lo, hi] per reward"
        )
    for spec, r in zip(funcs, ranges):
        if not (isinstance(r, (list, tuple)) and len(r) == 2 and all(map(_finite, r)) and r[0] < r[1]):
            raise ValueError(f"{key}.ranges: the range of {spec!r} must be [lo, hi] with finite lo < hi, got {r!r}")


def _finite(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def combined_range(funcs, weights=None, ranges=None) -> tuple[float, float]:
    """The range of R (module docstring) for terms ``funcs`` with ``weights`` (default 1 each) and
    ``ranges`` (default ``DEFAULT_RANGE`` each), over every set S of terms that answer. With P the
    terms of weight > 0, M ⊆ P the task's verifier (it never skips) and W = Σ_k w_k:

        R_min = W · min_{M ⊆ S ⊆ P, S ≠ ∅} Σ_S w_k lo_k / Σ_S w_k,   R_max likewise with max and hi_k,

    widened to hold 0 when M is empty (every term of P skips: R = 0). The weighted sum
    ``[Σ w_k lo_k, Σ w_k hi_k]`` when every term has the same range; wider otherwise (a skipped
    term's weight goes to the others). E.g. ``task`` [0, 1] and a penalty [-1, 0] at weights
    [1, 0.5]: R in [-0.5, 1.5], 1.5 when the penalty skips. Nothing is imported."""
    ws = [float(w) for w in weights] if weights is not None else [1.0] * len(funcs)
    rs = [(float(lo), float(hi)) for lo, hi in ranges] if ranges is not None else [DEFAULT_RANGE] * len(funcs)
    live = [(w, r, parse_spec(s)[1] is None) for s, w, r in zip(funcs, ws, rs) if w > 0]
    must = [(w, r) for w, r, builtin in live if builtin]
    may = [(w, r) for w, r, builtin in live if not builtin]
    total = sum(ws)
    lo = total * _extreme_mean(must, may, lambda r: r[0])
    hi = -total * _extreme_mean(must, may, lambda r: -r[1])
    return (lo, hi) if must else (min(lo, 0.0), max(hi, 0.0))


def _extreme_mean(must, may, value) -> float:
    """min over S ⊇ must, S ⊆ must ∪ may, S ≠ ∅ of Σ_S w·value(r) / Σ_S w. The best S adds the
    ``may`` terms in increasing order of value while each lowers the mean, so it is one of those
    prefixes."""
    num = sum(w * value(r) for w, r in must)
    den = sum(w for w, _ in must)
    best = num / den if den else math.inf
    for w, r in sorted(may, key=lambda x: value(x[1])):
        num, den = num + w * value(r), den + w
        best = min(best, num / den)
    return best


def with_rewards(task, funcs, weights=None, ranges=None, *, probe=None, reward_range=None):
    """``task`` scored by ``funcs`` (``reward.funcs``) with ``weights`` and ``ranges``; ``task``
    itself when ``funcs`` is empty. Every function is imported now and its parameters checked
    against the fields of ``probe`` (a problem of the task), so a bad spec fails before the run.
    Each term's values are checked against its range: ``ranges`` when given, else ``[0, 1]`` when
    ``reward_range`` is fixed (under ``None``, ``group``, ``batch`` an undeclared range is not
    checked). With a fixed ``reward_range`` (R_min, R_max), evaluation counts a sample correct when
    R >= R_max (the rule of ``rollout/pass_rate``); otherwise when R > 0."""
    if not funcs:
        if getattr(task, "needs_reward", False):
            raise ValueError(
                f"task {task.name!r} has no verifier of its own; give one with --reward "
                "module.path:function or --reward my_rewards.py:function (reward.funcs)"
            )
        return task
    check_reward_config(funcs, weights, ranges)
    ws = list(weights) if weights is not None else [1.0] * len(funcs)
    terms = [RewardTerm(s, w) for s, w in zip(funcs, ws)]
    for t in terms:
        if t.builtin and getattr(task, "needs_reward", False):
            raise ValueError(f"reward {BUILTIN!r}: task {task.name!r} has no verifier of its own to include")
        t.resolve()
        if probe is not None:
            t.check_fields(problem_fields(probe))
    fixed = None if reward_range is None or isinstance(reward_range, str) else tuple(map(float, reward_range))
    if ranges is not None:
        per_term = [(float(lo), float(hi)) for lo, hi in ranges]
    else:
        per_term = [DEFAULT_RANGE] * len(funcs) if fixed is not None else None
    return RewardTask(
        task,
        terms,
        success_reward=None if fixed is None else fixed[1],
        ranges=per_term,
        declared=ranges is not None,
        bounds=fixed,
    )
