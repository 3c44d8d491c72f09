"""The golden regression check (benchmarks/regression.py), a quick subset: a short ``gapo train``
run straight through and the same run stopped by SIGTERM and resumed must reproduce
benchmarks/golden/resume.jsonl bit for bit (``time/*`` aside). The subset is kept small (three
short training processes and three start-up probes: 67 s of CPU; 6 min 12 s of wall time at a
load average of 10-12 on 2 cores) so that it finishes well inside its timeout on a busy machine.
The whole set (the demo, a grid with pretraining, SIGKILL resume, eval, the verl and TRL
adapters) is a benchmark command: ``python benchmarks/regression.py check``.

The golden values are CPU- and torch-build-specific; on a machine whose torch differs from
``benchmarks/golden/meta.json`` the test is skipped rather than failed.
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
    # quiet 2-core machine: about 70 s (its CPU time); measured 372 s at a load average of 10-12 on
    # 2 cores, a fifth of the limit
    p = timing.run([sys.executable, str(SCRIPT), "check", "--quick", "--quiet"], capture_output=True, text=True,
                   timeout=1800, quiet_s=70, what="benchmarks/regression.py check --quick", env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "all identical" in p.stdout
