"""One reward function of the user's (``--reward module.path:function``, :mod:`gapo.tasks.custom`):
its import, its signature, one call, and what it returns, every failure an error naming it.

Two forms, told apart by the function's parameter names:

- **per completion** (no parameter named ``prompts`` or ``completions``), called once per
  completion::

      def f(prompt, completion, **fields) -> float | None

  ``prompt`` and ``completion`` are passed *positionally*, so they may have any names; the
  problem's fields follow as keywords (all of them to ``**fields``, else the ones it names). A
  field named like either positional parameter is not passed: the positional value wins. So a
  dataset column called ``prompt`` (TRL's standard name) or ``completion`` collides with nothing
  (never an error); the function reads the prompt from its first argument.
- **per batch** (TRL's form: a parameter named ``prompts`` or ``completions``), called once per
  scored batch, with keywords::

      def f(prompts, completions, **columns) -> list[float | None]

  ``prompts[i]``, ``completions[i]`` and ``columns[k][i]`` (every field, as a list aligned with
  the completions; the ones it names without ``**columns``) belong to completion i. With a
  conversational prompt (``data:PATH`` whose prompt column is a list of ``{role, content}``
  messages), ``prompts[i]`` is that conversation and ``completions[i]`` is
  ``[{"role": "assistant", "content": text}]``, as TRL passes them, so TRL reward functions that
  read ``completion[0]["content"]`` work unchanged; otherwise both are strings. A field named
  ``prompts`` or ``completions`` is not passed. TRL also passes ``completion_ids``,
  ``trainer_state``, ``log_extra``, ``log_metric`` (and ``environments``); gapo does not: a
  function that needs one of them is an error before the run (one with a default, or taking
  ``**kwargs``, runs). It returns one value per completion, in order (a list, a tuple or a 1-d
  array); a wrong length is an error naming the function.

A value is a real number (``int``, ``float``, numpy or 0-d tensor scalars; not a ``bool``, not a
string such as ``"1"``, not NaN or ±inf), or ``None``: the term does not apply to that completion.

Raising anything (an ``Exception``, ``SystemExit`` from ``sys.exit()``, ``KeyboardInterrupt``, any
other ``BaseException``), in the call or while its module is imported, is a
:class:`~gapo.exec.scoring_pool.UserCodeError` naming the function; only the soft timeout's
:class:`~gapo.exec.scoring_pool.AlarmInterrupt` goes through. Where these calls run (a worker
process that can be killed, never the trainer's) is :mod:`gapo.exec.scoring`'s business.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from dataclasses import dataclass

from gapo.exec.scoring_pool import AlarmInterrupt, UserCodeError, score_one

__all__ = [
    "BUILTIN",
    "BATCH_NAMES",
    "TRL_ONLY",
    "RewardTerm",
    "Signature",
    "parse_spec",
    "check_value",
    "problem_fields",
]

BUILTIN = "task"  # --reward task: the task's own verifier as one term
BATCH_NAMES = ("prompts", "completions")  # a parameter named so: TRL's batched form
# what TRL's GRPOTrainer passes a reward function besides prompts, completions and the columns
TRL_ONLY = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
_DETAIL_KEYS = ("source", "line", "split", "messages")  # where a problem came from, how it is rendered: not fields


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


def _what_raised(e: BaseException) -> str:
    """``SystemExit(0) (sys.exit(), exit() or quit())``, ``KeyError: 'x'``, ..."""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}) (sys.exit(), exit() or quit()): user code may not end the process"
    if isinstance(e, KeyboardInterrupt):
        return "KeyboardInterrupt: user code may not interrupt the run (Ctrl-C goes to the trainer)"
    if not isinstance(e, Exception):
        return f"{type(e).__name__}: {e} (a BaseException, not an Exception)"
    return f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class Signature:
    """What a reward function takes (module docstring): its form, and which fields to pass."""

    batched: bool  # TRL's form: lists, keywords
    takes_all: bool  # **fields / **kwargs
    names: frozenset  # the fields it names
    required: tuple  # the named fields without a default
    skip: frozenset  # names that are never fields: its positional parameters', or prompts/completions
    keywords: frozenset = frozenset()  # every parameter it takes by keyword

    def pass_fields(self, fields: dict) -> dict:
        keep = {k: v for k, v in fields.items() if k not in self.skip}
        return keep if self.takes_all else {k: v for k, v in keep.items() if k in self.names}

    def takes(self, keyword: str) -> bool:
        return self.takes_all or keyword in self.keywords


def signature(fn, spec: str) -> Signature:
    """``fn``'s :class:`Signature`; one that cannot take (prompt, completion) nor the batched
    keywords is a ``ValueError`` naming ``spec``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: per completion, every field
        return Signature(False, True, frozenset(), (), frozenset({"prompt", "completion"}))
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    by_name = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.name in BATCH_NAMES for p in params):
        if any(p.kind is p.POSITIONAL_ONLY and p.default is p.empty for p in params):
            raise ValueError(
                f"reward {spec!r}: a batched reward (it takes {'/'.join(BATCH_NAMES)}) is called with "
                f"keywords only; its signature {inspect.signature(fn)} has positional-only parameters"
            )
        rest, skip = [p for p in by_name if p.name not in BATCH_NAMES], frozenset(BATCH_NAMES)
    else:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ValueError(
                f"reward {spec!r}: the function must take (prompt, completion, **fields), or TRL's "
                f"(prompts, completions, **columns); its signature is {inspect.signature(fn)}"
            )
        skip = frozenset(p.name for p in positional[:2])
        rest = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = tuple(p.name for p in rest if p.default is p.empty)
    batched = skip == frozenset(BATCH_NAMES)
    names, keywords = frozenset(p.name for p in rest), frozenset(p.name for p in by_name)
    return Signature(batched, var_kw, names, required, skip, keywords)


