"""The task interface shared by every verifiable task, and helpers for building one.

A task turns seeds into :class:`Problem` s and scores completions with an exact verifier.

Splits. ``train`` and ``eval`` are disjoint *by construction*: an instance belongs to a split
according to a stable hash of its canonical key (not to the seed that drew it),

    bucket(key) = int(sha256(key)[:8 hex], 16) / 16**8 ∈ [0, 1)
    split(key)  = "eval" if bucket(key) < eval_fraction else "train"

so the same instance lands in the same split whatever the seed, the number of problems
drawn or the task's difficulty knobs (the key depends only on the instance).
``generate(split, n, seed)`` draws instances from a ``random.Random`` seeded by
``(split, seed)`` and keeps those of the requested split, skipping duplicates; it is therefore
deterministic and prefix-stable (``generate(s, m, seed) == generate(s, n, seed)[:m]`` for
``m <= n``).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import random
import typing
import warnings
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Problem:
    """One task instance.

    ``prompt`` is the exact text fed to the model, ``answer`` the reference answer (task
    specific), ``meta`` free-form details (e.g. Countdown's numbers and target). ``meta`` takes
    no part in equality or hashing, so problems stay hashable. ``meta["messages"]``, where set
    (``data:PATH``'s conversational rows), is the whole conversation the chat template renders,
    its last user turn ``prompt`` (:mod:`gapo.policy.chat`).
    """

    prompt: str
    answer: object
    meta: dict = field(default_factory=dict, hash=False, compare=False)


@runtime_checkable
class Task(Protocol):
    """What the sampler, trainer and metrics rely on.

    - ``name``: registry name.
    - ``alphabet``: every character that can appear in a prompt or a well-formed completion
      (a character-level tokenizer is built from it plus special tokens).
    - ``max_completion_len``: a generation cap in characters, long enough for every correct
      completion of this task's instances plus a little slack.
    - ``generate(split, n, seed)``: ``n`` problems of ``split`` ∈ {"train", "eval"}; the two
      splits are disjoint; deterministic in ``(split, n, seed)``; no duplicates within a call
      unless the instance space is exhausted.
    - ``score(problem, completion)``: 1.0 if the completion is correct, else 0.0. Never raises
      and never evaluates the completion as code.
    - ``parse_ok(completion)``: whether the completion is well-formed (syntax only, not
      correctness), for an ``unparsable`` metric.
    - ``first_move(completion)``: a hashable summary of the completion's first decision, or
      ``None`` when it has none (see each task for its definition).
    - ``demonstration(problem, rng)``: a correct completion for supervised warm-up.
    """

    name: str
    alphabet: str
    max_completion_len: int

    def generate(self, split: str, n: int, seed: int) -> list[Problem]: ...

    def score(self, problem: Problem, completion: str) -> float: ...

    def parse_ok(self, completion: str) -> bool: ...

    def first_move(self, completion: str) -> Hashable | None: ...

    def demonstration(self, problem: Problem, rng: random.Random) -> str: ...


def _check_type(owner: str, name: str, value, kinds: tuple, what: str) -> None:
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class DataSplits:
    """Which rows of a local dataset a task trains and evaluates on (``math:``, ``data:``).

    ``split``: the dataset's split to read (None: ``train``, or its only split). ``eval_split``
    (a split of the same dataset, or of ``eval_path``) or ``eval_path`` (another dataset) name
    the held-out data; training rows whose question also appears there are dropped. Without
    either, a stable hash of the question puts ``eval_fraction`` ∈ [0, 1) of the rows in eval
    (:func:`split_of`). A bad value is a ``ValueError`` naming the field.
    """

    split: str | None = None
    eval_split: str | None = None
    eval_path: str | Path | None = None
    eval_fraction: float | None = 0.1  # None: 0.1, as the tasks always took it

    def __post_init__(self):
        if self.eval_fraction is None:
            object.__setattr__(self, "eval_fraction", 0.1)
        for name in ("split", "eval_split"):
            _check_type("DataSplits", name, getattr(self, name), (str, type(None)), "a split name or None")
        _check_type("DataSplits", "eval_path", self.eval_path, (str, Path, type(None)), "a path or None")
        f = self.eval_fraction
        _check_type("DataSplits", "eval_fraction", f, (int, float), "a number in [0, 1)")
        if not 0.0 <= f < 1.0:  # NaN fails this too
            raise ValueError(f"eval_fraction must be in [0, 1), got {f}")


@dataclass(frozen=True)
class PromptFormat:
    """How a task turns a problem into a prompt, and how long a completion may be:
    ``template`` wraps the question (each task names its placeholder, ``{question}`` or
    ``{prompt}``); ``max_completion_len`` caps generation (characters; a real tokenizer's
    tokens). The math, data and reasoning-gym tasks share it; each has its own defaults."""

    template: str
    max_completion_len: int = 1024

    def __post_init__(self):
        _check_type("PromptFormat", "template", self.template, (str,), "a string")
        n = self.max_completion_len
        _check_type("PromptFormat", "max_completion_len", n, (int,), "an integer >= 1")
        if n < 1:
            raise ValueError(f"PromptFormat.max_completion_len must be an integer >= 1, got {n!r}")


G = TypeVar("G")


def as_group(group: type[G], value: G | Mapping | None, default: G) -> G:
    """A task constructor's parameter group ``group`` (a frozen dataclass): ``value`` itself, a
    mapping of its fields over ``default`` (a YAML file's form, ``splits: {split: test}``) or
    ``default`` for None. An unknown field, or a value of another kind, is a ``TypeError``."""
    if value is None:
        return default
    if isinstance(value, Mapping):
        names = {f.name for f in dataclasses.fields(group)}
        bad = sorted(set(value) - names)
        if bad:
            raise TypeError(f"{group.__name__} has no field {bad[0]!r} (fields: {sorted(names)})")
        return dataclasses.replace(default, **value)
    if not isinstance(value, group):
        raise TypeError(f"expected a {group.__name__} (or a mapping of its fields), got {type(value).__name__}")
    return value


def group_keywords(cls: type) -> dict[str, type]:
    """``cls``'s parameter groups (``param_groups``) by the constructor keyword that takes each
    (the one whose type hint names the group): ``{"splits": DataSplits, ...}``."""
    hints = typing.get_type_hints(cls.__init__)
    out = {}
    for kw, hint in hints.items():
        kinds = typing.get_args(hint) or (hint,)
        for g in getattr(cls, "param_groups", ()):
            if g in kinds:
                out[kw] = g
    return out


def nest_group_fields(cls: type, params: dict) -> dict:
    """``params`` as ``task.params`` gives them, each field of a parameter group of ``cls`` moved
    into that group's keyword: ``{"split": "test"}`` -> ``{"splits": {"split": "test"}}``. A field
    goes over the group given as well (a mapping, or an instance), as in a YAML file that sets
    ``splits`` and overrides one of its fields on the command line."""
    out = dict(params)
    for kw, group in group_keywords(cls).items():
        own = {f.name: out.pop(f.name) for f in dataclasses.fields(group) if f.name in out}
        if not own:
            continue
        given = out.get(kw)
        if isinstance(given, group):
            out[kw] = dataclasses.replace(given, **own)
        elif given is None or isinstance(given, Mapping):
            out[kw] = {**(given or {}), **own}
        # else: a value of another kind, which the constructor's as_group names
    return out


def group_params(cls: type) -> dict[str, Any]:
    """The flat keywords ``cls`` accepts through its parameter groups (``param_groups`` in its
    MRO, each a dataclass of :func:`as_group`): field name -> type hint, for checking
    ``task.params`` against the task (:mod:`gapo.rl.domains`)."""
    out: dict[str, Any] = {}
    for c in reversed(cls.__mro__):
        for g in vars(c).get("param_groups", ()):
            out.update(typing.get_type_hints(g))
    return out


def split_of(key: str, eval_fraction: float) -> str:
    """The split an instance with canonical ``key`` belongs to (see the module docstring)."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    bucket = int(digest[:8], 16) / 16**8
    return "eval" if bucket < eval_fraction else "train"


def question_key(question: str) -> str:
    """A question as the math and data tasks compare it across splits: whitespace collapsed,
    lower case (the same question from two files, re-wrapped or re-cased, is one question)."""
    return " ".join(question.split()).lower()


def split_rows(splits: DataSplits, train: tuple, load_eval: Callable[[], tuple], where: str) -> dict:
    """``{"train": (source, rows), "eval": (source, rows)}`` of a local dataset (``math:``,
    ``data:``), whose rows are tuples with the question second, as ``splits`` says.

    ``train`` is ``(source, rows, split)``: the training split's rows and that split's name. With
    ``eval_split`` or ``eval_path``, eval is ``load_eval() -> (source, rows)`` and training keeps
    the rows whose ``question_key`` is not in eval; an ``eval_split`` that is the training split
    itself (no ``eval_path``) is an error naming ``where``, raised before eval is read. Without
    either, ``split_of`` puts ``eval_fraction`` of the training rows in eval by their question."""
    src, rows, train_split = train
    if splits.eval_split is None and splits.eval_path is None:
        in_eval = [split_of(question_key(r[1]), splits.eval_fraction) == "eval" for r in rows]
        return {
            "train": (src, [r for r, e in zip(rows, in_eval) if not e]),
            "eval": (src, [r for r, e in zip(rows, in_eval) if e]),
        }
    if splits.eval_path is None and splits.eval_split == train_split:
        raise ValueError(
            f"{where}: eval_split={splits.eval_split!r} is the training split too; "
            "name another split of the dataset (e.g. test)"
        )
    ev_src, ev = load_eval()
    seen = {question_key(r[1]) for r in ev}
    return {"train": (src, [r for r in rows if question_key(r[1]) not in seen]), "eval": (ev_src, ev)}


def check_split(split: str, n: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def draw_problems(
    split: str,
    n: int,
    seed: int,
    draw: Callable[[random.Random], tuple[str, Problem] | None],
    *,
    eval_fraction: float,
    task_name: str,
    max_stale: int = 2000,
) -> list[Problem]:
    """Draw ``n`` problems of ``split`` with ``draw(rng) -> (key, problem) | None``.

    ``draw`` returns ``None`` to reject a candidate (e.g. an unsolvable instance). Instances of
    the other split and repeats of an instance already drawn are skipped. After ``max_stale``
    consecutive draws that yield nothing new, the space is taken as exhausted: repeats are then
    allowed (with a warning) so that small spaces still give ``n`` problems; if not even one
    problem of the split was found, ``ValueError`` is raised.
    """
    check_split(split, n)
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    rng = random.Random(f"{task_name}:{split}:{seed}")
    out: list[Problem] = []
    seen: set[str] = set()
    stale = 0
    allow_repeats = False
    while len(out) < n:
        candidate = draw(rng)
        if candidate is None or split_of(candidate[0], eval_fraction) != split:
            stale += 1
        elif candidate[0] in seen and not allow_repeats:
            stale += 1
        else:
            seen.add(candidate[0])
            out.append(candidate[1])
            stale = 0
        if stale >= max_stale:
            if not out:
                raise ValueError(
                    f"{task_name}: found no {split!r} instance in {max_stale} draws; "
                    "the instance space is empty or too small for this split"
                )
            if not allow_repeats:
                warnings.warn(
                    f"{task_name}: only {len(seen)} distinct {split!r} instances found; "
                    f"repeating instances to reach n={n}",
                    stacklevel=3,
                )
            allow_repeats = True
            stale = 0
    return out


def read_jsonl(path, required=()) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line of a (optionally gzipped) JSONL file.

    Anything malformed is a ``ValueError`` naming the file, the line and the field: a missing
    file, a directory, non-UTF-8 text, a line that is not a JSON object, a record without one of
    the ``required`` fields, or a file with no records at all.
    """
    path = str(path)
    if not os.path.exists(path):
        raise ValueError(f"{path}: dataset file not found")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a file")
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(
                        f"{path}:{lineno}: not valid JSON ({e.msg}); expected one JSON object per line"
                    ) from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
                for field in required:
                    if field not in rec:
                        raise ValueError(f"{path}:{lineno}: missing field {field!r} (fields present: {sorted(rec)})")
                out.append((lineno, rec))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read dataset ({e})") from None
    if not out:
        raise ValueError(f"{path}: dataset file is empty (no JSON lines)")
    return out


def draw_from_split(pool: list, split: str, n: int, seed: int, *, where: str) -> list:
    """``n`` problems of a dataset split ``pool`` in a seeded order: train cycles through
    reshuffled passes when ``n`` exceeds the split, eval refuses (repeats would bias evaluation).
    ``where`` is the message for an empty split."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not pool:
        raise ValueError(where)
    if split == "eval" and n > len(pool):
        raise ValueError(f"asked for {n} eval problems but the eval split has {len(pool)}")
    rng = random.Random(f"{split}:{seed}")
    out: list = []
    while len(out) < n:
        order = list(range(len(pool)))
        rng.shuffle(order)
        out.extend(pool[i] for i in order[: n - len(out)])
    return out
