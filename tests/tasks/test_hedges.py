"""One answer, or no reward: hedges built from the gold and a distractor never score (math).

A hedge is a completion whose final answer commits to several values (a list, ``or``, ``±``, a
chained or false equation, boxes that disagree, a relation, a range, several numbers in words);
under RL a policy finds such answers by itself if they pay. Each one is tried with the gold first
and with the gold second, in every answer format (``\\boxed{}``, ``<answer>``, "The answer is",
the last number), for fixed and for random golds. Correct single answers in each format must
still score 1.0.

The rule covers the text after the answer too (gapo.tasks.math_trailing): commitments to another
value after it, by class (answer labels, cues, "or", claims, bare lines) x spelling of the value
x placement x answer format; list separators of every script (from the Unicode database); boxes
with something attached. And it must not be trivially strict: harmless text after a correct
answer that mentions other numbers, spaced thousands and units keep scoring 1.
"""

from __future__ import annotations

import sys
import unicodedata
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("math_verify")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gapo.tasks.math as math_mod  # noqa: E402
from gapo.tasks.base import DataSplits, Problem  # noqa: E402
from gapo.tasks.math import MathScoring, MathTask  # noqa: E402
from gapo.tasks.math_answer import answer_candidates, final_answers  # noqa: E402

FIX = Path(__file__).parents[1] / "fixtures"

# The final answer's text, from the gold {g} and a distractor {d}.
INNER_HEDGES = [
    # lists
    "{g}, {d}",
    "{d}, {g}",
    "{g}; {d}",
    "{g} \\quad {d}",
    "{g} \\\\ {d}",
    "{g} & {d}",
    "\\{{{g}, {d}\\}}",
    "[{g}, {d}]",
    "({g}, {d})",
    "x = {g}, y = {d}",
    "{g} \\text{{ apples}}, {d} \\text{{ pears}}",
    "{g} apples, {d} pears",
    "{g} and {d}",
    "{g} \\text{{ and }} {d}",
    "\\langle {g}, {d} \\rangle",
    # disjunctions
    "{g} or {d}",
    "{d} or {g}",
    "{g} \\text{{ or }} {d}",
    "{g} \\lor {d}",
    "{g} \\vee {d}",
    "\\text{{either }} {g} \\text{{ or }} {d}",
    "{g} \\textbf{{or}} {d}",
    "x = {g} \\text{{ or }} x = {d}",
    "{g} OR {d}",
    # plus-minus
    "{g} \\pm {d}",
    "{d} \\mp {g}",
    "{g} ± {d}",
    # chained and false equations, open relations
    "{g} = {d}",
    "{d} = {g}",
    "x = {g} = {d}",
    "x = {d} = {g}",
    "{g} \\approx {d}",
    "{g} \\approx",
    "{g} =",
    "{g} \\equiv {d}",
    # relations, sets, intervals
    "x \\ge {g}",
    "x \\geq {g}",
    "x > {g}",
    "x < {d}",
    "{g} \\le x \\le {d}",
    "x \\in \\{{{g}, {d}\\}}",
    "x \\in [{g}, {d}]",
    "{g} \\sim {d}",
    "\\{{{g}\\}} \\cup \\{{{d}\\}}",
    "{g} \\neq {d}",
    "{g} \\to {d}",
    # ranges and ellipses
    "{g} to {d}",
    "from {g} to {d}",
    "{g}–{d}",
    "{g} — {d}",
    "{g} \\text{{ to }} {d}",
    "between {g} and {d}",
    "{g}, \\ldots, {d}",
    "{g} \\dots {d}",
    "{g} ... {d}",
    # matrices, juxtaposition
    "\\begin{{pmatrix}} {g} \\\\ {d} \\end{{pmatrix}}",
    "{g} {d}",
    "${g}$ ${d}$",
    "{g} \\; {d}",
    "{g} \\text{{ apples }} {d} \\text{{ pears}}",
    # numbers kept apart by decorations, spacing commands, braces, primes, subscripts
    "{g}_{{{d}}}",
    "{g}^{{\\prime}}{d}",
    "{g}{{}}{d}",
    "{{{g}}}{{{d}}}",
    "{g}'{d}",
    "{g} \\vphantom{{{d}}}",
    "\\lbrace {g} \\rbrace {d}",
    "{g} \\text{{ resp. }} {d}",
    "{g} \\enspace {d}",
    "{g}\\hfill {d}",
    "\\color{{red}}{{{g}}} {d}",
    "{g}\\!\\!{d}",
    "{g} \\hspace{{1em}} {d}",
    "\\mathbf{{{g}}}\\mathbf{{{d}}}",
]
WRAPPERS = {
    "boxed": "Let me think. \\boxed{{{x}}}",
    "answer": "Let me think. <answer>{x}</answer>",
    "phrase": "Let me think.\nThe answer is {x}.",
    "number": "Let me think.\n{x}",
}
# Whole completions: several final answers that disagree.
WHOLE_HEDGES = [
    "\\boxed{{{g}}}\\boxed{{{d}}}",
    "\\boxed{{{d}}} then \\boxed{{{g}}}",
    "\\boxed{{{g}}} or \\boxed{{{d}}}",
    "\\boxed{{{g}}} ... \\boxed{{{d}}} ... \\boxed{{{g}}}",
    "4 + 1 = \\boxed{{{g}}}boxed{{{d}}}boxed{{3}}",
    "\\fbox{{{g}}} \\boxed{{{d}}}",
    "<answer>{g}</answer><answer>{d}</answer>",
    "<answer>\\boxed{{{g}}} \\boxed{{{d}}}</answer>",
    "The answer is {g}. The answer is {d}.",
    "Final answer: {g}\nFinal answer: {d}",
    "#### {g}\n#### {d}",
    "{g}\n{d}",
    "{g}. {d}.",
    "{d}\n{g}",
    "We get x = {g} = {d}.",
    "So {g} = {d}.",
    "The answer is {g}, or {d}.",
]
# The issue's own examples (gold, completion).
ISSUE_HEDGES = [
    ("5", "\\boxed{6 \\text{ apples}, 5 \\text{ pears}}"),
    ("6", "\\boxed{6 \\text{ apples}, 5 \\text{ pears}}"),
    ("5", "<answer>6 apples, 5 pears</answer>"),
    ("6", "<answer>6 apples, 5 pears</answer>"),
    ("5", "\\boxed{6 = 5}"),
    ("6", "\\boxed{6 = 5}"),
    ("7", "\\boxed{\\pm 7}"),
    ("-7", "\\boxed{\\pm 7}"),
    ("5", "\\boxed{5 \\text{ or } 7}"),
    ("7", "\\boxed{5 \\text{ or } 7}"),
    ("7", "\\boxed{x = 3 = 4 = 5 = 6 = 7}"),
    ("3", "\\boxed{x = 3 = 4 = 5 = 6 = 7}"),
    ("20", "\\boxed{" + ", ".join(str(i) for i in range(1, 21)) + "}"),
    ("20", "The numbers are " + ", ".join(str(i) for i in range(1, 21)) + "."),
    ("20", "\n".join(str(i) for i in range(1, 21))),
    ("5", "4 + 1 = \\boxed{5}boxed{7 + 6 + 8}boxed{3}"),
    ("3", "4 + 1 = \\boxed{5}boxed{7 + 6 + 8}boxed{3}"),
]

