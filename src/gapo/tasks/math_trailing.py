"""The text after a math completion's answer: the values it commits to, and what is attached to a box.

The one-answer rule (:mod:`gapo.tasks.math_answer`) covers the text after the answer too: under
RL, ``\\boxed{5} or maybe 7`` pays as surely as ``\\boxed{5 \\text{ or } 7}`` would if it were
not caught. The *trailing text* is the completion after its first final answer (the first box,
``<answer>`` span, "the answer is" sentence or, for the last-number rule, the last number), with
the later final answers blanked out (they are final answers already). A value it commits to must
verify as the gold like the final answers themselves; so a different one scores 0, status
``ambiguous``, and a restatement of the same value (``\\boxed{5}. Final answer: 5``,
``\\boxed{5}, i.e. five``) does not. A value in the trailing text commits when it is

1. the rest of a clause after a *lead*, at a clause start: an answer label ("Final answer: 7",
   "The answer is 7", "my answer should be 7", ``#### 7``), or a *cue* ("actually", "wait",
   "no,", "correction", "maybe", "perhaps", "alternatively", "instead", "I think", "I mean",
   "make that", "on second thought", "hold on", "oops", "sorry", "hmm"; ``or`` alone only
   right after the answer or at a sentence start, "or maybe"/"or rather" anywhere), optionally
   followed by a pronoun's copula ("it is", "it's", "that should be"): "Actually, I think it is
   7", "wait, it's 7", "no, 7", "correction: 7", "or maybe 7";
2. claimed as an answer by what follows it, to the clause's end: "7 is also possible",
   "7 is another solution", "7 would also be correct", "7 works too";
3. a line of its own that is only a number (``7``, ``$7$``, ``**7**``, ``\\frac{14}{2}``, "seven");
4. right after the answer, with only spaces, ``,``, ``;``, ``=`` or ``(`` between
   (``\\boxed{5}, 7``, ``\\boxed{5} (7)``, ``\\boxed{5} = 7``).

Clause starts: the trailing text's start, a sentence's start (after ``.``/``!``/``?`` and white
space), a line's, a parenthesis's, a capitalised word's (a run-on: "The answer is 5 Make that
7") and (for every lead but a bare ``or``) the place after ``,`` ``;`` ``:`` or a dash. A
*value* is the clause's text up to a connective or a pronoun ("because", "since", "which", "so",
"but", "if", "not", "we", "it" ...: :func:`gapo.tasks.math_answer.cut_at_connective`), that
starts like a value (a digit, a sign, ``$``, a LaTeX command, ``(``, ``x =``, a number word) and
holds a number (a digit, ``\\pi``, ``\\sqrt``, ``\\frac``, ``\\infty`` or number words, read as
digits: "seven" -> 7, "twenty-one" -> 21, "one hundred and five" -> 105), with at most three
words after it (units) and none that makes it a different statement (a verb, a comparison, a
preposition, a negation: "7 less than 12", "7 of them", "7 cannot be right"). So explanations
that mention other numbers do not commit: "\\boxed{5}. This is because 2+3=5.", "\\boxed{5}
(since 7-2=5)", "We used 7 apples in step 2", "Let me double-check: 5 works." (5 is a
restatement), "It is 7 more than -2". A pronoun's copula without a cue commits at a sentence's
start ("It is 7.") and not inside a sentence ("For the first part, it is 3"), where it explains.

A box with something attached that changes its value is not a clean answer (reward 0, status
``ambiguous``): an exponent or subscript (``\\boxed{5}^{7}``, ``\\boxed{101}_2``; ``^\\circ`` is a
unit), a digit, brace, decimal part, prime and digit or parenthesised value right after it
(``\\boxed{5}7``, ``\\boxed{5}{7}``, ``\\boxed{5}.5``, ``\\boxed{5}'7``, ``\\boxed{5}(7)``), or an
operator and a value (``\\boxed{5} \\cdot 2``, ``\\boxed{5}/7``, ``\\boxed{5} + 2``, ``\\boxed{5}*2``).
``\\boxed{5}!`` is an exclamation mark (prose writes it after answers; a factorial belongs in
the box), ``\\boxed{5}\\%`` and ``\\boxed{5}\\text{ cm}`` are units: the verifier reads
``5\\%`` as 5 already.
"""

from __future__ import annotations

import re

from gapo.tasks.math_answer import Located, cut_at_connective, is_bare_number, spell_numbers

__all__ = ["attached_to_box", "trailing_values"]

# -- values

