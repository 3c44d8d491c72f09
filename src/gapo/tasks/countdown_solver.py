"""Countdown's completions and expressions: parsing and checking a completion, the canonical form
of the expression it computes, and the exact solver. The task, and the format and rules of
prompts and completions, are in :mod:`gapo.tasks.countdown`.

Canonical solutions
-------------------
Two solutions are the same when their expression trees are equal up to commutativity and
associativity. The canonical form flattens the tree:

- a sum node is a multiset of positive terms and a multiset of negative terms:
  ``a − (b − c)``, ``a − b + c`` and ``(a + c) − b`` are all ``{a, c} − {b}``;
- a product node is a multiset of numerator and of denominator factors:
  ``a / (b / c)``, ``a · c / b`` and ``(a / b) · c`` are all ``{a, c} / {b}``;
- terms of a sum are leaves or products, factors of a product are leaves or sums.

It is written with every multiset sorted as strings, positive terms (numerators) first::

    1+2+3     2*3*4/6     10+3-5     8/(4-2)     2*3+4

Equal values are interchangeable, so solutions using two equal given numbers are counted once.
Only commutativity and associativity are quotiented out, not cancellation: ``x*1`` and
``x/1`` are different solutions (1 in the numerator or the denominator), and so are
``x+1-1`` and ``x``. A completion names values, not positions; when a value could refer to
several available items, it refers to the *most recently computed* one, else to a given
number (:func:`canonical`). A few trees therefore cannot be written in any step order and
are not counted as solutions, e.g. ``9/(3*3)`` (``3*3=9,9/9=1`` reads as ``(3*3)/9``) or
``(8-4)/(10-6)`` with numbers 8 6 10 4 (whichever difference comes second reads its given 4
as the first one's result); about 0.2% of expressions over 4 numbers. So the solution set is
exactly the set of canonical forms of correct completions (checked by brute force in tests).

Solver
------
:func:`solutions` enumerates every reachable canonical expression over every sub-multiset of
the numbers by dynamic programming over sub-multisets (two disjoint parts, all operators,
both orders), deduplicating canonical forms per sub-multiset; it is exact because whether an
expression combines with another depends only on its value and canonical form. Forms whose
derivation has a value collision are then kept only if some step order of one of their
derivations (built from up to 8 root realisations kept per form and sub-form) reads back as
the form. Results are cached per multiset
and per (multiset, target).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice, product

MAX_DIGITS = 12  # longest number literal a completion may contain

_NUM = rf"(?:0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})"
_STEP = re.compile(rf"({_NUM})([-+*/])({_NUM})=({_NUM})")

Step = tuple[int, str, int, int]  # (a, op, b, c) for "a op b = c"
# A derivation: a given number, or (op, left, right, value) written "left op right = value".
Derivation = int | tuple


# ---------------------------------------------------------------- canonical expressions
@dataclass(frozen=True)
class _Expr:
    """A canonical expression: ``kind`` is "n" (number), "+" (sum) or "*" (product).

    For a sum, ``pos``/``neg`` are the sorted term strings; for a product, the sorted
    numerator/denominator factor strings (sums parenthesised). ``text`` is the canonical
    string. ``deriv`` is one tree that realises it with positive integer intermediates.
    """

    value: int
    kind: str
    text: str
    pos: tuple[str, ...]
    neg: tuple[str, ...]
    deriv: Derivation
    # root realisations (x, op, y), the first giving ``deriv``; more are kept (up to
    # _MAX_SPLITS) to find a writable derivation when the first is not
    splits: list = field(default_factory=list, repr=False)


def _leaf(v: int) -> _Expr:
    return _Expr(v, "n", str(v), (), (), v)


def _terms(e: _Expr) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (e.pos, e.neg) if e.kind == "+" else ((e.text,), ())


def _factors(e: _Expr) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if e.kind == "*":
        return e.pos, e.neg
    return ((e.text if e.kind == "n" else f"({e.text})",), ())


def _combine(x: _Expr, op: str, y: _Expr, value: int) -> _Expr:
    """Canonical form of ``x op y`` (the caller checked that ``value`` is valid)."""
    if op in "+-":
        (xp, xn), (yp, yn) = _terms(x), _terms(y)
        pos, neg = (xp + yp, xn + yn) if op == "+" else (xp + yn, xn + yp)
        kind, plus, minus = "+", "+", "-"
    else:
        (xp, xn), (yp, yn) = _factors(x), _factors(y)
        pos, neg = (xp + yp, xn + yn) if op == "*" else (xp + yn, xn + yp)
        kind, plus, minus = "*", "*", "/"
    pos, neg = tuple(sorted(pos)), tuple(sorted(neg))
    text = plus.join(pos) + "".join(minus + t for t in neg)
    return _Expr(value, kind, text, pos, neg, (op, x.deriv, y.deriv, value), [(x, op, y)])


def _apply(a: int, op: str, b: int) -> int | None:
    """``a op b`` if it is a positive integer, else ``None``."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    if op == "/":
        return a // b if b > 0 and a % b == 0 else None
    return None


