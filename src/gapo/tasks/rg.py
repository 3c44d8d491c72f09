"""Any reasoning-gym dataset as a gapo task, scored by the dataset's own ``score_answer``.

    task = ReasoningGymTask(dataset="chain_sum", config={"min_terms": 2, "max_terms": 3}, seed=0)
    task = gapo.tasks.get("rg", dataset="basic_arithmetic", size=10_000)

(The dataset is ``dataset=``, the ``task.params`` key: ``name`` is the registry's task name.)

Instances. The task's instance space is items ``0 .. size-1`` of
``reasoning_gym.create_dataset(name, seed=seed, size=size, **config)``. ``generate`` draws item
indices at random (seeded by split and seed) through :func:`gapo.tasks.base.draw_problems`.

Train/eval disjointness. reasoning-gym seeds item ``i`` of a dataset with seed ``s`` by
``s + i``, so datasets with seeds 1 and 2 share all but one item; and small instance spaces
repeat questions under any seeds. Different seeds therefore do not give disjoint splits. gapo
assigns every instance to a split by a stable hash of its question text (whitespace
normalised), as every gapo task does: an eval question never appears in train, whatever the
seeds. Within one ``generate`` call questions are distinct unless the space is exhausted (then
repeats, with a warning).

Answer extraction. The answer is the content of the last ``<answer>...</answer>`` span; with
``last_line=True`` (the default) a completion without tags falls back to its last non-empty
line. The extracted text is stripped of surrounding whitespace before scoring: reasoning-gym's
default scorer compares strings exactly and gives ``len(oracle)/len(answer)`` to an answer that
merely contains the oracle, so a stray space or newline would otherwise cost reward. No answer
-> reward 0, status ``unparsable``.

One answer. A completion must commit to one answer, or it scores 0 (status ``ambiguous``), whatever
the dataset's scorer would say: several ``<answer>`` spans that disagree; an answer with ``or``,
``±`` or ``\\lor`` when the oracle has none; when the oracle is one number, an answer holding
several numbers (``5, 7``, ``5 or 7``: reasoning-gym's ``gsm_symbolic`` scorer reads the first
number of the answer, so ``<answer>5 or 7</answer>`` would score 1 for 5); when the oracle holds no
``,``, ``;`` or line break, an answer that is a list of several items. Oracles that are lists,
grids or sentences keep their own scorer's rules.

Reward. Binary by default: 1.0 when ``score_answer`` returns 1.0 (within 1e-9), else 0.0. The
substring partial credit would reward padding an answer with the right digits ("12" scores 0.5
against the oracle "1"); GAPO's clip schedule assumes binary rewards. ``partial_credit=True``
returns the raw score clamped to [0, 1] for datasets whose partial credit is meaningful (e.g.
graded puzzles). A scorer that raises gives 0 (status ``unparsable``). reasoning-gym scorers
have no timeout of their own; :func:`gapo.exec.scoring.score_batch` bounds them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from gapo.tasks.base import Problem, PromptFormat, as_group, check_split, draw_problems

__all__ = ["ReasoningGymTask", "RGScoring", "extract_rg_answer", "one_rg_answer"]

DEFAULT_TEMPLATE = "{question}\nGive your final answer between <answer> and </answer> tags."
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")
_DISJ = re.compile(
    r"(?<![A-Za-z])or(?![A-Za-z])|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|\\pm(?![A-Za-z])|±|"
    r"\\mp(?![A-Za-z])|∓|∨",
    re.IGNORECASE,
)
_SEP = re.compile(r"[,;\n]")


def _answers(completion: str, last_line: bool) -> list[str]:
    """Every non-empty ``<answer>`` span (stripped), else the last non-empty line."""
    if not isinstance(completion, str):
        return []
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return [t.strip() for t in tags if t.strip()]
    if not last_line:
        return []
    lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
    return lines[-1:]


def extract_rg_answer(completion: str, *, last_line: bool = True) -> str | None:
    """Stripped content of the last ``<answer>`` span, else (optionally) the last non-empty line."""
    if not isinstance(completion, str):
        return None
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip() or None
    found = _answers(completion, last_line)
    return found[-1] if found else None


def one_rg_answer(answers: list[str], oracle: Any) -> str | None:
    """The one answer of ``answers`` (a completion's), or None when they commit to several
    values (see the module docstring)."""
    if not answers or len(dict.fromkeys(answers)) > 1:
        return None
    ans = answers[-1]
    if oracle is None:
        return ans
    o = str(oracle).strip()
    if _DISJ.search(ans) and not _DISJ.search(o):
        return None
    if _NUMBER.fullmatch(o):
        if len(_NUMBER.findall(ans)) > 1:
            return None
    elif not _SEP.search(o) and sum(1 for item in _SEP.split(ans) if item.strip()) > 1:
        return None
    return ans


def _qkey(question: str) -> str:
    return " ".join(question.split())


@dataclass(frozen=True)
class RGScoring:
    """How :class:`ReasoningGymTask` scores an answer (see the module docstring):
    ``partial_credit`` returns the dataset scorer's raw score clamped to [0, 1] instead of the
    binary reward; ``last_line`` lets a completion without ``<answer>`` tags answer with its last
    non-empty line. A bad value is a ``ValueError`` naming the field."""

    partial_credit: bool = False
    last_line: bool = True

    def __post_init__(self):
        for name in ("partial_credit", "last_line"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RGScoring.{name} must be true or false, got {getattr(self, name)!r}")


class ReasoningGymTask:
    """A reasoning-gym procedural dataset; see the module docstring for the decisions.

    ``scoring`` (:class:`RGScoring`) and ``prompt_format`` (:class:`~gapo.tasks.base.PromptFormat`,
    placeholder ``{question}``), each an instance or a mapping of its fields (``task.params`` may
    give a field on its own: ``gapo.tasks.get`` puts it in its group). Any other keyword is a
    field of the dataset's ``config``; a group's field among them is a ``TypeError`` naming the
    group (it would reach the dataset's config)."""

    alphabet = None  # a real tokenizer
    param_groups = (RGScoring, PromptFormat)  # task.params may give their fields flat

    def __init__(
        self,
        dataset: str,
        config: dict[str, Any] | None = None,
        *,
        size: int = 100_000,
        seed: int = 0,
        eval_fraction: float = 0.1,
        scoring: RGScoring | None = None,
        prompt_format: PromptFormat | None = None,
        **config_kwargs: Any,  # the dataset's config, forwarded to reasoning_gym.create_dataset
    ):
        for kw, group in (("scoring", RGScoring), ("prompt_format", PromptFormat)):
            misplaced = sorted(set(config_kwargs) & {f.name for f in dataclasses.fields(group)})
            if misplaced:
                raise TypeError(f"ReasoningGymTask(): {misplaced[0]!r} is a field of {kw}={group.__name__}(...)")
        scoring = as_group(RGScoring, scoring, RGScoring())
        fmt = as_group(PromptFormat, prompt_format, PromptFormat(DEFAULT_TEMPLATE))
        template = fmt.template
        # lazy: reasoning-gym is the optional [tasks] extra
        import reasoning_gym
        from reasoning_gym.factory import DATASETS

        name = dataset
        if name not in DATASETS:
            close = difflib.get_close_matches(name, list(DATASETS), n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise ValueError(f"unknown reasoning-gym dataset {name!r}.{hint} ({len(DATASETS)} datasets available)")
        if "{question}" not in template:
            raise ValueError(f"template must contain '{{question}}', got {template!r}")
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        cfg = dict(config or {})
        cfg.update(config_kwargs)
        for reserved in ("seed", "size"):
            if reserved in cfg:
                raise ValueError(f"pass {reserved}= to ReasoningGymTask itself, not in config")
        self.dataset_name = name
        self.name = f"rg:{name}"
        self.config = cfg
        self.size = size
        self.seed = seed
        self.eval_fraction = eval_fraction
        self.partial_credit = scoring.partial_credit
        self.last_line = scoring.last_line
        self.template = template
        self.max_completion_len = fmt.max_completion_len
        try:
            self._ds = reasoning_gym.create_dataset(name, seed=seed, size=size, **cfg)
        except (TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"reasoning-gym dataset {name!r} rejected config {cfg}: {e}") from e

    @property
    def dataset(self):
        if self._ds is None:  # unpickled in a scoring worker
            import reasoning_gym  # lazy: the optional [tasks] extra

            self._ds = reasoning_gym.create_dataset(self.dataset_name, seed=self.seed, size=self.size, **self.config)
        return self._ds

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ds"] = None  # rebuilt on first use; keeps the pickle small
        return state

    # -- instances

    def _problem(self, idx: int) -> Problem:
        entry = self.dataset[idx]
        prompt = self.template.replace("{question}", entry["question"])
        meta = {"entry": entry, "index": idx, "dataset": self.dataset_name}
        return Problem(prompt=prompt, answer=entry.get("answer"), meta=meta)

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        check_split(split, n)

        def draw(rng: random.Random):
            p = self._problem(rng.randrange(self.size))
            return _qkey(p.meta["entry"]["question"]), p

        return draw_problems(split, n, seed, draw, eval_fraction=self.eval_fraction, task_name=self.name)

    # -- scoring

    def parse_ok(self, completion: str) -> bool:
        return extract_rg_answer(completion, last_line=self.last_line) is not None

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        """(reward, status), status ok / unparsable / ambiguous (several answers: reward 0)."""
        found = _answers(completion, self.last_line)
        if not found:
            return 0.0, "unparsable"
        answer = one_rg_answer(found, problem.meta["entry"].get("answer", problem.answer))
        if answer is None:
            return 0.0, "ambiguous"
        try:
            raw = float(self.dataset.score_answer(answer, problem.meta["entry"]))
        except Exception:  # noqa: BLE001 - a scorer choking on odd text is a wrong answer, not a crash
            return 0.0, "unparsable"
        if not math.isfinite(raw):
            return 0.0, "ok"
        if self.partial_credit:
            return min(max(raw, 0.0), 1.0), "ok"
        return (1.0 if raw >= 1.0 - 1e-9 else 0.0), "ok"

    def score(self, problem: Problem, completion: str) -> float:
        return self.score_detailed(problem, completion)[0]

    def first_move(self, completion: str):
        return None  # datasets differ too much for a shared notion of a first move

    def demonstration(self, problem: Problem, rng: random.Random | None = None) -> str:
        if problem.answer is None:
            raise ValueError(f"{self.name}: this dataset gives no reference answer to demonstrate")
        return f"<answer>{problem.answer}</answer>"
