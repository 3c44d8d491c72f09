"""Math word problems with final answers checked by ``math-verify``.

Data: a local dataset, one problem per record: JSONL, JSON, Parquet, CSV/TSV, Arrow, a
``datasets`` ``save_to_disk`` folder or a folder of data files (:mod:`gapo.tasks.datasets_io`;
``split`` picks a split, default ``train``). The question is read from ``prompt_field`` (default:
the first of ``question``, ``problem``, ``prompt``, ``messages`` among the columns, or present on
line 1 of JSONL), the reference answer from ``answer_field`` (default: the first of ``answer``,
``solution``, ``messages``): GSM8K (question/answer), MATH and MATH-500 (problem/solution or
answer), DeepScaleR (problem/answer/solution) and NuminaMath (problem/solution/messages) are
recognised as they ship. A chat-format field (a list of ``{"role", "content"}``) gives its last
user turn as the question (the template wraps it) and its last assistant turn as the answer; the
turns before that question (a system turn, few-shot exchanges: TRL's conversational prompts) are
kept and rendered whole through the chat template, as ``data:PATH`` does. The answer field may be

- GSM8K style: worked solution ending in ``#### 1,234`` -> gold ``1234`` (commas dropped),
- MATH style: a solution containing ``\\boxed{...}`` -> the last box's content (nested braces ok),
- anything else: the field itself, stripped (numbers are turned into strings).

Scoring: :mod:`gapo.tasks.math_answer` finds the completion's final answers (``<answer>`` tags,
boxes, "the answer is", the last number) and the values they commit to, and
:mod:`gapo.tasks.math_trailing` the values the text after the first of them commits to ("or maybe
7", "Actually, it is 7", "Final answer: 7"); the reward is 1 only if every one of them verifies as
the gold (one answer, or no reward). No answer -> reward 0, status ``unparsable``; several values
where the gold is one, or a box with an exponent or operator attached -> reward 0, status
``ambiguous``.

Each value and the gold are parsed as LaTeX (wrapped in ``$...$``) with ``math_verify.parse`` and
compared with ``math_verify.verify`` (numeric and symbolic equivalence: ``1/2``, ``0.5`` and
``\\frac{1}{2}`` agree). If that fails and the value contains letters (``18 dollars``), the plain
text is parsed too and compared again.

Timeouts: math-verify's own timeout uses ``signal.alarm`` and raises ``ValueError`` when called
off the main thread. gapo calls it with its timeouts disabled and guards the whole
parse-and-verify with :func:`gapo.exec.scoring.run_with_timeout`: a ``SIGALRM`` timer on the main
thread (sympy's work is Python code, so the alarm interrupts it: ``9^{9^{9^9}}`` stops at the
limit), and off the main thread a helper process that is killed and replaced on timeout. A
timeout is reward 0, status ``timeout``.

A timeout never changes a later result. An alarm that cut sympy's first import short left
half-initialised modules behind, and every later parse of the process failed
(``verify_answer('5', '5') == (False, False)``). So the guard never interrupts an import
(:mod:`gapo.exec.scoring_pool`), :func:`warmup` (untimed, never interrupted) runs before the
first timed verification of every process (pool workers and helper processes on load, serial
scoring before its batch, ``MathTask`` before its first timed call), and :func:`after_timeout`
checks canaries after each in-process timeout: caches cleared and re-warmed if they fail, and a
helper process verifies from then on if they still fail.

Splits: with ``eval_path`` (any of the formats; ``eval_split`` picks its split) or ``eval_split``
alone (a split of ``path``, e.g. GSM8K's ``test``) the train split is ``path``'s ``split`` minus
any problem whose question also appears in the eval data; without either a stable hash of the
question puts ``eval_fraction`` of the problems in eval (the shared rule of
:func:`gapo.tasks.base.split_of`). Either way the splits are disjoint by question text.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gapo.exec.scoring import VerifierTimeout, run_with_timeout
from gapo.exec.scoring_pool import alarm_deferred, signal_guard_usable
from gapo.tasks.base import (
    DataSplits,
    Problem,
    PromptFormat,
    as_group,
    draw_from_split,
    split_rows,
)
from gapo.tasks.datasets_io import conversation, read_records
from gapo.tasks.math_answer import answer_candidates, gold_from_field, is_single_value, last_boxed, locate_answers
from gapo.tasks.math_trailing import trailing_values

__all__ = [
    "MathTask",
    "verifier_healthy",
    "verify_all",
    "verify_answer",
    "warmup",
]

DEFAULT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
_PROMPT_FIELDS = ("question", "problem", "prompt")
_ANSWER_FIELDS = ("answer", "solution")


class _DropTimeoutWarning(logging.Filter):
    # math-verify warns that its timeout is off; gapo supplies its own guard.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def _strip_math_delims(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


# ----------------------------------------------------------------------------- verification


def _parse(s: str, latex: bool):
    from math_verify import parse  # lazy: math-verify is the optional [math] extra

    return parse(f"${s}$" if latex else s, parsing_timeout=None)


def verify_answer(gold: str, pred: str) -> tuple[bool, bool]:
    """(correct, parsed) for two answer strings; no timeout here (see ``MathTask``).

    Module-level so that it pickles for the helper process.
    """
    from math_verify import verify  # lazy: math-verify is the optional [math] extra

    gold, pred = _strip_math_delims(gold), _strip_math_delims(pred)
    g = _parse(gold, latex=True) or _parse(gold, latex=False)
    p = _parse(pred, latex=True)
    parsed = bool(p)
    if p and g and verify(g, p, timeout_seconds=None):
        return True, True
    if re.search(r"[A-Za-z]", pred):
        p2 = _parse(pred, latex=False)
        parsed = parsed or bool(p2)
        if p2 and g and verify(g, p2, timeout_seconds=None):
            return True, True
    return False, parsed


def verify_all(gold: str, candidates: list[str]) -> tuple[bool, bool]:
    """(every candidate verifies as the gold, every candidate parsed); one timed call for all."""
    ok_all, parsed_all = bool(candidates), True
    for c in dict.fromkeys(candidates):  # the same value written twice is verified once
        ok, parsed = verify_answer(gold, c)
        ok_all, parsed_all = ok_all and ok, parsed_all and parsed
        if not ok_all:
            break
    return ok_all, parsed_all


# Comparisons that exercise math-verify's import and the parser's paths a final answer takes
# (numbers, fractions, roots, sets, tuples, intervals, relations, units, text), so that sympy's
# lazy imports and the LaTeX parser's first uses happen here and not under a timer.
_WARMUP = (
    ("\\frac{1}{2}", "0.5"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("(1, 2)", "(1,2)"),
    ("[0, 1)", "[0,1)"),
    ("x^2+1", "1+x^2"),
    ("90^\\circ", "90"),
    ("18", "18 dollars"),
    ("5", "5\\%"),
    ("\\pi", "\\pi"),
    ("x \\ge 5", "x \\geq 5"),
    ("4", "x = 4"),
    ("-7", "-7.0"),
    ("\\pm 3", "\\pm 3"),
    ("\\text{Monday}", "Monday"),
    ("\\sin(x)", "\\sin x"),
    ("1000", "1000"),
)
# What a sound verifier says about these; checked after every timeout in this process.
_CANARIES = (("5", "5", True), ("\\frac{1}{2}", "0.5", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("72", "27", False))
_WARM_PID: int | None = None  # the process that has warmed up
_BROKEN_PID: int | None = None  # the process whose in-process verifier could not be repaired


def warmup() -> None:
    """Import math-verify and run a set of comparisons (sympy's first use is slow, and an
    interrupted import would break it for the process), so that the first timed verification
    of a process does not pay for them. Never interrupted by gapo's timeout guard."""
    global _WARM_PID
    with alarm_deferred():
        for gold, pred in _WARMUP:
            verify_answer(gold, pred)
        _WARM_PID = os.getpid()  # before an alarm due meanwhile fires at the section's end