def _combinations(x: _Expr, y: _Expr):
    """Every valid ``x op y`` and ``y op x``, the larger operand written first.

    Between equal values a computed result comes first, as a completion's ``v/v`` reads its
    first ``v`` as the computed one (see :func:`canonical`).
    """
    hi, lo = (x, y) if (x.value, x.kind != "n") >= (y.value, y.kind != "n") else (y, x)
    yield _combine(hi, "+", lo, hi.value + lo.value)
    yield _combine(hi, "*", lo, hi.value * lo.value)
    if hi.value > lo.value:
        yield _combine(hi, "-", lo, hi.value - lo.value)
    if hi.value % lo.value == 0:
        yield _combine(hi, "/", lo, hi.value // lo.value)
        if hi.value == lo.value and hi.text != lo.text:
            yield _combine(lo, "/", hi, 1)  # (1+2)/(6-3) and (6-3)/(1+2) differ


def _submultisets(values: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Distinct sub-multisets of a sorted tuple, as sorted tuples (including () and itself)."""
    counts = sorted(Counter(values).items())
    out = []
    for picks in product(*(range(c + 1) for _, c in counts)):
        out.append(tuple(v for (v, _), k in zip(counts, picks) for _ in range(k)))
    return out


def _minus(values: tuple[int, ...], part: tuple[int, ...]) -> tuple[int, ...]:
    rest = Counter(values)
    rest.subtract(part)
    return tuple(sorted(rest.elements()))


_MAX_SPLITS = 8  # root realisations kept per expression


@lru_cache(maxsize=4096)
def _exprs(values: tuple[int, ...]) -> dict[str, _Expr]:
    """All canonical expressions using every value of the sorted tuple ``values`` once."""
    if len(values) == 1:
        e = _leaf(values[0])
        return {e.text: e}
    out: dict[str, _Expr] = {}
    for left in _submultisets(values):
        right = _minus(values, left)
        if not left or not right or left > right:  # each unordered split once
            continue
        for x in _exprs(left).values():
            for y in _exprs(right).values():
                for e in _combinations(x, y):
                    seen = out.setdefault(e.text, e)
                    if seen is not e and len(seen.splits) < _MAX_SPLITS:
                        seen.splits.append(e.splits[0])
    return out


@dataclass(frozen=True)
class _Solved:
    by_value: dict[int, tuple[str, ...]]  # value -> sorted canonical solutions
    exprs: dict[str, _Expr]


@lru_cache(maxsize=512)
def _solve(values: tuple[int, ...]) -> _Solved:
    """Every canonical expression with at least one operation over sub-multisets of values."""
    exprs: dict[str, _Expr] = {}
    for sub in _submultisets(values):
        if len(sub) >= 2:
            for text, e in _exprs(sub).items():
                exprs.setdefault(text, e)
    by_value: dict[int, list[str]] = {}
    for text, e in exprs.items():
        by_value.setdefault(e.value, []).append(text)
    return _Solved({v: tuple(sorted(ts)) for v, ts in by_value.items()}, exprs)


def _key(numbers: Sequence[int]) -> tuple[int, ...]:
    values = tuple(sorted(int(v) for v in numbers))
    if not values or values[0] < 1:
        raise ValueError(f"numbers must be positive integers, got {list(numbers)}")
    return values


def solutions(numbers: Sequence[int], target: int) -> list[str]:
    """All distinct canonical solutions (sorted strings) reaching ``target``.

    A solution uses at least one operation and each given number at most once, and some
    completion writes it (see :func:`canonical`). Example:
    ``solutions([1, 2, 3], 6) == ["1*2*3", "1+2+3", "2*3", "2*3/1"]``.
    """
    return list(_solutions(_key(numbers), int(target)))


def reachable(numbers: Sequence[int]) -> set[int]:
    """Every value some completion over ``numbers`` computes (at least one operation)."""
    return set(_solve(_key(numbers)).by_value)


@lru_cache(maxsize=1 << 16)
def _solutions(values: tuple[int, ...], target: int) -> tuple[str, ...]:
    solved = _solve(values)
    return tuple(t for t in solved.by_value.get(target, ()) if _writable(solved.exprs[t]))


def _writable(expr: _Expr) -> bool:
    """Whether some step order of ``expr``'s derivation reads back as ``expr``.

    Without value collisions (an intermediate result equal to another one or to a number the
    tree uses) the plain order does. With one, an operand may name the wrong item in every
    order, e.g. ``(8-4)/(10-6)``: whichever difference comes second reads its given 4 as the
    first one's result. Such trees are rare (about 0.2% of expressions over 4 numbers), are
    not expressible as completions and so are not counted as solutions.
    """
    return _order_for(expr) is not None


def _order_for(expr: _Expr, rng: random.Random | None = None) -> str | None:
    """A completion reading back as ``expr`` (random among valid orders with ``rng``)."""
    leaves: list[int] = []
    inner: list[int] = []

    def walk(d: Derivation) -> None:
        if isinstance(d, tuple):
            inner.append(d[3])
            walk(d[1])
            walk(d[2])
        else:
            leaves.append(d)

    walk(expr.deriv)
    inner = inner[1:]  # the root's result is never an operand
    collision = len(set(inner)) < len(inner) or bool(set(inner) & set(leaves))
    if not collision:
        return render(expr.deriv, rng)
    values = tuple(sorted(leaves))
    orders = [c for d in islice(_derivations(expr), 256) for c in _all_orders(d)]
    if rng is not None:
        rng.shuffle(orders)
    for completion in orders:
        if canonical(completion, values) == expr.text:
            return completion
    return None


def _derivations(expr: _Expr) -> Iterator[Derivation]:
    """Derivations of ``expr`` from its kept root realisations, recursively."""
    if expr.kind == "n":
        yield expr.value
        return
    for x, op, y in expr.splits:
        for dx in _derivations(x):
            for dy in _derivations(y):
                yield (op, dx, dy, expr.value)


# ---------------------------------------------------------------- completions
def parse(completion: str) -> list[Step] | None:
    """The steps of a well-formed completion, else ``None`` (syntax only, no arithmetic)."""
    if not isinstance(completion, str):
        return None
    text = completion.strip()
    if not text or len(text) > 10_000:
        return None
    steps = []
    for segment in text.split(","):
        m = _STEP.fullmatch(segment)
        if m is None:
            return None
        steps.append((int(m[1]), m[2], int(m[3]), int(m[4])))
    return steps


def check(numbers: Sequence[int], target: int, completion: str) -> bool:
    """Whether ``completion`` solves the instance (see the module docstring for the rules)."""
    steps = parse(completion)
    if steps is None:
        return False
    available = Counter(int(v) for v in numbers)
    for a, op, b, c in steps:
        available[a] -= 1
        available[b] -= 1
        if available[a] < 0 or available[b] < 0 or _apply(a, op, b) != c:
            return False
        available[c] += 1
    return steps[-1][3] == int(target)


def canonical(completion: str, numbers: Sequence[int] | None = None) -> str | None:
    """Canonical form of the expression the completion's last step computes.

    Each operand refers to the most recently computed unused result with that value, else to
    a given number. With ``numbers``, returns ``None`` unless every step is valid for them
    (the target is not checked); without, any operand that is not an earlier result is taken
    as a given number. ``None`` also for unparsable completions or wrong arithmetic.
    """
    steps = parse(completion)
    if steps is None:
        return None
    given = Counter(int(v) for v in numbers) if numbers is not None else None
    results: list[_Expr] = []  # computed, unused, oldest first

    def take(v: int) -> _Expr | None:
        for i in range(len(results) - 1, -1, -1):
            if results[i].value == v:
                return results.pop(i)
        if given is not None:
            if given[v] <= 0:
                return None
            given[v] -= 1
        return _leaf(v)

    for a, op, b, c in steps:
        if _apply(a, op, b) != c:
            return None
        x, y = take(a), take(b)
        if x is None or y is None:
            return None
        results.append(_combine(x, op, y, c))
    return results[-1].text


def first_move(completion: str) -> tuple[int, str] | None:
    """``(first operand, operator)`` of the first step, larger operand first for ``+``/``*``.

    Only the first step has to be well-formed (``a<op>b=c``); its arithmetic is not checked.
    """
    if not isinstance(completion, str):
        return None
    m = _STEP.fullmatch(completion.strip().split(",", 1)[0])
    if m is None:
        return None
    a, op, b = int(m[1]), m[2], int(m[3])
    return (max(a, b), op) if op in "+*" else (a, op)


def _steps(deriv: Derivation) -> list[tuple[str, list[int]]]:
    """The derivation's steps, children before parents: (text, indices of child steps)."""
    steps: list[tuple[str, list[int]]] = []

    def walk(d: Derivation) -> int | None:
        if not isinstance(d, tuple):
            return None
        op, left, right, value = d
        kids = [i for i in (walk(left), walk(right)) if i is not None]
        lv, rv = (x[3] if isinstance(x, tuple) else x for x in (left, right))
        steps.append((f"{lv}{op}{rv}={value}", kids))
        return len(steps) - 1

    walk(deriv)
    return steps


def render(deriv: Derivation, rng: random.Random | None = None) -> str:
    """Write a derivation as steps, in a uniformly random valid order when ``rng`` is given."""
    steps = _steps(deriv)
    order = list(range(len(steps)))  # children before parents
    if rng is not None:
        done: set[int] = set()
        order = []
        while len(order) < len(steps):
            ready = [i for i, (_, kids) in enumerate(steps) if i not in done and all(k in done for k in kids)]
            pick = ready[rng.randrange(len(ready))]
            done.add(pick)
            order.append(pick)
    return ",".join(steps[i][0] for i in order)


def _all_orders(deriv: Derivation) -> list[str]:
    """Every valid step order of a derivation, written as completions."""
    steps = _steps(deriv)
    out: list[str] = []

    def extend(done: list[int]) -> None:
        if len(done) == len(steps):
            out.append(",".join(steps[i][0] for i in done))
            return
        for i, (_, kids) in enumerate(steps):
            if i not in done and all(k in done for k in kids):
                extend(done + [i])

    extend([])
    return out


def solution_completion(numbers: Sequence[int], text: str, rng: random.Random | None = None) -> str:
    """A completion whose canonical form is the solution ``text`` (from :func:`solutions`),
    its steps in a random valid order when ``rng`` is given."""
    expr = _solve(_key(numbers)).exprs.get(text)
    completion = _order_for(expr, rng) if expr is not None else None
    if completion is None:
        raise ValueError(f"{text!r} is not a solution expression for {list(numbers)}")
    return completion
