"""The golden regression check (benchmarks/regression.py), a quick subset: the demo's two runs and
the straight / SIGTERM-resumed / SIGKILL-resumed run must reproduce benchmarks/golden/ bit for bit
(``time/*`` aside). The whole set: ``python benchmarks/regression.py check`` (about 2 minutes).

The golden values are CPU- and torch-build-specific; on a machine whose torch differs from
``benchmarks/golden/meta.json`` the test is skipped rather than failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    p = subprocess.run([sys.executable, str(SCRIPT), "check", "--quick", "--quiet"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "all identical" in p.stdout
