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

Extraction from a completion: the first format that applies gives *every* final answer of it,

1. every ``<answer>...</answer>`` span (inside one, its ``\\boxed{}`` stand for it),
2. every ``\\boxed{...}`` / ``\\fbox{...}`` / bare ``boxed{...}`` (balanced braces, so
   ``\\boxed{\\frac{1}{2}}`` works; a truncated box is skipped),
3. the rest of each "the answer is ...", "final answer: ..." or ``#### ...`` sentence,
4. the numbers of the last sentence holding one (``-1,234.5``, ``3/4``, ``\\frac{3}{4}``), except
   those of a calculation left of ``=``, unless ``last_number=False``.

No answer -> reward 0, status ``unparsable``.

One answer, or no reward. The answer is one final expression: the reward is 1 only if every
final answer, and every value one of them commits to (:func:`answer_candidates`), verifies as the
gold. When the gold is one value, an answer holding a list (``6, 5``), ``±``, a set, an interval,
a relation (``\\ge 5``, ``\\in``), a range (``5 to 7``, ``5–7``) or several numbers in words is
refused outright; ``or`` separates values, and so do the sides of an equation chain (``x = 5`` is
the value 5; ``6 = 5``, ``x = 3 = 7`` are two values). So ``\\boxed{6 \\text{ apples}, 5
\\text{ pears}}``, ``\\boxed{5 \\text{ or } 7}``, ``\\boxed{\\pm 7}``, ``\\boxed{5}\\boxed{7}`` and
"the values are 2, 5 and 8" score 0 (status ``ambiguous``) for gold 5 and for gold 7, while
``\\boxed{1,000}``, ``\\boxed{x = 5}``, ``\\boxed{\\text{5 apples}}`` and ``\\boxed{5} ... \\boxed{5}``
score 1. A gold that is itself a set, tuple, interval, list, ``±`` or relation is matched as one
structure (``\\boxed{(1, 2)}`` for gold ``(1, 2)``); only ``or`` and a ``±`` the gold lacks split
or refuse it. docs/tasks.md has the full table.

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
    draw_from_split,
    flat_eval_fraction,
    refuse_leftovers,
    split_of,
    take_group,
)
from gapo.tasks.datasets_io import read_records

__all__ = [
    "MathTask",
    "answer_candidates",
    "extract_answer",
    "final_answers",
    "gold_from_field",
    "last_boxed",
    "verifier_healthy",
    "verify_all",
    "verify_answer",
    "warmup",
]

