"""What a scoring worker runs and the worker processes themselves, for :mod:`gapo.exec.scoring`.

- the ``SIGALRM`` guard (``call_with_alarm``, nestable; main thread only) that turns a verifier
  running past its time into :class:`VerifierTimeout`, used in the calling process and, as the
  soft timeout, inside each worker;
- :func:`score_one`, the reward and status of one completion, and ``score_guarded``, the same
  under the soft timeout;
- ``Workers``: N spawn-started processes, one job each at a time, killed and replaced when a job
  runs past its hard deadline (the pool of :class:`gapo.exec.scoring.ScoringPool` and the helper
  process of :func:`gapo.exec.scoring.run_with_timeout`); each dies with the process that
  started it, ``kill -9`` included (``_die_with_parent``), taking its sandboxes along.

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


class VerifierTimeout(Exception):
    """A verifier ran past its time limit."""


class _Alarm(BaseException):
    # BaseException so that verifiers' ``except Exception`` blocks (math-verify has many) do not
    # swallow the interrupt and carry on; converted to VerifierTimeout at the guard.
    pass


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
            raise _Alarm()


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
    raise _Alarm()


def call_with_alarm(fn: Callable, args: tuple, timeout_s: float):
    """SIGALRM guard; nests: an inner guard arms min(inner, outer) and re-arms the outer after."""
    global _alarm_deadline
    outer = _alarm_deadline
    start = time.monotonic()
    mine = start + timeout_s
    old_handler = signal.signal(signal.SIGALRM, _raise_alarm) if outer is None else None
    _alarm_deadline = mine if outer is None else min(mine, outer)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(_alarm_deadline - start, 1e-6))
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
    except _Alarm:
        if outer is not None and time.monotonic() >= outer:
            raise  # the outer guard's time is up: let it handle this
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


def score_one(task, problem, completion: str) -> tuple:
    """(reward, status) for one completion, using ``score_detailed`` where the task has it;
    (reward, status, {term: value}) for a task scored by several rewards (``gapo.tasks.custom``)."""
    detailed = getattr(task, "score_detailed", None)
    if detailed is not None:
        out = detailed(problem, completion)
        if len(out) == 3:  # several rewards (gapo.tasks.custom): each term's value rides along
            return _as_reward(out[0]), out[1], out[2]
        reward, status = out
        return _as_reward(reward), status
    reward = _as_reward(task.score(problem, completion))
    parse_ok = getattr(task, "parse_ok", None)
    status = "ok" if parse_ok is None or parse_ok(completion) else "unparsable"
    return reward, status


def score_guarded(task, problem, completion, timeout_s):
    try:
        if timeout_s is not None and signal_guard_usable():
            return call_with_alarm(score_one, (task, problem, completion), timeout_s)
        return score_one(task, problem, completion)
    except VerifierTimeout:
        # An interrupt may have cut the verifier's own state short: the task checks and repairs
        # it now, so that this timeout changes no later result (MathTask.after_timeout).
        recover = getattr(task, "after_timeout", None)
        if callable(recover):
            recover()
        return 0.0, "timeout"


# ----------------------------------------------------------------------------- worker processes


def _die_with_parent(parent_pid: int, pdeathsig: bool) -> None:
    """End this worker at once when the process that started it ends, even mid-job: a trainer
    killed with ``kill -9`` must not leave workers (and their sandboxes, which die with this
    process by their own ``PR_SET_PDEATHSIG``) running on until their deadlines.

    ``PR_SET_PDEATHSIG`` (Linux) fires when the parent *thread* that forked us exits, not the
    process: it is set only when the parent started this worker from its main thread (a
    replacement started from the pool's scoring thread, or the helper of ``run_with_timeout``
    started from any thread, must not die with that thread). Always, a watchdog thread waits on
    a pidfd of the parent process (readable once the whole process has exited; children of an
    exiting thread are re-parented within the process), or polls ``getppid()`` where there is
    no ``pidfd_open``."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # gone already (before the signal or the watchdog was set)
        os._exit(1)
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(parent_pid)
        except OSError:
            pidfd = None
        if pidfd is not None and os.getppid() != parent_pid:  # the pid may have been reused
            os._exit(1)

    def watch():
        if pidfd is not None:
            import select

            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while os.getppid() == parent_pid:
                time.sleep(0.2)
        os._exit(1)

    if os.name == "posix":
        # Born with every signal blocked: the kernel must keep delivering SIGALRM (the soft
        # timeout) to the main thread, never to this one.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            threading.Thread(target=watch, name="gapo-parent-watch", daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_main(conn, parent_pid: int | None = None, pdeathsig: bool = False) -> None:
    if parent_pid is not None:
        _die_with_parent(parent_pid, pdeathsig)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    task = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind == "stop":
            return
        try:
            if kind in ("task", "import"):
                # Loading is acknowledged before any job is timed, so that spawn start-up and
                # heavy imports (sympy) never count against a verifier's time limit.
                if kind == "task":
                    task = pickle.loads(msg[1])
                    warm = getattr(task, "warmup", None)
                else:
                    warm = getattr(importlib.import_module(msg[1]), "warmup", None)
                if callable(warm):
                    warm()
                out = ("ok", None)
            elif kind == "score":
                _, problem, completion, soft_timeout = msg
                out = ("ok", score_guarded(task, problem, completion, soft_timeout))
            else:  # "call"
                _, fn, args = msg
                out = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which re-raises
            try:
                pickle.dumps(e)
                out = ("raised", e)
            except Exception:
                out = ("raised", RuntimeError(f"{type(e).__name__}: {e}"))
        conn.send(out)


_LOAD_TIMEOUT_S = 300.0


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        # die with this process (see _die_with_parent); PR_SET_PDEATHSIG only from the main thread
        main = threading.current_thread() is threading.main_thread()
        self.proc = ctx.Process(target=_worker_main, args=(child, os.getpid(), main), daemon=True)
        self.proc.start()
        child.close()
        self.loaded: str | None = None  # key of the task or module this worker has loaded

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()
        # Its sandboxes died with it (PR_SET_PDEATHSIG); remove what is left (cgroups, dirs).
        sb = sys.modules.get("gapo.exec.sandbox")
        if sb is not None:
            try:
                sb.reap_orphans()
            except Exception:  # noqa: BLE001 - cleanup must not break the pool
                pass


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
        """Send the load message to workers ``ids`` (in parallel) and wait for their acks."""
        key, msg = prep
        todo = [w for w in ids if self._workers[w].loaded != key]
        for w in todo:
            self._workers[w].conn.send(msg)
        for w in todo:
            worker = self._workers[w]
            if not worker.conn.poll(_LOAD_TIMEOUT_S):
                raise RuntimeError(f"scoring worker did not load {key} within {_LOAD_TIMEOUT_S:g}s")
            status, value = worker.conn.recv()
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
        pending = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, deadline)
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
        return results

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in self._workers:
            try:
                w.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for w in self._workers:
            w.proc.join(timeout=1)
            w.kill()
