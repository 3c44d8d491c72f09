"""Rewards of your own: ``--reward module.path:function`` or ``--reward my_rewards.py:function``.

A reward function has one of two forms (:mod:`gapo.tasks.reward_fn` has the details), told apart
by its parameter names. Per completion::

    def my_reward(prompt: str, completion: str, **fields) -> float | None: ...

- ``prompt``: the task's prompt text (the user turn, before any chat template);
- ``completion``: the decoded completion;
- ``fields``: the problem's fields. For ``data:PATH`` the dataset row's prompt column and its
  ``answer_fields`` columns, under their column names; for any other task ``answer`` (the task's
  reference answer, e.g. the gold of ``math:PATH``) and the problem's details (``math``:
  ``question``, ``solution``; ``countdown``: ``numbers``, ``target``, ...). A function may take
  ``**fields`` or name only the fields it uses (``def f(prompt, completion, answer)``); naming a
  field the task does not have is an error before the run. ``prompt`` and ``completion`` are
  passed positionally, and a field named like either parameter is not passed as a keyword: the
  positional value wins, so a column called ``prompt`` (TRL's name) or ``completion`` collides
  with nothing.

Per batch, TRL's form (a parameter named ``prompts`` or ``completions``), called once per scored
batch with keywords, every field a list aligned with the completions::

    def my_reward(prompts, completions, **columns) -> list[float | None]: ...

with TRL's conversational shapes for a conversational prompt (``prompts[i]`` the messages,
``completions[i]`` ``[{"role": "assistant", "content": text}]``); gapo does not pass TRL's
``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``.

A value is a number (``int``/``float``, numpy or 0-d tensor scalars; not a ``bool`` and not a
string such as ``"1"``), or ``None`` when the term does not apply to this completion ("skip"); a
batched function returns one per completion.

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

The functions never run in the trainer's process: their import, the check of their parameters,
the probe and every call run in a scoring worker that the trainer can kill (the pool of
``task.scoring_workers``, or with 0 a pool of one, kept for the run so the import is paid once),
under the verifiers' timeouts with the hard deadline behind the soft alarm (a batched function:
the per-completion deadline times the batch's size); the worker's whole process group dies with
it (:mod:`gapo.exec.scoring`). Whatever a function raises or returns wrongly, ``SystemExit`` and
``KeyboardInterrupt`` included, is a :class:`~gapo.exec.scoring_pool.UserCodeError` naming it.
What travels to a worker is the spec (module path or the file's absolute path, and the
function's name), never the function object, so each worker imports it itself. A module path is
looked up on ``sys.path`` and then in the directory the run started in; :func:`absolute_spec`
records a module found only there by its file's path, so a saved run finds it from any folder.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import os

from gapo.core.checks import is_real
from gapo.exec.scoring import SHARED, STATUSES, UserCodeError
from gapo.tasks.reward_fn import BUILTIN, RewardTerm, parse_spec, problem_fields

__all__ = [
    "RewardTask",
    "absolute_spec",
    "check_reward_config",
    "combined_range",
    "DEFAULT_RANGE",
    "with_rewards",
]

CHECK_TIMEOUT_S = 60.0  # checking the functions' parameters, once imported (the import has the pool's limit)
DEFAULT_RANGE = (0.0, 1.0)  # a term's range unless reward.ranges says otherwise: the built-in verifiers'
# what gapo.exec.scoring writes under reward/ for every batch (reward/n, reward/mean and, per status,
# reward/n_<s> and reward/<s>_frac, "ok" not counted); a term writes reward/<name> and
# reward/n_<name>, neither of which may be one of these
_COUNTED = [s for s in STATUSES if s != "ok"]
_RESERVED = frozenset({"mean", "n", *(f"n_{s}" for s in _COUNTED), *(f"{s}_frac" for s in _COUNTED)})


def absolute_spec(spec: str) -> str:
    """``spec`` as a saved config records it, so that ``gapo eval RUN``, ``--resume`` and the pool's
    workers find the same function from any folder: a file path made absolute (against the
    current directory, the start folder); a module found in the start folder and not elsewhere on
    ``sys.path`` (``my_rewards:fn`` beside the run) as its file's absolute path; any other spec as
    it is. Nothing is imported. A package module found only in the start folder is a
    ``ValueError``: as a file on its own its imports would break, so it must be made importable."""
    target, fn, is_file = parse_spec(spec)
    start = os.getcwd()
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
        self.deadline_s: float | None = None  # per completion, set: reward.timeout_s (see with_rewards)
        self.workers = 1  # the scoring pool its functions run in: the run's (task.scoring_workers) or one
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

    # What gapo.exec.scoring reads to score this task: a user's function runs in a worker, never in
    # the calling process; the batched ones once per batch (score_terms), before the rest.
    @property
    def runs_user_code(self) -> bool:
        return any(not t.builtin for t in self.terms)

    @property
    def batch_terms(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.terms if t.batched)

    @property
    def batch_only(self) -> bool:
        return all(t.batched for t in self.terms)

    @property
    def loads(self) -> str:
        return f"the reward modules {[t.target for t in self.terms if not t.builtin]}"

    def warmup(self) -> None:
        """In a scoring worker, before any timed job: import the functions, warm the task up."""
        for t in self.terms:
            t.resolve()
        warm = getattr(self.task, "warmup", None)
        if warm is not None:
            warm()

    def check(self, probe=None) -> None:
        """Import the functions and check their parameters against ``probe``'s fields, in a
        scoring worker (a pool of one, kept for the run): an import that hangs, exits or raises
        fails here, before the run, as an error naming it. Records each term's form."""
        if not self.runs_user_code:
            return
        fields = None if probe is None else problem_fields(probe)
        forms = SHARED.pool(self.workers).ask(self, "check_terms", fields, timeout_s=CHECK_TIMEOUT_S)
        for t in self.terms:
            t.batched = forms.get(t.name, False)

    def check_terms(self, fields: dict | None) -> dict[str, bool]:
        """(In the worker.) ``{name: batched}`` of the functions, each checked against ``fields``."""
        return {t.name: t.check(fields) for t in self.terms if not t.builtin}

    def score_terms(self, problems: list, completions: list[str]) -> dict[str, list]:
        """(In the worker.) The batched functions' values, ``{name: one value or None per completion}``."""
        return {t.name: t.call_batch(problems, completions) for t in self.terms if t.batched}

    def score_detailed(self, problem, completion: str, given: dict | None = None):
        """``(R, status, {name: value or None})``; status is the task term's, else ``ok``
        (``unparsable`` when every term skipped). ``given``: terms' values already computed for
        this completion (:meth:`score_terms`)."""
        parts: dict[str, float | None] = {}
        status = "ok"
        num = den = 0.0
        for k, t in enumerate(self.terms):
            value, st = (given[t.name], "ok") if given and t.name in given else t(self.task, problem, completion)
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
        # a user's function out of its range is the user's error (mid-run: checkpoint, exit 2); the
        # task's own verifier out of [0, 1] would be gapo's bug
        cls = ValueError if t.builtin else UserCodeError
        raise cls(f"reward {t.name!r} ({t.spec}) returned {value!r}, outside {where}")

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


