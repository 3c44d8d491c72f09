"""Final answers of a math completion, the values they commit to, and gold answers of a dataset.

Extraction from a completion, read with other scripts' separators, spaces and digits in ASCII
(:func:`unify_unicode`): the first format that applies gives *every* final answer of it,

1. every ``<answer>...</answer>`` span (inside one, its ``\\boxed{}`` stand for it),
2. every ``\\boxed{...}`` / ``\\fbox{...}`` / bare ``boxed{...}`` (balanced braces, so
   ``\\boxed{\\frac{1}{2}}`` works; a truncated box is skipped),
3. the rest of each "the answer is ...", "final answer: ..." or ``#### ...`` sentence, up to a
   connective or pronoun that starts a new statement ("5, since ..." -> 5),
4. the numbers of the last sentence holding one (``-1,234.5``, ``1 234``, ``3/4``, ``\\frac{3}{4}``),
   except those of a calculation left of ``=``, unless ``last_number=False``.

No answer -> reward 0, status ``unparsable``.

One answer, or no reward. The answer is one final expression: the reward is 1 only if every
final answer, and every value one of them commits to (:func:`answer_candidates`), verifies as the
gold. When the gold is one value, an answer holding a list (``6, 5``), ``±``, a set, an interval,
a relation (``\\ge 5``, ``\\in``), a range (``5 to 7``, ``5–7``) or several numbers with words
between them (number words count: :func:`spell_numbers`) is refused outright; ``or`` separates
values, and so do the sides of an equation chain (``x = 5`` is the value 5; ``6 = 5``,
``x = 3 = 7`` are two values). So ``\\boxed{6 \\text{ apples}, 5
\\text{ pears}}``, ``\\boxed{5 \\text{ or } 7}``, ``\\boxed{\\pm 7}``, ``\\boxed{5}\\boxed{7}`` and
"the values are 2, 5 and 8" score 0 (status ``ambiguous``) for gold 5 and for gold 7, while
``\\boxed{1,000}``, ``\\boxed{x = 5}``, ``\\boxed{\\text{5 apples}}`` and ``\\boxed{5} ... \\boxed{5}``
score 1. A gold that is itself a set, tuple, interval, list, ``±`` or relation is matched as one
structure (``\\boxed{(1, 2)}`` for gold ``(1, 2)``); only ``or`` and a ``±`` the gold lacks split
or refuse it. What the text after the answer commits to is :mod:`gapo.tasks.math_trailing`'s.
docs/tasks.md has the full table.

A gold answer is read from a dataset field by :func:`gold_from_field`: GSM8K's ``#### 1,234`` (commas
dropped), a MATH-style solution's last ``\\boxed{}``, else the field itself, stripped.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import unicodedata
from typing import Any, NamedTuple

__all__ = [
    "Located",
    "answer_candidates",
    "cut_at_connective",
    "extract_answer",
    "final_answers",
    "gold_from_field",
    "is_bare_number",
    "is_single_value",
    "last_boxed",
    "locate_answers",
    "spell_numbers",
    "unify_unicode",
]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "\boxed{", "\fbox{" and a bare "boxed{" (a run-on completion's "...}boxed{7}" is a box too)
_BOX = re.compile(r"(?:\\|(?<![A-Za-z\\]))(?:boxed|fbox)\s*\{")
# a sentence ends at ". " before a new sentence: not after an ellipsis ("5 ... 7"), not before a
# digit, a lower-case word or a brace ("5. 7", "5 resp. 7", "\\text{ resp. }")
_SENTENCE_END = re.compile(r"(?<=[^.\s][.!?])\s+(?=[^\s\da-z{}])")
# (not "... is not the answer: ...")
_PHRASE = re.compile(
    r"(?<!not )(?<!n't )(?:\b(?:the\s+)?final\s+answer\b|\bthe\s+answer\b)\s*(?:is\b\s*:?|:|=)\s*|####\s*",
    re.IGNORECASE,
)
_BOX_SPACE = re.compile(r"\\boxed +([^\s$]+)")  # "\boxed 5"
# what separates groups of three digits in one number: 1,000  1{,}000  1\,000  1\ 000  1~000  1 000
# (any Unicode space is a plain space by then: :func:`unify_unicode`)
_GROUP_SEP = r"(?:,|\{,\}|\\[,;: ]|~| )"
# A number: optional sign, thousands groups (one separator throughout; no leading 0: "0 100" is two
# numbers), decimals, optional "/denominator".
_NUMBER = re.compile(
    r"(?<![\w.])-?(?:[1-9]\d{0,2}(?P<sep>" + _GROUP_SEP + r")\d{3}(?:(?P=sep)\d{3})*(?!\d)|\d+)"
    r"(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
)
# the last-number rule's numbers: a LaTeX fraction of two numbers is one
_NUM_TOKEN = re.compile(r"-?\\[dt]?frac\s*\{\s*-?\d+(?:\.\d+)?\s*\}\s*\{\s*\d+(?:\.\d+)?\s*\}|" + _NUMBER.pattern)


# ----------------------------------------------------------------------------- extraction


@functools.cache
def _unicode_table() -> dict[int, str]:
    """The translation of :func:`unify_unicode`, read from the Unicode database once per process
    (about 0.1 s): every non-ASCII character by its category and name."""
    table: dict[int, str] = {}
    for cp in range(128, sys.maxunicode + 1):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat == "Nd":
            table[cp] = str(unicodedata.decimal(ch))
        elif cat == "Zs":
            table[cp] = " "
        elif cat[0] == "P":
            name = unicodedata.name(ch, "")
            if name in _ARABIC_SEPARATORS:
                table[cp] = _ARABIC_SEPARATORS[name]
            elif "COMMA" in name:
                table[cp] = ","
            elif "SEMICOLON" in name or "SEPARATOR" in name:
                table[cp] = ";"
            elif "FULL STOP" in name:  # fullwidth and small forms are a decimal point, as "." is
                nfkc = unicodedata.normalize("NFKC", ch)
                table[cp] = "." if nfkc == "." else ". "
    return table


# the Arabic decimal separator is a decimal point (5٫7 is 5.7), its thousands separator a comma
_ARABIC_SEPARATORS = {"ARABIC DECIMAL SEPARATOR": ".", "ARABIC THOUSANDS SEPARATOR": ","}


def unify_unicode(text: str) -> str:
    """One spelling for what other scripts write differently, so that the ASCII rules apply:

    - punctuation (Unicode category P) whose name says COMMA -> ``,`` (fullwidth ``，``, ideographic
      ``、``, small ``﹐``, vertical ``︐``, Arabic ``،`` ...), SEMICOLON or SEPARATOR -> ``;``
      (``；``, ``؛``, word and paragraph separators), FULL STOP -> ``.`` for the fullwidth and
      small forms (``５．５`` is 5.5) and ``". "`` for every other (an ideographic ``。`` ends a
      sentence, it is never a decimal point); the Arabic decimal separator ``٫`` -> ``.`` and its
      thousands separator ``٬`` -> ``,``;
    - every space (category Zs: no-break, thin U+2009, narrow no-break U+202F, ideographic ...) ->
      `` ``;
    - every decimal digit (category Nd: fullwidth ``５``, Arabic-Indic ``٥`` ...) -> its ASCII digit.

    Superscripts, fractions such as ``½`` and letters are left alone (NFKC would turn ``5²`` into
    ``52``)."""
    return text if text.isascii() else text.translate(_unicode_table())


def _boxes(text: str) -> list[tuple[str, int, int]]:
    """``(content, start, end)`` of every balanced ``\\boxed{...}`` / ``\\fbox{...}`` (or bare
    ``boxed{...}``), in order; an unbalanced (truncated) box is skipped. Without any, the
    ``\\boxed 5`` form."""
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
                    out.append((text[m.end() : i].strip(), m.start(), i + 1))
                    break
            i += 1
    if not out:
        out = [(m.group(1).strip(), m.start(), m.end()) for m in _BOX_SPACE.finditer(text)]
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``) with balanced braces, else None."""
    boxes = _boxes(text)
    return boxes[-1][0] if boxes else None


