"""Math word problems with final answers checked by ``math-verify``.

Data: a local dataset, one problem per record: JSONL, JSON, Parquet, CSV/TSV, Arrow, a
``datasets`` ``save_to_disk`` folder or a folder of data files (:mod:`gapo.tasks.datasets_io`;
``split`` picks a split, default ``train``). The question is read from ``prompt_field`` (default:
the first of ``question``, ``problem``, ``prompt``, ``messages`` among the columns, or present on
line 1 of JSONL), the reference answer from ``answer_field`` (default: the first of ``answer``,
``solution``, ``messages``): GSM8K (question/answer), MATH and MATH-500 (problem/solution or
answer), DeepScaleR (problem/answer/solution) and NuminaMath (problem/solution/messages) are
recognised as they ship. A chat-format field (a list of ``{"role", "content"}``) gives its first
user turn as the question and its last assistant turn as the answer. The answer field may be

- GSM8K style: worked solution ending in ``#### 1,234`` -> gold ``1234`` (commas dropped),
- MATH style: a solution containing ``\\boxed{...}`` -> the last box's content (nested braces ok),
- anything else: the field itself, stripped (numbers are turned into strings).

Extraction from a completion (first rule that applies):

1. the last ``<answer>...</answer>`` span (inside it, a ``\\boxed{}`` wins if present),
2. the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces, so ``\\boxed{\\frac{1}{2}}`` works),
3. the last number in the text (``-1,234.5``, ``3/4``), unless ``last_number=False``.

No answer -> reward 0, status ``unparsable``. Otherwise the extracted string and the gold are
parsed as LaTeX (wrapped in ``$...$``) with ``math_verify.parse`` and compared with
``math_verify.verify`` (numeric and symbolic equivalence: ``1/2``, ``0.5`` and ``\\frac{1}{2}``
agree). If that fails and the extracted answer contains letters (``18 dollars``), the plain
text is parsed too and compared again.

Timeouts: math-verify's own timeout uses ``signal.alarm`` and raises ``ValueError`` when called
off the main thread. gapo calls it with its timeouts disabled and guards the whole
parse-and-verify with :func:`gapo.tasks.scoring.run_with_timeout`: a ``SIGALRM`` timer on the main
thread (sympy's work is Python code, so the alarm interrupts it: ``9^{9^{9^9}}`` stops at the
limit), and off the main thread a helper process that is killed and replaced on timeout. A
timeout is reward 0, status ``timeout``.

Splits: with ``eval_path`` (any of the formats; ``eval_split`` picks its split) or ``eval_split``
alone (a split of ``path``, e.g. GSM8K's ``test``) the train split is ``path``'s ``split`` minus
any problem whose question also appears in the eval data; without either a stable hash of the question puts ``eval_frac`` of the
problems in eval (the shared rule of :func:`gapo.tasks.base.split_of`). Either way the splits are disjoint by question text.
"""

from __future__ import annotations

import logging
import math
import random
import re
from pathlib import Path
from typing import Any

from gapo.tasks.scoring import VerifierTimeout, run_with_timeout

from gapo.tasks.base import Problem, split_of
from gapo.tasks.datasets_io import read_records

__all__ = ["MathTask", "extract_answer", "gold_from_field", "last_boxed", "verify_answer", "warmup"]

DEFAULT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
_PROMPT_FIELDS = ("question", "problem", "prompt")
_ANSWER_FIELDS = ("answer", "solution")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SPACE = re.compile(r"\\boxed +([^\s$]+)")  # "\boxed 5"
# A number: optional sign, thousands groups, decimals, optional "/denominator".
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")


