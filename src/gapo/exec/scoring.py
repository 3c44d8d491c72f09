"""Scoring completions with a task's verifier: serially, in a process pool, or asynchronously.

    rewards, stats = score_batch(task, problems, completions, workers=0, timeout_s=10.0)
    fut = submit_batch(task, problems, completions, workers=4)   # returns at once
    ...                                                          # sample the next batch
    rewards, stats = fut.result()

Rewards are one float per completion. ``stats`` holds

- ``reward/mean``, ``reward/n``
- ``reward/unparsable_frac`` and ``reward/n_unparsable``: no answer could be read (reward 0)
- ``reward/timeout_frac`` and ``reward/n_timeout``: the verifier ran out of time (reward 0)
- ``reward/error_frac`` and ``reward/n_error``: a pool worker died (crash, OOM kill; reward 0)
- ``reward/ambiguous_frac`` and ``reward/n_ambiguous``: the answer committed to several values
  (``6, 5``, ``5 or 7``, two boxes that disagree: reward 0; see :mod:`gapo.tasks.math`)
- ``time/score_s``: wall-clock time of the batch.

Timeouts and worker errors are the verifier's failures, not the policy's:
:func:`verifier_failure_warning` says when a step's rewards are all 0 because of them (the
trainer prints it once per step). A task's ``warmup()`` runs before the first timed completion
of a process (in each worker when it loads the task; here before a serial batch), and a task's
``after_timeout()`` after each soft timeout, so that a cold start or an interrupt cannot change
later results (see ``MathTask``).

Status per completion comes from ``task.score_detailed(problem, completion) -> (reward, status)``
with status one of ``ok``, ``unparsable``, ``timeout``, ``error``, ``ambiguous`` when the task has it; otherwise
``task.score`` gives the reward and ``task.parse_ok`` (if present) the ``unparsable`` count.

Why processes and not threads: verifiers are CPU-bound Python (sympy) and the GIL serialises
threads; and a runaway verifier (``9^{9^{9^9}}``) can only be stopped for sure by killing the
process that runs it. With ``workers > 0`` each worker handles one completion at a time and the
parent kills and replaces a worker whose completion runs past ``timeout_s`` (hard timeout).
Workers are started with ``spawn`` (safe with CUDA and threads in the parent; a script that
uses the pool must guard its entry point with ``if __name__ == "__main__":``) and are kept
alive between batches; the task is pickled once per batch and sent to each worker once.

With ``workers == 0`` scoring runs in the calling process. On the main thread the timeout is a
``SIGALRM`` timer (soft: it interrupts Python code, which is where sympy spends its time);
off the main thread the task's own guard applies (``MathTask`` then uses a helper process).
Code that swallows the interrupt (a bare ``except:``) and returns has still timed out.

A task that runs a user's code (``runs_user_code``: the reward functions of
:mod:`gapo.tasks.custom`) is never scored in the calling process: with ``workers == 0`` it goes
to the shared pool of one worker, so the hard deadline can stop it whatever it does (swallow the
alarm, ignore ``SIGALRM``, spin in C), and whatever it raises, ``SystemExit`` included, comes
back as an error (:class:`UserCodeError` names the function) instead of ending this process.
Each worker leads a process group of its own with a sentinel in it, so what the code starts
(``subprocess.Popen(["sleep", "1000"])``) dies with the worker: at a hard kill, a crash, the
pool's close, a ``kill -9`` of this process; after a soft timeout the worker kills it itself. A
task's ``batch_terms`` are computed once per batch (``task.score_terms``, TRL's batched reward
form) in one job whose deadlines are the per-completion ones times the batch's size; a batch
that runs past it or loses its worker costs each of its completions (``timeout``/``error``).
Loading the task in a worker (a user's module imported) does not count against any deadline but
is bounded by ``scoring_pool._LOAD_TIMEOUT_S``; running past it, or dying meanwhile, is an error
naming what was loading (``task.loads``).

Scoring errors are the task's bugs, never the completion's (tasks turn bad completions into
reward 0 themselves), and stop the run with a ``ValueError`` (the CLI prints it as ``gapo train:
error: ...`` and exits 2) that names the task, the problem (index in the batch, ``task_id`` when
the problem has one, the start of the prompt) and what went wrong:

- ``task.score`` / ``score_detailed`` raised: the original exception's type and message (chained
  as ``__cause__``), serial or in a worker;
- a reward that is not a finite number with ``|r| <= MAX_ABS_REWARD`` (1e6): NaN and ±inf, and
  also absurd finite values such as 1e30, whose square (the advantage's variance) overflows
  float32 and turns every advantage of the group into NaN. Nothing is silently zeroed.

A task may declare ``score_timeout_s``, the longest one ``score_detailed`` call can take because
the task enforces its own limit (the code tasks: the sandbox's wall clock). The pool then trusts
it: no soft alarm, and the hard kill comes only after ``max(timeout_s, score_timeout_s)`` plus a
grace period, so a worker is never killed while its sandbox is still inside its own deadline.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import hashlib
import math
import pickle
import threading
import time
from collections.abc import Callable

from gapo.exec.scoring_pool import (
    UserCodeError,
    VerifierTimeout,
    WorkerLoadError,
    Workers,
    call_with_alarm,
    is_real_number,
    score_guarded,
    score_one,
    signal_guard_usable,
)

__all__ = [
    "VerifierTimeout",
    "UserCodeError",
    "ScoringPool",
    "score_batch",
    "submit_batch",
    "run_with_timeout",
    "score_one",
    "score_checked",
    "score_samples",
    "check_reward",
    "STATUSES",
    "verifier_failure_warning",
    "MAX_ABS_REWARD",
    "SharedWorkers",
    "SHARED",
]

STATUSES = ("ok", "unparsable", "timeout", "error", "ambiguous")

#: Largest accepted |reward|: beyond it the group's variance overflows float32 (see above).
MAX_ABS_REWARD = 1e6
#: Added to a task's own ``score_timeout_s`` before the pool kills the worker.
SELF_TIMED_GRACE_S = 5.0


def run_with_timeout(fn: Callable, *args, timeout_s: float | None, mode: str = "auto"):
    """Call ``fn(*args)``; raise :class:`VerifierTimeout` if it runs past ``timeout_s``.

    ``mode``: ``"signal"`` (SIGALRM timer; main thread only), ``"process"`` (a persistent helper
    process that is killed and replaced on timeout; ``fn`` and ``args`` must pickle), ``"auto"``
    (signal where usable, process otherwise) or ``"none"``.
    """
    if timeout_s is None or mode == "none":
        return fn(*args)
    if mode not in ("auto", "signal", "process"):
        raise ValueError(f"mode must be auto, signal, process or none, not {mode!r}")
    if mode == "signal" or (mode == "auto" and signal_guard_usable()):
        return call_with_alarm(fn, args, timeout_s)
    status, value = SHARED.call_in_helper(fn, args, timeout_s)
    if status == "timeout":
        raise VerifierTimeout(f"{getattr(fn, '__name__', fn)} ran past {timeout_s:g}s")
    if status == "error":
        raise RuntimeError(f"helper process died while running {getattr(fn, '__name__', fn)}")
    if status == "raised":
        raise value
    return value


# ----------------------------------------------------------------------------- batches


def _check_inputs(task, problems, completions):
    if len(problems) != len(completions):
        raise ValueError(
            f"score_batch: {len(problems)} problems but {len(completions)} completions "
            f"(task {getattr(task, 'name', type(task).__name__)!r}); pass one problem per completion"
        )


def _where(task, problems, i) -> str:
    """``task 'x', problem 3 (id 'HumanEval/2', prompt 'def f...')`` for error messages."""
    name = getattr(task, "name", type(task).__name__)
    p = problems[i]
    meta = getattr(p, "meta", None)
    tid = meta.get("task_id") if isinstance(meta, dict) else None
    prompt = str(getattr(p, "prompt", p))[:120]
    ident = f"id {tid!r}, " if tid is not None else ""
    return f"task {name!r}, problem {i} ({ident}prompt {prompt!r})"


def check_reward(task, problems, i, reward) -> float:
    """``reward`` as a float, or ``ValueError`` naming the task and problem when it is not a
    real number (``scoring_pool.is_real_number``: a string ``"1"``, a bool, a list are errors, not 1.0)
    or not finite and within ``±MAX_ABS_REWARD``."""
    if not is_real_number(reward):
        raise ValueError(
            f"{_where(task, problems, i)}: reward {reward!r} (a {type(reward).__name__}) is not a "
            "number; rewards must be finite real numbers (int or float; not a bool or a string)"
        )
    r = float(reward)
    if not math.isfinite(r) or abs(r) > MAX_ABS_REWARD:
        raise ValueError(
            f"{_where(task, problems, i)}: returned reward {r}; rewards must be finite and within ±{MAX_ABS_REWARD:g}"
        )
    return r


def score_samples(task, problems, texts: list[list[str]], *, timeout_s: float | None = 10.0) -> list[list[float]]:
    """The rewards of ``texts[j]``, samples of ``problems[j]``, for evaluation: each as
    :func:`score_checked` (no timeout), except that a task that runs a user's code
    (``runs_user_code``) is scored in one batch by :func:`score_batch`, in a worker, under
    ``timeout_s`` per completion (a timeout: reward 0)."""
    if not getattr(task, "runs_user_code", False):
        return [[score_checked(task, problems, j, t) for t in ts] for j, ts in enumerate(texts)]
    flat = [(p, t) for p, ts in zip(problems, texts) for t in ts]
    rewards, _ = score_batch(task, [p for p, _ in flat], [t for _, t in flat], timeout_s=timeout_s)
    it = iter(rewards)
    return [[next(it) for _ in ts] for ts in texts]


def score_checked(task, problems, i, completion) -> float:
    """``task.score(problems[i], completion)`` for evaluation: an exception or a bad reward
    becomes the same ``ValueError`` as in :func:`score_batch`. A user's code
    (``runs_user_code``) goes to a worker, as in :func:`score_samples`."""
    if getattr(task, "runs_user_code", False):
        return score_samples(task, [problems[i]], [[completion]])[0][0]
    try:
        r = task.score(problems[i], completion)
    except Exception as e:  # noqa: BLE001 - a task's scorer may raise anything; re-raised naming the problem
        _raise_from_task(task, problems, i, e)
    return check_reward(task, problems, i, r)


def _finish(task, problems, rewards, statuses, t0, parts=None) -> tuple[list[float], dict]:
    for i, r in enumerate(rewards):
        check_reward(task, problems, i, r)
    n = len(rewards)
    stats: dict[str, float] = {"reward/n": float(n)}
    stats["reward/mean"] = sum(rewards) / n if n else 0.0
    for status, key in (
        ("unparsable", "unparsable"),
        ("timeout", "timeout"),
        ("error", "error"),
        ("ambiguous", "ambiguous"),
    ):
        n_status = sum(s == status for s in statuses)
        stats[f"reward/n_{key}"] = float(n_status)
        stats[f"reward/{key}_frac"] = n_status / n if n else 0.0
    # several rewards (gapo.tasks.custom): reward/<term> is the term's mean over the completions it
    # scored (not skipped, not timed out), reward/n_<term> how many those were
    for name in getattr(task, "reward_names", None) or []:
        vals = [p[name] for p in parts or [] if p is not None and p.get(name) is not None]
        stats[f"reward/n_{name}"] = float(len(vals))
        if vals:
            stats[f"reward/{name}"] = sum(vals) / len(vals)
    stats["time/score_s"] = time.perf_counter() - t0
    return rewards, stats


def verifier_failure_warning(stats: dict, rewards) -> str | None:
    """A warning when every reward of a batch is 0 and the verifier's failures (timeouts, dead
    workers) are at least as many as the answers it judged, so the zeros say nothing about the
    policy; else None. ``stats`` as :func:`score_batch` returns them."""
    rewards = [float(r) for r in rewards]
    if not rewards or any(r != 0.0 for r in rewards):
        return None
    n_timeout, n_error = int(stats.get("reward/n_timeout", 0)), int(stats.get("reward/n_error", 0))
    n_unparsable, n_ambiguous = int(stats.get("reward/n_unparsable", 0)), int(stats.get("reward/n_ambiguous", 0))
    n = int(stats.get("reward/n", len(rewards)))
    failed = n_timeout + n_error
    judged = n - failed - n_unparsable
    if failed == 0 or failed < judged:
        return None
    return (
        f"every reward is 0 and the verifier failed on {failed} of {n} completions ({n_timeout} timed out, "
        f"{n_error} lost to a dead worker; {n_unparsable} had no answer, {max(judged, 0)} were judged, "
        f"{n_ambiguous} of them ambiguous): these zeros are the verifier's, not the policy's. Raise the "
        "verifier's time limit (reward.timeout_s for --reward functions, task.params.timeout_s for math) "
        "or use task.scoring_workers"
    )


def _raise_from_task(task, problems, i, exc):
    if isinstance(exc, UserCodeError):  # it names the function and what it did already
        raise UserCodeError(f"{_where(task, problems, i)}: {exc}") from exc
    raise ValueError(
        f"{_where(task, problems, i)}: the task's score function raised {type(exc).__name__}: {exc}"
    ) from exc


def _name(task) -> str:
    return getattr(task, "name", type(task).__name__)


def _times(deadline: float | None, n: int) -> float | None:
    return None if deadline is None else deadline * n


def _prep(task) -> tuple[str, tuple]:
    """The pool's load message for ``task``: pickled once per batch, keyed by its bytes."""
    blob = pickle.dumps(task)
    return "task:" + hashlib.sha1(blob).hexdigest(), ("task", blob)