def _segments(text: str) -> list[str]:
    """Lines and sentences (a ``.``/``!``/``?`` followed by white space ends one; ``3.5`` does not)."""
    return [seg for line in text.splitlines() for seg in _SENTENCE_END.split(line) if seg.strip()]


def is_bare_number(segment: str) -> bool:
    """Whether a sentence is just a number (``5``, ``-3.5.``, ``\\frac{1}{2}``, ``$7$``)."""
    t = segment.strip().rstrip(".!").strip().strip("$").strip()
    return bool(_NUM_TOKEN.fullmatch(t.removeprefix("\\$")))


def _join_groups(number: str) -> str:
    """A number token without white space and thousands separators (``1\\,000`` -> ``1000``)."""
    return re.sub(_GROUP_SEP + r"|\s", "", number)


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
        return [_join_groups(m.group(0)) for m in _NUM_TOKEN.finditer(part)]

    if not nums(sides[-1]):
        return [seg.strip()]  # "5 =", "5 \approx": left open
    out = [n for side in sides[:-1] if not _CALCULATION.search(side) for n in nums(side)] + nums(sides[-1])
    if is_bare_number(seg):
        for prev in reversed(segs[:-1]):
            if not is_bare_number(prev):
                break
            out = nums(prev) + out
    return out


