"""MathTask: extraction, gold answers, math-verify equivalences, loader errors, timeouts."""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts

pytest.importorskip("math_verify")

from gapo.tasks import get  # noqa: E402
from gapo.tasks.math import MathTask, verify_answer  # noqa: E402
from gapo.tasks.math_answer import extract_answer, gold_from_field, last_boxed  # noqa: E402

FIX = Path(__file__).parents[1] / "fixtures"
GSM = FIX / "math_gsm8k.jsonl"
COMP = FIX / "math_competition.jsonl"
BOMB = "\\boxed{9^{9^{9^{9}}}}"  # sympy tries to evaluate a number with ~3.7e8 digits


# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # two levels of nesting
        ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),  # the last box (both must verify)
        ("\\boxed{1} and a truncated \\boxed{\\frac{1}{", "1"),  # unbalanced last box skipped
        ("\\fbox{7}", "7"),
        ("\\boxed 5", "5"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the box
        ("<answer>42</answer>", "42"),
        ("<answer> 1 </answer> ... <answer>\n 2\n</answer>", "2"),  # last tag, stripped
        ("<answer>so \\boxed{x+1}</answer> \\boxed{9}", "x+1"),  # tag first, box inside it
        ("He pays 1,234 dollars. #### 1,234", "1234"),  # GSM8K commas
        ("It drops to -7 degrees", "-7"),  # negative
        ("it is 13/4", "13/4"),  # last number, fraction
        ("about 3.25 or 13/4", "about 3.25 or 13/4"),  # "or": the sentence, which then scores 0
        ("The values are 2, 4 and 8", "8"),  # the last number; the reward needs 2 = 4 = 8
        ("x = -0.5.", "-0.5"),
        ("no digits here", None),
        ("", None),
        ("<answer>   </answer>", None),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_extract_answer_strict_and_non_strings():
    assert extract_answer("it is 12", last_number=False) is None
    assert extract_answer("\\boxed{12}", last_number=False) == "12"
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    "field, gold",
    [
        ("48/2 = 24\n48+24 = 72\n#### 72", "72"),
        ("#### 2,350", "2350"),
        ("#### -7", "-7"),
        ("so $x=\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        (42, "42"),
        (" 5/2 ", "5/2"),
        ("", None),
        (None, None),
        (float("nan"), None),
    ],
)
def test_gold_from_field(field, gold):
    assert gold_from_field(field) == gold


# ----------------------------------------------------------------------------- verification


@pytest.mark.parametrize(
    "gold, pred",
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("4", "x = 4"),
        ("72", "72.0"),
        ("2350", "2,350"),
        ("-7", "-7"),
        ("\\frac{3}{4}", "0.75"),
        ("90^\\circ", "90"),
        ("2, 3", "3, 2"),
        ("18", "18 dollars"),  # text fallback
        ("\\pi", "$\\pi$"),  # math delimiters stripped
    ],
)
def test_verify_equivalent(gold, pred):
    assert verify_answer(gold, pred) == (True, True)


@pytest.mark.parametrize("gold, pred", [("\\frac{1}{2}", "0.51"), ("72", "27"), ("-7", "7"), ("2\\sqrt{2}", "2")])
def test_verify_rejects(gold, pred):
    ok, parsed = verify_answer(gold, pred)
    assert not ok and parsed


# ----------------------------------------------------------------------------- loading


def test_fixtures_load_and_demonstrations_score_one():
    for path in (GSM, COMP):
        task = MathTask(path, splits=DataSplits(eval_fraction=0.0))
        problems = task.generate("train", task.split_size("train"), seed=0)
        assert len(problems) == 6 and task.split_size("eval") == 0
        for p in problems:
            assert task.score(p, task.demonstration(p)) == 1.0, (p.answer, task.demonstration(p))
            assert p.prompt.startswith(p.meta["question"]) and "\\boxed{}" in p.prompt
    gsm = {
        p.meta["line"]: p.answer for p in MathTask(GSM, splits=DataSplits(eval_fraction=0.0)).generate("train", 6, 0)
    }
    assert gsm == {1: "72", 2: "2350", 3: "-7", 4: "1.5", 5: "36", 6: "0.625"}