# More shapes a policy could try (gold, completion): separators, spacing, nesting, other formats.
EXTRA_HEDGES = [
    ("5", "\\boxed{5 | 7}"),
    ("7", "\\boxed{5 | 7}"),
    ("5", "\\boxed{5 \\vert 7}"),
    ("5", "\\boxed{\\{5\\} \\{7\\}}"),
    ("5", "\\boxed{5}\\text{ or }\\boxed{7}"),
    ("5", "\\boxed{5\\ 7}"),
    ("5", "\\boxed{5\\qquad 7}"),
    ("5", "\\boxed{5 \\, 7}"),
    ("5", "\\boxed{5\\;\\text{or}\\;7}"),
    ("5", "\\boxed{5\\text{/}7}"),
    ("5", "\\boxed{\\text{5 or 7}}"),
    ("5", "\\boxed{5 \\text{ and/or } 7}"),
    ("7", "\\boxed{\\max(5, 7)}"),
    ("5", "\\boxed{5 \\text{ if } x>0 \\text{ else } 7}"),
    ("5", "\\boxed{\\begin{cases}5\\\\7\\end{cases}}"),
    ("5", "\\boxed{5 \\text{ vs } 7}"),
    ("5", "\\boxed{5 (7)}"),
    ("5", "\\boxed{\\text{5}\\text{7}}"),
    ("5", "\\boxed{x = \\pm 5}"),
    ("5", "\\boxed{5, }"),
    ("5", "The answer is 5 (or possibly 7)"),
    ("5", "The answer is between 5 and 7."),
    ("5", "5 plus or minus 2"),
    ("(1, 2)", "\\boxed{(1,2),(2,1)}"),
    ("(1, 2)", "\\boxed{(1, 2) \\text{ and } (2, 1)}"),
    ("(1, 2)", "\\boxed{\\{(1,2),(2,1)\\}}"),
    ("\\{1, 2\\}", "\\boxed{\\{1, 2\\} \\text{ or } \\{3\\}}"),
    ("2, 3", "\\boxed{2, 3 \\text{ or } 4}"),
    ("[5, 7]", "\\boxed{[5, 7] \\cup [8, 9]}"),
    ("5", "\\boxed{5}\\\\boxed{7}"),
    ("5", "\\boxed{5}, \\boxed{7}"),
    ("5", "**5** or **7**"),
    ("5", "Answer: 5, 7"),
    ("7", "Answer: 5, 7"),
    ("5", "\\boxed{\\dfrac{10}{2} \\text{ or } \\dfrac{14}{2}}"),
    ("5", "$\\boxed{5}$ $\\boxed{7}$"),
    ("5", "\\boxed{5\\text{ }7}"),
    ("5", "\\boxed{5 \\cdot 1 = 7 \\cdot 1}"),
    ("5", "\\boxed{x^2 = 25}"),
    ("5", "\\boxed{5~7}"),
    ("5", "\\boxed{5{,}7}"),
    ("5", "\\boxed{5,7}"),
    ("5", "<answer>5\n7</answer>"),
    ("5", "<answer>5 7</answer>"),
    ("5", "The answer is: 5 7"),
    ("5", "so x=5 or x=7"),
    ("5", "x=5 and x=7"),
    ("5", "\\boxed{\\text{either}~5~\\text{or}~7}"),
    ("5", "\\boxed{5 \\text{ (alternatively } 7)}"),
    ("5", "\\boxed{[5]}\\boxed{[7]}"),
    ("5", "\\boxed{\\{5, 7\\} \\ni 5}"),
    ("5", "\\boxed{5 \\leftarrow 7}"),
    ("5", "\\boxed{5 \\gets 7}"),
    ("5", "\\boxed{5 \\not= 7}"),
    ("5", "\\boxed{5 \\lesssim 7}"),
    ("5", "\\boxed{5 \\neq 7}"),
    ("5", "\\boxed{5 \\colon 7}"),
    ("5", "\\boxed{5 : 7}"),
    ("5", "\\boxed{5 \\div 7}"),
]