def _ensure_warm() -> None:
    if _WARM_PID != os.getpid():
        warmup()


def verifier_healthy() -> bool:
    """Whether this process's math-verify still gives the canaries' known answers."""
    with alarm_deferred():
        try:
            return all(verify_answer(g, p)[0] == want for g, p, want in _CANARIES)
        except Exception:  # noqa: BLE001 - a broken verifier may raise anything
            return False


def _reset_verifier() -> None:
    """Drop what math-verify and sympy cache between calls."""
    import math_verify.parser as mvp  # lazy: the optional [math] extra
    from sympy.core.cache import clear_cache

    clear_cache()
    for obj in vars(mvp).values():
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()


def after_timeout() -> None:
    """Called after a verification of this process was interrupted: if the verifier no longer
    gives the canaries' answers, clear its caches and re-warm; if it still does not, this process
    verifies in a helper process from now on (a fresh interpreter, replaced after each timeout),
    so that a timeout never changes a later result."""
    global _BROKEN_PID
    if _BROKEN_PID == os.getpid() or verifier_healthy():
        return
    try:
        _reset_verifier()
        with alarm_deferred():
            for gold, pred in _WARMUP:
                verify_answer(gold, pred)
    except Exception:  # noqa: BLE001 - a failed re-warm-up is judged below by verifier_healthy()
        pass
    if not verifier_healthy():
        _BROKEN_PID = os.getpid()
        print(
            "[gapo] warning: math-verify gives wrong answers in this process after a timeout; "
            "verifying in a helper process from now on",
            file=sys.stderr,
        )