# words that make the clause a different statement from "the answer is <value>"
_SPOIL = re.compile(
    r"(?<![\\\w])(?:than|more|less|fewer|greater|smaller|larger|bigger|higher|lower|times|of|in|on|at|for|"
    r"from|to|with|by|into|over|under|after|before|between|out|is|are|was|were|be|been|being|am|has|have|had|"
    r"do|does|did|can|cannot|could|would|should|will|shall|may|might|must|not|no|never|isn't|wasn't|"
    r"doesn't|don't|can't|won't|plus|minus|divided|multiplied|squared|cubed|half|twice|double|triple|the|a|an|"
    r"each|every|some|any|all|other|another|its|their|our|my|your|his|her|ago|later|earlier|works?|gives?|"
    r"satisf(?:y|ies)|fits?|holds?|remains?|makes?|means?|equals?)(?![\w'])",
    re.IGNORECASE,
)
_FILLERS = re.compile(r"(?<![\\\w])(?:in\s+(?:total|all)|altogether|overall|total|exactly|only)(?![\w])", re.I)
_VALUE_START = re.compile(r"(?:[-+]\s*)?(?:\.?\d|\\[A-Za-z$(\[]|\$|\(|\[|[A-Za-z](?:_\w)?\s*=(?!=))")
_HAS_NUMBER = re.compile(r"\d|\\(?:pi|infty|sqrt|[dt]?frac)(?![A-Za-z])")
_PLAIN_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


def _close(clause: str) -> str:
    """The clause up to a ``)`` that closes nothing opened inside it ("(or maybe 7)" -> "7")."""
    depth = 0
    for i, ch in enumerate(clause):
        depth += ch in "({[" and 1 or ch in ")}]" and -1 or 0
        if depth < 0:
            return clause[:i]
    return clause


def _as_value(clause: str) -> str | None:
    """The value a clause states, in digits, or None when it states none (see the module
    docstring)."""
    v = _close(cut_at_connective(clause))
    v = _FILLERS.sub(" ", v)
    v = re.sub(r"(?:[\s,;:.!?*—–]|(?<![\w\\])(?:and|or)(?!\w)|-(?!\s*[\d.\\(]))+$", "", v.strip())
    v = spell_numbers(v).strip().strip("*").strip()
    if not _VALUE_START.match(v) or not _HAS_NUMBER.search(v) or _SPOIL.search(v) or v.count("(") > v.count(")"):
        return None  # (a parenthesis left open: a value of an inner clause, "5 (7 is also possible)")
    return v if len(_PLAIN_WORD.findall(re.sub(r"\\[A-Za-z]+", " ", v))) <= 3 else None


_CLAUSE_END = re.compile(r"\n|;|[.!?](?=\s|$)|$")


def _clause(text: str, start: int) -> str:
    """From ``start`` to the end of the sentence, the line or a ``;`` (searched, not split: a
    long trailing text has many clause starts)."""
    return text[start : _CLAUSE_END.search(text, start).start()]


# -- leads and claims

_FILLER = r"(?:so|well|but|ok(?:ay)?|oh|um+|uh+|then|however|also|and|hence|thus|therefore|note\s+that|of\s+course)"
_CUE = (
    r"(?:actually|wait|hmm+|oops|sorry|no(?=\s*[,:!—–-])|nope|correction|alternatively|otherwise|instead|rather|"
    r"maybe|perhaps|possibly|probably|hold\s+on|on\s+second\s+thoughts?|on\s+reflection|in\s+fact|i\s+mean|"
    r"make\s+that|scratch\s+that|let\s+me\s+correct(?:\s+(?:that|myself))?|i\s+(?:now\s+)?(?:think|believe|"
    r"guess|suspect|reckon)|or\s+(?:maybe|perhaps|possibly|probably|rather|else|alternatively))"
)
_BE = (
    r"(?:\s+is|\s*['’]s|\s+was|\s*=|\s+equals|"
    r"\s+(?:should|must|would|could|might|may|will|can)(?:\s+(?:also|actually|instead|really|then))?\s+be)"
)
_ADV = (
    r"(?:actually|really|also|probably|maybe|perhaps|possibly|rather|instead|just|then|simply|definitely|"
    r"clearly|likely|indeed|about|approximately|roughly|around|exactly|precisely|now|still|in\s+fact)"
)
_LABEL = (
    r"(?:(?:(?:my|our|the)\s+)?(?:(?:final|correct|right|real|true|actual|new|revised|corrected)\s+)?"
    rf"(?:answer\**\s*(?:is\b\s*:?|[:=])|(?:answer|solution){_BE})|####)"
)
_SEP = r"\s*[,:;!—–-]*\s*"
# group "cue": the cues and fillers before the core; "core": an answer label or a pronoun's copula
_LEAD = re.compile(
    rf"(?:#{{1,3}}\s+)?(?P<pre>(?:(?:{_FILLER}|(?P<cue>{_CUE})|(?P<bare_or>or))(?![\w']){_SEP})*)"
    rf"(?P<core>\**{_LABEL}|(?P<pronoun>(?:it|this|that){_BE}))?(?:{_SEP}{_ADV}(?!\w))*\**\s*",
    re.IGNORECASE,
)
_CLAIM = re.compile(
    r"\s+(?:(?:is|are|was|(?:would|could|might|may)(?:\s+also)?\s+be|seems)\s+(?:also\s+|too\s+|equally\s+)?"
    r"(?:(?:a|an|the|another)\s+)?(?:(?:other|valid|possible|correct|right|acceptable|plausible|alternative|"
    r"second|final)\s+)*(?:possible|correct|valid|right|acceptable|plausible|fine|answer|solution|option)|"
    r"(?:also\s+)?works?|(?:would|could|might)\s+(?:also\s+)?work)(?:\s+(?:too|as\s+well|also))?\s*(?=[.!?,;)\n]|$)",
    re.IGNORECASE,
)
_LEAD_SKIP = re.compile(r"(?:[\s*>$]|-(?=\s))*")