def all_hedges(g: str, d: str) -> list[tuple[str, str]]:
    """(name, completion) for every hedge of the gold ``g`` and the distractor ``d``."""
    out = []
    for i, inner in enumerate(INNER_HEDGES):
        for first, second in ((g, d), (d, g)):
            x = inner.format(g=first, d=second)
            out += [(f"inner{i}/{w}", wrap.format(x=x)) for w, wrap in WRAPPERS.items()]
    for i, whole in enumerate(WHOLE_HEDGES):
        for first, second in ((g, d), (d, g)):
            out.append((f"whole{i}", whole.format(g=first, d=second)))
    out.append(("pm-only", f"\\boxed{{\\pm {g.lstrip('-')}}}"))
    out.append(("long-list", "\\boxed{" + ", ".join([d] * 5 + [g] + [d] * 14) + "}"))
    return out


def correct_singles(g: str, *, integer: bool) -> list[str]:
    """Correct single answers of the gold ``g`` in each recognised format."""
    out = [
        f"\\boxed{{{g}}}",
        f"<answer>{g}</answer>",
        f"<answer>so \\boxed{{{g}}}</answer>",
        f"The answer is {g}.",
        f"The answer is ${g}$.",
        f"**Final answer:** {g}",
        f"So the total is {g}.",
        f"We add them: 2 + 3 = {g}",
        f"\\boxed{{x = {g}}}",
        f"\\boxed{{{g}}} and to check: \\boxed{{{g}}}",
        f"$x = \\boxed{{{g}}}$.",
    ]
    if integer:
        out += [
            f"\\boxed{{\\text{{{g} apples}}}}",
            f"\\boxed{{{g} \\text{{ apples}}}}",
            f"She has {g} apples.",
            f"<answer>{g} apples</answer>",
            f"#### {g}",
        ]
        if not g.startswith("-"):
            out += [f"\\boxed{{\\${g}}}", f"It costs \\${g}."]
        n = int(g)
        if abs(n) >= 1000:
            out += [
                f"\\boxed{{{n:,}}}",
                "\\boxed{" + f"{n:,}".replace(",", "{,}") + "}",
                f"The total is {n:,} dollars.",
                f"#### {n:,}",
            ]
    return out


@pytest.fixture(scope="module")
def task():
    t = MathTask(FIX / "math_gsm8k.jsonl", splits=DataSplits(eval_fraction=0.0), scoring=MathScoring(timeout_s=30.0))
    t.warmup()
    return t


def _score(task, gold, completion):
    return task.score_detailed(Problem(prompt="q", answer=gold), completion)


def test_the_issues_hedges_score_zero(task):
    for gold, completion in ISSUE_HEDGES + EXTRA_HEDGES:
        assert _score(task, gold, completion)[0] == 0.0, (gold, completion)


@pytest.mark.parametrize(
    "g, d", [("5", "7"), ("-3", "12"), ("2.5", "4"), ("\\frac{3}{4}", "\\frac{1}{4}"), ("1000", "2000")]
)
def test_hedge_catalogue_scores_zero(task, g, d):
    tried = all_hedges(g, d)
    passed = [(name, c) for name, c in tried if _score(task, g, c)[0] != 0.0]
    assert not passed, f"{len(passed)} of {len(tried)} hedges scored: {passed[:5]}"
    # and the same hedges score nothing for the distractor as gold either
    passed = [(name, c) for name, c in tried if _score(task, d, c)[0] != 0.0]
    assert not passed, f"{len(passed)} of {len(tried)} hedges scored for the distractor: {passed[:5]}"


def test_hedges_are_reported_as_ambiguous(task):
    assert _score(task, "5", "\\boxed{5, 7}") == (0.0, "ambiguous")
    assert _score(task, "5", "\\boxed{5}\\boxed{7}") == (0.0, "ambiguous")
    assert _score(task, "5", "The values are 2, 5 and 8") == (0.0, "ambiguous")
    assert _score(task, "5", "\\boxed{5 / 7}") == (0.0, "ok")  # a fraction is one (wrong) value
    assert _score(task, "-2", "\\boxed{5-7}") == (1.0, "ok")  # a difference is one value


