"""What a scoring worker runs and the worker processes themselves, for :mod:`gapo.exec.scoring`.

- the ``SIGALRM`` guard (``call_with_alarm``, nestable; main thread only) that turns a verifier
  running past its time into :class:`VerifierTimeout`, used in the calling process and, as the
  soft timeout, inside each worker;
- :func:`score_one`, the reward and status of one completion, and ``score_guarded``, the same
  under the soft timeout;
- ``Workers``: N spawn-started processes, one job each at a time, killed and replaced when a job
  runs past its hard deadline (the pool of :class:`gapo.exec.scoring.ScoringPool` and the helper
  process of :func:`gapo.exec.scoring.run_with_timeout`); each dies with the process that
  started it, ``kill -9`` included (``proc_tree.die_with_parent``), taking its sandboxes along. Each leads
  a process group of its own, and whatever it started dies with it (``_lead_own_group``): on a
  hard kill, a crash, the pool's close or the trainer's ``kill -9``.

The policy (which deadlines, what a batch's statistics are, which errors stop a run) is in
:mod:`gapo.exec.scoring`; the module docstring there says why processes and not threads.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import multiprocessing as mp
import multiprocessing.connection as mpc
import numbers
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gapo.exec.proc_tree import become_subreaper, die_with_parent, kill_tree, wait_for_parent


class VerifierTimeout(Exception):
    """A verifier ran past its time limit."""


class AlarmInterrupt(BaseException):
    """The soft timeout's interrupt, raised in the guarded code when its time is up. A
    BaseException so that verifiers' ``except Exception`` blocks (math-verify has many) do not
    swallow it and carry on; converted to :class:`VerifierTimeout` at the guard. Code that turns a
    user's exceptions into errors (``gapo.tasks.custom``) lets it through."""


class UserCodeError(ValueError):
    """Code of the user's (a reward function, its module's import) failed: it raised, exited
    (``SystemExit``), raised ``KeyboardInterrupt`` or another ``BaseException``, or returned what a
    reward cannot be. The message names the function. The trainer checkpoints before it stops on one
    (docs/design.md §6); the CLI prints it as one ``error:`` line, exit 2."""


class WorkerLoadError(RuntimeError):
    """A worker did not load what a batch needs (the task, a module): it ran past
    ``_LOAD_TIMEOUT_S`` or died meanwhile. The worker is gone; the caller names what was loading."""


# ----------------------------------------------------------------------------- timeouts


_alarm_deadline: float | None = None  # deadline of the innermost active SIGALRM guard


