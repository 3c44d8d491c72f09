"""Multi-digit arithmetic with a single exact answer.

Formats
-------
Prompt ``a<op>b=`` and completion the answer in decimal, no sign, no leading zeros::

    123+456=    ->  579
    907-58=     ->  849
    12*34=      ->  408
    408/12=     ->  34

Operands have ``digits`` digits each (an int, or an inclusive ``(min, max)`` range drawn per
operand; 1-digit operands include 0). Subtraction puts the larger operand first, so answers are
never negative. Division is exact: the divisor (``digits`` digits, ≥ 1) and the quotient are
drawn and the dividend is their product. Surrounding whitespace in a completion is ignored.

``first_move`` is the first character of the answer (its leading digit), the only decision
a single-answer task has before the rest is forced by the arithmetic.
"""

from __future__ import annotations

import random
import re

from gapo.tasks.base import Problem, draw_problems

_ANSWER = re.compile(r"0|[1-9][0-9]*")
OPS = "+-*/"


class ArithmeticTask:
    """``a op b`` with ``op`` drawn uniformly from ``ops`` (a subset of ``"+-*/"``).

    ``Problem.answer`` is the integer result; ``Problem.meta`` holds ``a``, ``op``, ``b``.
    Split membership hashes ``"arithmetic:" + prompt`` (see :mod:`gapo.tasks.base`).
    """

    name = "arithmetic"

    def __init__(
        self,
        digits: int | tuple[int, int] = 3,
        ops: str = "+-*",
        eval_fraction: float = 0.1,
    ) -> None:
        lo, hi = (digits, digits) if isinstance(digits, int) else tuple(digits)
        if not 1 <= lo <= hi <= 18:
            raise ValueError(f"digits must be in 1..18 with min <= max, got {digits}")
        if not ops or any(op not in OPS for op in ops) or len(set(ops)) != len(ops):
            raise ValueError(f"ops must be distinct characters from {OPS!r}, got {ops!r}")
        self.digits = (int(lo), int(hi))
        self.ops = ops
        self.eval_fraction = eval_fraction
        self.alphabet = "0123456789=" + "".join(op for op in OPS if op in ops)
        # longest answer: a product of two hi-digit numbers has at most 2*hi digits
        longest = 2 * hi if "*" in ops else hi + 1
        self.max_completion_len = longest + 2

    def _number(self, rng: random.Random) -> int:
        d = rng.randint(*self.digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    def _draw(self, rng: random.Random) -> tuple[str, Problem]:
        op = self.ops[rng.randrange(len(self.ops))]
        a, b = self._number(rng), self._number(rng)
        if op == "-" and a < b:
            a, b = b, a
        if op == "/":
            b = max(b, 1)
            a, answer = a * b, a  # dividend = quotient * divisor
        else:
            answer = a + b if op == "+" else a - b if op == "-" else a * b
        prompt = f"{a}{op}{b}="
        return f"arithmetic:{prompt}", Problem(prompt, answer, {"a": a, "op": op, "b": b})

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_problems(split, n, seed, self._draw, eval_fraction=self.eval_fraction, task_name=self.name)

    def parse_ok(self, completion: str) -> bool:
        return isinstance(completion, str) and _ANSWER.fullmatch(completion.strip()) is not None

    def score(self, problem: Problem, completion: str) -> float:
        if not self.parse_ok(completion):
            return 0.0
        return float(completion.strip() == str(problem.answer))

    def first_move(self, completion: str) -> str | None:
        if not isinstance(completion, str):
            return None
        text = completion.strip()
        return text[0] if text and text[0].isdigit() else None

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        return str(problem.answer)
