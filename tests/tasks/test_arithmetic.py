"""Arithmetic task: formats, verifier, generation, first move."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gapo.tasks
from gapo.tasks.arithmetic import ArithmeticTask
from gapo.tasks.base import Problem, Task

FAST = settings(max_examples=50, deadline=None)


def test_hand_checked_scores():
    task = ArithmeticTask()
    p = Problem("123+456=", 579, {})  # 123 + 456 = 579
    assert task.score(p, "579") == 1.0
    assert task.score(p, " 579\n") == 1.0
    for wrong in ("578", "0579", "+579", "5 79", "579579", "", "  ", "abc", "57.9", "-579", "9" * 10_000):
        assert task.score(p, wrong) == 0.0, wrong
    assert task.score(p, None) == 0.0  # type: ignore[arg-type]
    assert task.score(Problem("907-58=", 849, {}), "849") == 1.0  # 907 - 58 = 849
    assert task.score(Problem("12*34=", 408, {}), "408") == 1.0  # 12 * 34 = 408
    assert task.score(Problem("5-5=", 0, {}), "0") == 1.0


def test_parse_ok_and_first_move():
    task = ArithmeticTask()
    assert task.parse_ok("0") and task.parse_ok("579") and task.parse_ok(" 12 ")
    assert not task.parse_ok("") and not task.parse_ok("05") and not task.parse_ok("1a")
    assert task.first_move("579") == "5"
    assert task.first_move(" 0") == "0"
    assert task.first_move("x9") is None and task.first_move("") is None


@FAST
@given(st.integers(0, 10**6), st.sampled_from(["+", "-", "*", "/", "+-*/"]), st.integers(1, 4))
def test_generated_problems_are_correct(seed, ops, digits):
    task = ArithmeticTask(digits=digits, ops=ops)
    for p in task.generate("train", 3, seed=seed):
        a, op, b = p.meta["a"], p.meta["op"], p.meta["b"]
        assert p.prompt == f"{a}{op}{b}="
        # the reference answer, recomputed independently
        expected = {"+": a + b, "-": a - b, "*": a * b}.get(op)
        if op == "/":
            assert b >= 1 and a % b == 0
            expected = a // b
        assert p.answer == expected >= 0
        demo = task.demonstration(p, random.Random(0))
        assert task.score(p, demo) == 1.0
        assert task.score(p, str(expected + 1)) == 0.0
        assert len(demo) <= task.max_completion_len
        assert set(p.prompt + demo) <= set(task.alphabet)
        assert task.first_move(demo) == demo[0]


def test_digit_ranges():
    task = ArithmeticTask(digits=(2, 3), ops="+")
    for p in task.generate("train", 100, seed=0):
        for v in (p.meta["a"], p.meta["b"]):
            assert 10 <= v <= 999
    assert ArithmeticTask(digits=3, ops="*").max_completion_len >= len(str(999 * 999))


def test_generate_deterministic_disjoint_unique():
    task = ArithmeticTask(digits=2)
    a = task.generate("train", 100, seed=1)
    assert a == task.generate("train", 100, seed=1)
    assert a[:30] == task.generate("train", 30, seed=1)
    assert a != task.generate("train", 100, seed=2)
    assert len({p.prompt for p in a}) == len(a)
    train = {p.prompt for s in range(3) for p in task.generate("train", 200, seed=s)}
    evals = {p.prompt for s in range(3) for p in task.generate("eval", 50, seed=s)}
    assert evals and not train & evals


def test_small_space_repeats_with_warning():
    # 1-digit '+' has 100 instances, about 90 of them train: 200 problems must repeat
    task = ArithmeticTask(digits=1, ops="+")
    with pytest.warns(UserWarning, match="repeating"):
        out = task.generate("train", 200, seed=0)
    assert len(out) == 200 and 80 <= len({p.prompt for p in out}) <= 100


def test_registry_protocol_and_validation():
    task = gapo.tasks.get("arithmetic", digits=2, ops="+-")
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task)
    assert task.name == "arithmetic" and "*" not in task.alphabet
    for bad in ({"digits": 0}, {"digits": (3, 2)}, {"ops": ""}, {"ops": "+%"}, {"ops": "++"}):
        with pytest.raises(ValueError):
            ArithmeticTask(**bad)