def signal_guard_usable() -> bool:
    if not hasattr(signal, "setitimer"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    if _alarm_deadline is not None:  # our own guard is active: nest inside it
        return True
    # Someone else's timer (pytest-timeout, math-verify's alarm) is running: do not clobber it.
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


#: While an import runs, the alarm is retried this often instead of interrupting it.
_RETRY_S = 0.01
#: An import still running this long after the guard's deadline is interrupted after all.
_MAX_IMPORT_DEFER_S = 60.0
_defer_depth = 0  # > 0 inside alarm_deferred()
_deferred = False  # an alarm came inside alarm_deferred()
_alarms_raised = 0  # AlarmInterrupts raised so far: a guard sees whether its code swallowed one


def _importing(frame) -> bool:
    """Whether ``frame`` (or a caller of it) is running an import's module code."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def alarm_deferred():
    """A section the ``SIGALRM`` guard never interrupts: an alarm due inside it fires (as
    :class:`VerifierTimeout`) once the section is over. For warm-ups and health checks, whose
    interruption would leave the verifier half set up."""
    global _defer_depth, _deferred
    if threading.current_thread() is not threading.main_thread():
        yield  # the guard interrupts the main thread only
        return
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
    if _defer_depth == 0 and _deferred:
        _deferred = False
        if _alarm_deadline is not None:  # the guard's time ran out inside: a timeout of the call
            _interrupt()


def _interrupt():
    global _alarms_raised
    _alarms_raised += 1
    raise AlarmInterrupt()


def _raise_alarm(signum, frame):
    # Never interrupt an import: Python drops the module whose import failed but keeps every
    # submodule already executed, half wired (sympy cut off mid-import raises TypeError or
    # RecursionError in each later parse, which math-verify turns into "no answer" for ever).
    # That was the cold-start poisoning: the first timed verification imports sympy. Retry
    # shortly instead; the pool's hard kill still bounds a worker.
    global _deferred
    if _defer_depth:
        _deferred = True
        return
    if _importing(frame) and (_alarm_deadline is None or time.monotonic() < _alarm_deadline + _MAX_IMPORT_DEFER_S):
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    _interrupt()


def call_with_alarm(fn: Callable, args: tuple, timeout_s: float):
    """SIGALRM guard; nests: an inner guard arms min(inner, outer) and re-arms the outer after.
    Code that catches the interrupt (a bare ``except:`` around a retried call) and returns anyway
    has still run out of time: :class:`VerifierTimeout` all the same. Code that catches it and
    carries on is not stopped here: only a worker's hard kill stops that (gapo.exec.scoring)."""
    global _alarm_deadline, _alarms_raised
    outer = _alarm_deadline
    start = time.monotonic()
    mine = start + timeout_s
    old_handler = signal.signal(signal.SIGALRM, _raise_alarm) if outer is None else None
    _alarm_deadline = mine if outer is None else min(mine, outer)
    raised = _alarms_raised
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(_alarm_deadline - start, 1e-6))
            out = fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
        if _alarms_raised != raised:  # the interrupt was swallowed: the call's time ran out all the same
            raise AlarmInterrupt()
        return out
    except AlarmInterrupt:
        if outer is not None and time.monotonic() >= outer:
            raise  # the outer guard's time is up: let it handle this
        _alarms_raised = raised  # accounted for (here, a timeout): an outer guard must not count it again
        raise VerifierTimeout(f"{getattr(fn, '__name__', fn)} ran past {timeout_s:g}s") from None
    finally:
        _alarm_deadline = outer
        if outer is None:
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
        else:  # re-arm the outer guard (fires at once if it is already past)
            signal.setitimer(signal.ITIMER_REAL, max(outer - time.monotonic(), 1e-6))


# ----------------------------------------------------------------------------- one completion


def is_real_number(x) -> bool:
    """A real number, as a reward must be: ``int``, ``float``, a numpy or 0-d tensor integer or
    float. Not a ``bool`` (of any library), not a string (``float("1")`` would accept ``"1"``)."""
    dt = str(getattr(x, "dtype", ""))
    if isinstance(x, (bool, str, bytes)) or "bool" in dt or type(x).__name__ in ("bool_", "bool"):
        return False
    if isinstance(x, numbers.Real):
        return True
    return getattr(x, "ndim", None) == 0 and ("int" in dt or "float" in dt)  # numpy / torch 0-d arrays


def _as_reward(x):
    """``float(x)`` for a real number; anything else unchanged, for ``scoring.check_reward`` to
    reject with the task and problem named (``float`` would turn ``"1"`` and ``True`` into 1.0)."""
    return float(x) if is_real_number(x) else x


def score_one(task, problem, completion: str, given: dict | None = None) -> tuple:
    """(reward, status) for one completion, using ``score_detailed`` where the task has it;
    (reward, status, {term: value}) for a task scored by several rewards (``gapo.tasks.custom``).
    ``given``: the values of the task's ``batch_terms`` for this completion, already computed over
    the whole batch by ``task.score_terms`` (passed on to ``score_detailed``)."""
    detailed = getattr(task, "score_detailed", None)
    if detailed is not None:
        out = detailed(problem, completion) if given is None else detailed(problem, completion, given)
        if len(out) == 3:  # several rewards (gapo.tasks.custom): each term's value rides along
            return _as_reward(out[0]), out[1], out[2]
        reward, status = out
        return _as_reward(reward), status
    reward = _as_reward(task.score(problem, completion))
    parse_ok = getattr(task, "parse_ok", None)
    status = "ok" if parse_ok is None or parse_ok(completion) else "unparsable"
    return reward, status