class _DropTimeoutWarning(logging.Filter):
    # math-verify warns that its timeout is off; gapo supplies its own guard.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ----------------------------------------------------------------------------- extraction


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``) with balanced braces, else None."""
    starts = [m.end() for m in _BOX.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text):
            ch = text[i]
            if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2  # escaped brace \{ \} does not count
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
            i += 1
        # unbalanced (truncated completion): try an earlier box
    m = None
    for m in _BOX_SPACE.finditer(text):
        pass
    return m.group(1).strip() if m else None


def _last_number(text: str) -> str | None:
    m = None
    for m in _NUMBER.finditer(text):
        pass
    if m is None:
        return None
    return re.sub(r"\s+", "", m.group(0)).replace(",", "")


def extract_answer(completion: str, *, last_number: bool = True) -> str | None:
    """The answer string a completion commits to, or None (see the module docstring)."""
    if not isinstance(completion, str):
        return None
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        inner = tags[-1]
        boxed = last_boxed(inner)
        ans = boxed if boxed is not None else inner.strip()
        return ans or None
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed or None
    return _last_number(completion) if last_number else None


def gold_from_field(value: Any) -> str | None:
    """Reference answer from a dataset field (GSM8K ``####``, MATH ``\\boxed{}``, or plain)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return None if isinstance(value, float) and not math.isfinite(value) else str(value)
    if not isinstance(value, str):
        return None
    if "####" in value:
        ans = value.rsplit("####", 1)[1].strip()
        return re.sub(r"(?<=\d),(?=\d{3})", "", ans) or None
    if _BOX.search(value):
        return last_boxed(value) or None
    return value.strip() or None


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


def warmup() -> None:
    """Import math-verify and run one comparison (sympy's first use is slow), so that a
    worker's first timed verification does not pay for it."""
    verify_answer("\\frac{1}{2}", "0.5")


# ----------------------------------------------------------------------------- the task


def _turn(value: Any, role: str, last: bool) -> Any:
    """The content of the first (or last) ``role`` turn of a chat-format field (NuminaMath's
    ``messages``: a list of ``{"role", "content"}``); any other value as it is."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        turns = [m.get("content") for m in value if m.get("role") == role]
        return (turns[-1] if last else turns[0]) if turns else None
    return value


def _load(path: Path, split: str | None, prompt_field: str | None, answer_field: str | None):
    """``(source, split, [(position, question, gold, raw answer)])`` of one split of a dataset
    (any format of :func:`gapo.tasks.datasets_io.read_records`)."""
    # `datasets` (the optional [math] extra) is imported inside read_records only for
    # Parquet/CSV/Arrow files and dataset folders; JSON and JSONL need nothing.
    def wanted(columns: list[str]) -> list[str]:  # of a wide table, read the two columns used only
        return [prompt_field or next((k for k in _PROMPT_FIELDS + ("messages",) if k in columns), ""),
                answer_field or next((k for k in _ANSWER_FIELDS + ("messages",) if k in columns), "")]

    recs = read_records(path, split=split, columns=wanted)
    head = recs.where(recs.rows[0][0] if not recs.tabular else None)
    present = sorted(recs.columns) if not recs.tabular else recs.columns
    noun = recs.noun
    if prompt_field is None:
        prompt_field = next((k for k in _PROMPT_FIELDS + ("messages",) if k in recs.columns), None)
        if prompt_field is None:
            raise ValueError(f"{head}: no question {noun} (tried {list(_PROMPT_FIELDS) + ['messages']}; "
                             f"{noun}s present: {present}); pass prompt_field=")
    if recs.tabular and prompt_field not in recs.columns:
        raise ValueError(f"{recs.where()}: missing column {prompt_field!r} (columns present: {recs.columns})")
    if answer_field is None:
        answer_field = next((k for k in _ANSWER_FIELDS + ("messages",) if k in recs.columns), None)
        if answer_field is None:
            raise ValueError(f"{head}: no answer {noun} (tried {list(_ANSWER_FIELDS) + ['messages']}; "
                             f"{noun}s present: {present}); pass answer_field=")
    if recs.tabular and answer_field not in recs.columns:
        raise ValueError(f"{recs.where()}: missing column {answer_field!r} (columns present: {recs.columns})")
    records = []
    for pos, rec in recs.rows:
        for fld in (prompt_field, answer_field):
            if fld not in rec:
                raise ValueError(f"{recs.where(pos)}: missing field {fld!r} (fields present: {sorted(rec)})")
        question = _turn(rec[prompt_field], "user", last=False)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{recs.where(pos)}: {noun} {prompt_field!r} must be a non-empty string")
        raw = _turn(rec[answer_field], "assistant", last=True)
        gold = gold_from_field(raw)
        if gold is None:
            raise ValueError(f"{recs.where(pos)}: {noun} {answer_field!r} holds no usable answer ({str(raw)[:80]!r})")
        records.append((pos, question, gold, raw))
    return recs.source, recs.split, records


def _qkey(question: str) -> str:
    return " ".join(question.split()).lower()


class MathTask:
    """Problems from a local dataset (JSONL, JSON, Parquet, CSV, a ``datasets`` folder), rewards
    from ``math-verify`` (binary 0/1).

    ``split`` names the dataset's split to read (default ``train``, or its only split);
    ``eval_split`` a split of the same dataset (or of ``eval_path``) to evaluate on instead of
    the ``eval_frac`` hash split, e.g. GSM8K's ``test``.
    """

    alphabet = None  # a real tokenizer

    def __init__(
        self,
        path: str | Path,
        *,
        split: str | None = None,
        eval_split: str | None = None,
        prompt_field: str | None = None,
        answer_field: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        eval_path: str | Path | None = None,
        eval_frac: float = 0.1,
        timeout_s: float | None = 5.0,
        guard: str = "auto",
        last_number: bool = True,
        max_completion_len: int = 1024,
        name: str = "math",
    ):
        if "{question}" not in template:
            raise ValueError(f"template must contain '{{question}}', got {template!r}")
        if not 0.0 <= eval_frac < 1.0:
            raise ValueError(f"eval_frac must be in [0, 1), got {eval_frac}")
        if guard not in ("auto", "signal", "process", "none"):
            raise ValueError(f"guard must be auto, signal, process or none, not {guard!r}")
        self.name = name
        self.path = Path(path)
        self.template = template
        self.timeout_s = timeout_s
        self.eval_frac = eval_frac
        self.guard = guard
        self.last_number = last_number
        self.max_completion_len = max_completion_len
        src, self.split, train = _load(self.path, split, prompt_field, answer_field)
        self.eval_split = eval_split
        if eval_path is not None or eval_split is not None:
            self.eval_path = Path(eval_path) if eval_path is not None else None
            ev_src_path = self.eval_path if self.eval_path is not None else self.path
            if self.eval_path is None and eval_split == self.split:
                raise ValueError(f"{self.path}: eval_split={eval_split!r} is the training split too; "
                                 "name another split of the dataset (e.g. test)")
            ev_src, self.eval_split, ev = _load(ev_src_path, eval_split, prompt_field, answer_field)
            seen = {_qkey(q) for _, q, _, _ in ev}
            kept = [r for r in train if _qkey(r[1]) not in seen]
            self.n_dropped_overlap = len(train) - len(kept)
            pools = {"train": (src, kept), "eval": (ev_src, ev)}
        else:
            self.eval_path = None
            self.n_dropped_overlap = 0

            def is_eval(q: str) -> bool:
                return split_of(_qkey(q), eval_frac) == "eval"

            pools = {
                "train": (src, [r for r in train if not is_eval(r[1])]),
                "eval": (src, [r for r in train if is_eval(r[1])]),
            }
        self._pools = {
            split: [self._problem(src, split, *rec) for rec in recs] for split, (src, recs) in pools.items()
        }

    def _problem(self, src: str, split: str, lineno: int, question: str, gold: str, raw: Any) -> Problem:
        prompt = self.template.replace("{question}", question)
        # line: the JSONL line number, or the 1-based record/row number of other formats
        meta = {"source": str(src), "line": lineno, "split": split, "question": question, "solution": raw}
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
        pool = self._split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if not pool:
            raise ValueError(f"{self.path}: the {split} split is empty (eval_frac={self.eval_frac})")
        if split == "eval" and n > len(pool):
            raise ValueError(f"asked for {n} eval problems but the eval split has {len(pool)}")
        rng = random.Random(f"{split}:{seed}")
        out: list[Problem] = []
        while len(out) < n:
            order = list(range(len(pool)))
            rng.shuffle(order)
            out.extend(pool[i] for i in order[: n - len(out)])
        return out

    # -- scoring

    def warmup(self) -> None:
        warmup()

    def parse_ok(self, completion: str) -> bool:
        return extract_answer(completion, last_number=self.last_number) is not None

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        """(reward, status) with status ok / unparsable / timeout; never raises."""
        pred = extract_answer(completion, last_number=self.last_number)
        if pred is None:
            return 0.0, "unparsable"
        try:
            ok, parsed = run_with_timeout(verify_answer, str(problem.answer), pred, timeout_s=self.timeout_s, mode=self.guard)
        except VerifierTimeout:
            return 0.0, "timeout"
        except Exception:  # a math-verify/sympy failure on odd input is a wrong answer
            return 0.0, "unparsable"
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
        if isinstance(raw, str) and _BOX.search(raw):
            return raw
        return f"The answer is \\boxed{{{gold}}}."