@contextlib.contextmanager
def _naming_load(task):
    """A worker that could not load ``task`` (an import that hangs, a crash while importing) is an
    error naming the task and what it loads (``task.loads``: a custom reward's modules)."""
    try:
        yield
    except WorkerLoadError as e:
        cls = UserCodeError if getattr(task, "runs_user_code", False) else ValueError
        what = getattr(task, "loads", None) or "it"
        raise cls(f"task {_name(task)!r}: a scoring worker loading {what} {e}") from None


def _deadlines(task, timeout_s: float | None) -> tuple[float | None, float | None]:
    """(soft alarm, hard kill) per completion. A task that times itself (``score_timeout_s``,
    e.g. the sandbox's wall clock) gets no soft alarm and a hard kill only after its own
    deadline: killing the worker first would orphan the sandbox's processes. A task that carries
    its configured deadline (``deadline_s``: a user's reward, ``reward.timeout_s``) is scored under
    that one, whoever scores it (a step, an evaluation, the probe)."""
    timeout_s = getattr(task, "deadline_s", None) or timeout_s
    own = getattr(task, "score_timeout_s", None)
    if isinstance(own, (int, float)) and own > 0:
        return None, max(timeout_s or 0.0, float(own)) + SELF_TIMED_GRACE_S
    return (None if timeout_s is None else 0.9 * timeout_s), timeout_s


