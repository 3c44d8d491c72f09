"""A user's reward runs where it can be stopped (gapo.tasks.custom, gapo.exec.scoring): in a worker
process with a hard deadline, never in the trainer's; whatever it raises, exits or leaves running
is an error naming it or dies with the worker. Each failure class is tried here, and TRL's batched
form and a ``prompt`` column are scored as TRL's own examples would be."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import timing
from gapo import tasks
from gapo.exec import scoring_pool
from gapo.exec.scoring import SHARED, UserCodeError, score_batch, score_samples
from gapo.rl.rollout import probe_reward
from gapo.tasks.custom import with_rewards

REWARDS = textwrap.dedent("""
    import os, signal, subprocess, sys, time

    class Stop(BaseException):
        pass

    def bare_retry(prompt, completion, **f):
        for _ in range(160):  # 8 s of retries, each swallowing whatever interrupts it
            try:
                time.sleep(0.05)
            except:  # noqa: E722
                pass
        return 1.0

    def spin(prompt, completion, **f):
        if completion != "spin":
            return 0.5
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass

    def slow(prompt, completion, **f):
        time.sleep(2)
        return 0.75

    def exits(prompt, completion, **f):
        raise SystemExit(0)

    def interrupts(prompt, completion, **f):
        raise KeyboardInterrupt

    def stops(prompt, completion, **f):
        raise Stop("halt")

    def crash(prompt, completion, **f):
        if completion == "crash":
            os._exit(3)
        return 0.5

    def child(prompt, completion, **f):  # completion: where to write the child's pid, and what to do
        path, then = completion.split("|")
        p = subprocess.Popen(["sleep", "987.25"])
        with open(path, "w") as fh:
            fh.write(str(p.pid))
        if then == "hang":
            time.sleep(600)
        return 1.0

    def daemon(prompt, completion, **f):  # a double fork into a session of its own: out of the group
        path, then = completion.split("|")
        code = (
            "import os, subprocess, sys; os.setsid(); "
            "open(sys.argv[1], 'w').write(str(subprocess.Popen(['sleep', '987.75']).pid))"
        )
        subprocess.run([sys.executable, "-c", code, path], check=True)
        if then == "hang":
            time.sleep(600)
        return 1.0

    def pid(prompt, completion, **f):
        return float(os.getpid())

    def both_names(prompt, completion, **fields):
        assert "prompt" not in fields and "completion" not in fields, fields
        return 1.0 if fields["solution"] in completion and prompt.startswith("What") else 0.0

    def other_names(p, c, prompt):  # its positionals are p and c: the prompt column is a field
        return 1.0 if prompt == p else 0.0

    def reward_len(completions, **kwargs):  # TRL's docs
        return [-abs(20 - len(completion)) for completion in completions]

    def accuracy(completions, solution, **kwargs):
        contents = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if s in c else 0.0 for c, s in zip(contents, solution)]

    def format_reward(completions, **kwargs):  # TRL's conversational example
        return [1.0 if c[0]["content"].startswith("<think>") else 0.0 for c in completions]

    def echo_prompts(prompts, completions, **kwargs):
        return [float(len(p)) if isinstance(p, list) else -1.0 for p in prompts]

    def short_list(completions, **kwargs):
        return [1.0]

    def not_a_list(completions, **kwargs):
        return 1.0

    def a_string_inside(completions, **kwargs):
        return ["1"] * len(completions)

    def slow_batch(completions, **kwargs):
        time.sleep(1.5)  # over one completion's 1 s, under the batch's 4 x 1 s
        return [None if c == "skip" else 0.25 for c in completions]

    def hang_batch(completions, **kwargs):
        time.sleep(600)

    def needs_ids(completions, completion_ids, **kwargs):
        return [0.0] * len(completions)
""")


@pytest.fixture(scope="module")
def rw(tmp_path_factory):
    p = tmp_path_factory.mktemp("rewards") / "hostile.py"
    p.write_text(REWARDS)
    return p


@pytest.fixture(scope="module")
def arith():
    base = tasks.get("arithmetic")
    return base, base.generate("train", 1, 0)[0]


def _alive(pid: int, cmd: str = "sleep") -> bool:
    """Whether ``pid`` runs (a zombie is dead) and is still the ``cmd`` it was."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z" and argv[0].endswith(cmd.encode())