def test_custom_fields_template_and_registry():
    task = get(
        "math",
        path=str(FIX / "math_custom_fields.jsonl"),
        prompt_field="q",
        answer_field="final",
        template="Q: {question} A:",
        eval_fraction=0.0,
    )
    by_line = {p.meta["line"]: p for p in task.generate("train", 2, 0)}
    assert by_line[1].prompt == "Q: What is 6 times 7? A:" and by_line[1].answer == "42"
    assert task.score(by_line[2], "10/4 = \\boxed{2.5}") == 1.0
    with pytest.raises(ValueError, match="template"):
        MathTask(GSM, prompt_format=PromptFormat("no placeholder"))


def _write(tmp_path, text, name="d.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_bad_files_name_file_line_and_field(tmp_path):
    with pytest.raises(ValueError, match="not found") as e:
        MathTask(tmp_path / "missing.jsonl")
    assert "missing.jsonl" in str(e.value)
    with pytest.raises(ValueError, match=r"e\.jsonl: dataset file is empty"):
        MathTask(_write(tmp_path, "\n\n", "e.jsonl"))
    bad = _write(tmp_path, '{"question": "a", "answer": "1"}\n{"question": "b", answer: 2}\n', "bad.jsonl")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        MathTask(bad)
    arr = _write(tmp_path, "[1, 2]\n", "arr.jsonl")
    with pytest.raises(ValueError, match=r"arr\.jsonl:1: expected a JSON object"):
        MathTask(arr)
    nofield = _write(tmp_path, '{"question": "a", "answer": "1"}\n\n{"question": "b"}\n', "nf.jsonl")
    with pytest.raises(ValueError, match=r"nf\.jsonl:3: missing field 'answer'"):
        MathTask(nofield)
    with pytest.raises(ValueError, match=r"nf\.jsonl:1: missing field 'problem'"):
        MathTask(nofield, prompt_field="problem")
    with pytest.raises(ValueError, match=r"nf\.jsonl:1: no question field"):
        MathTask(_write(tmp_path, '{"text": "a", "answer": "1"}\n', "nf.jsonl"))
    with pytest.raises(ValueError, match=r"ea\.jsonl:1: field 'answer' holds no usable answer"):
        MathTask(_write(tmp_path, '{"question": "a", "answer": "  "}\n', "ea.jsonl"))
    with pytest.raises(ValueError, match=r"eq\.jsonl:1: field 'question' must be a non-empty string"):
        MathTask(_write(tmp_path, '{"question": "", "answer": "1"}\n', "eq.jsonl"))


def test_a_conversational_question_is_its_last_user_turn_with_the_turns_before(tmp_path):
    """TRL's conversational prompt column (system turn, a worked exchange, the real question last):
    the question is the last user turn, wrapped by the template, and the turns before it are kept
    for the chat template (not cut to the first user turn, the few-shot one). NuminaMath's
    ``messages`` (the question, then its answer) gives its one question with nothing before it."""
    import json

    few_shot = [
        {"role": "system", "content": "Answer with a number only."},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "What is 3 + 4?"},
    ]
    numina = [{"role": "user", "content": "What is 5 + 5?"}, {"role": "assistant", "content": "\\boxed{10}"}]
    rows = [{"prompt": few_shot, "answer": "7"}, {"prompt": numina, "answer": "10"}]
    path = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
    task = MathTask(path, splits=DataSplits(eval_fraction=0.0), prompt_format=PromptFormat("Q: {question}"))
    by_line = {p.meta["line"]: p for p in task.generate("train", 2, 0)}
    first, second = by_line[1], by_line[2]
    assert first.prompt == "Q: What is 3 + 4?" and first.meta["question"] == "What is 3 + 4?"
    assert first.meta["messages"] == (*few_shot[:3], {"role": "user", "content": "Q: What is 3 + 4?"})
    assert task.score(first, "\\boxed{7}") == 1.0
    assert second.prompt == "Q: What is 5 + 5?" and "messages" not in second.meta
    no_user = _write(
        tmp_path, json.dumps({"prompt": [{"role": "system", "content": "x"}], "answer": "1"}) + "\n", "nu.jsonl"
    )
    with pytest.raises(ValueError, match=r"nu\.jsonl:1: field 'prompt': the conversation has no user turn"):
        MathTask(no_user)
    bad = [{"role": "user", "content": 3}]
    with pytest.raises(ValueError, match=r"bm\.jsonl:1: field 'prompt': message 1 is not"):
        MathTask(_write(tmp_path, json.dumps({"prompt": bad, "answer": "1"}) + "\n", "bm.jsonl"))