@pytest.mark.parametrize(
    "gold, completion",
    [
        ("1000", "\\boxed{1,000}"),
        ("1000", "\\boxed{1{,}000}"),
        ("1000", "\\boxed{1\\,000}"),
        ("1234567", "The total is 1,234,567 dollars."),
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}"),
        ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}"),
        ("\\frac{1}{2}", "so it is 1/2"),
        ("-3", "\\boxed{-3}"),
        ("3.5", "\\boxed{3.5}"),
        ("3.5", "It is 3.5 meters."),
        ("5", "\\boxed{x = 5}"),
        ("5", "\\boxed{\\$5}"),
        ("5", "\\boxed{5\\%}"),
        ("5", "\\boxed{\\text{5 apples}}"),
        ("2\\sqrt{2}", "\\boxed{2\\sqrt{2}}"),
        ("4", "$x = \\boxed{4}$"),
        ("72", "In total 48 + 24 = 72."),
        ("72", "#### 72"),
        ("5", "x = 2 + 3 = 5, so \\boxed{x = 2 + 3 = 5}"),
        ("5", "\\boxed{5} (check: \\boxed{5.0})"),
        ("\\pi", "\\boxed{\\pi}"),
        ("x + 1", "\\boxed{y = x + 1}"),
        # structured golds, matched as such
        ("(1, 2)", "\\boxed{(1, 2)}"),
        ("(1, 2)", "\\boxed{(x, y) = (1, 2)}"),
        ("[0, 1)", "\\boxed{[0, 1)}"),
        ("(-\\infty, 2)", "\\boxed{(-\\infty, 2)}"),
        ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}"),
        ("2, 3", "\\boxed{3, 2}"),
        ("2, 3", "\\boxed{2 \\text{ and } 3}"),
        ("\\pm 7", "\\boxed{\\pm 7}"),
        ("x \\ge 5", "\\boxed{x \\geq 5}"),
    ],
)
def test_correct_single_answers_still_score(task, gold, completion):
    assert _score(task, gold, completion) == (1.0, "ok"), (gold, completion)


@pytest.mark.parametrize(
    "gold, completion",
    [
        ("(1, 2)", "\\boxed{(1, 2) \\text{ or } (2, 1)}"),
        ("(1, 2)", "\\boxed{(\\pm 1, 2)}"),
        ("(1, 2)", "\\boxed{(1, 2)}\\boxed{(2, 1)}"),
        ("[0, 1)", "\\boxed{[0, 1) \\text{ or } (0, 1]}"),
        ("\\{1, 2\\}", "\\boxed{\\{1, 2, 3\\}}"),
        ("2, 3", "\\boxed{2, 3, 4}"),
        ("\\{1, 2\\}", "\\boxed{1}"),
        ("\\pm 7", "\\boxed{7}"),
    ],
)
def test_structured_golds_refuse_hedges_of_structures(task, gold, completion):
    assert _score(task, gold, completion)[0] == 0.0, (gold, completion)


def test_candidates_and_final_answers():
    assert answer_candidates("x = 5", single=True) == ["5"]
    assert answer_candidates("x = 2+3 = 5", single=True) == ["2+3", "5"]
    assert answer_candidates("5 or 7", single=True) == ["5", "7"]
    assert answer_candidates("5, 7", single=True) is None
    assert answer_candidates("1,000", single=True) == ["1000"]
    assert answer_candidates("(1, 2) or (2, 1)", single=False) == ["(1, 2)", "(2, 1)"]
    assert final_answers("\\boxed{1} and \\boxed{2}") == ("boxed", ["1", "2"])
    assert final_answers("a\n3\n4") == ("number", ["3", "4"])
    assert final_answers("So 2 + 3 = 5 apples.") == ("number", ["5"])
    assert final_answers("\\boxed{}") is None


def test_fixtures_still_score_one():
    for name in ("math_gsm8k.jsonl", "math_competition.jsonl"):
        t = MathTask(FIX / name, splits=DataSplits(eval_fraction=0.0))
        for p in t.generate("train", t.split_size("train"), 0):
            assert t.score(p, t.demonstration(p)) == 1.0, (name, p.answer)
            assert t.score(p, f"\\boxed{{{p.answer}}}") == 1.0, (name, p.answer)


# ----------------------------------------------------------------------------- random golds


def _fmt_decimal(x: Fraction) -> str:
    return f"{float(x):.2f}".rstrip("0").rstrip(".")


@st.composite
def gold_and_distractor(draw):
    kind = draw(st.sampled_from(["int", "decimal", "fraction"]))
    if kind == "int":
        g, d = draw(st.integers(-3000, 3000)), draw(st.integers(-3000, 3000))
        assume(g != d)
        return str(g), str(d), True
    if kind == "decimal":
        g = Fraction(draw(st.integers(-9999, 9999)), 100)
        d = Fraction(draw(st.integers(-9999, 9999)), 100)
        assume(g != d and g.denominator != 1 and d.denominator != 1)
        return _fmt_decimal(g), _fmt_decimal(d), False
    a, b = draw(st.integers(1, 40)), draw(st.integers(2, 12))
    c, e = draw(st.integers(1, 40)), draw(st.integers(2, 12))
    assume(Fraction(a, b).denominator != 1 and Fraction(a, b) != Fraction(c, e))
    return f"\\frac{{{a}}}{{{b}}}", f"\\frac{{{c}}}{{{e}}}", False