def test_a_bare_except_retry_loop_is_a_timeout(rw, arith):
    """The soft alarm is swallowed by ``except:``; the hard deadline kills the worker anyway
    (before: 8 s per completion, scored ok with reward 1)."""
    base, p = arith
    t = with_rewards(base, [f"{rw}:bare_retry"])
    t0 = time.monotonic()
    rewards, stats = score_batch(t, [p, p], ["a", "b"], timeout_s=1.0)
    assert rewards == [0.0, 0.0] and stats["reward/n_timeout"] == 2
    timing.assert_within(time.monotonic() - t0, 12, quiet_s=3, what="two 1 s timeouts")


def test_a_swallowed_alarm_is_a_timeout_even_in_process():
    """A verifier that catches the alarm and returns a reward has still run out of its time."""

    class Swallows:
        name = "swallows"

        def score(self, problem, completion):
            try:
                time.sleep(5)
            except BaseException:  # noqa: BLE001 - the point: a scorer that swallows the timeout
                pass
            return 1.0

    rewards, stats = score_batch(Swallows(), ["p"], ["c"], workers=0, timeout_s=0.5)
    assert rewards == [0.0] and stats["reward/n_timeout"] == 1


def test_reward_timeout_s_is_the_deadline_wherever_the_task_is_scored(rw, arith):
    """reward.timeout_s (with_rewards' timeout_s) replaces the scoring call's own deadline: `slow`
    (2 s) is cut at 1 s although the call gives it 30, and finishes at 5 s although the call gives
    it 1 (before: a fixed 10 s for every user reward, in every step and evaluation)."""
    base, p = arith
    tight = with_rewards(base, [f"{rw}:slow"], timeout_s=1.0)
    rewards, stats = score_batch(tight, [p], ["a"], timeout_s=30.0)
    assert rewards == [0.0] and stats["reward/n_timeout"] == 1
    roomy = with_rewards(base, [f"{rw}:slow"], timeout_s=5.0)
    rewards, stats = score_batch(roomy, [p], ["a"], timeout_s=1.0)
    assert rewards == [0.75] and stats["reward/n_timeout"] == 0
    with pytest.raises(ValueError, match=r"reward.timeout_s .*must be a finite number > 0"):
        from gapo.rl.config import load_config

        load_config(None, ["reward.timeout_s=0"])


def test_the_functions_live_in_the_runs_pool_only(rw, arith):
    """With task.scoring_workers=2 the functions are checked, scored in steps and scored in
    evaluations in that one pool: no second pool of one imports them again for the run's length."""
    base, p = arith
    SHARED.close()
    t = with_rewards(base, [f"{rw}:slow_batch"], timeout_s=5.0, workers=2)  # checked here
    assert score_batch(t, [p, p], ["a", "b"], workers=2)[0] == [0.25, 0.25]  # a step
    assert score_samples(t, [p], [["c"]]) == [[0.25]]  # an evaluation
    assert sorted(SHARED._pools) == [2]


def test_a_spinner_that_ignores_sigalrm_is_killed(rw, arith):
    base, p = arith
    t = with_rewards(base, [f"{rw}:spin"])
    rewards, stats = score_batch(t, [p, p], ["spin", "fine"], timeout_s=1.0)
    assert rewards == [0.0, 0.5] and stats["reward/n_timeout"] == 1


@pytest.mark.parametrize(
    "fn, said", [("exits", r"SystemExit\(0\)"), ("interrupts", "KeyboardInterrupt"), ("stops", r"Stop: halt")]
)
def test_exiting_or_interrupting_is_an_error_naming_the_function(rw, arith, fn, said):
    base, p = arith
    t = with_rewards(base, [f"{rw}:{fn}"])
    with pytest.raises(UserCodeError, match=said) as e:
        probe_reward(t, [p], (0.0, 1.0))
    assert f"hostile.py:{fn}" in str(e.value)


@pytest.mark.parametrize(
    "module, said",
    [
        ("raise SystemExit(0)\n", r"importing file .*exits_on_import\.py.* raised SystemExit\(0\)"),
        ("raise KeyboardInterrupt\n", r"importing file .*exits_on_import\.py.* raised KeyboardInterrupt"),
        ("import os\nos._exit(3)\n", r"loading the reward modules \[.*exits_on_import\.py'\] died .*exit code 3"),
    ],
)
def test_an_import_that_exits_is_an_error_naming_the_module(tmp_path, arith, module, said):
    (tmp_path / "exits_on_import.py").write_text(module + "def f(prompt, completion):\n    return 1.0\n")
    with pytest.raises(UserCodeError, match=said):
        with_rewards(arith[0], [f"{tmp_path}/exits_on_import.py:f"], probe=arith[1])