def _check_one_per_reward(funcs, values, key: str, items: str, unit: str) -> None:
    """``values`` (``reward.weights``, ``reward.ranges``) is a list of ``items``, one ``unit`` per reward."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{key}: expected a list of {items}, one per reward, got {values!r}")
    if not funcs:
        raise ValueError(f"{key}: set but there are no rewards (--reward module:function, reward.funcs)")
    if len(values) != len(funcs):
        noun = key.rsplit(".", 1)[-1][:-1]  # weight, range
        raise ValueError(
            f"{key}: {len(values)} {noun}(s) for {len(funcs)} reward(s) {list(funcs)}; give one {unit} per reward"
        )


def _check_weights(funcs, weights, key: str) -> None:
    _check_one_per_reward(funcs, weights, f"{key}.weights", "numbers", "weight")
    for w in weights:
        if not _finite(w) or w < 0:
            raise ValueError(f"{key}.weights: each weight must be a finite number >= 0, got {w!r}")
    if not sum(weights) > 0:
        raise ValueError(f"{key}.weights: at least one weight must be > 0, got {list(weights)}")


def _check_ranges(funcs, ranges, key: str) -> None:
    _check_one_per_reward(funcs, ranges, f"{key}.ranges", "[lo, hi]", "[lo, hi]")
    for spec, r in zip(funcs, ranges):
        if not (isinstance(r, (list, tuple)) and len(r) == 2 and all(map(_finite, r)) and r[0] < r[1]):
            raise ValueError(f"{key}.ranges: the range of {spec!r} must be [lo, hi] with finite lo < hi, got {r!r}")


def _finite(x) -> bool:
    return is_real(x) and math.isfinite(x)


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


def with_rewards(task, funcs, weights=None, ranges=None, *, probe=None, reward_range=None, timeout_s=None, workers=1):
    """``task`` scored by ``funcs`` (``reward.funcs``) with ``weights`` and ``ranges``; ``task``
    itself when ``funcs`` is empty. Every function is imported now and its parameters checked
    against the fields of ``probe`` (a problem of the task), so a bad spec fails before the run.
    Each term's values are checked against its range: ``ranges`` when given, else ``[0, 1]`` when
    ``reward_range`` is fixed (under ``None``, ``group``, ``batch`` an undeclared range is not
    checked). With a fixed ``reward_range`` (R_min, R_max), evaluation counts a sample correct when
    R >= R_max (the rule of ``rollout/pass_rate``); otherwise when R > 0. ``timeout_s``
    (``reward.timeout_s``), when given, is the deadline per completion wherever the task is scored
    (``RewardTask.deadline_s``, which replaces the scoring call's own ``timeout_s``); ``workers``
    (``task.scoring_workers``, at least 1) the one pool the functions are checked and scored in."""
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
    fixed = None if reward_range is None or isinstance(reward_range, str) else tuple(map(float, reward_range))
    if ranges is not None:
        per_term = [(float(lo), float(hi)) for lo, hi in ranges]
    else:
        per_term = [DEFAULT_RANGE] * len(funcs) if fixed is not None else None
    out = RewardTask(
        task,
        terms,
        success_reward=None if fixed is None else fixed[1],
        ranges=per_term,
        declared=ranges is not None,
        bounds=fixed,
    )
    out.deadline_s = None if timeout_s is None else float(timeout_s)
    out.workers = max(1, int(workers))
    out.check(probe)  # imported and checked in a worker (never in this process)
    return out