def test_splits_disjoint_deterministic(tmp_path):
    rows = [f'{{"question": "What is {i} plus {i}?", "answer": "#### {2 * i}"}}' for i in range(200)]
    path = _write(tmp_path, "\n".join(rows) + "\n")
    task = MathTask(path, splits=DataSplits(eval_fraction=0.2))
    train = task.generate("train", task.split_size("train"), 0)
    ev = task.generate("eval", task.split_size("eval"), 0)
    assert len(train) + len(ev) == 200 and 20 < len(ev) < 60
    assert not {p.prompt for p in train} & {p.prompt for p in ev}
    assert task.generate("train", 10, 3) == task.generate("train", 10, 3)
    assert task.generate("train", 5, 3) == task.generate("train", 10, 3)[:5]  # prefix-stable
    assert len(task.generate("train", 500, 1)) == 500  # train cycles
    with pytest.raises(ValueError, match="eval split has"):
        task.generate("eval", 1000, 0)
    with pytest.raises(ValueError, match="split must be"):
        task.generate("test", 1, 0)
    # An explicit eval file: train drops questions that appear in it.
    evp = _write(tmp_path, rows[0] + "\n" + rows[1] + "\n", "ev.jsonl")
    task2 = MathTask(path, splits=DataSplits(eval_path=evp))
    assert task2.split_size("eval") == 2 and task2.split_size("train") == 198 and task2.n_dropped_overlap == 2


# ----------------------------------------------------------------------------- scoring


@pytest.fixture(scope="module")
def comp():
    return MathTask(COMP, splits=DataSplits(eval_fraction=0.0), scoring=MathScoring(timeout_s=1.0))


def test_bad_completions_score_zero_never_raise(comp):
    p = next(q for q in comp.generate("train", 6, 0) if q.answer == "\\frac{1}{2}")
    assert comp.score_detailed(p, "I don't know") == (0.0, "unparsable")
    assert comp.score_detailed(p, "<answer></answer>") == (0.0, "unparsable")
    assert comp.score_detailed(p, "\\boxed{}") == (0.0, "unparsable")
    assert not comp.parse_ok("no answer") and comp.parse_ok("\\boxed{1}")
    for junk in (
        "\\boxed{\\frac{}{}}",
        "\\boxed{)(}",
        "\\boxed{" + "{" * 500 + "}",
        "\\boxed{\\x00\\ud800}",
        "9" * 5000,
    ):
        r, status = comp.score_detailed(p, junk)
        assert r == 0.0 and status in ("ok", "unparsable", "ambiguous")
    assert comp.score_detailed(p, "<answer>0.5</answer>") == (1.0, "ok")
    assert comp.first_move("\\boxed{1}") is None


def test_timeout_on_main_thread(comp):
    p = comp.generate("train", 1, 0)[0]
    t0 = time.perf_counter()
    assert comp.score_detailed(p, BOMB) == (0.0, "timeout")
    # timeout_s=1.0; the bomb alone would run far longer. Bound: 15x, for a busy machine
    timing.assert_within(time.perf_counter() - t0, 15.0, quiet_s=1.1, what="a verifier bomb under timeout_s=1.0")


def test_timeout_off_main_thread(comp):
    # math-verify's own timeout raises ValueError off the main thread; ours uses a helper process.
    p = next(q for q in comp.generate("train", 6, 0) if q.answer == "\\frac{1}{2}")
    out = {}

    def work():
        out["good"] = comp.score_detailed(p, "\\boxed{0.5}")  # also starts the helper (untimed)
        t0 = time.perf_counter()
        out["bomb"] = comp.score_detailed(p, BOMB)
        out["bomb_s"] = time.perf_counter() - t0
        out["after"] = comp.score_detailed(p, "\\boxed{1/2}")  # helper was replaced

    th = threading.Thread(target=work)
    th.start()
    th.join(600 * timing.SCALE)
    assert not th.is_alive(), timing.timeout_message("scoring off the main thread", 600 * timing.SCALE, 5)
    assert out["good"] == (1.0, "ok") and out["after"] == (1.0, "ok")
    assert out["bomb"] == (0.0, "timeout")
    timing.assert_within(out["bomb_s"], 15.0, quiet_s=1.1, what="a verifier bomb off the main thread")


def test_pickle_drops_data_but_scores(comp):
    p = comp.generate("train", 1, 0)[0]
    clone = pickle.loads(pickle.dumps(comp))
    assert clone.score(p, comp.demonstration(p)) == 1.0
    with pytest.raises(RuntimeError, match="without its data"):
        clone.generate("train", 1, 0)