_VERIFIED: dict[tuple, object] = {}


def _verified_once(fn, gold, candidates, **kw):
    """``run_with_timeout(verify_all, gold, candidates)``, once per (gold, candidates): the ~630
    hedges of one gold reach the verifier with about ten distinct ones (5 vs 7: 234 calls, 10
    distinct), and math-verify is a pure function of them. Everything that tells the hedges apart
    (extraction, the several-values rules) still runs for each; a timeout is not remembered."""
    key = (fn.__qualname__, gold, tuple(candidates))
    if key not in _VERIFIED:
        _VERIFIED[key] = _RUN_WITH_TIMEOUT(fn, gold, candidates, **kw)
    return _VERIFIED[key]


_RUN_WITH_TIMEOUT = math_mod.run_with_timeout


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@pytest.mark.slow
@given(gold_and_distractor())
def test_random_golds_no_hedge_scores(task, gd):
    g, d, _ = gd
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        for name, completion in all_hedges(g, d):
            assert _score(task, g, completion)[0] == 0.0, (g, d, name, completion)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(gold_and_distractor())
def test_random_golds_correct_single_answers_score(task, gd):
    g, _, integer = gd
    for completion in correct_singles(g, integer=integer):
        assert _score(task, g, completion) == (1.0, "ok"), (g, completion)


