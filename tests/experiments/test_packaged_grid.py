"""``gapo compare --quick`` works from an installed wheel: its grid ships as package data, found
through importlib.resources, and the user-facing configs/grid-quick.yaml is the same file."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gapo.experiments.grid_spec import QUICK_GRID, load_grid

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_grid_is_package_data_equal_to_the_user_facing_copy():
    assert QUICK_GRID.is_file()
    assert Path(sys.modules["gapo"].__file__).parent in QUICK_GRID.parents  # inside the package
    assert QUICK_GRID.read_bytes() == (ROOT / "configs" / "grid-quick.yaml").read_bytes()
    assert load_grid(QUICK_GRID)["name"] == "quick"


@pytest.mark.skipif(
    shutil.which("pip") is None and not (Path(sys.executable).parent / "pip").exists(),
    reason="pip is needed to build the wheel",
)
def test_the_wheel_carries_the_quick_grid(tmp_path):
    # no build isolation: the venv's setuptools, no network
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("gapo-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("gapo/experiments/data/grid-quick.yaml") == QUICK_GRID.read_bytes()
        assert "gapo/exec/sandbox_boot.py" in z.namelist() and "gapo/machine/threads.py" in z.namelist()
