"""gapo.tasks.math_trailing and the reading helpers it uses (gapo.tasks.math_answer): number
words, other scripts, what the text after an answer commits to, what is attached to a box.
The scoring of whole completions is tested in test_hedges.py."""

from __future__ import annotations

import pytest

from gapo.tasks.math_answer import final_answers, locate_answers, spell_numbers, unify_unicode
from gapo.tasks.math_trailing import attached_to_box, trailing_values


@pytest.mark.parametrize(
    "text, digits",
    [
        ("seven", "7"),
        ("Seven", "7"),
        ("twenty-one", "21"),
        ("twenty one", "21"),
        ("one hundred and five", "105"),
        ("two thousand and three", "2003"),
        ("three hundred forty-two thousand six hundred", "342600"),  # (300 + 42) * 1000 + 600
        ("a million", "a 1000000"),
        ("hundred", "100"),
        ("minus twelve", "-12"),
        ("negative three", "-3"),
        ("five seven", "5 7"),  # two numbers: units cannot follow units
        ("twenty thirty", "20 30"),
        ("five and seven", "5 and 7"),  # "and" joins only after hundred / thousand / million
        ("or maybe seven.", "or maybe 7."),
        ("someone, none, tone, often", "someone, none, tone, often"),  # words inside words stay
        ("\\seven", "\\seven"),
        ("Maybe one day. Or one.", "Maybe one day. Or 1."),  # a lone "one" before a word: a pronoun
        ("twenty-one apples", "21 apples"),
    ],
)
def test_spell_numbers(text, digits):
    assert spell_numbers(text) == digits


def test_unify_unicode():
    assert unify_unicode("5，7、8；9") == "5,7,8;9"
    assert unify_unicode("１２٫５") == "12.5"  # fullwidth digits, Arabic decimal separator
    assert unify_unicode("1٬000") == "1,000"
    assert unify_unicode("1\u2009000\u202f000\u00a0000") == "1 000 000 000"
    assert unify_unicode("答案是5。") == "答案是5. "
    assert unify_unicode("５．５") == "5.5"
    assert unify_unicode("5² ½") == "5² ½"  # not NFKC: 5² is not 52
    assert final_answers("\\boxed{５，７}") == ("boxed", ["5,7"])


def _trailing(completion: str):
    return trailing_values(locate_answers(completion))


@pytest.mark.parametrize(
    "completion, values",
    [
        ("\\boxed{5} or maybe 7", ["7"]),
        ("\\boxed{5}. Actually, I think it is 7 because 2 + 5 = 7.", ["7"]),
        ("\\boxed{5}.\n\nFinal answer: 7", ["7"]),
        ("<answer>5</answer> or 7", ["7"]),
        ("\\boxed{5}. Wait, it's seven.", ["7"]),
        ("\\boxed{5}. No, $x = \\frac{14}{2}$.", ["$x = \\frac{14}{2}$"]),
        ("\\boxed{5}. 7 is also possible.", ["7"]),
        ("\\boxed{5}, 7", ["7"]),
        ("\\boxed{5}\n\n**7**", ["7"]),
        ("The answer is 5 (or maybe 7).", ["7"]),
        ("The answer is 5 (7 is also possible).", ["7"]),
        ("The answer is 5 I think it is 7", ["7"]),
        ("She has 5 apples.\nOr maybe seven.", ["7"]),
        ("\\boxed{5}. Actually, the answer is 7, not 5.", ["7"]),
        ("\\boxed{5} or \\boxed{7}", []),  # a later answer is an answer, not trailing text
        # explanations
        ("\\boxed{5}. This is because 2+3=5.", []),
        ("\\boxed{5} (since 7-2=5)", []),
        ("\\boxed{5}. It is 7 more than -2.", []),
        ("\\boxed{5}. For the first part, it is 3.", []),
        ("\\boxed{5}. At first I got 7, but that was a slip.", []),
        ("\\boxed{5}. No, 7 cannot be right.", []),
        ("\\boxed{5}. Note that 7 is not a solution.", []),
        ("\\boxed{5}. We could take 3, or 4.", []),
        ("\\boxed{5}\n\n1. First we add.", []),
        ("\\boxed{5}. Let me double-check: 5 works.", ["5"]),  # a restatement
    ],
)
def test_trailing_values(completion, values):
    assert _trailing(completion) == values


def test_attached_to_box():
    assert attached_to_box(locate_answers("\\boxed{5}^{7}"))
    assert attached_to_box(locate_answers("so \\boxed{3} and \\boxed{5}_2"))  # any box
    assert not attached_to_box(locate_answers("\\boxed{5}^\\circ"))
    assert not attached_to_box(locate_answers("\\boxed{5}!"))
    assert not attached_to_box(locate_answers("The answer is 5^7"))  # one answer, 5^7: no box
    assert _trailing("\\boxed{5}^{7}") is None