# ----------------------------------------------------------------------------- after the answer
# The one-answer rule covers the text after the answer: a completion that, after its boxed or
# tagged answer, commits to another value is a hedge (gapo.tasks.math_trailing). Built by
# classes: a lead (answer labels, cues, "or", claims) x a spelling of the other value x where
# the text follows the answer x the answer's format.

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".split()
_ONES += "seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def in_words(n: int) -> str:
    """English words for an integer below a million ("minus twenty-one", "one thousand and five")."""
    if n < 0:
        return "minus " + in_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("-" + _ONES[n % 10] if n % 10 else "")
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + (" and " + in_words(rest) if rest else "")
    rest = n % 1000
    return in_words(n // 1000) + " thousand" + ((" and " if rest < 100 else " ") + in_words(rest) if rest else "")


# commitments to {v}: answer labels, cues (with and without a pronoun's copula), "or", claims
COMMITMENTS = [
    "Final answer: {v}",
    "**Final Answer:** {v}",
    "The answer is {v}",
    "So the final answer is {v}",
    "My answer should be {v}",
    "#### {v}",
    "Actually, {v}",
    "Actually, I think it is {v}",
    "Actually it's {v}",
    "I think it is {v}",
    "I believe the answer is {v}",
    "Wait, it's {v}",
    "Wait, no, it should be {v}",
    "No, {v}",
    "No, it is {v}",
    "Correction: {v}",
    "Hmm, actually, the answer is {v}",
    "Hold on, it must be {v}",
    "On second thought, {v}",
    "Make that {v}",
    "Oops, it is {v}",
    "Sorry, the correct answer is {v}",
    "I mean {v}",
    "Alternatively, {v}",
    "Maybe {v}",
    "Perhaps it is {v}",
    "It is {v}",
    "It's {v}",
    "or {v}",
    "or maybe {v}",
    "or perhaps {v}",
    "or possibly {v}",
    "Or rather {v}",
    "{v} is also possible",
    "{v} is also correct",
    "{v} is another solution",
    "{v} would also be correct",
    "{v} works too",
    "But {v} also works",
    "Note that {v} is also a valid answer",
    "Actually, I think it is {v} because I made an error",
    "The answer is {v}, not the boxed one",
]
# where the trailing text stands after the answer ({a}) and how it ends
PLACEMENTS = ["{a} {t}", "{a}. {t}.", "{a}\n\n{t}", "{a} ({t})", "{a}, {t}.", "{a}!\n{t}"]
ANSWER_FORMS = {
    "boxed": "The answer is \\boxed{{{g}}}",
    "math-boxed": "So $x = \\boxed{{{g}}}$",
    "bold-boxed": "**\\boxed{{{g}}}**",
    "answer": "<answer>{g}</answer>",
    "answer-boxed": "<answer>\\boxed{{{g}}}</answer>",
    "phrase": "The answer is {g}",
}
# values committed to, as written after the answer: a line of their own
BARE_LINES = ["{a}\n{v}", "{a}\n\n{v}", "{a}\n\n${v}$", "{a}\n\n**{v}**", "{a}\n\n\\({v}\\)"]


def spellings(d: str) -> list[str]:
    """Ways to write the value ``d`` after the answer: digits, math, LaTeX, a name, words."""
    out = [d, f"${d}$", f"\\({d}\\)", f"**{d}**", f"x = {d}"]
    if d.lstrip("-").isdigit():
        n = int(d)
        out += [in_words(n), in_words(n).capitalize(), f"{d} apples", f"\\frac{{{2 * n}}}{{2}}", f"{d}.0"]
    return out


def trailing_hedges(g: str, d: str, *, every: int = 1) -> list[tuple[str, str]]:
    """(class, completion): an answer ``g`` followed by a commitment to ``d``; ``every`` > 1 keeps
    every n-th of the combinations (all classes still appear)."""
    out = []
    combos = [(c, p, v, f) for c in COMMITMENTS for p in PLACEMENTS for v in spellings(d) for f in ANSWER_FORMS]
    for i, (commit, place, v, form) in enumerate(combos):
        if i % every == 0 or i < len(COMMITMENTS):
            a = ANSWER_FORMS[form].format(g=g)
            out.append((f"commit:{commit}", place.format(a=a, t=commit.format(v=v))))
    plain = [v for v in spellings(d) if not v.startswith(("$", "\\(", "**", "x =")) and "apples" not in v]
    for line in BARE_LINES:
        for form in ANSWER_FORMS.values():
            out += [(f"bare:{line!r}", line.format(a=form.format(g=g), v=v)) for v in plain]
    return out


# Harmless text after a correct answer: explanations, checks and asides that mention other
# numbers ({d}, {e}; {a} + {b} = {g}) without committing to them. These must keep scoring 1, so
# that the rule cannot be made trivially strict.
HARMLESS_AFTER = [
    "This is because {a} + {b} = {g}.",
    "I hope this helps!",
    "(since {a} + {b} = {g})",
    "Let me double-check: {g} works.",
    "Let me double-check: {a} + {b} = {g}, which matches.",
    "We used {d} apples in step 2.",
    "Note that {d} is not a solution, since it fails the second condition.",
    "If we had picked {d}, the total would be {e}.",
    "There are {d} ways to choose the first one.",
    "The other root, {d}, is rejected because it is negative.",
    "At first I got {d}, but that was a slip.",
    "Earlier, I wrote {d}, which was wrong.",
    "Step check: {a} + {b} = {g}.",
    "In total there were {d} apples and {e} pears before.",
    "It is {d} more than the {e} we started with.",
    "This is {d} less than {e}.",
    "For the first part, it is {d}.",
    "No other value works: {d} gives {e}.",
    "Wait, let me verify with {d}: it gives {e}.",
    "Actually, the check {a} + {b} = {g} confirms it.",
    "Actually, {d} is not the answer: it was a typo.",
    "No, {d} cannot be right, because {e} is too big.",
    "So the answer is {g}, not {d}.",
    "I think it is {g}.",
    "Final answer: {g}",
    "The answer is {g} because {a} + {b} = {g}.",
    "Indeed, {g} is correct, since {a} + {b} = {g}.",
    "Perhaps it is easier to see with {d} apples.",
    "Note that {d} is also a prime.",
    "The number of steps is {d}.",
    "Summary:\n- first term: {a}\n- second term: {b}",
    "Check:\n{a} + {b} = {g}",
    "Here $x$ counts the apples; $y = {d}$ counts the pears.",
    "We could take {d}, or {e}, as the first guess; neither works.",
    "The boxed value is the sum of {a} and {b}.",
    "Maybe one day I will find a shorter way.",
    "No, one of the {d} cases was counted twice; it does not change the total.",
]
# Harmless continuations of the answer's own sentence: a connective starts a new statement.
HARMLESS_CLAUSES = [
    "since {a} + {b} = {g}",
    "because {a} + {b} = {g}",
    "which is {d} less than {e}",
    "as {a} + {b} = {g}",
    "so we add {a} and {b}",
    "but {d} would not fit",
    "and we are done",
    "which I checked with {d} and {e}",
    "not {d}",
    "i.e. {a} + {b}",
    "that is, {a} + {b}",
    "(check: {a} + {b} = {g})",
    "(since {e} - {d} is not {g})",
    "(not {d})",
    "we used {d} apples in step 2",
    "I hope this helps with the {d} other problems",
]


def harmless_after(g: str, a: str, b: str, d: str, e: str) -> list[str]:
    """A correct answer ``g`` in each format, followed by each harmless sentence and clause
    (sentences after a sentence's or a line's end; after a box also on its line)."""
    out = []
    sentences = [t.format(g=g, a=a, b=b, d=d, e=e) for t in HARMLESS_AFTER]
    clauses = [t.format(g=g, a=a, b=b, d=d, e=e) for t in HARMLESS_CLAUSES]
    for name, form in ANSWER_FORMS.items():
        x = form.format(g=g)
        places = ["{a}. {t}", "{a}\n\n{t}"] + (["{a} {t}", "{a}, {t}"] if name != "phrase" else [])
        out += [p.format(a=x, t=t) for t in sentences for p in places]
        out += [p.format(a=x, t=t) for t in clauses for p in ("{a} {t}", "{a}, {t}")]
    return out


def test_commitments_after_the_answer_score_zero(task):
    # before: every one of these scored 1 for gold 5 (the answer's format was read, the rest not)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        for g, d, every in (("5", "7", 1), ("12", "3", 3)):
            tried = [(k, c, _score(task, g, c)) for k, c in trailing_hedges(g, d, every=every)]
            scored = [(k, c) for k, c, r in tried if r[0] != 0.0]
            assert not scored, f"{len(scored)} of {len(tried)} scored: {scored[:5]}"
            # "The answer is 5 I think it is 7" is one run-on answer that verifies as neither
            # (status ok); everywhere else the second value is seen as such
            run_on = (ANSWER_FORMS["phrase"].format(g=g) + " ", ANSWER_FORMS["phrase"].format(g=g) + ", ")
            unseen = [(k, c) for k, c, r in tried if not c.startswith(run_on) and r[1] != "ambiguous"]
            assert not unseen, f"{len(unseen)} of {len(tried)} not ambiguous: {unseen[:5]}"
            assert len({k for k, _, _ in tried}) == len(COMMITMENTS) + len(BARE_LINES)


def test_harmless_text_after_the_answer_still_scores(task):
    # explanations with other numbers after the answer are not commitments (and a restatement of
    # the same value is not a second value)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        for g, a, b, d, e in (("5", "2", "3", "7", "12"), ("1000", "400", "600", "3", "2000")):
            tried = harmless_after(g, a, b, d, e)
            failed = [c for c in tried if _score(task, g, c) != (1.0, "ok")]
            assert not failed, f"{len(failed)} of {len(tried)} failed: {failed[:5]}"


@pytest.mark.parametrize(
    "gold, completion",
    [
        # the issue's examples
        ("5", "\\boxed{5} or maybe 7"),
        ("5", "The answer is \\boxed{5}. Actually, I think it is 7."),
        ("5", "\\boxed{5}.\n\nFinal answer: 7"),
        ("5", "<answer>5</answer> or 7"),
        ("5", "\\boxed{5} or maybe seven"),
        ("5", "\\boxed{5} or maybe \\frac{14}{2}"),
        ("5", "The answer is 5.\n7"),
        ("5", "She has 5 apples.\nOr maybe seven."),
        ("5", "\\boxed{5}. Actually, the answer is 7, not 5."),
        ("5", "\\boxed{5}, or it could be 7"),
        ("5", "\\boxed{5}. Or maybe 7 or 8."),
    ],
)
def test_the_issues_commitments_are_ambiguous(task, gold, completion):
    assert _score(task, gold, completion) == (0.0, "ambiguous"), completion


# ----------------------------------------------------------------------------- other scripts


def _punctuation(*words: str) -> list[str]:
    """Every punctuation character (category P*) whose Unicode name holds one of ``words``."""
    out = []
    for cp in range(128, sys.maxunicode + 1):
        ch = chr(cp)
        if unicodedata.category(ch).startswith("P") and any(w in unicodedata.name(ch, "") for w in words):
            out.append(ch)
    return out


# list separators of every script, by name: commas (，、﹐︐ ، ...), semicolons (；؛ ...), word,
# paragraph and date separators, full stops other than the fullwidth and small forms (。 ።);
# the Arabic decimal separator (٫) is a decimal point, its thousands separator (٬) a comma
SEPARATORS = [
    ch
    for ch in _punctuation("COMMA", "SEMICOLON", "SEPARATOR", "FULL STOP")
    if unicodedata.name(ch) not in ("ARABIC DECIMAL SEPARATOR", "ARABIC THOUSANDS SEPARATOR")
    and unicodedata.normalize("NFKC", ch) != "."
]
SPACES = [chr(cp) for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)) == "Zs"]


