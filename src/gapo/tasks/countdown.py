"""Countdown: combine the given numbers with + − × ÷ to reach a target.

Formats
-------
Prompt: the numbers in drawn order separated by spaces, ``>``, the target, ``:``::

    3 7 9 2>24:

Completion: one or more steps separated by ``,``; a step is ``a<op>b=c`` with ``op`` in
``+ - * /`` and non-negative decimal integers without leading zeros (at most 12 digits)::

    9+3=12,12*2=24

Rules (checked by :func:`check` / :meth:`CountdownTask.score`):

- ``a`` and ``b`` must be *available*: a given number not used yet, or the result of an
  earlier step not used yet (the available values form a multiset; a step removes ``a`` and
  ``b`` and adds ``c``). So each given number is used at most once; not all must be used.
- ``c`` must equal ``a op b`` exactly, and every value must be a positive integer:
  ``a − b`` needs ``a > b``; ``a / b`` needs ``b`` to divide ``a`` (no fractions, no negatives,
  no zero).
- The last step's result must equal the target. Steps whose result is never used are allowed
  (they are harmless: they only consume numbers).
Surrounding whitespace is ignored; anything else unexpected makes the completion wrong.

First move
----------
``(first operand, operator)`` of the first step. The operand order of ``+`` and ``*`` is
canonicalised to the larger operand first, matching ``−`` and ``÷``, where the first operand
is always the larger. Demonstrations also write the larger operand first.

Canonical solutions and the solver
----------------------------------
Two solutions are the same when their expression trees are equal up to commutativity and
associativity; :func:`solutions` enumerates them exactly. Both are described, and implemented,
in :mod:`gapo.tasks.countdown_solver`.
"""

from __future__ import annotations

import random

from gapo.tasks.base import Problem, draw_problems
from gapo.tasks.countdown_solver import (
    MAX_DIGITS,
    Derivation,
    Step,
    canonical,
    check,
    first_move,
    parse,
    reachable,
    render,
    solution_completion,
    solutions,
)

__all__ = [
    "ALPHABET",
    "MAX_DIGITS",
    "CountdownTask",
    "Derivation",
    "Step",
    "canonical",
    "check",
    "first_move",
    "parse",
    "reachable",
    "render",
    "solution_completion",
    "solutions",
]

ALPHABET = "0123456789 +-*/=,>:"


# ---------------------------------------------------------------- the task
def _as_range(x: int | tuple[int, int], name: str) -> tuple[int, int]:
    lo, hi = (x, x) if isinstance(x, int) else tuple(x)
    if lo > hi:
        raise ValueError(f"{name}: empty range {x}")
    return int(lo), int(hi)


class CountdownTask:
    """Countdown instances and their verifier.

    Knobs:

    - ``n_numbers``: how many numbers (an int, or an inclusive ``(min, max)`` range drawn
      uniformly per instance), 2..6; 3 is easy, 4 is the default, 5 is hard.
    - ``num_range``: inclusive range the numbers are drawn from (uniform, with repeats).
    - ``target_range``: inclusive range of targets; the target is drawn uniformly among the
      values in range that have between ``min_solutions`` and ``max_solutions`` canonical
      solutions and are not one of the given numbers (so every instance is solvable and needs
      at least one step).
    - ``eval_fraction``: share of the instance space in the eval split (hash of
      ``"countdown:" + sorted numbers + target``; see :mod:`gapo.tasks.base`).

    ``Problem.answer`` is the target; ``Problem.meta`` holds ``numbers`` (prompt order),
    ``target`` and ``n_solutions``.
    """

    name = "countdown"
    alphabet = ALPHABET

    def __init__(
        self,
        n_numbers: int | tuple[int, int] = 4,
        num_range: tuple[int, int] = (1, 10),
        target_range: tuple[int, int] = (1, 100),
        min_solutions: int = 1,
        max_solutions: int | None = None,
        eval_fraction: float = 0.1,
    ) -> None:
        self.n_numbers = _as_range(n_numbers, "n_numbers")
        self.num_range = _as_range(num_range, "num_range")
        self.target_range = _as_range(target_range, "target_range")
        if not 2 <= self.n_numbers[0] <= self.n_numbers[1] <= 6:
            raise ValueError(f"n_numbers must lie in 2..6, got {n_numbers}")
        if self.num_range[0] < 1 or self.target_range[0] < 1:
            raise ValueError("numbers and targets must be positive")
        if min_solutions < 1 or (max_solutions is not None and max_solutions < min_solutions):
            raise ValueError(f"bad solution-count bounds {min_solutions}..{max_solutions}")
        self.min_solutions = min_solutions
        self.max_solutions = max_solutions
        self.eval_fraction = eval_fraction
        self.max_completion_len = self._max_len()

    def _max_len(self) -> int:
        """Longest correct completion: step k's operands are at most M**k and its result at
        most M**(k+1) (M = max(largest number, 2)); the last result is at most the target."""
        m, n = max(self.num_range[1], 2), self.n_numbers[1]
        digits = lambda v: len(str(v))  # noqa: E731
        total = 0
        for k in range(1, n):
            result = self.target_range[1] if k == n - 1 else m ** (k + 1)
            total += 2 * digits(m**k) + 2 + digits(result) + (k < n - 1)
        return total + 4

    # -- generation
    def _draw(self, rng: random.Random) -> tuple[str, Problem] | None:
        numbers = [rng.randint(*self.num_range) for _ in range(rng.randint(*self.n_numbers))]
        lo, hi = self.target_range
        top = self.max_solutions if self.max_solutions is not None else float("inf")
        targets = sorted(v for v in reachable(numbers) if lo <= v <= hi and v not in numbers)
        if self.min_solutions > 1 or self.max_solutions is not None:
            targets = [t for t in targets if self.min_solutions <= len(solutions(numbers, t)) <= top]
        if not targets:
            return None
        target = rng.choice(targets)
        key = f"countdown:{' '.join(map(str, sorted(numbers)))}>{target}"
        prompt = f"{' '.join(map(str, numbers))}>{target}:"
        meta = {
            "numbers": tuple(numbers),
            "target": target,
            "n_solutions": len(solutions(numbers, target)),
        }
        return key, Problem(prompt, target, meta)

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_problems(split, n, seed, self._draw, eval_fraction=self.eval_fraction, task_name=self.name)

    # -- verification
    def score(self, problem: Problem, completion: str) -> float:
        try:
            return float(check(problem.meta["numbers"], problem.answer, completion))
        except Exception:  # noqa: BLE001 - the verifier must never crash a training run
            return 0.0

    def parse_ok(self, completion: str) -> bool:
        return parse(completion) is not None

    def first_move(self, completion: str) -> tuple[int, str] | None:
        return first_move(completion)

    def solutions(self, problem: Problem) -> list[str]:
        return solutions(problem.meta["numbers"], problem.answer)

    def canonical(self, completion: str, problem: Problem | None = None) -> str | None:
        """Canonical solution string of a completion (``None`` if invalid for ``problem``)."""
        if problem is None:
            return canonical(completion)
        if not self.score(problem, completion):
            return None
        return canonical(completion, problem.meta["numbers"])

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        """A correct completion of a uniformly random canonical solution, steps in a random
        valid order (so first moves are diverse)."""
        texts = self.solutions(problem)
        if not texts:
            raise ValueError(f"unsolvable instance {problem.prompt!r}")
        text = texts[rng.randrange(len(texts))]
        return solution_completion(problem.meta["numbers"], text, rng)