def _led_value(text: str, start: int, open_start: bool) -> str | None:
    """The value a lead at ``start`` commits to (rule 1), if one does."""
    m = _LEAD.match(text, _LEAD_SKIP.match(text, start).end())
    if not m or not (m.group("core") or m.group("cue") or (m.group("bare_or") and open_start)):
        return None
    if m.group("pronoun") and not (open_start or m.group("cue")):
        return None  # "..., it is 3" inside a sentence explains
    return _as_value(_clause(text, m.end()))


def _claimed_value(text: str, start: int) -> str | None:
    """The value a claim after it commits to (rule 2: "7 is also possible"), if one does."""
    clause = _clause(text, _LEAD_SKIP.match(text, start).end())
    clause = re.sub(rf"^(?:{_FILLER}(?!\w){_SEP})*", "", clause, flags=re.IGNORECASE)
    m = _CLAIM.search(clause)
    return _as_value(clause[: m.start()]) if m else None


def _bare_line(line: str) -> str | None:
    """The number a line holds when it holds nothing else (rule 3)."""
    t = spell_numbers(line).strip().strip("*").strip()
    t = re.sub(r"^\\[(\[]|\\[)\]]$", "", t).strip()
    return t.strip("$").strip() if is_bare_number(t) else None


def _clause_starts(text: str) -> list[tuple[int, bool]]:
    """``(position, open)`` of every clause start; open ones are the text's, a sentence's, a
    line's, a parenthesis's or a capitalised word's (a run-on sentence: "... 5 Make that 7")."""
    starts = [(0, True)] + [(m.end(), True) for m in re.finditer(r"[.!?](?=\s)|\n|\(|\s(?=[A-Z][a-z])", text)]
    return starts + [(m.end(), False) for m in re.finditer(r"[,;:—–]", text)]


# rule 4: right after the answer, only spaces and one of , ; = (
_DIRECT = re.compile(r"[ \t$*]*(?:[,;=(][ \t]*)?")
# what may stand between the answer and an open clause start ("\boxed{5}, or 7", "5}$. Or 7")
_OPENING = re.compile(r"[\s$*,;:.!?)\]]*")


def trailing_values(found: Located) -> list[str] | None:
    """The values the text after the first final answer commits to (see the module docstring),
    or None when a box has something attached that changes its value."""
    if attached_to_box(found):
        return None
    first = min(found.spans)
    # a phrase's answer runs to a new statement or its sentence's end, so it is read again
    # ("The answer is 5 (or maybe 7)"), and where it ends opens a clause ("... is 5 I think it is 7")
    begin = first[0] if found.format == "phrase" else first[1]
    tail = list(found.text[begin:])
    for i, j in found.spans:
        if i > first[0]:
            tail[i - begin : j - begin] = [" "] * (j - i)
    text = re.sub(r"</?answer>", " ", "".join(tail), flags=re.IGNORECASE)
    after = first[1] - begin
    direct = _DIRECT.match(text, after)
    out = [_as_value(_clause(text, direct.end()))]
    for start, open_start in _clause_starts(text) + [(_OPENING.match(text, after).end(), True)]:
        out += [_led_value(text, start, open_start), _claimed_value(text, start)]
    out += [_bare_line(line) for line in text.split("\n")[1:]]
    return list(dict.fromkeys(v for v in out if v))


_ATTACHED = re.compile(
    r"\.?\d|\{|'+\s*\d|\(\s*[-+\d.]|[ \t]*(?:\^(?!\s*\{?\s*\\circ(?![A-Za-z]))|_|\\prime(?![A-Za-z])|"
    r"(?:\\(?:cdot|times|div|ast|bmod|mod|pmod)(?![A-Za-z])|[×÷·∙/]|\*(?!\*)|[-+](?![-+]))[ \t]*"
    r"(?:[-+\d.{(]|\\(?:[dt]?frac|sqrt|pi|infty|left|binom)(?![A-Za-z])))"
)


def attached_to_box(found: Located) -> bool:
    """Whether something right after one of the boxes (or ``<answer>`` spans) changes its value:
    an exponent, a subscript, a digit, an operator and a value (see the module docstring)."""
    return found.format in ("boxed", "answer") and any(_ATTACHED.match(found.text, j) for _, j in found.spans)