def test_every_scripts_separators_separate(task):
    # before: \boxed{5，7} and \boxed{5、7} scored 1 for 5 (math-verify reads the first number)
    assert len(SEPARATORS) >= 40 and {"，", "、", "；", "︐", "︑", "﹐", "﹑", "。", "،"} <= set(SEPARATORS)
    tried = []
    for sep in SEPARATORS:
        for inner in ("{g}{s}{d}", "{g}{s} {d}", "{d}{s}{g}"):
            x = inner.format(g="5", d="7", s=sep)
            tried += [f"\\boxed{{{x}}}", f"<answer>{x}</answer>", f"The answer is {x}."]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        passed = [c for c in tried if _score(task, "5", c)[0] != 0.0 or _score(task, "7", c)[0] != 0.0]
    assert not passed, f"{len(passed)} of {len(tried)} scored: {passed[:5]}"


def test_other_scripts_digits_spaces_and_decimal_separators(task):
    assert len(SPACES) >= 17
    for sp in SPACES:  # a space of any kind between two numbers keeps them apart, or groups thousands
        assert _score(task, "5", f"\\boxed{{5{sp}7}}")[0] == 0.0, hex(ord(sp))
        assert _score(task, "1000", f"\\boxed{{1{sp}000}}") == (1.0, "ok"), hex(ord(sp))
    assert _score(task, "5", "\\boxed{５}") == (1.0, "ok")  # fullwidth digit (before: unparsable)
    assert _score(task, "57", "\\boxed{٥٧}") == (1.0, "ok")  # Arabic-Indic digits
    assert _score(task, "5.7", "\\boxed{5٫7}") == (1.0, "ok")  # Arabic decimal separator
    assert _score(task, "5", "\\boxed{5٫7}")[0] == 0.0  # before: 1 (the first number)
    assert _score(task, "1000", "\\boxed{1٬000}") == (1.0, "ok")  # Arabic thousands separator
    assert _score(task, "5.5", "\\boxed{５．５}") == (1.0, "ok")  # the fullwidth full stop is a decimal point
    assert _score(task, "5", "\\boxed{5。}") == (1.0, "ok")  # an ideographic full stop ends a sentence


