"""The golden regression check (benchmarks/regression.py), a quick subset: a short ``gapo train``
run stopped by SIGTERM and resumed must reproduce benchmarks/golden/resume.jsonl (recorded from
the same run straight through) bit for bit (``time/*`` aside). The subset is kept small (two
short training processes and two start-up probes) so that it finishes well inside its timeout on
a busy machine. That a resumed run equals the straight run, state and records, is also checked
in-process (tests/rl/test_trainer.py::test_resume_is_bit_exact); the full ``resume`` unit runs
the straight run, SIGTERM and SIGKILL resumes through the command line.
The whole set (the demo, a grid with pretraining, SIGKILL resume, eval, the verl and TRL
adapters) is a benchmark command: ``python benchmarks/regression.py check``.

The golden values are CPU- and torch-build-specific: on a machine whose torch differs from
``benchmarks/golden/meta.json`` the test is skipped rather than failed; on another CPU (meta.json's
``cpu``) floats are compared to a relative tolerance and everything else exactly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import timing  # tests/timing.py

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "regression.py"
GOLDEN = ROOT / "benchmarks" / "golden"

pytestmark = pytest.mark.slow


def test_quick_subset_is_identical_to_golden():
    import torch

    meta = json.loads((GOLDEN / "meta.json").read_text())
    if meta.get("torch") != torch.__version__:
        pytest.skip(f"golden values recorded with torch {meta.get('torch')}, this is {torch.__version__}")
    env = {k: v for k, v in os.environ.items() if k != "GAPO_CACHE"}
    # about 33 s of CPU (two training processes; measured on a busy 2-core machine); the three-process
    # subset it replaces took 372 s of wall time at a load average of 10-12, a fifth of the limit
    p = timing.run(
        [sys.executable, str(SCRIPT), "check", "--quick", "--quiet"],
        capture_output=True,
        text=True,
        timeout=1800,
        quiet_s=35,
        what="benchmarks/regression.py check --quick",
        env=env,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    # exact on the CPU the golden records come from; elsewhere floats to benchmarks/regression.py's
    # OTHER_CPU_RTOL (ints and strings still exact)
    assert "all identical" in p.stdout or "all equal within rtol" in p.stdout, p.stdout[-4000:]


def _regression_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gapo_regression_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tolerant_comparison_keeps_ints_and_strings_exact():
    r = _regression_module()
    gold = [{"_src": "run", "step": 1, "loss": 0.25, "tok": "9+3=12", "n": [3, 4]}]
    drift = [{"_src": "run", "step": 1, "loss": 0.25 * (1 + 1e-7), "tok": "9+3=12", "n": [3, 4]}]
    assert r.compare(gold, drift)["run"]["keys"] == ["loss"]  # exact by default
    assert r.compare(gold, drift, 1e-3)["run"]["first"] is None  # another CPU's last bits
    for key, value in (("step", 2), ("tok", "9+3=13"), ("n", [3, 5]), ("loss", 0.25 * 1.01)):
        moved = [dict(gold[0], **{key: value})]
        assert r.compare(gold, moved, 1e-3)["run"]["keys"] == [key], key
    assert r.same(True, True, 1e-3) and not r.same(True, False, 1.0) and not r.same(1, 2, 1.0)
