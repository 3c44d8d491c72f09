"""Timeouts that say they are timeouts (tests/ is on sys.path under pytest: ``import timing``).

The suite must pass on a busy machine (two cores shared with other jobs run 3-5 times slower), so
no test asserts a tight wall-clock bound. Where a test needs a bound at all (a child process
that could hang, a timeout mechanism that must fire), the bound is at least 5 times what the
work takes on a quiet 2-core machine, and a failure says that it is a timeout on a possibly busy
machine, with the child's CPU time, rather than looking like a wrong result.

``GAPO_TEST_TIMEOUT_SCALE=3`` multiplies every bound here (a very slow or very busy machine).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time

import pytest

SCALE = float(os.environ.get("GAPO_TEST_TIMEOUT_SCALE", "1") or 1)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timeout_message(what: str, limit_s: float, quiet_s: float, cpu_s: float | None = None) -> str:
    cpu = f"; its processes used {cpu_s:.0f} s of CPU" if cpu_s is not None else ""
    return (
        f"TIMEOUT, not a wrong result: {what} ran past its {limit_s:.0f} s wall-clock limit (about "
        f"{quiet_s:.0f} s on a quiet 2-core machine{cpu}). The machine is probably busy: rerun it, or set "
        f"GAPO_TEST_TIMEOUT_SCALE=3 on a slow machine."
    )


def run(cmd, *, timeout: float, quiet_s: float, what: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=timeout·SCALE, **kwargs)``; running past it fails the test with
    :func:`timeout_message` (the child is killed and reaped first, so its CPU time is counted)."""
    limit = timeout * SCALE
    cpu0 = _children_cpu()
    try:
        return subprocess.run(cmd, timeout=limit, **kwargs)
    except subprocess.TimeoutExpired:
        pytest.fail(
            timeout_message(what or " ".join(map(str, cmd))[:200], limit, quiet_s, _children_cpu() - cpu0),
            pytrace=False,
        )


def communicate(p: subprocess.Popen, *, timeout: float, quiet_s: float, what: str):
    """``p.communicate(timeout=timeout·SCALE)``; running past it kills ``p`` and fails as a timeout."""
    limit = timeout * SCALE
    try:
        return p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(timeout_message(what, limit, quiet_s), pytrace=False)


def wait_for(condition, *, timeout: float, quiet_s: float, what: str, poll_s: float = 0.1) -> None:
    """Poll ``condition()`` until true; past ``timeout·SCALE`` seconds, fail as a timeout."""
    deadline = time.monotonic() + timeout * SCALE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(timeout_message(what, timeout * SCALE, quiet_s), pytrace=False)
        time.sleep(poll_s)


def assert_within(elapsed_s: float, limit_s: float, *, quiet_s: float, what: str) -> None:
    """A bound on a measured wall time (a timeout mechanism that must fire): ``limit_s·SCALE``."""
    limit = limit_s * SCALE
    assert elapsed_s < limit, timeout_message(what, limit, quiet_s) + f" It took {elapsed_s:.1f} s."