class RewardTerm:
    """One reward function, by spec; the function itself is imported on first use in each process
    (it is not pickled). ``batched`` is its form as the worker that checked it found it
    (:meth:`check`), for the caller that plans a batch without importing it."""

    def __init__(self, spec: str, weight: float = 1.0, *, start_dir: str | None = None):
        self.target, self.fn_name, self.is_file = parse_spec(spec)
        if self.is_file:
            self.target = os.path.abspath(os.path.expanduser(self.target))
        self.spec = f"{self.target}:{self.fn_name}" if self.fn_name else BUILTIN
        self.name = BUILTIN if self.fn_name is None else self.fn_name
        self.weight = float(weight)
        self.start_dir = start_dir or os.getcwd()
        self.batched = False
        self._fn = None
        self._sig: Signature | None = None

    def __getstate__(self):
        return {**self.__dict__, "_fn": None, "_sig": None}

    @property
    def builtin(self) -> bool:
        return self.fn_name is None

    def resolve(self):
        """The function, imported now; every failure is a ``ValueError`` naming the file or module
        and the function (a :class:`UserCodeError` when the module's own code raised or exited)."""
        if self._fn is not None or self.builtin:
            return self._fn
        what = f"reward {self.spec!r}"
        where = "file" if self.is_file else "module"
        try:
            mod = self._import()
        except ValueError:
            raise
        except ModuleNotFoundError as e:
            if not self.is_file and e.name is not None and self.target.startswith(e.name):
                raise ValueError(
                    f"{what}: cannot import module {self.target!r} ({e}; looked on sys.path and in {self.start_dir!r})"
                ) from None
            raise ValueError(f"{what}: importing {where} {self.target!r} raised ModuleNotFoundError: {e}") from None
        except BaseException as e:  # noqa: BLE001 - the user's module failed (or exited) while importing
            raise UserCodeError(f"{what}: importing {where} {self.target!r} raised {_what_raised(e)}") from None
        fn = getattr(mod, self.fn_name, None)
        if fn is None:
            public = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_"))
            raise ValueError(
                f"{what}: {where} {self.target!r} has no function {self.fn_name!r} (callables there: {public[:20]})"
            )
        if not callable(fn):
            raise ValueError(f"{what}: {self.fn_name!r} in {self.target!r} is a {type(fn).__name__}, not a function")
        self._fn = fn
        return fn

    def _import(self):
        if self.is_file:
            if not os.path.isfile(self.target):
                raise ValueError(f"reward {self.spec!r}: no such file {self.target!r}")
            return _load_file(self.target)
        try:
            return importlib.import_module(self.target)
        except ModuleNotFoundError as e:
            if e.name != self.target.split(".")[0] or self.start_dir in sys.path:
                raise
            sys.path.append(self.start_dir)  # `gapo` (a console script) does not put the cwd on sys.path
            return importlib.import_module(self.target)

    def signature(self) -> Signature:
        if self._sig is None:
            self._sig = signature(self.resolve(), self.spec)
        return self._sig

    def check(self, fields: dict | None) -> bool:
        """Import the function and check that the fields it needs are ``fields`` (a problem's;
        None: not checked) -> whether it is batched. A ``ValueError`` naming what is missing."""
        sig = self.signature()
        if fields is None:
            return sig.batched
        trl = [n for n in sig.required if n in TRL_ONLY]
        if trl:
            raise ValueError(
                f"reward {self.spec!r}: the function needs {trl}, which TRL's trainer passes and gapo "
                f"does not (gapo passes prompts, completions and the problems' fields); give "
                f"{'them' if len(trl) > 1 else 'it'} a default or take **kwargs"
            )
        missing = [n for n in sig.required if n not in fields]
        if missing:
            raise ValueError(
                f"reward {self.spec!r}: the function needs field(s) {missing} but the problems have "
                f"{sorted(fields)}; name only these, or take **fields"
            )
        return sig.batched

    def __call__(self, task, problem, completion: str):
        """``(value or None, status)``: the built-in verifier's (reward, status), or the function's
        value (a batched function is called with lists of one)."""
        if self.builtin:
            out = score_one(task, problem, completion)
            return check_value(self.spec, out[0]), out[1]  # the task's reward: a real number too
        fn, sig = self.resolve(), self.signature()
        if sig.batched:
            return self.call_batch([problem], [completion])[0], "ok"
        fields = sig.pass_fields(problem_fields(problem))
        try:
            value = fn(problem.prompt, completion, **fields)
        except AlarmInterrupt:  # the soft timeout: the guard's business
            raise
        except BaseException as e:  # noqa: BLE001 - named here; gapo.exec.scoring stops the run with it
            raise UserCodeError(f"reward {self.spec!r} raised {_what_raised(e)}") from e
        return check_value(self.spec, value), "ok"

    def call_batch(self, problems: list, completions: list[str]) -> list[float | None]:
        """The batched function's values for ``completions`` (of ``problems``), checked."""
        fn, sig = self.resolve(), self.signature()
        chats = [(getattr(p, "meta", None) or {}).get("messages") for p in problems]
        kw: dict = {}
        if sig.takes("prompts"):
            kw["prompts"] = [list(m) if m is not None else p.prompt for p, m in zip(problems, chats)]
        if sig.takes("completions"):
            kw["completions"] = [
                [{"role": "assistant", "content": c}] if m is not None else c for c, m in zip(completions, chats)
            ]
        rows = [problem_fields(p) for p in problems]
        for k in dict.fromkeys(k for r in rows for k in r):
            kw.update(sig.pass_fields({k: [r.get(k) for r in rows]}))
        try:
            values = fn(**kw)
        except AlarmInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the user's reward may raise anything; re-raised as UserCodeError
            raise UserCodeError(f"reward {self.spec!r} raised {_what_raised(e)}") from e
        if hasattr(values, "tolist") and getattr(values, "ndim", None) == 1:  # numpy / torch 1-d
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            raise UserCodeError(
                f"reward {self.spec!r} returned {values!r:.80} (a {type(values).__name__}); a batched reward "
                "(it takes `completions`) returns a list: one number or None per completion"
            )
        if len(values) != len(completions):
            raise UserCodeError(
                f"reward {self.spec!r} returned {len(values)} value(s) for {len(completions)} completion(s); a "
                "batched reward returns one number or None per completion, in their order"
            )
        return [check_value(self.spec, v, at=i) for i, v in enumerate(values)]