DEFAULT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
_PROMPT_FIELDS = ("question", "problem", "prompt")
_ANSWER_FIELDS = ("answer", "solution")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "\boxed{", "\fbox{" and a bare "boxed{" (a run-on completion's "...}boxed{7}" is a box too)
_BOX = re.compile(r"(?:\\|(?<![A-Za-z\\]))(?:boxed|fbox)\s*\{")
# a sentence ends at ". " before a new sentence: not after an ellipsis ("5 ... 7"), not before a
# digit, a lower-case word or a brace ("5. 7", "5 resp. 7", "\\text{ resp. }")
_SENTENCE_END = re.compile(r"(?<=[^.\s][.!?])\s+(?=[^\s\da-z{}])")
_PHRASE = re.compile(
    r"(?:\b(?:the\s+)?final\s+answer\b|\bthe\s+answer\b)\s*(?:is\b\s*:?|:|=)\s*|####\s*", re.IGNORECASE
)
_BOX_SPACE = re.compile(r"\\boxed +([^\s$]+)")  # "\boxed 5"
# A number: optional sign, thousands groups, decimals, optional "/denominator".
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
# the last-number rule's numbers: a LaTeX fraction of two numbers is one
_NUM_TOKEN = re.compile(r"-?\\[dt]?frac\s*\{\s*-?\d+(?:\.\d+)?\s*\}\s*\{\s*\d+(?:\.\d+)?\s*\}|" + _NUMBER.pattern)


class _DropTimeoutWarning(logging.Filter):
    # math-verify warns that its timeout is off; gapo supplies its own guard.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ----------------------------------------------------------------------------- extraction


def _boxes(text: str) -> list[str]:
    """Contents of every balanced ``\\boxed{...}`` / ``\\fbox{...}`` (or bare ``boxed{...}``), in order;
    an unbalanced (truncated) box is skipped. Without any, the ``\\boxed 5`` form."""
    out = []
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
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
                    out.append(text[m.end() : i].strip())
                    break
            i += 1
    if not out:
        out = [m.group(1).strip() for m in _BOX_SPACE.finditer(text)]
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``) with balanced braces, else None."""
    boxes = _boxes(text)
    return boxes[-1] if boxes else None


def _segments(text: str) -> list[str]:
    """Lines and sentences (a ``.``/``!``/``?`` followed by white space ends one; ``3.5`` does not)."""
    return [seg for line in text.splitlines() for seg in _SENTENCE_END.split(line) if seg.strip()]


def _bare(segment: str) -> bool:
    """Whether a sentence is just a number (``5``, ``-3.5.``, ``\\frac{1}{2}``, ``$7$``)."""
    t = segment.strip().rstrip(".!").strip().strip("$").strip()
    return bool(_NUM_TOKEN.fullmatch(t.removeprefix("\\$")))


def _number_answers(text: str) -> list[str]:
    """The last-number rule, on the last sentence that holds a number: its numbers, except those
    of a calculation left of an ``=`` (``2 + 3 = 5`` gives 5; ``x = 3 = 7``, ``So 7 = 5`` and
    ``x = 7, y = 5`` give two numbers), and the bare numbers of the sentences right before it when it
    is a bare number itself (a list written one number per line). A sentence with ``±``, ``or``,
    a relation or a range is returned whole, for :func:`answer_candidates` to refuse."""
    segs = [seg for seg in _segments(text) if _NUMBER.search(seg)]
    if not segs:
        return []
    seg = segs[-1]
    if _PROSE_MULTI.search(seg):
        return [seg.strip()]
    sides = _EQ.split(seg)

    def nums(part: str) -> list[str]:
        return [re.sub(r"\s+", "", m).replace(",", "") for m in _NUM_TOKEN.findall(part)]

    if not nums(sides[-1]):
        return [seg.strip()]  # "5 =", "5 \approx": left open
    out = [n for side in sides[:-1] if not _CALCULATION.search(side) for n in nums(side)] + nums(sides[-1])
    if _bare(seg):
        for prev in reversed(segs[:-1]):
            if not _bare(prev):
                break
            out = nums(prev) + out
    return out


def _phrase_answers(text: str) -> list[str]:
    """What follows every "the answer is", "final answer:" or GSM8K's ``####``, to the end of
    its sentence."""
    out = []
    for m in _PHRASE.finditer(text):
        rest = text[m.end() :].split("\n", 1)[0]
        rest = _SENTENCE_END.split(rest, 1)[0].strip().strip("*").strip()
        rest = re.sub(r"[.!?]+$", "", rest).strip().strip("*").strip()
        if rest and m.group(0).startswith("#"):  # GSM8K's "#### 1,234", as its gold is read
            rest = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", rest)
        if rest:
            out.append(rest)
    return out


def final_answers(completion: str, *, last_number: bool = True) -> tuple[str, list[str]] | None:
    """``(format, answers)``: every final answer the completion writes in the first format that
    applies (see the module docstring), or None when it writes none."""
    if not isinstance(completion, str):
        return None
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        out = []
        for inner in tags:
            boxes = [b for b in _boxes(inner) if b]
            out += boxes if boxes else [inner.strip()] if inner.strip() else []
        return ("answer", out) if out else None
    boxes = [b for b in _boxes(completion) if b]
    if boxes:
        return "boxed", boxes
    if _boxes(completion):  # only empty boxes: the completion answered nothing
        return None
    phrases = _phrase_answers(completion)
    if phrases:
        return "phrase", phrases
    if last_number:
        nums = _number_answers(completion)
        if nums:
            return "number", nums
    return None


def extract_answer(completion: str, *, last_number: bool = True) -> str | None:
    """The last final answer a completion writes, or None (see the module docstring).

    This is what a reader would take as "the" answer; the reward also requires every other
    final answer of the completion to agree with it (:func:`answer_candidates`)."""
    found = final_answers(completion, last_number=last_number)
    return found[1][-1] if found else None


# -- one answer: the values a final answer commits to

_TEXT_WRAP = re.compile(
    r"\\(?:text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathsf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_SPACING = re.compile(
    r"(?<!\\)\\[,;:! ]|~|\\q?quad\b|\\(?:displaystyle|textstyle)\b|\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])"
)
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:,|\{,\}|\\,)\d{3})+(?![\d])")
# several values inside one answer, when the gold is one value: lists, ±, sets, relations,
# ranges, matrices, ellipses
_MULTI = re.compile(
    r",|;|\\\\|&|\\pm(?![A-Za-z])|±|\\mp(?![A-Za-z])|∓|\\[{}]|\\(?:cup|cap|setminus|in|notin|ni|subset|subseteq|"
    r"supset|supseteq|le|leq|leqslant|ge|geq|geqslant|lt|gt|ne|neq|ll|gg|sim|simeq|propto|to|gets|mapsto|"
    r"implies|impliedby|iff|land|wedge|lor|vee|ldots|cdots|dots|vdots|ddots|begin|mid|parallel|perp)(?![A-Za-z])|"
    r"lbrace|rbrace|[<>≤≥≠∈∉∪∩⊂⊆⊃⊇∧∨…–—→⇒⇔]|\\(?:[lL]ong)?(?:left|right|leftright)(?:arrow|Arrow)|\.\.|--|"
    r"(?<=[\w})])\s*\|\s*(?=[\w\\(])"  # "5 | 7" (divides, given, or), not |x|
)
_DISJ = re.compile(r"\s*(?:(?<![A-Za-z\\])or(?![A-Za-z])|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|∨)\s*", re.IGNORECASE)
_CONJ = re.compile(r"\s*(?:(?<![A-Za-z\\])and(?![A-Za-z])|\\land(?![A-Za-z])|\\wedge(?![A-Za-z])|∧)\s*", re.IGNORECASE)
_EQ = re.compile(r"\s*(?:=|\\approx(?![A-Za-z])|≈|\\equiv(?![A-Za-z])|\\coloneqq(?![A-Za-z]))\s*")
# in prose (the last-number rule): several values or a relation, whatever the numbers
_PROSE_MULTI = re.compile(
    r"\\pm(?![A-Za-z])|±|\\mp(?![A-Za-z])|∓|\\[{}]|\\(?:in|le|leq|ge|geq|lt|gt|ne|neq|lor|vee|sim)(?![A-Za-z])|"
    r"[<>≤≥≠∈∨–—]|(?<![A-Za-z\\])or(?![A-Za-z])",
    re.IGNORECASE,
)
_CALCULATION = re.compile(r"\d\s*(?:[-+*/×÷^]|\\(?:cdot|times|div|frac)(?![A-Za-z]))\s*[\d(\\]")
_PM = re.compile(r"\\pm(?![A-Za-z])|±|\\mp(?![A-Za-z])|∓")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
# two values side by side with only spaces, braces (and removed words, decorations) between:
# "5 7", "5 to 7", "2 hours 30", "{5}7", "5{}7", "\\frac{1}{2} 3"
_JUXTAPOSED = re.compile(r"\d(?:\s|[{}])[\s{}]*[-+]?\.?\d")
_FRAC = re.compile(r"\\(?:[dtc]?frac|[dt]?binom)\s*\{[^{}]*\}\s*\{[^{}]*\}")
_PRIME = re.compile(r"\^\s*\{\s*\\prime\s*\}|\^\s*\\prime|\\prime|'+|\"")
# LaTeX commands that join two numbers into one value; any other (spacing, colour, phantoms,
# decorations, nested boxes) separates them
_DECOR = re.compile(
    r"\\(?!(?:cdot|times|div|ast|over|choose|mod|bmod|pmod|sqrt|log|ln|lg|exp|sin|cos|tan|cot|sec|"
    r"csc|arcsin|arccos|arctan|sinh|cosh|tanh|max|min|gcd|lcm)(?![A-Za-z]))[A-Za-z]+\*?"
)
_NUM_SUBSCRIPT = re.compile(r"\d\s*_\s*\{?\s*[-+]?\.?\d")  # 5_{7}: a second number, unless the gold has a base


def _several_values(value: str, gold: str) -> bool:
    """Whether one value's text shows several numbers side by side (``5 to 7``, ``5 \\enspace 7``,
    ``5'7``, ``{5}{7}``, ``5_{7}``) rather than one expression of them (``2 \\sqrt{3}``,
    ``\\frac{1}{2}``, ``3.5``, ``2 \\times 10^{3}``)."""
    t = _FRAC.sub(" 1 ", value)  # a fraction or a binomial of two groups is one value
    t = _PRIME.sub(" ", t)
    t = _DECOR.sub(" ", t)
    t = _WORD.sub(" ", t)
    t = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", t)  # full stops and "resp.", not decimal points
    if "_" not in gold and _NUM_SUBSCRIPT.search(t):
        return True
    return bool(_JUXTAPOSED.search(t))


_SUBSCRIPT = re.compile(r"_(?:\{[^{}]*\}|\w)|'+")


def _normalise(ans: str) -> str:
    """One spelling for scoring: math delimiters, sizing and spacing commands and ``\\text{}``
    wrappers dropped; thousands separators (``1,000``, ``1{,}000``, ``1\\,000``) removed."""
    s = ans.replace("$", " ").replace("\\(", " ").replace("\\)", " ").replace("\\[", " ").replace("\\]", " ")
    s = _THOUSANDS.sub(lambda m: re.sub(r"\D", "", m.group(0)), s)
    prev = None
    while prev != s:  # nested wrappers: \text{\textbf{5}}
        prev, s = s, _TEXT_WRAP.sub(lambda m: f" {m.group(1)} ", s)
    s = _SPACING.sub(" ", s)
    s = s.replace(">=", "\\ge ").replace("<=", "\\le ").replace("!=", "\\ne ").replace("==", "=")
    return " ".join(s.split())


def _is_name(side: str) -> bool:
    """The left of ``x = 5``: a variable or a digit-free expression of variables (``a+b``,
    ``f(x)``, ``\\angle ABC``), not a constant (``\\pi``, ``e``, ``\\infty``)."""
    bare = _SUBSCRIPT.sub("", side).strip()
    if not re.search(r"[A-Za-z]", bare) or re.search(r"\d|\\pi|\\infty|\\sqrt", bare):
        return False
    return bare not in ("e", "i")


def _is_single(gold: str) -> bool:
    """Whether the gold is one value (not a set, tuple, interval, list, ± or relation)."""
    return answer_candidates(gold, single=True) is not None


def answer_candidates(answer: str, *, single: bool, gold: str = "") -> list[str] | None:
    """The values one final answer commits to, or None when it commits to several and ``single``
    (the gold is one value) forbids that.

    - ``or`` / ``\\lor`` always separate candidates (each must verify);
    - ``x = 5`` is the value 5; a chain ``x = 2+3 = 5`` commits to each side that is not a name,
      and a side left empty (``5 \\approx``) commits to nothing;
    - with ``single``: a list (``,`` ``;`` ``and``), ``±``, a set, an interval, a relation
      (``\\ge``, ``\\in``), a range (``5–7``, ``5 to 7``), a matrix or several numbers in words
      (``5 apples 7 pears``) is several values: None. Otherwise (the gold is a set, tuple, interval
      ...) the answer is compared as one structure, ``and`` reads as a comma, and only a ``\\pm``
      the gold does not have is refused (and ``or`` splits only when the gold has none).
    """
    s = _normalise(answer)
    if not s:
        return []
    if not single and _PM.search(s) and not _PM.search(gold):
        return None
    out: list[str] = []
    for part in [s] if not single and _DISJ.search(_normalise(gold)) else _DISJ.split(s):
        if not single:
            part = _CONJ.sub(", ", part)
        elif _CONJ.search(part):
            return None
        if single and _MULTI.search(part):
            return None
        sides = _EQ.split(part)
        if len(sides) > 1 and not sides[-1].strip():
            return None  # "5 =", "5 \approx": a relation left open
        sides = [x for x in sides if x.strip()]
        if not sides:
            return None if single else []
        values = [x for x in sides if not _is_name(x)] or sides[-1:]
        for v in values:
            if single and _several_values(v, gold):
                return None
            out.append(v.strip())
    return out


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
    except Exception:  # noqa: BLE001
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

    Every field of the three groups is also a keyword of its own, the ``task.params`` spelling:
    ``MathTask(path, split="train", eval_split="test", timeout_s=2)`` is
    ``MathTask(path, splits=DataSplits(split="train", eval_split="test"),
    scoring=MathScoring(timeout_s=2))``; a keyword replaces that field of a group given too.
    ``eval_frac`` is the old name of ``eval_fraction`` (still accepted, with a FutureWarning).
    """

    alphabet = None  # a real tokenizer
    param_groups = (DataSplits, PromptFormat, MathScoring)  # their fields are keywords too

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
        eval_frac: float | None = None,  # eval_fraction's old name (warns)
        **fields,  # the groups' fields, one keyword each
    ):
        flat_eval_fraction(fields, eval_frac)
        splits = take_group(DataSplits, splits, fields, DataSplits())
        fmt = take_group(PromptFormat, prompt_format, fields, PromptFormat(DEFAULT_TEMPLATE))
        scoring = take_group(MathScoring, scoring, fields, MathScoring())
        refuse_leftovers("MathTask", fields)
        if "{question}" not in fmt.template:
            raise ValueError(f"template must contain '{{question}}', got {fmt.template!r}")
        self.name = name
        self.path = Path(path)
        self.template = fmt.template
        self.timeout_s = scoring.timeout_s
        self.eval_fraction = eval_fraction = splits.eval_fraction
        self.guard = scoring.guard
        self.last_number = scoring.last_number
        self.max_completion_len = fmt.max_completion_len
        split, eval_split, eval_path = splits.split, splits.eval_split, splits.eval_path
        src, self.split, train = _load(self.path, split, prompt_field, answer_field)
        self.eval_split = eval_split
        if eval_path is not None or eval_split is not None:
            self.eval_path = Path(eval_path) if eval_path is not None else None
            ev_src_path = self.eval_path if self.eval_path is not None else self.path
            if self.eval_path is None and eval_split == self.split:
                raise ValueError(
                    f"{self.path}: eval_split={eval_split!r} is the training split too; "
                    "name another split of the dataset (e.g. test)"
                )
            ev_src, self.eval_split, ev = _load(ev_src_path, eval_split, prompt_field, answer_field)
            seen = {_qkey(q) for _, q, _, _ in ev}
            kept = [r for r in train if _qkey(r[1]) not in seen]
            self.n_dropped_overlap = len(train) - len(kept)
            pools = {"train": (src, kept), "eval": (ev_src, ev)}
        else:
            self.eval_path = None
            self.n_dropped_overlap = 0

            def is_eval(q: str) -> bool:
                return split_of(_qkey(q), eval_fraction) == "eval"

            pools = {
                "train": (src, [r for r in train if not is_eval(r[1])]),
                "eval": (src, [r for r in train if is_eval(r[1])]),
            }
        self._pools = {split: [self._problem(src, split, *rec) for rec in recs] for split, (src, recs) in pools.items()}

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
        return final_answers(completion, last_number=self.last_number) is not None

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        """(reward, status) with status ok / unparsable / ambiguous / timeout; never raises.

        ``ambiguous``: the completion commits to several values (reward 0; see the module
        docstring)."""
        found = final_answers(completion, last_number=self.last_number)
        if found is None:
            return 0.0, "unparsable"
        gold = str(problem.answer)
        single = _is_single(gold)
        candidates: list[str] = []
        for ans in found[1]:
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
        except Exception:  # a math-verify/sympy failure on odd input is a wrong answer
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
        if isinstance(raw, str) and _BOX.search(raw):
            return raw
        return f"The answer is \\boxed{{{gold}}}."
