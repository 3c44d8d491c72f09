"""The process side of :mod:`gapo.exec.sandbox`: start the bootstrap, move it into its cgroups,
pump its pipes under the output caps and the wall-clock deadline, and kill what is left.

Kept apart from ``sandbox.py`` (the API, the isolation it detects and the bootstrap's
configuration) because this is the part that deals with file descriptors and process groups;
nothing here decides what a run's status is.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time


def child_env(workdir: str) -> dict[str, str]:
    # Nothing inherited: no tokens, keys or proxies from the trainer's environment.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONIOENCODING": "utf-8",
        # RLIMIT_NPROC=0 forbids threads: numerical libraries must not try to start a pool
        # (OpenBLAS aborts numpy's import otherwise).
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
    }


def execute(argv: list[str], cfg: dict, *, workdir: str, stdin: bytes | None, cgroup, deadline: float, cap: int):
    """Start the bootstrap ``argv`` with the JSON of ``cfg`` as its last argument (``cfg``'s
    ``report_fd``/``go_fd`` filled in with the pipes made here) in a session of its own, move it
    into ``cgroup`` (a :class:`gapo.exec.sandbox_ns.Cgroup` or None) and pump its pipes until
    it ends (:func:`communicate`). Returns ``(stdout, stderr, report, limit_hit, timed_out,
    returncode)``; every pipe end of this side is closed when it returns or raises."""
    report_r = report_w = go_r = go_w = -1
    try:
        report_r, report_w = os.pipe()
        if cgroup is not None:
            go_r, go_w = os.pipe()
        cfg = dict(cfg, report_fd=report_w, go_fd=go_r if cgroup else None)
        proc = subprocess.Popen(
            [*argv, json.dumps(cfg)],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_w,) if cgroup is None else (report_w, go_r),
            env=child_env(workdir),
            cwd=workdir,
            start_new_session=True,
        )
        os.close(report_w)
        report_w = -1
        if cgroup is not None:
            # move the child into the cgroup while its interpreter starts; it waits for this
            os.close(go_r)
            go_r = -1
            joined = cgroup.add(proc.pid)
            try:
                os.write(go_w, b"1" if joined else b"0")
            except OSError:
                pass
        out, err, report, limit_hit, timed_out = communicate(proc, stdin, report_r, deadline=deadline, cap=cap)
        return out, err, report, limit_hit, timed_out, proc.returncode
    finally:
        for fd in (report_r, report_w, go_r, go_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def kill(proc: subprocess.Popen) -> None:
    for fn in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            fn()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def communicate(proc, stdin: bytes | None, report_fd: int, *, deadline: float, cap: int):
    """Pump the child's pipes until it exits, a cap is exceeded or the deadline passes."""
    out, err, report = bytearray(), bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sel.register(report_fd, selectors.EVENT_READ, report)
    pending = memoryview(stdin) if stdin else None
    if pending is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, None)
    limit_hit = timed_out = False
    try:
        limit_hit, timed_out = _pump(proc, sel, pending, report, deadline=deadline, cap=cap)
        if not (limit_hit or timed_out):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        _finish(proc, sel, still_running=limit_hit or timed_out or proc.poll() is None)
    return out, err, bytes(report), limit_hit, timed_out


def _pump(proc, sel, pending, report: bytearray, *, deadline: float, cap: int) -> tuple[bool, bool]:
    """The select loop of :func:`communicate`; returns ``(limit_hit, timed_out)``."""
    limit_hit = False
    while sel.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return limit_hit, True
        for key, _ in sel.select(timeout=min(remaining, 0.5)):
            if key.data is None:  # stdin
                pending = _feed(proc, sel, key, pending)
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            key.data.extend(chunk)
            if key.data is not report and len(key.data) > cap:
                limit_hit = True
        if limit_hit:
            break
    return limit_hit, False


def _feed(proc, sel, key, pending: memoryview) -> memoryview:
    # one non-blocking write of the child's stdin; closes it once everything is written
    try:
        n = os.write(key.fd, pending[:65536])
        pending = pending[n:]
    except (BrokenPipeError, OSError):
        pending = pending[:0]
    if not len(pending):
        sel.unregister(key.fileobj)
        proc.stdin.close()
    return pending


def _finish(proc, sel, *, still_running: bool) -> None:
    if still_running:
        kill(proc)
    else:
        # The program has exited; make sure nothing it left behind survives it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    sel.close()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
