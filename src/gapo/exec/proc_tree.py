"""The process tree of a scoring worker: dying with the process that started it, and killing
what it started (:mod:`gapo.exec.scoring_pool`'s workers; design §6). Linux where it says so
(``/proc``, ``prctl``); elsewhere what cannot be done is skipped."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent", "wait_for_parent", "become_subreaper", "descendants", "kill_tree"]


def die_with_parent(parent_pid: int, pdeathsig: bool) -> None:
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
        wait_for_parent(parent_pid, pidfd)
        os._exit(1)

    if os.name == "posix":
        # Born with every signal blocked: the kernel must keep delivering SIGALRM (the soft
        # timeout) to the main thread, never to this one.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            threading.Thread(target=watch, name="gapo-parent-watch", daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def wait_for_parent(parent_pid: int, pidfd: int | None) -> None:
    """Return once this process's parent ``parent_pid`` has exited: ``pidfd`` (its pidfd) becomes
    readable then; without one, ``getppid()`` changes (polled)."""
    if pidfd is not None:
        import select

        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
    else:
        while os.getppid() == parent_pid:
            time.sleep(0.2)


def become_subreaper() -> None:
    """``PR_SET_CHILD_SUBREAPER`` (Linux): what this process's children orphan is re-parented to
    it, not to init, so that :func:`descendants` still finds it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def proc_table() -> dict[int, tuple[int, int]]:
    """``pid -> (ppid, pgrp)`` of every process, from ``/proc`` (empty where there is none)."""
    out = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
                out[int(name)] = (int(fields[1]), int(fields[2]))
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return out


def descendants(pid: int, *, group: int | None = None) -> set[int]:
    """The processes below ``pid`` in the process tree (and, with ``group``, that group's members),
    ``pid`` itself excluded."""
    table = proc_table()
    found = {p for p, (_, g) in table.items() if group is not None and g == group}
    frontier = {pid}
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier and p not in found and p != pid}
        found |= frontier
    found.discard(pid)
    return found


def kill_tree(pid: int, *, spare: tuple[int, ...] = ()) -> None:
    """SIGKILL what is below ``pid`` (its descendants and its process group's members, ``spare``
    and ``pid`` itself excepted). Each is stopped first, until no new one appears, so that nothing
    forks past the sweep."""
    stopped: set[int] = set()
    for _ in range(100):  # each round stops what the last one found, until nothing new appears
        found = descendants(pid, group=pid) - stopped - set(spare)
        if not found:
            break
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGSTOP)
        stopped |= found
    for p in stopped:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