def score_guarded(task, problem, completion, timeout_s, given: dict | None = None):
    out = _guarded(task, score_one, (task, problem, completion, given), timeout_s)
    return (0.0, "timeout") if out is _TIMED_OUT else out


_TIMED_OUT = object()


def _guarded(task, fn: Callable, args: tuple, timeout_s: float | None):
    """``fn(*args)`` under the soft timeout (where a SIGALRM guard is usable), or ``_TIMED_OUT``."""
    try:
        if timeout_s is not None and signal_guard_usable():
            return call_with_alarm(fn, args, timeout_s)
        return fn(*args)
    except VerifierTimeout:
        # An interrupt may have cut the verifier's own state short: the task checks and repairs
        # it now, so that this timeout changes no later result (MathTask.after_timeout).
        recover = getattr(task, "after_timeout", None)
        if callable(recover):
            recover()
        return _TIMED_OUT


# ----------------------------------------------------------------------------- worker processes


def _lead_own_group() -> None:
    """Make this worker the leader of a session of its own (so of a process group), and fork a
    sentinel into the group that SIGKILLs the whole group once the worker is gone, however it
    went: a hard kill, a crash, ``kill -9`` of the trainer (the worker then dies by
    ``proc_tree.die_with_parent``), or a normal stop. So what a user's reward starts (``subprocess.Popen(
    ["sleep", "1000"])``) dies with the worker; the trainer's own kill (``_Worker.kill``) takes the
    group at once. A child that starts a session of its own (``setsid``, ``start_new_session=True``,
    a daemon's double fork) leaves the group but not the worker's tree: the worker is a child
    subreaper (Linux), so its orphans stay its descendants, and every kill but the sentinel's
    sweeps the tree too (:func:`kill_tree`). Not covered: such a child of a worker that crashed,
    or that died with a ``kill -9``-ed trainer (docs/design.md §6)."""
    if os.name != "posix":
        return
    os.setsid()
    become_subreaper()
    me = os.getpid()
    try:
        pidfd = os.pidfd_open(me) if hasattr(os, "pidfd_open") else None
    except OSError:
        pidfd = None
    global _sentinel
    _sentinel = os.fork()  # (before any thread is started: die_with_parent comes next)
    if _sentinel != 0:
        if pidfd is not None:
            os.close(pidfd)
        return
    try:  # the sentinel holds no descriptor of the worker's: the trainer must see the worker's pipe close
        os.closerange(0, pidfd if pidfd is not None else 0)
        os.closerange((pidfd if pidfd is not None else 0) + 1, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        wait_for_parent(me, pidfd)  # the worker
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


_sentinel = 0  # in a worker: the pid of its group's sentinel (_lead_own_group)


def _kill_strays() -> None:
    """Kill what this worker's code started and left running (its descendants and its group, but
    the sentinel), after a user's code ran out of time and was interrupted, not killed (a soft
    timeout must not leave its children behind either), and when the worker stops. Linux
    (``/proc``); elsewhere they die with the worker's group."""
    if os.path.isdir("/proc") and os.getpgrp() == os.getpid():
        kill_tree(os.getpid(), spare=(_sentinel,))


def _worker_main(conn, parent_pid: int | None = None, pdeathsig: bool = False) -> None:
    _lead_own_group()
    if parent_pid is not None:
        die_with_parent(parent_pid, pdeathsig)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    task = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            if getattr(task, "runs_user_code", False):  # what its code left running ends with it
                _kill_strays()
            return
        try:
            if msg[0] == "task":
                task = pickle.loads(msg[1])
            out = _job(task, msg)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which re-raises
            try:
                pickle.dumps(e)
                ok = isinstance(e, Exception)  # never a SystemExit or KeyboardInterrupt in the parent
            except Exception:  # noqa: BLE001 - pickling an arbitrary exception may raise anything
                ok = False
            out = ("raised", e if ok else RuntimeError(f"{type(e).__name__}: {e}"))
        conn.send(out)


def _job(task, msg: tuple) -> tuple:
    """What a worker answers to ``msg`` -> ``(status, value)``; the messages:

    - ``("task", blob)`` / ``("import", module)``: load (the task is unpickled by the caller) and
      warm up; acknowledged before any job is timed, so that spawn start-up and heavy imports
      (sympy, a user's reward module) never count against a verifier's time limit;
    - ``("score", problem, completion, soft_timeout[, given])``: one completion (as :func:`score_guarded`);
    - ``("batch", problems, completions, soft_timeout)``: ``task.score_terms`` over the whole batch
      (the terms that take lists, ``gapo.tasks.custom``), or ``("timeout", None)``;
    - ``("apply", method, args)``: ``getattr(task, method)(*args)`` (checks of the loaded task);
    - ``("call", fn, args)``: ``fn(*args)``.
    """
    kind = msg[0]
    if kind in ("task", "import"):
        warm = getattr(task if kind == "task" else importlib.import_module(msg[1]), "warmup", None)
        if callable(warm):
            warm()
        return ("ok", None)
    if kind in ("score", "batch"):
        if kind == "score":
            out = _guarded(task, score_one, (task, *msg[1:3], *msg[4:]), msg[3])
        else:
            out = _guarded(task, task.score_terms, msg[1:3], msg[3])
        if out is not _TIMED_OUT:
            return ("ok", out)
        if getattr(task, "runs_user_code", False):
            _kill_strays()
        return ("ok", (0.0, "timeout")) if kind == "score" else ("timeout", None)
    if kind == "apply":
        return ("ok", getattr(task, msg[1])(*msg[2]))
    return ("ok", msg[1](*msg[2]))  # "call"


_LOAD_TIMEOUT_S = 300.0


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        # die with this process (see proc_tree.die_with_parent); PR_SET_PDEATHSIG only from the main thread
        main = threading.current_thread() is threading.main_thread()
        self.proc = ctx.Process(target=_worker_main, args=(child, os.getpid(), main), daemon=True)
        self.proc.start()
        child.close()
        self.loaded: str | None = None  # key of the task or module this worker has loaded

    def kill(self, wait_s: float = 0.0) -> int | None:
        """Kill the worker with its whole process group (``_lead_own_group``), after waiting up to
        ``wait_s`` for it to end by itself; its exit code (negative: the signal that ended it)."""
        if wait_s > 0:
            mpc.wait([self.proc.sentinel], wait_s)  # ended, not yet reaped: its pid is still its own
        popen = self.proc._popen
        if popen is not None and popen.returncode is None:  # unreaped: its pid and group id are surely its
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGSTOP)  # no fork past the sweep; its orphans stay below it
            kill_tree(self.proc.pid)  # what its code started, in its group or in a session of its own
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.kill()  # (not yet a group leader, if it was killed that early)
        self.proc.join(timeout=5)
        self.conn.close()
        # Its sandboxes died with it (PR_SET_PDEATHSIG); remove what is left (cgroups, dirs).
        sb = sys.modules.get("gapo.exec.sandbox")
        if sb is not None:
            try:
                sb.reap_orphans()
            except Exception:  # noqa: BLE001 - cleanup must not break the pool
                pass
        return self.proc.exitcode