# where a value's clause ends: a connective or a pronoun starts a new statement
_CONNECTIVE = re.compile(
    r"(?<![\\\w])(?:because|since|as|so|which|who|when|where|whereas|if|but|though|although|while|hence|"
    r"thus|therefore|then|it|this|that|these|those|we|they|he|she|(?-i:I)|you|let|note|here|there|not|"
    r"instead\s+of|rather\s+than|i\.e\.|e\.g\.)(?![\w])|\((?=\s*[A-Za-z]{2,})",  # "(since ...", not "(x, 1)"
    re.IGNORECASE,
)


def cut_at_connective(text: str, start: int = 0) -> str:
    """``text`` up to the first connective or pronoun at or after ``start`` that starts a new
    statement ("5 apples, which is odd" -> "5 apples, "; "7 because ..." -> "7 ")."""
    m = _CONNECTIVE.search(text, start)
    return text[: m.start()] if m else text


_TRAILING_PUNCTUATION = re.compile(r"(?:[\s.!?,;:]|(?<![\w\\])(?:and|or|but)(?!\w))+$")  # "5, and we are done"


def _phrase_answers(text: str) -> list[tuple[str, int, int]]:
    """``(answer, start, end)``: what follows every "the answer is", "final answer:" or GSM8K's
    ``####``, to the end of its sentence or to a connective or pronoun that starts a new
    statement ("5, since ...", "5 I hope ..."; one that comes first is kept: "therefore 5")."""
    out = []
    for m in _PHRASE.finditer(text):
        sentence = _SENTENCE_END.split(text[m.end() :].split("\n", 1)[0], 1)[0]
        body = cut_at_connective(sentence, len(sentence) - len(sentence.lstrip(" *")) + 1)
        rest = _TRAILING_PUNCTUATION.sub("", body.strip().strip("*").strip()).strip().strip("*").strip()
        if rest and m.group(0).startswith("#"):  # GSM8K's "#### 1,234", as its gold is read
            rest = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", rest)
        if rest:
            out.append((rest, m.end(), m.end() + len(body)))
    return out


class Located(NamedTuple):
    """The final answers of a completion: their ``format`` (``answer``, ``boxed``, ``phrase``,
    ``number``), the ``answers``, where each stands in ``text`` (``spans``: ``(start, end)``) and
    ``text``, the completion as :func:`unify_unicode` spells it (what the spans index)."""

    format: str
    answers: list[str]
    spans: list[tuple[int, int]]
    text: str