def test_an_import_that_hangs_is_bounded_and_named(tmp_path, arith, monkeypatch):
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(600)\ndef f(prompt, completion):\n    return 1.0\n")
    monkeypatch.setattr(scoring_pool, "_LOAD_TIMEOUT_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(UserCodeError, match=r"loading the reward modules \[.*hangs\.py'\] did not finish .*2s"):
        with_rewards(arith[0], [f"{tmp_path}/hangs.py:f"])
    timing.assert_within(time.monotonic() - t0, 20, quiet_s=3, what="a 2 s load timeout")


class _Interrupted(BaseException):
    pass


def test_a_batch_interrupted_in_the_parent_leaves_no_stale_answer(rw, arith):
    """Interrupted while a worker is on a job (Ctrl-C in the parent): that worker is replaced,
    so the next batch gets its own answers, not the abandoned job's."""
    import threading

    base, p = arith
    slow, crash = with_rewards(base, [f"{rw}:slow"]), with_rewards(base, [f"{rw}:crash"])
    old = signal.signal(signal.SIGUSR1, lambda *a: (_ for _ in ()).throw(_Interrupted()))
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(_Interrupted):
            score_batch(slow, [p], ["x"], timeout_s=30.0)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert score_batch(crash, [p], ["fine"], timeout_s=30.0)[0] == [0.5]


def test_a_worker_crash_is_counted_as_an_error(rw, arith):
    base, p = arith
    t = with_rewards(base, [f"{rw}:crash"])
    rewards, stats = score_batch(t, [p, p, p], ["fine", "crash", "fine"], timeout_s=10.0)
    assert rewards == [0.5, 0.0, 0.5] and stats["reward/n_error"] == 1


def test_the_reward_and_its_import_never_run_in_this_process(rw, arith, tmp_path):
    base, p = arith
    (tmp_path / "where.py").write_text(
        f"import os\nopen({str(tmp_path / 'imported')!r}, 'w').write(str(os.getpid()))\n"
        "def f(prompt, completion):\n    return float(os.getpid())\n"
    )
    t = with_rewards(base, [f"{tmp_path}/where.py:f", f"{rw}:pid"], [1.0, 0.0])
    assert int((tmp_path / "imported").read_text()) != os.getpid()
    rewards, _ = score_batch(t, [p], ["x"], workers=0)
    assert rewards[0] not in (0.0, float(os.getpid()))
    assert score_samples(t, [p], [["x", "y"]]) == [[rewards[0]] * 2]  # evaluation: the same worker


def _child_pid(path, wait=True):
    if wait:
        timing.wait_for(path.exists, timeout=20, quiet_s=1, what="the reward's child to start")
    return int(path.read_text())


def test_no_child_outlives_a_timeout_or_the_pool(rw, arith, tmp_path):
    base, p = arith
    t = with_rewards(base, [f"{rw}:child"])
    rewards, stats = score_batch(t, [p], [f"{tmp_path}/a|hang"], timeout_s=1.0)
    assert stats["reward/n_timeout"] == 1
    first = _child_pid(tmp_path / "a")
    timing.wait_for(lambda: not _alive(first), timeout=10, quiet_s=0.1, what="the child of a timed-out reward to die")
    assert score_batch(t, [p], [f"{tmp_path}/b|return"], timeout_s=10.0)[0] == [1.0]
    second = _child_pid(tmp_path / "b")
    assert _alive(second)  # left running by a reward that returned: it lives as long as the worker
    SHARED.close()  # the run's end
    timing.wait_for(lambda: not _alive(second), timeout=10, quiet_s=0.1, what="the child to die with the pool")


def test_no_child_in_a_session_of_its_own_outlives_a_timeout_or_the_pool(rw, arith, tmp_path):
    """A daemon's double fork (setsid, then its parent exits) leaves the worker's process group; it
    stays in the worker's tree (a child subreaper), which the hard kill and the pool's close sweep
    (before: it ran on, re-parented to init)."""
    base, p = arith
    t = with_rewards(base, [f"{rw}:daemon"])
    _, stats = score_batch(t, [p], [f"{tmp_path}/a|hang"], timeout_s=2.0)
    assert stats["reward/n_timeout"] == 1
    first = _child_pid(tmp_path / "a")
    timing.wait_for(lambda: not _alive(first), timeout=10, quiet_s=0.1, what="the daemon of a timed-out reward to die")
    assert score_batch(t, [p], [f"{tmp_path}/b|return"], timeout_s=10.0)[0] == [1.0]
    second = _child_pid(tmp_path / "b")
    assert _alive(second)
    SHARED.close()
    timing.wait_for(lambda: not _alive(second), timeout=10, quiet_s=0.1, what="the daemon to die with the pool")


def test_no_child_outlives_a_kill_9_of_the_trainer(rw, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(f"""
        from gapo import tasks
        from gapo.exec.scoring import score_batch
        from gapo.tasks.custom import with_rewards
        if __name__ == "__main__":
            base = tasks.get("arithmetic")
            t = with_rewards(base, ["{rw}:child"])
            score_batch(t, base.generate("train", 1, 0), ["{tmp_path}/c|hang"], timeout_s=300.0)
        """)
    )
    trainer = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        kid = _child_pid(tmp_path / "c")
        assert _alive(kid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        timing.wait_for(lambda: not _alive(kid), timeout=10, quiet_s=0.2, what="the child to die with the trainer")
    finally:
        trainer.kill()
        trainer.wait()


# ------------------------------------------------------------------ a prompt column; TRL's batched form


def _rows(tmp_path, rows, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tasks.build("data", {"path": str(path), "eval_fraction": 0.0})


TRL_ROWS = [{"prompt": f"What is {i}+{i}?", "solution": str(2 * i), "completion": "ref"} for i in range(6)]


def test_a_prompt_column_collides_with_no_argument(rw, tmp_path):
    """TRL's column names ``prompt`` and ``completion``: the positional values win; a function
    whose positionals are named otherwise gets the column by name."""
    t = _rows(tmp_path, TRL_ROWS)
    probs = t.generate("train", 6, 0)
    both = with_rewards(t, [f"{rw}:both_names"], probe=probs[0])
    comps = [f"it is {p.meta['fields']['solution']}" for p in probs]
    assert score_batch(both, probs, comps)[0] == [1.0] * 6
    other = with_rewards(t, [f"{rw}:other_names"], probe=probs[0])
    assert score_batch(other, probs, comps)[0] == [1.0] * 6


def test_trl_batched_rewards_on_standard_rows(rw, tmp_path):
    t = _rows(tmp_path, TRL_ROWS)
    probs = t.generate("train", 4, 0)
    r = with_rewards(t, [f"{rw}:reward_len", f"{rw}:accuracy"], [0.5, 1.0], probe=probs[0])
    assert r.batch_terms == ("reward_len", "accuracy") and r.batch_only
    comps = ["x" * 20, "y" * 10, probs[2].meta["fields"]["solution"], "none"]
    rewards, stats = score_batch(r, probs, comps)
    # R = W·Σ w r / Σ w with W = 1.5: 0.5·len_term + 1·accuracy (here no term skips)
    want_len = [0.0, -10.0, -abs(20 - len(comps[2])), -16.0]
    assert rewards == pytest.approx([0.5 * a + (1.0 if i == 2 else 0.0) for i, a in enumerate(want_len)])
    assert stats["reward/n_accuracy"] == 4 and stats["reward/accuracy"] == 0.25


def test_trl_batched_rewards_on_conversational_rows(rw, tmp_path):
    """A conversational prompt: prompts are the messages, completions [{"role": "assistant", ...}]."""
    rows = [
        {"prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": f"q{i}"}], "solution": "4"}
        for i in range(4)
    ]
    t = _rows(tmp_path, rows)
    probs = t.generate("train", 4, 0)
    r = with_rewards(t, [f"{rw}:format_reward", f"{rw}:echo_prompts"], [1.0, 0.0], probe=probs[0])
    comps = ["<think>a</think>4", "4", "<think>", "no"]
    rewards, stats = score_batch(r, probs, comps)
    assert rewards == [1.0, 0.0, 1.0, 0.0]  # weight 0 for echo_prompts: R = W · format (W = 1)
    assert stats["reward/echo_prompts"] == 2.0  # each prompt a list of its 2 messages


@pytest.mark.parametrize(
    "fn, said",
    [
        ("short_list", r"returned 1 value\(s\) for 3 completion\(s\)"),
        ("not_a_list", r"returned 1.0 \(a float\); a batched reward .* returns a list"),
        ("a_string_inside", r"returned '1' for completion 0 of the batch \(a str, not a number\)"),
    ],
)
def test_batched_rewards_that_return_the_wrong_thing_are_errors_naming_them(rw, tmp_path, fn, said):
    t = _rows(tmp_path, TRL_ROWS)
    probs = t.generate("train", 3, 0)
    r = with_rewards(t, [f"{rw}:{fn}"], probe=probs[0])
    with pytest.raises(UserCodeError, match=said) as e:
        score_batch(r, probs, ["a", "b", "c"])
    assert f"hostile.py:{fn}" in str(e.value)


def test_a_batch_gets_the_deadline_times_its_size(rw, tmp_path):
    t = _rows(tmp_path, TRL_ROWS)
    probs = t.generate("train", 4, 0)
    slow = with_rewards(t, [f"{rw}:slow_batch"], probe=probs[0])
    rewards, stats = score_batch(slow, probs, ["a", "skip", "b", "c"], timeout_s=1.0)
    assert rewards == [0.25, 0.0, 0.25, 0.25] and stats["reward/n_unparsable"] == 1  # None: the term skips
    hang = with_rewards(t, [f"{rw}:hang_batch"], probe=probs[0])
    rewards, stats = score_batch(hang, probs[:2], ["a", "b"], timeout_s=1.0)
    assert rewards == [0.0, 0.0] and stats["reward/n_timeout"] == 2


def test_a_trl_only_argument_is_named_before_the_run(rw, tmp_path):
    t = _rows(tmp_path, TRL_ROWS)
    with pytest.raises(ValueError, match=r"needs \['completion_ids'\], which TRL's trainer passes and gapo does not"):
        with_rewards(t, [f"{rw}:needs_ids"], probe=t.generate("train", 1, 0)[0])


# ------------------------------------------------------------------ through the command line


@pytest.mark.parametrize(
    "raise_, extra",
    [("SystemExit(0)", ["eval.problems=0"]), ("KeyboardInterrupt", [])],  # in a step; in the first evaluation
)
def test_a_reward_that_exits_mid_run_checkpoints_and_exits_2(easy_policy, tmp_path, capfd, raise_, extra):
    from checkpoints import train_run

    (tmp_path / "midrun.py").write_text(
        f"def leave(prompt, completion, **f):\n    if completion:\n        raise {raise_}\n    return 0.0\n"
    )
    run = tmp_path / "run"
    code = train_run(run, easy_policy, f"reward.funcs=[{tmp_path}/midrun.py:leave]", "train.steps=3", *extra)
    err = capfd.readouterr().err
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == 2, err[-2000:]
    assert len(errors) == 1 and "midrun.py:leave" in errors[0] and raise_.split("(")[0] in errors[0], err[-2000:]
    assert "--resume" in errors[0] and (run / "checkpoint.pt").is_file()


def test_a_reward_that_fails_before_any_step_of_an_overwrite_keeps_the_old_run(easy_policy, tmp_path, capfd):
    """--overwrite deletes the old run at the new run's first checkpoint: a reward that fails in the
    step-0 evaluation (nothing trained) must not write that checkpoint, so the old run is put back."""
    from checkpoints import train_run

    run = tmp_path / "run"
    assert train_run(run, easy_policy, "train.steps=1", "eval.problems=0") == 0
    before = (run / "metrics.jsonl").read_text()
    (tmp_path / "midrun.py").write_text(  # passes the probe (an empty completion), fails in the evaluation
        "def leave(prompt, completion, **f):\n    if completion:\n        raise KeyboardInterrupt\n    return 0.0\n"
    )
    code = train_run(run, easy_policy, f"reward.funcs=[{tmp_path}/midrun.py:leave]", flags=["--overwrite"])
    err = capfd.readouterr().err
    assert code == 2 and "nothing was trained" in err, err[-2000:]
    assert (run / "metrics.jsonl").read_text() == before and (run / "policy").is_dir()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # nothing left aside


def test_a_reward_module_that_exits_stops_the_cli_before_the_run(easy_policy, tmp_path, capfd):
    from checkpoints import train_run

    (tmp_path / "bye.py").write_text("import sys\nsys.exit(0)\ndef f(prompt, completion):\n    return 1.0\n")
    run = tmp_path / "run"
    assert train_run(run, easy_policy, f"reward.funcs=[{tmp_path}/bye.py:f]") == 2
    err = capfd.readouterr().err
    assert [ln for ln in err.splitlines() if "error:" in ln and "bye.py" in ln and "SystemExit(0)" in ln]
    assert not run.exists()
