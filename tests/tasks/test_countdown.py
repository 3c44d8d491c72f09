"""Countdown: verifier, exact solver (cross-checked by brute force), generation, first moves."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gapo.tasks
from gapo.tasks.base import Problem, Task, split_of
from gapo.tasks.countdown import (
    ALPHABET,
    CountdownTask,
    canonical,
    check,
    first_move,
    parse,
    reachable,
    solution_completion,
    solutions,
)
from gapo.tasks.countdown_solver import _solve  # the raw enumeration, for the brute-force check

FAST = settings(max_examples=40, deadline=None)


def problem(numbers, target) -> Problem:
    return Problem(f"{' '.join(map(str, numbers))}>{target}:", target, {"numbers": tuple(numbers), "target": target})


# ------------------------------------------------------------ hand-checked solver output
def test_solutions_hand_checked_small():
    # numbers 1 2 3, target 6. Every tree with positive integer intermediates:
    #   (1+2)+3, (1+3)+2, (2+3)+1            -> one class 1+2+3
    #   (1*2)*3, (1*3)*2, (2*3)*1            -> one class 1*2*3
    #   (2/1)*3, (3/1)*2, (2*3)/1            -> one class 2*3/1 (1 in the denominator)
    #   2*3 (subset {2,3})                   -> 2*3
    # nothing else: e.g. (3-1)*2 = 4, (2-1)*3 = 3, 3*2-1 = 5.
    assert solutions([1, 2, 3], 6) == ["1*2*3", "1+2+3", "2*3", "2*3/1"]
    # numbers 2 3 4, target 10: 2*3+4 = 10 and 3*4-2 = 10; pairs give 5,6,1 | 6,8,2,2 | 7,12,1
    # and e.g. (2+3)*4 = 20, 2*4+3 = 11, 2*(3+4) = 14, 2+3+4 = 9.
    assert solutions([4, 2, 3], 10) == ["2*3+4", "3*4-2"]


def test_solutions_hand_checked_associativity():
    # 10-(5-3) = 10-5+3 = (10+3)-5 = 8: one class {10,3}-{5}; plus 3+5 = 8.
    assert solutions([10, 5, 3], 8) == ["10+3-5", "3+5"]
    # 8/4*2 = 8/(4/2) = 8*2/4 = 4: one class {2,8}/{4}; 8/4+2 = 4; 8/(4-2) = 4;
    # 8-4 = 4; 8/2 = 4.  (4*2-8 = 0 is not positive; 8-2-... cannot reach 4.)
    assert solutions([8, 4, 2], 4) == ["2*8/4", "2+8/4", "8-4", "8/(4-2)", "8/2"]
    for c in ("10-5=5,5+3=8", "5-3=2,10-2=8", "10+3=13,13-5=8", "3+10=13,13-5=8"):
        assert canonical(c, [10, 5, 3]) == "10+3-5", c
    for c in ("8/4=2,2*2=4", "4/2=2,8/2=4", "8*2=16,16/4=4"):
        assert canonical(c, [8, 4, 2]) == "2*8/4", c


def test_solutions_equal_numbers_counted_once():
    # 2 2 3 -> 5. Pairs: (2,2) gives 4, 4, 1 and then with 3: 7, 12, 1 | 4, 3, 2, 3;
    # (2,3) gives 5, 6, 1 and then with the other 2: 7, 10, 3 | 8, 12, 4, 3 | 3, 2, 1, 2.
    # So the only solution is 2+3, which either 2 realises: listed once.
    assert solutions([2, 2, 3], 5) == ["2+3"]
    # 3 3 3 -> 3: (3*3)/3 = 3*(3/3) = 3/3*3 is {3,3}/{3}; (3+3)-3 = 3-(3-3)? no, 3-3 = 0 is
    # not allowed, but (3+3)-3 is; (3+3)/3 = 2, 3*3-3 = 6, 3-3/3 = 2.
    assert solutions([3, 3, 3], 3) == ["3*3/3", "3+3-3"]


# ------------------------------------------------------------ independent brute force
def _trees(values: tuple[int, ...]):
    """All (value, tree) over exactly these values, positive integer intermediates only."""
    if len(values) == 1:
        yield values[0], values[0]
        return
    idx = range(len(values))
    for k in range(1, len(values)):
        for left in combinations(idx, k):
            lv = tuple(values[i] for i in left)
            rv = tuple(values[i] for i in idx if i not in left)
            for a, ta in _trees(lv):
                for b, tb in _trees(rv):
                    for op, val in (("+", a + b), ("-", a - b), ("*", a * b), ("/", Fraction(a, b))):
                        if val > 0 and val == int(val):
                            yield int(val), (op, ta, tb)


def _norm(tree):
    """Flatten +/- into signed-term multisets and * / into numerator/denominator multisets."""
    if isinstance(tree, int):
        return tree

    def collect(t, sign, kind, out):
        if isinstance(t, tuple) and t[0] in kind:
            op, a, b = t
            collect(a, sign, kind, out)
            collect(b, sign if op == kind[0] else not sign, kind, out)
        else:
            out[sign].append(_norm(t))

    kind = "+-" if tree[0] in "+-" else "*/"
    parts = {True: [], False: []}
    collect(tree, True, kind, parts)
    return (kind, tuple(sorted(parts[True], key=repr)), tuple(sorted(parts[False], key=repr)))


def _parse_expr(text: str):
    """Recursive-descent parser of canonical strings into trees (left-assoc, usual precedence)."""
    pos = 0

    def atom():
        nonlocal pos
        if text[pos] == "(":
            pos += 1
            t = expr()
            assert text[pos] == ")"
            pos += 1
            return t
        start = pos
        while pos < len(text) and text[pos].isdigit():
            pos += 1
        return int(text[start:pos])

    def chain(sub, ops):
        nonlocal pos
        t = sub()
        while pos < len(text) and text[pos] in ops:
            op = text[pos]
            pos += 1
            t = (op, t, sub())
        return t

    def term():
        return chain(atom, "*/")

    def expr():
        return chain(term, "+-")

    t = expr()
    assert pos == len(text), text
    return t


def _value(tree) -> Fraction:
    if isinstance(tree, int):
        return Fraction(tree)
    op, a, b = tree
    a, b = _value(a), _value(b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]


def _brute_force(numbers, target):
    found = set()
    for k in range(2, len(numbers) + 1):
        for sub in combinations(numbers, k):
            for v, t in _trees(sub):
                if v == target:
                    found.add(_norm(t))
    return found


def _all_completions(values: list[int], prefix: str = ""):
    """Every well-formed, arithmetically valid completion (value semantics, any order)."""
    for i, j in ((i, j) for i in range(len(values)) for j in range(len(values)) if i != j):
        a, b = values[i], values[j]
        for op, c in (("+", a + b), ("-", a - b), ("*", a * b), ("/", a // b if a % b == 0 else 0)):
            if c > 0:
                step = f"{prefix},{a}{op}{b}={c}" if prefix else f"{a}{op}{b}={c}"
                yield step, c
                rest = [v for k, v in enumerate(values) if k not in (i, j)] + [c]
                yield from _all_completions(rest, step)


CASES = [
    ((1, 2, 3), 6),
    ((2, 3, 4), 10),
    ((8, 4, 2), 4),
    ((2, 2, 3), 5),
    ((3, 3, 3), 3),
    ((3, 3, 9), 1),
    ((1, 2, 3, 6), 1),
    ((1, 1, 2, 5), 7),
    ((2, 3, 5, 7), 24),
    ((4, 4, 6, 9), 12),
    ((1, 5, 6, 10), 60),
    ((2, 2, 4, 4), 1),
]


@pytest.mark.parametrize("numbers,target", CASES)
def test_solver_matches_brute_force_trees(numbers, target):
    # The solver's enumeration (before dropping unwritable trees) finds exactly the classes
    # of all trees; the solutions are those classes minus a few no completion can write.
    brute = _brute_force(numbers, target)
    every = _solve(tuple(sorted(numbers))).by_value.get(target, ())
    assert brute == {_norm(_parse_expr(s)) for s in every}
    assert len(brute) == len(every)  # distinct strings are distinct classes
    assert {_norm(_parse_expr(s)) for s in solutions(numbers, target)} <= brute


def test_unwritable_trees_excluded():
    # 8 6 10 4 -> 1: (8-4)/(10-6) would need "8-4=4,10-6=4,4/4=1" (reads (10-6)/(8-4)) or
    # "10-6=4,8-4=4,4/4=1" (its "8-4" reads the computed 4): no order writes it.
    assert "(8-4)/(10-6)" in _solve((4, 6, 8, 10)).by_value[1]
    assert "(8-4)/(10-6)" not in solutions([8, 6, 10, 4], 1)
    assert "(10-6)/(8-4)" in solutions([8, 6, 10, 4], 1)


def test_unwritable_division_excluded():
    # 3 3 9 -> 1. 9/(3*3) would be written "3*3=9,9/9=1", which reads as (3*3)/9: only the
    # latter counts. 9/3=3, 3/3=1 is {9}/{3,3}; 3/3 from the subset {3,3}; 9/(3+3)... = 1.5 no.
    assert solutions([3, 3, 9], 1) == ["3*3/9", "3/3", "9/3/3"]
    assert canonical("3*3=9,9/9=1", [3, 3, 9]) == "3*3/9"
    assert canonical("9/3=3,3/3=1", [3, 3, 9]) == "9/3/3"


@pytest.mark.parametrize(
    "numbers,target",
    [c for c in CASES if len(c[0]) == 3]
    + [((2, 3, 5, 7), 24), ((2, 2, 4, 4), 1), ((8, 6, 10, 4), 1), ((2, 10, 3, 6), 9), ((3, 3, 6, 9), 6)],
)
def test_solver_matches_every_writable_completion(numbers, target):
    # independent of the solver's enumeration: all completions, mapped through canonical()
    found = {canonical(c, numbers) for c, v in _all_completions(list(numbers)) if v == target}
    assert found == set(solutions(numbers, target))


@FAST
@given(st.lists(st.integers(1, 9), min_size=2, max_size=3), st.integers(1, 40))
def test_solver_matches_brute_force_property(numbers, target):
    got = solutions(numbers, target)
    every = _solve(tuple(sorted(numbers))).by_value.get(target, ())
    assert _brute_force(numbers, target) == {_norm(_parse_expr(s)) for s in every}
    found = {canonical(c, numbers) for c, v in _all_completions(numbers) if v == target}
    assert found == set(got)
    assert got == sorted(set(got))


@FAST
@given(st.lists(st.integers(1, 10), min_size=2, max_size=4), st.data())
def test_every_solution_scores_and_round_trips(numbers, data):
    target = data.draw(st.sampled_from(sorted(reachable(numbers))))
    got = solutions(numbers, target)
    assert got
    for text in got:
        assert _value(_parse_expr(text)) == target
        c = solution_completion(numbers, text, random.Random(1))
        assert check(numbers, target, c), (text, c)
        assert canonical(c, numbers) == text


# ------------------------------------------------------------ verifier
@pytest.mark.parametrize(
    "completion",
    [
        "9+3=12,12*2=24",  # 9+3 = 12, 12*2 = 24
        "3+9=12,2*12=24",  # either operand order
        " 9+3=12,12*2=24\n",  # surrounding whitespace
    ],
)
def test_verifier_accepts(completion):
    assert check([3, 7, 9, 2], 24, completion)


@pytest.mark.parametrize(
    "completion,why",
    [
        ("9+3=13,13*2=26", "wrong arithmetic (9+3 is 12)"),
        ("9+3=12,12*2=25", "wrong arithmetic in the last step"),
        ("9+3=12,12+12=24", "reuses the intermediate 12"),
        ("3+3=6,6*4=24", "reuses the given 3 and uses 4, not given"),
        ("8*3=24", "8 is not given"),
        ("9/2=4,4*...", "garbage"),
        ("7/2=3,3*8=24", "non-exact division 7/2"),
        ("2-9=7", "negative intermediate"),
        ("9-9=0", "zero"),
        ("9+3=12,12*2=24,", "trailing comma"),
        ("09+3=12,12*2=24", "leading zero"),
        ("9 + 3 = 12,12*2=24", "inner spaces"),
        ("9+3=12", "last result is not the target"),
        ("", "empty"),
        ("   ", "blank"),
        ("24", "a bare number is not a step"),
        ("9+3=12;12*2=24", "wrong separator"),
        ("9^3=729", "unknown operator"),
        ("9+3=12,12*2=24=24", "trailing junk"),
        ("99999999999999999999*9=899999999999999999991", "huge literal"),
        ("9" * 5000 + "*9=1", "huge literal"),
    ],
)
def test_verifier_rejects(completion, why):
    task = CountdownTask()
    p = problem([3, 7, 9, 2], 24)
    assert task.score(p, completion) == 0.0, why


def test_verifier_unused_step_allowed_and_numbers_used_once():
    # 10 2 6 4 -> 24: 6*4 = 24, the step 10-2 = 8 is never used (allowed)
    assert check([10, 2, 6, 4], 24, "10-2=8,6*4=24")
    assert not check([10, 2, 6, 4], 24, "10-2=8,6*4=24,8*3=24")  # 3 not available
    assert check([6, 6], 36, "6*6=36")  # two sixes given: both usable
    assert not check([6], 36, "6*6=36")  # only one six


@FAST
@given(st.text(alphabet=ALPHABET + "x(). \n-", max_size=60))
def test_score_never_raises_on_garbage(text):
    task = CountdownTask()
    p = problem([3, 7, 9, 2], 24)
    assert task.score(p, text) in (0.0, 1.0)
    assert isinstance(task.parse_ok(text), bool)
    task.first_move(text)
    canonical(text, [3, 7, 9, 2])


def test_score_non_string_and_parse_ok():
    task = CountdownTask()
    p = problem([3, 7, 9, 2], 24)
    assert task.score(p, None) == 0.0  # type: ignore[arg-type]
    assert task.parse_ok("1+1=3")  # well-formed, wrong
    assert not task.parse_ok("1+1=")
    assert not task.parse_ok("")
    assert parse("3+9=12,12*2=24") == [(3, "+", 9, 12), (12, "*", 2, 24)]


def test_canonical_reference_rule():
    # 6 is both given and computed (2*3): an operand 6 names the computed one first.
    assert canonical("2*3=6,6*4=24", [6, 2, 3, 4]) == "2*3*4"
    assert canonical("6*4=24", [6, 2, 3, 4]) == "4*6"
    assert canonical("6*4=24,2*3=6,24+6=30", [6, 2, 3, 4]) == "2*3+4*6"
    assert canonical("6*4=24", [2, 3, 4]) is None  # 6 not given
    assert canonical("6*4=24") == "4*6"  # without numbers: leaves are free
    assert canonical("6*4=25") is None
    task = CountdownTask()
    assert task.canonical("6*4=24", problem([6, 2, 3, 4], 24)) == "4*6"
    assert task.canonical("6*4=24", problem([6, 2, 3, 4], 25)) is None  # wrong target


# ------------------------------------------------------------ first move
@pytest.mark.parametrize(
    "completion,move",
    [
        ("3+9=12,12*2=24", (9, "+")),  # commutative: larger operand first
        ("9+3=12,12*2=24", (9, "+")),
        ("2*12=24", (12, "*")),
        ("9-3=6,6*4=24", (9, "-")),
        ("3-9=6", (3, "-")),  # ill-valued but well-formed: as written
        ("8/2=4,xx", (8, "/")),  # only the first step must be well-formed
        ("8/2=", None),
        ("", None),
        ("hello", None),
    ],
)
def test_first_move(completion, move):
    assert first_move(completion) == move
    assert CountdownTask().first_move(completion) == move


# ------------------------------------------------------------ generation
def test_generate_deterministic_prefix_stable_unique():
    task = CountdownTask()
    a = task.generate("train", 60, seed=3)
    assert a == task.generate("train", 60, seed=3)
    assert [p.meta for p in a] == [p.meta for p in task.generate("train", 60, seed=3)]
    assert task.generate("train", 20, seed=3) == a[:20]
    assert a != task.generate("train", 60, seed=4)
    keys = [(tuple(sorted(p.meta["numbers"])), p.answer) for p in a]
    assert len(set(keys)) == len(keys)


def test_train_eval_disjoint_by_construction():
    task = CountdownTask(n_numbers=3, num_range=(1, 6), target_range=(1, 30))
    key = lambda p: (tuple(sorted(p.meta["numbers"])), p.answer)  # noqa: E731
    train = {key(p) for s in range(3) for p in task.generate("train", 150, seed=s)}
    evals = {key(p) for s in range(3) for p in task.generate("eval", 40, seed=s)}
    assert train and evals and not train & evals
    # membership depends on the instance only, not on the knobs that drew it
    other = CountdownTask(n_numbers=(2, 3), num_range=(1, 6), eval_fraction=0.1)
    assert not {key(p) for p in other.generate("train", 150, seed=9)} & evals
    for nums, target in evals:
        assert split_of(f"countdown:{' '.join(map(str, nums))}>{target}", 0.1) == "eval"


def test_generated_problems_are_well_formed():
    task = CountdownTask(n_numbers=(3, 5), num_range=(1, 10), target_range=(10, 60))
    rng = random.Random(0)
    for p in task.generate("train", 40, seed=1):
        nums, target = p.meta["numbers"], p.answer
        assert 3 <= len(nums) <= 5 and all(1 <= v <= 10 for v in nums)
        assert 10 <= target <= 60 and target not in nums
        assert p.prompt == f"{' '.join(map(str, nums))}>{target}:"
        assert set(p.prompt) <= set(task.alphabet)
        assert p.meta["n_solutions"] == len(task.solutions(p)) >= 1
        demo = task.demonstration(p, rng)
        assert task.score(p, demo) == 1.0 and set(demo) <= set(task.alphabet)
        assert task.canonical(demo, p) in task.solutions(p)


@FAST
@given(st.integers(0, 10**6), st.integers(2, 5))
def test_demonstration_always_correct(seed, n):
    task = CountdownTask(n_numbers=n)
    p = task.generate("train", 1, seed=seed)[0]
    demo = task.demonstration(p, random.Random(seed))
    assert task.score(p, demo) == 1.0
    assert task.parse_ok(demo)
    assert len(demo) <= task.max_completion_len
    assert task.canonical(demo, p) in task.solutions(p)


def test_demonstrations_are_diverse():
    # 1 2 10 6 -> 30 has several solutions; random demonstrations should show several first
    # moves and cover every canonical solution.
    task = CountdownTask()
    p = problem([1, 2, 10, 6], 30)
    rng = random.Random(0)
    demos = [task.demonstration(p, rng) for _ in range(300)]
    assert {task.canonical(d, p) for d in demos} == set(task.solutions(p))
    assert len(Counter(task.first_move(d) for d in demos)) >= 3


def test_max_completion_len_bounds_every_solution():
    task = CountdownTask(n_numbers=4, num_range=(1, 10), target_range=(1, 100))
    for nums in ([10, 10, 10, 10], [9, 9, 10, 10], [1, 7, 8, 10]):
        for target in reachable(nums):
            if target <= 100:
                for text in solutions(nums, target):
                    assert len(solution_completion(nums, text)) <= task.max_completion_len


def test_registry_and_protocol():
    task = gapo.tasks.get("countdown", n_numbers=3)
    assert isinstance(task, CountdownTask) and isinstance(task, Task)
    assert task.name == "countdown"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_numbers": 1},
        {"n_numbers": 7},
        {"n_numbers": (4, 3)},
        {"num_range": (0, 5)},
        {"min_solutions": 0},
        {"min_solutions": 3, "max_solutions": 2},
    ],
)
def test_invalid_knobs(kwargs):
    with pytest.raises(ValueError):
        CountdownTask(**kwargs)


def test_bad_split():
    with pytest.raises(ValueError):
        CountdownTask().generate("test", 3, seed=0)