def _tag_answers(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Every ``<answer>`` span's answers: its boxes if it has any, else its stripped content."""
    out, spans = [], []
    for m in _ANSWER_TAG.finditer(text):
        boxes = [(b, m.start(1) + i, m.start(1) + j) for b, i, j in _boxes(m.group(1)) if b]
        if not boxes and m.group(1).strip():
            boxes = [(m.group(1).strip(), m.start(), m.end())]
        out += [b for b, _, _ in boxes]
        spans += [(i, j) for _, i, j in boxes]
    return out, spans


def locate_answers(completion: str, *, last_number: bool = True) -> Located | None:
    """Every final answer the completion writes in the first format that applies (see the module
    docstring) and where it stands, or None when it writes none."""
    if not isinstance(completion, str):
        return None
    text = unify_unicode(completion)
    if _ANSWER_TAG.search(text):
        answers, spans = _tag_answers(text)
        return Located("answer", answers, spans, text) if answers else None
    boxes = _boxes(text)
    if boxes:  # only empty boxes: the completion answered nothing
        full = [(b, i, j) for b, i, j in boxes if b]
        return Located("boxed", [b for b, _, _ in full], [(i, j) for _, i, j in full], text) if full else None
    phrases = _phrase_answers(text)
    if phrases:
        return Located("phrase", [a for a, _, _ in phrases], [(i, j) for _, i, j in phrases], text)
    nums = _number_answers(text) if last_number else []
    if nums:
        last = list(_NUM_TOKEN.finditer(text))[-1]  # the answer's sentence ends no earlier
        return Located("number", nums, [last.span()], text)
    return None


def final_answers(completion: str, *, last_number: bool = True) -> tuple[str, list[str]] | None:
    """``(format, answers)``: every final answer the completion writes in the first format that
    applies (see the module docstring), or None when it writes none."""
    found = locate_answers(completion, last_number=last_number)
    return (found.format, found.answers) if found else None


def extract_answer(completion: str, *, last_number: bool = True) -> str | None:
    """The last final answer a completion writes, or None (see the module docstring).

    This is what a reader would take as "the" answer; the reward also requires every other
    final answer of the completion to agree with it (:func:`answer_candidates`)."""
    found = final_answers(completion, last_number=last_number)
    return found[1][-1] if found else None


# -- number words

_UNITS = "zero one two three four five six seven eight nine".split()
_TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
_VALUE_OF = {w: i for i, w in enumerate(_UNITS + _TEENS)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_NUM_WORD = "|".join(sorted([*_VALUE_OF, "hundred", *_SCALES], key=len, reverse=True))
_NUM_WORDS = re.compile(
    rf"(?<![\w\\])(?:(?:minus|negative)\s+)?(?:{_NUM_WORD})"
    rf"(?:(?:[\s-]+|(?<=hundred)\s+and\s+|(?<=thousand)\s+and\s+|(?<=million)\s+and\s+)(?:{_NUM_WORD}))*(?!\w)",
    re.IGNORECASE,
)


def _kind(word: str) -> str:
    if word in _SCALES:
        return "scale"
    if word == "hundred":
        return "hundred"
    return "tens" if word in _TENS else "unit" if _VALUE_OF[word] < 10 else "teen"


# which word may follow which inside one number ("twenty-one", "one hundred and five", "two
# thousand"); any other pair starts a new number ("five seven" is two numbers)
_NEXT = {
    "start": {"unit", "teen", "tens", "hundred", "scale"},  # "a hundred", "million"
    "unit": {"hundred", "scale"},
    "teen": {"hundred", "scale"},
    "tens": {"unit", "hundred", "scale"},
    "hundred": {"unit", "teen", "tens", "scale"},
    "scale": {"unit", "teen", "tens"},
}


def _spell_run(run: str) -> str:
    """Digits for one run of number words: ``twenty-one`` -> ``21``, ``five seven`` -> ``5 7``."""
    words = [w for w in re.split(r"[\s-]+", run.lower()) if w and w != "and"]
    sign = "-" if words[0] in ("minus", "negative") else ""
    numbers, total, cur, state = [], 0, 0, "start"
    for w in words[1:] if sign else words:
        kind = _kind(w)
        if kind not in _NEXT[state]:
            numbers.append(total + cur)
            total, cur, state = 0, 0, "start"
        if kind == "hundred":
            cur = (cur or 1) * 100
        elif kind == "scale":
            total, cur = total + (cur or 1) * _SCALES[w], 0
        else:
            cur += _VALUE_OF[w]
        state = kind
    numbers.append(total + cur)
    return sign + " ".join(str(n) for n in numbers)


def _spelled(m: re.Match) -> str:
    if m.group(0).lower() == "one" and re.match(r"\s+[A-Za-z]", m.string[m.end() :]):
        return m.group(0)  # the pronoun or article: "one day", "one could", "one of them"
    return _spell_run(m.group(0))


def spell_numbers(text: str) -> str:
    """``text`` with every run of English number words written in digits ("or maybe seven" ->
    "or maybe 7", "minus twenty-one" -> "-21"); a lone "one" before a word stays ("one day")."""
    return _NUM_WORDS.sub(_spelled, text)


# -- one answer: the values a final answer commits to

_TEXT_WRAP = re.compile(
    r"\\(?:text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathsf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_SPACING = re.compile(
    r"(?<!\\)\\[,;:! ]|~|\\q?quad\b|\\(?:displaystyle|textstyle)\b|\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])"
)
_THOUSANDS = re.compile(r"(?<![\d.])[1-9]\d{0,2}(?P<sep>" + _GROUP_SEP + r")\d{3}(?:(?P=sep)\d{3})*(?!\d)")
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
# words of prose, with their contractions ("it's"), and the pronoun "I" before a word
_WORD = re.compile(r"(?<![\\A-Za-z])(?:[A-Za-z]{2,}(?:['’][a-z]{1,2})?|I(?=\s+[A-Za-z]{2,}))(?![A-Za-z])")
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
    """One spelling for scoring: other scripts' separators, spaces and digits in ASCII
    (:func:`unify_unicode`); math delimiters, sizing and spacing commands and ``\\text{}``
    wrappers dropped; thousands separators (``1,000``, ``1{,}000``, ``1\\,000``, ``1 000``) removed;
    markdown bold dropped; number words in digits (:func:`spell_numbers`: "seven" -> 7)."""
    s = unify_unicode(ans)
    s = s.replace("$", " ").replace("\\(", " ").replace("\\)", " ").replace("\\[", " ").replace("\\]", " ")
    s = _THOUSANDS.sub(lambda m: _join_groups(m.group(0)), s)
    prev = None
    while prev != s:  # nested wrappers: \text{\textbf{5}}
        prev, s = s, _TEXT_WRAP.sub(lambda m: f" {m.group(1)} ", s)
    s = _SPACING.sub(" ", s).replace("**", " ")  # markdown bold is no power
    s = spell_numbers(s)
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