# ----------------------------------------------------------------------------- a verifier that cannot be poisoned

import subprocess  # noqa: E402
import sys  # noqa: E402

import gapo.tasks.math as math_mod  # noqa: E402


def _fresh_python(code: str) -> str:
    """stdout of ``code`` in a new interpreter (math-verify and sympy not yet imported)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_timeouts_during_the_cold_start_do_not_poison_the_verifier():
    # Before: the first timed call imported sympy under the alarm; the alarm cut the import and
    # every later verification failed: verify_answer('5', '5') == (False, False) for ever.
    line = _fresh_python(
        "from gapo.exec.scoring import run_with_timeout, VerifierTimeout\n"
        "from gapo.tasks.math import verify_answer\n"
        "t, n = 0.001, 0\n"
        "for _ in range(12):\n"
        "    try:\n"
        "        run_with_timeout(verify_answer, '5', '5', timeout_s=t, mode='signal')\n"
        "    except VerifierTimeout:\n"
        "        n += 1\n"
        "    t *= 1.6\n"
        "print(n > 0, verify_answer('5', '5'), verify_answer('\\\\frac{1}{2}', '0.5'))\n"
    )
    assert line == "True (True, True) (True, True)"


@pytest.mark.parametrize("first", ["task", "score_batch"])
def test_math_task_with_tiny_timeouts_from_a_cold_start_still_scores_exact_answers(first):
    # In-process scoring from a cold process, through MathTask itself or score_batch(workers=0),
    # under limits from 1 ms up (before: every status 'timeout', then 0.0 for exact answers).
    line = _fresh_python(
        "from gapo.tasks.math import MathTask\n"
        "from gapo.tasks.base import Problem\n"
        "from gapo.exec.scoring import score_batch\n"
        f"task = MathTask({str(GSM)!r}, splits={{'eval_fraction': 0.0}})\n"
        "p = Problem('q', '5')\n"
        "statuses = set()\n"
        "for i in range(10):\n"
        "    task.timeout_s = 0.001 * 1.6 ** i\n"
        f"    if {first!r} == 'task':\n"
        "        statuses.add(task.score_detailed(p, '\\\\boxed{5}')[1])\n"
        "    else:\n"
        "        _, st = score_batch(task, [p], ['\\\\boxed{5}'], timeout_s=task.timeout_s)\n"
        "        statuses.add('timeout' if st['reward/n_timeout'] else 'ok')\n"
        "task.timeout_s = 30.0\n"
        "after = [task.score(p, c) for c in ('\\\\boxed{5}', '<answer>5</answer>', 'so it is 5')]\n"
        "rewards, _ = score_batch(task, [p] * 2, ['\\\\boxed{5}'] * 2, timeout_s=30.0)\n"
        "print(sorted(statuses), after, rewards)\n"
    )
    statuses, rest = line.split("] ", 1)
    assert set(statuses.strip("[").replace("'", "").split(", ")) <= {"ok", "timeout"}, line
    assert rest == "[1.0, 1.0, 1.0] [1.0, 1.0]", line


def test_a_verifier_a_timeout_breaks_is_replaced_by_a_fresh_process(comp, monkeypatch, capsys):
    # A timeout that leaves math-verify answering wrongly (simulated: verify() returns False from
    # then on) is caught by the canary check; the caches are cleared, and as that does not help
    # here, this process verifies in a helper process from then on.
    import math_verify

    monkeypatch.setattr(math_mod, "_BROKEN_PID", None)
    p = next(q for q in comp.generate("train", 6, 0) if q.answer == "\\frac{1}{2}")
    assert comp.score_detailed(p, "\\boxed{0.5}") == (1.0, "ok") and math_mod.verifier_healthy()
    calls = []

    def poisoned(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(60)  # the call the timeout cuts short; wrong answers from then on
        return False

    monkeypatch.setattr(math_verify, "verify", poisoned)
    assert comp.score_detailed(p, "\\boxed{0.5}") == (0.0, "timeout")
    assert not math_mod.verifier_healthy()
    assert math_mod._BROKEN_PID == os.getpid()
    assert "verifying in a helper process" in capsys.readouterr().err
    assert comp.score_detailed(p, "\\boxed{0.5}") == (1.0, "ok")  # in the helper, unpoisoned
    assert comp.score_detailed(p, "\\boxed{0.25}") == (0.0, "ok")


def test_a_timeout_of_a_sound_verifier_changes_nothing(comp, monkeypatch):
    monkeypatch.setattr(math_mod, "_BROKEN_PID", None)
    p = next(q for q in comp.generate("train", 6, 0) if q.answer == "\\frac{1}{2}")
    assert comp.score_detailed(p, BOMB) == (0.0, "timeout")
    assert math_mod._BROKEN_PID is None  # the canaries passed: still verified in this process
    assert comp.score_detailed(p, "\\boxed{\\frac{1}{2}}") == (1.0, "ok")


def test_warmup_is_never_cut_by_the_guard(monkeypatch):
    # an alarm due during the warm-up fires after it, as a timeout of the call, not inside it
    from gapo.exec.scoring_pool import VerifierTimeout as VT
    from gapo.exec.scoring_pool import call_with_alarm

    monkeypatch.setattr(math_mod, "_WARM_PID", None)
    seen = []
    real = math_mod.verify_answer

    def slow(g, p):
        time.sleep(0.01)
        seen.append(g)
        return real(g, p)

    monkeypatch.setattr(math_mod, "verify_answer", slow)
    with pytest.raises(VT):
        call_with_alarm(math_mod.warmup, (), 0.02)
    assert len(seen) == len(math_mod._WARMUP)  # every warm-up comparison ran to the end
    assert math_mod._WARM_PID == os.getpid()


def test_pool_worker_scores_exact_answers_after_a_timeout(comp):
    # one worker: the answers after the bomb are scored by the same worker (soft timeout: its
    # canaries checked) or by its replacement (hard kill: warmed up on load)
    from gapo.exec.scoring import ScoringPool

    p = next(q for q in comp.generate("train", 6, 0) if q.answer == "\\frac{1}{2}")
    with ScoringPool(1, timeout_s=2.0) as pool:
        rewards, stats = pool.score(comp, [p] * 4, [BOMB, "\\boxed{0.5}", "<answer>1/2</answer>", "\\boxed{0.5, 1}"])
    assert rewards == [0.0, 1.0, 1.0, 0.0]
    assert stats["reward/n_timeout"] == 1 and stats["reward/n_ambiguous"] == 1


# ----------------------------------------------------------------------------- parameter groups
from gapo import tasks  # noqa: E402
from gapo.tasks.base import DataSplits, PromptFormat  # noqa: E402
from gapo.tasks.math import MathScoring  # noqa: E402


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: DataSplits(eval_fraction=1.0), "eval_fraction"),
        (lambda: DataSplits(eval_fraction=float("nan")), "eval_fraction"),
        (lambda: DataSplits(eval_fraction="0.1"), "eval_fraction"),
        (lambda: DataSplits(split=3), "split"),
        (lambda: DataSplits(eval_split=["test"]), "eval_split"),
        (lambda: DataSplits(eval_path=7), "eval_path"),
        (lambda: PromptFormat(None), "template"),
        (lambda: PromptFormat("{question}", max_completion_len=0), "max_completion_len"),
        (lambda: PromptFormat("{question}", max_completion_len=True), "max_completion_len"),
        (lambda: MathScoring(timeout_s=0), "timeout_s"),
        (lambda: MathScoring(timeout_s=float("inf")), "timeout_s"),
        (lambda: MathScoring(guard="thread"), "guard"),
        (lambda: MathScoring(last_number="yes"), "last_number"),
    ],
)
def test_a_bad_group_value_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def _same_task(a: MathTask, b: MathTask) -> None:
    assert vars(a) == vars(b)  # every attribute, the problem pools included (prompt and answer)
    for split in ("train", "eval"):  # Problem equality leaves meta out: compare it too
        assert [p.meta for p in a._split(split)] == [p.meta for p in b._split(split)]


def test_the_config_gives_a_groups_fields_flat_or_as_a_mapping():
    """``MathTask`` takes its groups (an instance, or a mapping of its fields); ``task.params`` may
    give a field on its own, which ``tasks.get`` puts into its group (``nest_group_fields``)."""
    tpl = "Q: {question}\nA:"
    grouped = MathTask(
        GSM,
        splits=DataSplits(eval_fraction=0.4),
        prompt_format=PromptFormat(tpl, max_completion_len=77),
        scoring=MathScoring(timeout_s=2.0, guard="process", last_number=False),
    )
    assert grouped.eval_fraction == 0.4 and grouped.template == tpl and grouped.max_completion_len == 77
    assert (grouped.timeout_s, grouped.guard, grouped.last_number) == (2.0, "process", False)
    assert grouped.split_size("eval") > 0 and grouped.split_size("train") > 0
    # the registry (the config's path) with flat fields, and a mapping per group (YAML), build the same task
    params = {"eval_fraction": 0.4, "template": tpl, "max_completion_len": 77, "timeout_s": 2.0}
    _same_task(grouped, get("math", path=str(GSM), guard="process", last_number=False, **params))
    _same_task(
        grouped,
        MathTask(
            GSM,
            splits={"eval_fraction": 0.4},
            prompt_format={"template": tpl, "max_completion_len": 77},
            scoring={"timeout_s": 2.0, "guard": "process", "last_number": False},
        ),
    )
    # the defaults are what they were: eval_fraction 0.1 (also for None), the boxed template, 1024, 5 s
    d = MathTask(GSM, splits=DataSplits(eval_fraction=None))
    assert (d.eval_fraction, d.max_completion_len, d.timeout_s) == (0.1, 1024, 5.0)
    assert (d.guard, d.last_number) == ("auto", True)
    assert "{question}" in d.template and "boxed" in d.template


def test_a_flat_field_goes_over_its_group_in_the_config():
    """``task.params.splits={eval_fraction: 0.4}`` from a file and ``task.params.eval_fraction=0.2``
    from the command line: the field wins, the group's other fields stay."""
    t = get("math", path=str(GSM), prompt_format=PromptFormat("Q: {question}", 50), max_completion_len=77)
    assert t.max_completion_len == 77 and t.template == "Q: {question}"
    t = get("math", path=str(GSM), splits={"eval_fraction": 0.4}, eval_fraction=0.2, guard="process")
    assert t.eval_fraction == 0.2 and t.guard == "process"