# ----------------------------------------------------------------------------- the task


def _turn(value: Any, role: str, last: bool) -> Any:
    """The content of the first (or last) ``role`` turn of a chat-format field (NuminaMath's
    ``messages``: a list of ``{"role", "content"}``); any other value as it is."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        turns = [m.get("content") for m in value if m.get("role") == role]
        return (turns[-1] if last else turns[0]) if turns else None
    return value


def _question(value: Any, where: str) -> tuple[Any, tuple | None]:
    """``(question, conversation or None)`` of a question field. A chat-format field (a list of
    ``{"role", "content"}``) is a prompt through its last user turn: TRL's conversational prompt
    (a system turn, few-shot exchanges, the question last) or an exchange that carries its answer
    after it (NuminaMath's ``messages``). The question is that last user turn; the turns before it
    are kept, to be rendered whole (``meta["messages"]``), unless there are none."""
    if not (isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value)):
        return value, None
    users = [i for i, m in enumerate(value) if m.get("role") == "user"]
    if not users:
        raise ValueError(f"{where}: the conversation has no user turn (its roles: {[m.get('role') for m in value]})")
    conv = conversation(value[: users[-1] + 1], where)
    return conv[-1]["content"], (conv if len(conv) > 1 else None)


def _load(path: Path, split: str | None, prompt_field: str | None, answer_field: str | None):
    """``(source, split, [(position, question, gold, raw answer)])`` of one split of a dataset
    (any format of :func:`gapo.tasks.datasets_io.read_records`)."""

    # `datasets` (the optional [math] extra) is imported inside read_records only for
    # Parquet/CSV/Arrow files and dataset folders; JSON and JSONL need nothing.
    def wanted(columns: list[str]) -> list[str]:  # of a wide table, read the two columns used only
        return [
            prompt_field or next((k for k in _PROMPT_FIELDS + ("messages",) if k in columns), ""),
            answer_field or next((k for k in _ANSWER_FIELDS + ("messages",) if k in columns), ""),
        ]

    recs = read_records(path, split=split, columns=wanted)
    head = recs.where(recs.rows[0][0] if not recs.tabular else None)
    present = sorted(recs.columns) if not recs.tabular else recs.columns
    noun = recs.noun
    if prompt_field is None:
        prompt_field = next((k for k in _PROMPT_FIELDS + ("messages",) if k in recs.columns), None)
        if prompt_field is None:
            raise ValueError(
                f"{head}: no question {noun} (tried {list(_PROMPT_FIELDS) + ['messages']}; "
                f"{noun}s present: {present}); pass prompt_field="
            )
    if recs.tabular and prompt_field not in recs.columns:
        raise ValueError(f"{recs.where()}: missing column {prompt_field!r} (columns present: {recs.columns})")
    if answer_field is None:
        answer_field = next((k for k in _ANSWER_FIELDS + ("messages",) if k in recs.columns), None)
        if answer_field is None:
            raise ValueError(
                f"{head}: no answer {noun} (tried {list(_ANSWER_FIELDS) + ['messages']}; "
                f"{noun}s present: {present}); pass answer_field="
            )
    if recs.tabular and answer_field not in recs.columns:
        raise ValueError(f"{recs.where()}: missing column {answer_field!r} (columns present: {recs.columns})")
    records = []
    for pos, rec in recs.rows:
        for fld in (prompt_field, answer_field):
            if fld not in rec:
                raise ValueError(f"{recs.where(pos)}: missing field {fld!r} (fields present: {sorted(rec)})")
        question, conv = _question(rec[prompt_field], f"{recs.where(pos)}: {noun} {prompt_field!r}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{recs.where(pos)}: {noun} {prompt_field!r} must be a non-empty string")
        raw = _turn(rec[answer_field], "assistant", last=True)
        gold = gold_from_field(raw)
        if gold is None:
            raise ValueError(f"{recs.where(pos)}: {noun} {answer_field!r} holds no usable answer ({str(raw)[:80]!r})")
        records.append((pos, question, gold, raw, conv))
    return recs.source, recs.split, records


_GUARDS = ("auto", "signal", "process", "none")


@dataclass(frozen=True)
class MathScoring:
    """How :class:`MathTask` checks a completion: ``math-verify`` under ``timeout_s`` seconds
    per completion (None: no limit), enforced by ``guard`` (``auto``, ``signal``, ``process``
    or ``none``: :func:`gapo.exec.scoring.run_with_timeout`); ``last_number``: without a boxed
    answer, fall back to the last number of the text (see the module docstring). A bad value is
    a ``ValueError`` naming the field."""

    timeout_s: float | None = 5.0
    guard: str = "auto"
    last_number: bool = True

    def __post_init__(self):
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
            raise ValueError(f"MathScoring.timeout_s must be a number > 0 or None, got {t!r}")
        if self.guard not in _GUARDS:
            raise ValueError(f"guard must be auto, signal, process or none, not {self.guard!r}")
        if not isinstance(self.last_number, bool):
            raise ValueError(f"MathScoring.last_number must be true or false, got {self.last_number!r}")


class MathTask:
    """Problems from a local dataset (JSONL, JSON, Parquet, CSV, a ``datasets`` folder), rewards
    from ``math-verify`` (binary 0/1).

    ``splits`` (:class:`~gapo.tasks.base.DataSplits`): the dataset's split to read (default
    ``train``, or its only split), and the held-out data: ``eval_split``, a split of the same
    dataset (or of ``eval_path``) to evaluate on instead of the ``eval_fraction`` hash split,
    e.g. GSM8K's ``test``. ``prompt_field`` / ``answer_field``: the question and answer columns
    (default: detected). ``prompt_format`` (:class:`~gapo.tasks.base.PromptFormat`): the
    template (``{question}`` is replaced) and the completion cap. ``scoring``
    (:class:`MathScoring`): the verifier's timeout, guard and last-number fallback.

    A group is an instance or a mapping of its fields (a YAML file's form). ``task.params`` may
    give a field on its own (``task.params.split=test``): ``gapo.tasks.get`` puts it in its group
    (:func:`~gapo.tasks.base.nest_group_fields`), so the constructor has one spelling,
    ``MathTask(path, splits=DataSplits(split="train", eval_split="test"))``.
    """

    alphabet = None  # a real tokenizer
    param_groups = (DataSplits, PromptFormat, MathScoring)  # task.params may give their fields flat

    def __init__(
        self,
        path: str | Path,
        *,
        splits: DataSplits | None = None,
        prompt_field: str | None = None,
        answer_field: str | None = None,
        prompt_format: PromptFormat | None = None,
        scoring: MathScoring | None = None,
        name: str = "math",
    ):
        splits = as_group(DataSplits, splits, DataSplits())
        fmt = as_group(PromptFormat, prompt_format, PromptFormat(DEFAULT_TEMPLATE))
        scoring = as_group(MathScoring, scoring, MathScoring())
        if "{question}" not in fmt.template:
            raise ValueError(f"template must contain '{{question}}', got {fmt.template!r}")
        self.name = name
        self.path = Path(path)
        self.template = fmt.template
        self.timeout_s = scoring.timeout_s
        self.eval_fraction = splits.eval_fraction
        self.guard = scoring.guard
        self.last_number = scoring.last_number
        self.max_completion_len = fmt.max_completion_len
        split, eval_split, eval_path = splits.split, splits.eval_split, splits.eval_path
        src, self.split, train = _load(self.path, split, prompt_field, answer_field)
        self.eval_split, self.eval_path = eval_split, Path(eval_path) if eval_path is not None else None

        def load_eval():  # the held-out rows, and the split they came from (resolved as for training)
            ev_src, self.eval_split, ev = _load(self.eval_path or self.path, eval_split, prompt_field, answer_field)
            return ev_src, ev

        pools = split_rows(splits, (src, train, self.split), load_eval, str(self.path))
        held_out = eval_split is not None or eval_path is not None
        self.n_dropped_overlap = len(train) - len(pools["train"][1]) if held_out else 0
        self._pools = {split: [self._problem(src, split, *rec) for rec in recs] for split, (src, recs) in pools.items()}

    def _problem(self, src: str, split: str, lineno: int, question: str, gold: str, raw: Any, conv) -> Problem:
        prompt = self.template.replace("{question}", question)
        # line: the JSONL line number, or the 1-based record/row number of other formats
        meta = {"source": str(src), "line": lineno, "split": split, "question": question, "solution": raw}
        if conv is not None:  # the conversation whole, its last user turn the templated question
            meta["messages"] = (*conv[:-1], {**conv[-1], "content": prompt})
        return Problem(prompt=prompt, answer=gold, meta=meta)

    def __getstate__(self):  # the pool pickles the task once per batch: leave the data behind
        state = dict(self.__dict__)
        state["_pools"] = None
        return state

    def __len__(self) -> int:
        return sum(len(p) for p in self._pools.values())

    def split_size(self, split: str) -> int:
        return len(self._split(split))

    def _split(self, split: str) -> list[Problem]:
        if self._pools is None:
            raise RuntimeError("this MathTask was unpickled without its data; it can score but not generate")
        if split not in self._pools:
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        return self._pools[split]

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        """``n`` problems of ``split`` in a seeded order; train cycles through reshuffled passes
        when ``n`` exceeds the split, eval refuses (repeats would bias evaluation)."""
        return draw_from_split(
            self._split(split),
            split,
            n,
            seed,
            where=f"{self.path}: the {split} split is empty (eval_fraction={self.eval_fraction})",
        )

    # -- scoring

    def warmup(self) -> None:
        _ensure_warm()  # once per process

    def after_timeout(self) -> None:
        after_timeout()

    def parse_ok(self, completion: str) -> bool:
        return locate_answers(completion, last_number=self.last_number) is not None

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        """(reward, status) with status ok / unparsable / ambiguous / timeout; never raises.

        ``ambiguous``: the completion commits to several values, in its final answers or in the
        text after them, or attaches something to a box (reward 0; see the module docstring)."""
        found = locate_answers(completion, last_number=self.last_number)
        if found is None:
            return 0.0, "unparsable"
        trailing = trailing_values(found)
        if trailing is None:  # a box with an exponent, a digit, an operator attached
            return 0.0, "ambiguous"
        gold = str(problem.answer)
        single = is_single_value(gold)
        candidates: list[str] = []
        for ans in found.answers + trailing:
            cands = answer_candidates(ans, single=single, gold=gold)
            if cands is None:
                return 0.0, "ambiguous"
            candidates += cands
        if not candidates:
            return 0.0, "unparsable"
        mode = "process" if _BROKEN_PID == os.getpid() else self.guard
        in_process = mode == "signal" or (mode == "auto" and signal_guard_usable())
        if in_process and self.timeout_s is not None:
            _ensure_warm()  # the first timed call of a process must not pay for (or cut) imports
        try:
            ok, parsed = run_with_timeout(verify_all, gold, candidates, timeout_s=self.timeout_s, mode=mode)
        except VerifierTimeout:
            if in_process:
                after_timeout()
            return 0.0, "timeout"
        except Exception:  # noqa: BLE001 - a math-verify/sympy failure on odd input is a wrong answer
            return 0.0, "unparsable"
        several = len(dict.fromkeys(candidates)) > 1
        if not ok and several:
            return 0.0, "ambiguous"
        if not parsed:
            return 0.0, "unparsable"
        return (1.0 if ok else 0.0), "ok"

    def score(self, problem: Problem, completion: str) -> float:
        return self.score_detailed(problem, completion)[0]

    def first_move(self, completion: str):
        return None  # no natural notion of a first move for free-form math

    def demonstration(self, problem: Problem, rng: random.Random | None = None) -> str:
        """A completion that scores 1: the worked solution if the data has one, ending in a box."""
        raw = problem.meta.get("solution")
        gold = str(problem.answer)
        if isinstance(raw, str) and "####" in raw:
            return raw.rsplit("####", 1)[0].rstrip() + f"\nThe answer is \\boxed{{{gold}}}."
        if isinstance(raw, str) and last_boxed(raw) is not None:
            return raw
        return f"The answer is \\boxed{{{gold}}}."
