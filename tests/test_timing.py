"""tests/timing.py: a test that runs past its bound says it is a timeout, not a wrong result."""

import subprocess
import sys

import pytest

import timing


def test_run_past_its_limit_fails_as_a_timeout_with_the_cpu_time():
    # the child burns CPU, then would sleep; the limit (0.5 s) stops it
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    with pytest.raises(pytest.fail.Exception) as info:
        timing.run([sys.executable, "-c", code], timeout=1.5, quiet_s=1, what="a sleeper")
    msg = str(info.value)
    assert msg.startswith("TIMEOUT, not a wrong result: a sleeper ran past its")
    assert "probably busy" in msg and "GAPO_TEST_TIMEOUT_SCALE" in msg
    assert "s of CPU" in msg


def test_communicate_kills_and_reports():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(pytest.fail.Exception, match="TIMEOUT, not a wrong result: a sleeper"):
        timing.communicate(p, timeout=0.5, quiet_s=1, what="a sleeper")
    assert p.returncode is not None  # killed and reaped


def test_within_bound_passes_and_past_it_says_timeout():
    timing.assert_within(1.0, 2.0, quiet_s=1, what="x")
    with pytest.raises(AssertionError, match="TIMEOUT, not a wrong result: x .* It took 3.0 s"):
        timing.assert_within(3.0, 2.0, quiet_s=1, what="x")
    assert (
        timing.run([sys.executable, "-c", "print(1)"], timeout=600, quiet_s=1, capture_output=True, text=True).stdout
        == "1\n"
    )