def test_the_constructor_has_one_spelling():
    """0.2's flat keywords of ``MathTask`` itself are gone (Python's own TypeError); a wrong group,
    an unknown field of one, or a bad value is named, through the config's path as well."""
    for flat in (dict(eval_fraction=0.2), dict(timeout_s=2), dict(template="{question}"), dict(timeout=2)):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(flat))}'"):
            MathTask(GSM, **flat)
    with pytest.raises(TypeError, match="'eval_fracion'"):
        MathTask(GSM, splits={"eval_fracion": 0.2})
    with pytest.raises(TypeError, match="DataSplits"):
        MathTask(GSM, splits=0.2)
    with pytest.raises(ValueError, match="task 'math'.*guard"):  # a bad field given flat is named
        tasks.build("math", {"path": str(GSM), "guard": "thread"})
    with pytest.raises(ValueError, match="task 'math'.*'timeout'"):
        tasks.build("math", {"path": str(GSM), "timeout": 2})


def test_the_config_checks_the_groups_fields_by_name_and_type():
    from gapo.rl.domains import check_task_param_types, task_params

    # every keyword each task took before the groups is still a task.params key
    common = {"path", "split", "eval_split", "eval_path", "eval_fraction", "template", "name"}
    before = {
        "math": common | {"prompt_field", "answer_field", "timeout_s", "guard", "last_number", "max_completion_len"},
        "data": common | {"prompt_field", "answer_fields", "max_completion_len"},
        "rg": {"config", "dataset", "size", "seed", "eval_fraction", "partial_credit", "last_line"}
        | {"template", "max_completion_len"},
        "mbpp": {"path", "split", "prompt_field", "tests_field", "solution_field", "setup_field", "id_field"}
        | {"prompt_is_code", "prompt_template", "timeout_s", "memory_mb", "max_completion_len", "eval_fraction"}
        | {"strict_returns"},
    }
    for name, old in before.items():
        accepted = task_params(name)
        if accepted is not None:  # None: the task's optional package is missing
            assert old <= accepted, (name, old - accepted)
    check_task_param_types("task.params", "math", {"eval_fraction": None, "timeout_s": 3, "last_number": False})
    with pytest.raises(ValueError, match="task.params.last_number"):
        check_task_param_types("task.params", "math", {"last_number": "maybe"})
    with pytest.raises(ValueError, match="task.params.max_completion_len"):
        check_task_param_types("task.params", "math", {"max_completion_len": "long"})