def check_value(spec: str, value, *, at: int | None = None) -> float | None:
    """A reward function's return value as a float (or None: skip); anything else is a
    :class:`UserCodeError` naming the function (and ``at``, the completion's place in a batch): a
    bool, a string (even ``"1"``), NaN, ±inf, a list."""
    if value is None:
        return None
    kind = type(value).__name__
    said = f"reward {spec!r} returned {value!r}" + (f" for completion {at} of the batch" if at is not None else "")
    if isinstance(value, bool) or kind in ("bool_", "bool"):
        raise UserCodeError(f"{said} (a bool); return a number such as 1.0 or 0.0")
    if isinstance(value, (str, bytes)):
        raise UserCodeError(f"{said} (a {kind}, not a number); return a float or None")
    if isinstance(value, numbers.Real):
        out = float(value)
    elif hasattr(type(value), "__float__") and getattr(value, "ndim", 0) == 0:  # numpy / torch 0-d scalars
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise UserCodeError(f"{said} (a {kind}); return a float or None") from None
    else:
        raise UserCodeError(f"{said} (a {kind}, not a number); return a float or None")
    if not math.isfinite(out):
        raise UserCodeError(f"{said}; rewards must be finite")
    return out


def problem_fields(problem) -> dict:
    """The fields a reward function sees for ``problem`` (:mod:`gapo.tasks.custom`)."""
    meta = getattr(problem, "meta", None) or {}
    if isinstance(meta.get("fields"), dict):  # data:PATH keeps the row's columns
        return dict(meta["fields"])
    out = {k: v for k, v in meta.items() if k not in _DETAIL_KEYS}
    out.setdefault("answer", problem.answer)
    return out
