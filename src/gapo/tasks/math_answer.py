"""Final answers of a math completion, the values they commit to, and gold answers of a dataset.

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

A gold answer is read from a dataset field by :func:`gold_from_field`: GSM8K's ``#### 1,234`` (commas
dropped), a MATH-style solution's last ``\\boxed{}``, else the field itself, stripped.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["answer_candidates", "extract_answer", "final_answers", "gold_from_field", "is_single_value", "last_boxed"]

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


def is_single_value(gold: str) -> bool:
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