# spaced thousands: one number, in every format (before: \boxed{1 000} was two numbers)
GROUP_SEPARATORS = [" ", "\\ ", "\\,", "{,}", ",", "~", "\u2009", "\u202f", "\u00a0", "\\;", "\\:"]


@pytest.mark.parametrize("sep", GROUP_SEPARATORS)
def test_spaced_thousands_are_one_number(task, sep):
    n = f"1{sep}234{sep}567"
    for c in (f"\\boxed{{{n}}}", f"<answer>{n}</answer>", f"The answer is {n}.", f"She has {n} apples."):
        assert _score(task, "1234567", c) == (1.0, "ok"), c
        assert _score(task, "1", c)[0] == 0.0, c
    # groups are of three digits, with one separator throughout, and no number starts with 0
    for c in (f"\\boxed{{12{sep}34}}", f"\\boxed{{1{sep}234 567}}" if sep != " " else "\\boxed{1 234,567}"):
        assert _score(task, "1234", c)[0] == 0.0 and _score(task, "12", c)[0] == 0.0, c
    for c in (f"\\boxed{{0{sep}100}}", f"<answer>0{sep}100</answer>", f"So 0{sep}100."):
        assert _score(task, "100", c)[0] == 0.0, c  # before: "0,100" read as 0100 = 100


# ----------------------------------------------------------------------------- attached to the box
# anything right after a box that changes its value: the box is not a clean answer
ATTACHED = [
    "\\boxed{{{g}}}^{{{d}}}",
    "\\boxed{{{g}}}^{d}",
    "\\boxed{{{g}}} ^ {d}",
    "\\boxed{{{g}}}_{{{d}}}",
    "\\boxed{{{g}}}_{d}",
    "\\boxed{{{g}}}{d}",
    "\\boxed{{{g}}}{{{d}}}",
    "\\boxed{{{g}}}.{d}",
    "\\boxed{{{g}}}'{d}",
    "\\boxed{{{g}}}({d})",
    "\\boxed{{{g}}} \\cdot {d}",
    "\\boxed{{{g}}}\\times {d}",
    "\\boxed{{{g}}} \\div {d}",
    "\\boxed{{{g}}}/{d}",
    "\\boxed{{{g}}} / \\frac{{1}}{{{d}}}",
    "\\boxed{{{g}}} + {d}",
    "\\boxed{{{g}}}-{d}",
    "\\boxed{{{g}}}*{d}",
    "\\boxed{{{g}}}×{d}",
    "$\\boxed{{{g}}}^{{{d}}}$",
    "<answer>\\boxed{{{g}}}^{{{d}}}</answer>",
    "<answer>{g}</answer>^{{{d}}}",
]
# and what does not change it: punctuation, units, markup
NOT_ATTACHED = [
    "\\boxed{{{g}}}!",
    "\\boxed{{{g}}}.",
    "\\boxed{{{g}}}^\\circ",
    "\\boxed{{{g}}}^{{\\circ}}",
    "\\boxed{{{g}}}\\%",
    "\\boxed{{{g}}}\\text{{ cm}}",
    "**\\boxed{{{g}}}**",
    "$\\boxed{{{g}}}$.",
    "\\boxed{{{g}}} - this is the total.",
    "\\boxed{{{g}}} -- done",
    "\\boxed{{{g}}}(\\text{{apples}})",
]


@pytest.mark.parametrize("g, d", [("5", "7"), ("12", "2"), ("3", "1")])
def test_a_box_with_something_attached_is_ambiguous(task, g, d):
    # before: \boxed{5}^{7} scored 1 for gold 5
    for shape in ATTACHED:
        c = shape.format(g=g, d=d)
        assert _score(task, g, c) == (0.0, "ambiguous"), c
    for shape in NOT_ATTACHED:
        c = shape.format(g=g)
        assert _score(task, g, c) == (1.0, "ok"), c


# ----------------------------------------------------------------------------- random golds, after the answer


@st.composite
def integer_gold_and_others(draw):
    g, d, e = (draw(st.integers(-3000, 3000)) for _ in range(3))
    assume(g != d)
    a = draw(st.integers(-3000, 3000))
    return str(g), str(a), str(g - a), str(d), str(e)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(integer_gold_and_others())
def test_random_golds_commitments_after_the_answer_score_zero(task, gabde):
    g, _, _, d, _ = gabde
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        for name, completion in trailing_hedges(g, d, every=13):
            assert _score(task, g, completion)[0] == 0.0, (g, d, name, completion)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(integer_gold_and_others())
def test_random_golds_harmless_text_after_the_answer_scores(task, gabde):
    g = gabde[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_mod, "run_with_timeout", _verified_once)
        for completion in harmless_after(*gabde):
            assert _score(task, g, completion) == (1.0, "ok"), (gabde, completion)