class ScoringPool:
    """A persistent pool of ``workers`` spawn-started processes for scoring.

    ``score(task, problems, completions)`` blocks; ``submit(...)`` returns a
    ``concurrent.futures.Future`` of ``(rewards, stats)`` so sampling can go on meanwhile.
    One batch is scored at a time (submitted batches queue up). Use as a context manager or
    call ``close()``.
    """

    def __init__(self, workers: int, *, timeout_s: float | None = 10.0):
        self.timeout_s = timeout_s
        self._workers = Workers(workers)
        self._lock = threading.Lock()
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gapo-scoring")

    @property
    def workers(self) -> int:
        return self._workers.n

    def score(self, task, problems, completions, *, timeout_s: float | None | str = "default"):
        timeout_s = self.timeout_s if timeout_s == "default" else timeout_s
        _check_inputs(task, problems, completions)
        t0 = time.perf_counter()
        prep = _prep(task)
        # The worker's own soft alarm fires a little before the parent's hard kill, so an
        # interruptible verifier reports a clean timeout and the worker survives.
        soft, hard = _deadlines(task, timeout_s)
        with self._lock, _naming_load(task):
            outs, given = self._batch_terms(task, problems, completions, (soft, hard), prep)
            todo = [i for i, out in enumerate(outs) if out is None]
            if getattr(task, "batch_only", False):  # every term is done: what is left is arithmetic
                for i in todo:
                    outs[i] = ("ok", score_one(task, problems[i], completions[i], given[i]))
            else:
                jobs = [("score", problems[i], completions[i], soft, given[i]) for i in todo]
                for i, out in zip(todo, self._workers.run(jobs, hard, prep)):
                    outs[i] = out
        rewards, statuses, parts = [], [], []
        for i, (status, value) in enumerate(outs):
            if status == "ok":
                r, s, *part = value
            elif status == "raised":
                _raise_from_task(task, problems, i, value)
            else:  # timeout (hard kill) or error (worker died)
                r, s, part = 0.0, status, []
            rewards.append(check_reward(task, problems, i, r))
            statuses.append(s)
            parts.append(part[0] if part else None)
        return _finish(task, problems, rewards, statuses, t0, parts)

    def _batch_terms(self, task, problems, completions, deadlines, prep) -> tuple[list, list]:
        """The task's ``batch_terms`` (functions that take the whole batch, gapo.tasks.custom) in
        one job, under the per-completion deadlines times the batch's size -> ``(outs, given)``:
        ``outs[i]`` is None where completion i is still to be scored (``given[i]``: the batch
        terms' values for it); a batch that ran out of time or lost its worker costs every
        completion of it (``timeout`` / ``error``, reward 0)."""
        n = len(completions)
        if not getattr(task, "batch_terms", ()) or n == 0:
            return [None] * n, [None] * n
        soft, hard = (_times(d, n) for d in deadlines)
        ((status, value),) = self._workers.run([("batch", list(problems), list(completions), soft)], hard, prep)
        if status == "raised":
            cls = UserCodeError if isinstance(value, UserCodeError) else ValueError
            raise cls(f"task {_name(task)!r}, a batch of {n} completions: {value}") from value
        if status != "ok":
            return [(status, None)] * n, [None] * n
        return [None] * n, [{k: v[i] for k, v in value.items()} for i in range(n)]

    def ask(self, task, method: str, *args, timeout_s: float):
        """``task.<method>(*args)`` in a worker that has loaded ``task``: a check of code that must
        not run in this process (a user's reward functions, gapo.tasks.custom); what it raises is
        raised here, and running past ``timeout_s`` (the worker is then killed) is an error."""
        with self._lock, _naming_load(task):
            ((status, value),) = self._workers.run([("apply", method, args)], timeout_s, _prep(task))
        if status == "raised":
            raise value
        if status != "ok":
            why = f"ran past {timeout_s:g}s" if status == "timeout" else "killed its worker (it died)"
            cls = UserCodeError if getattr(task, "runs_user_code", False) else ValueError
            raise cls(f"task {_name(task)!r}: {method} {why}")
        return value

    def submit(self, task, problems, completions, *, timeout_s: float | None | str = "default") -> cf.Future:
        return self._executor.submit(self.score, task, list(problems), list(completions), timeout_s=timeout_s)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._workers.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedWorkers:
    """The one owner of this package's process-wide scoring state: the pools ``score_batch(...,
    workers=N)`` shares (one per N), the helper process of ``run_with_timeout(mode="process")``
    and the background thread of ``submit_batch(..., workers=0)``. Each starts on first use and
    is started again when it was closed, so two trainers in one process (or a test that closes
    them) never get a closed pool; :meth:`close` closes them all (at exit, or between tests).
    The module-level instance is :data:`SHARED`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._helper_lock = threading.Lock()  # one call at a time in the helper process
        self._pools: dict[int, ScoringPool] = {}
        self._helper: Workers | None = None
        self._serial: cf.ThreadPoolExecutor | None = None

    def pool(self, workers: int) -> ScoringPool:
        with self._lock:
            pool = self._pools.get(workers)
            if pool is None or pool._workers.closed:
                pool = self._pools[workers] = ScoringPool(workers, timeout_s=None)
            return pool

    def call_in_helper(self, fn: Callable, args, timeout_s: float):
        with self._helper_lock:
            with self._lock:
                if self._helper is None or self._helper.closed:
                    self._helper = Workers(1)
                helper = self._helper
            return helper.call(fn, args, timeout_s)

    def serial(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._serial is None:
                self._serial = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gapo-scoring")
            return self._serial

    def close(self) -> None:
        """Close every pool, the helper and the thread; the next use starts new ones."""
        with self._lock:
            pools, helper, serial = list(self._pools.values()), self._helper, self._serial
            self._pools, self._helper, self._serial = {}, None, None
        for pool in pools:
            try:
                pool.close()
            except Exception:  # noqa: BLE001 - at exit, a pool already gone is fine
                pass
        if helper is not None:
            helper.close()
        if serial is not None:
            serial.shutdown(wait=True)


SHARED = SharedWorkers()
atexit.register(SHARED.close)


def score_batch(task, problems, completions, *, workers: int = 0, timeout_s: float | None = 10.0):
    """Score ``completions[i]`` against ``problems[i]`` -> ``(rewards, stats)``.

    ``workers=0`` scores in this process; ``workers=N`` uses a shared persistent pool of N
    processes (started on first use, closed at exit). ``timeout_s`` bounds each completion.
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    if workers == 0 and getattr(task, "runs_user_code", False):
        # a user's code never runs in this process: in a worker the hard deadline can kill; in the
        # pool the task names (the run's), so that its functions are imported in one pool only
        workers = getattr(task, "workers", 1)
    if workers > 0:
        return SHARED.pool(workers).score(task, problems, completions, timeout_s=timeout_s)
    _check_inputs(task, problems, completions)
    t0 = time.perf_counter()
    rewards, statuses, parts = [], [], []
    soft, _ = _deadlines(task, timeout_s)
    warm = getattr(task, "warmup", None)
    if callable(warm) and any(completions):  # (an all-empty batch, e.g. the reward probe, verifies nothing)
        warm()  # untimed: heavy imports and first uses must not be cut off by the guard below
    for i, (p, c) in enumerate(zip(problems, completions)):
        try:
            r, s, *part = score_guarded(task, p, c, soft)
        except Exception as e:  # noqa: BLE001 - a task's scorer may raise anything; re-raised naming the problem
            _raise_from_task(task, problems, i, e)
        rewards.append(check_reward(task, problems, i, r))
        statuses.append(s)
        parts.append(part[0] if part else None)
    return _finish(task, problems, rewards, statuses, t0, parts)


def submit_batch(task, problems, completions, *, workers: int = 0, timeout_s: float | None = 10.0) -> cf.Future:
    """Start scoring now; the returned ``Future`` yields ``(rewards, stats)``.

    With ``workers=0`` the batch is scored in one background thread (where a verifier's timeout
    is the task's own guard, see the module docstring); with ``workers=N`` in the shared pool.
    """
    problems, completions = list(problems), list(completions)
    if workers > 0:
        return SHARED.pool(workers).submit(task, problems, completions, timeout_s=timeout_s)
    return SHARED.serial().submit(score_batch, task, problems, completions, workers=0, timeout_s=timeout_s)