class Workers:
    """N spawn-started processes, one job each at a time, killed and replaced on timeout."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"need at least one worker, got {n}")
        self._ctx = mp.get_context("spawn")
        self.n = n
        self._workers = [_Worker(self._ctx) for _ in range(n)]
        self.closed = False
        self.n_replaced = 0

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = _Worker(self._ctx)
        self.n_replaced += 1

    def _load(self, ids: list[int], prep: tuple[str, tuple]) -> None:
        """Send the load message to workers ``ids`` (in parallel) and wait for their acks. What
        the load raised is raised here; a worker that runs past ``_LOAD_TIMEOUT_S`` (an import that
        hangs) or dies meanwhile is replaced, and that is a :class:`WorkerLoadError`."""
        key, msg = prep
        todo = [w for w in ids if self._workers[w].loaded != key]
        for w in todo:
            with contextlib.suppress(OSError):  # a worker already dead: its recv below says so
                self._workers[w].conn.send(msg)
        deadline = time.monotonic() + _LOAD_TIMEOUT_S
        for w in todo:
            worker = self._workers[w]
            try:
                if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                    self._replace(w)
                    raise WorkerLoadError(f"did not finish loading within {_LOAD_TIMEOUT_S:g}s")
                status, value = worker.conn.recv()
            except (EOFError, OSError):
                code = worker.kill(wait_s=1.0)
                self._workers[w] = _Worker(self._ctx)
                self.n_replaced += 1
                raise WorkerLoadError(f"died while loading (exit code {code})") from None
            if status == "raised":
                raise value
            worker.loaded = key

    def call(self, fn, args, timeout_s):
        """Run ``fn(*args)`` in a worker -> (status, value); status ok/raised/timeout/error."""
        prep = ("module:" + fn.__module__, ("import", fn.__module__))
        (out,) = self.run([("call", fn, args)], timeout_s, prep)
        return out

    def run(self, jobs: Sequence[tuple], timeout_s: float | None, prep: tuple[str, tuple] | None):
        """Run jobs (messages for ``_worker_main``); one (status, value) per job, in order."""
        if self.closed:
            raise RuntimeError("scoring pool is closed")
        if prep is not None:
            self._load(list(range(min(self.n, len(jobs)))), prep)
        results: list[Any] = [None] * len(jobs)
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, deadline)
        try:
            self._drive(jobs, timeout_s, prep, results, busy)
        except BaseException:  # Ctrl-C, a reload that failed: a worker still on a job would answer
            for w in busy:  # the next batch's first job with this one's result
                self._replace(w)
            raise
        return results

    def _drive(self, jobs, timeout_s, prep, results: list, busy: dict) -> None:
        pending = list(range(len(jobs)))[::-1]
        while pending or busy:
            for w in range(self.n):
                if w in busy or not pending:
                    continue
                j = pending.pop()
                try:
                    if prep is not None:
                        self._load([w], prep)  # no-op unless the worker was replaced
                    self._workers[w].conn.send(jobs[j])
                except (BrokenPipeError, EOFError, OSError):
                    self._replace(w)
                    results[j] = ("error", None)
                    continue
                deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
                busy[w] = (j, deadline)
            if not busy:
                continue
            wait_s = min(d for _, d in busy.values()) - time.monotonic()
            conns = [self._workers[w].conn for w in busy]
            ready = mpc.wait(conns, None if wait_s == math.inf else max(0.0, wait_s))
            now = time.monotonic()
            for w in list(busy):
                j, deadline = busy[w]
                worker = self._workers[w]
                if worker.conn in ready:
                    try:
                        results[j] = worker.conn.recv()
                    except (EOFError, OSError):  # died mid-job (segfault, OOM killer)
                        results[j] = ("error", None)
                        self._replace(w)
                    del busy[w]
                elif now >= deadline:
                    results[j] = ("timeout", None)
                    self._replace(w)
                    del busy[w]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in self._workers:
            try:
                w.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:  # each ends by itself, then its group (what the worker started) is killed
            w.kill(wait_s=max(0.0, deadline - time.monotonic()))
