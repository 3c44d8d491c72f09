"""`gapo demo` end to end, shrunk: the shipped base policy, two runs, a report and a summary table."""

import sys

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts


@pytest.mark.slow
def test_demo_smoke(tmp_path):
    out = tmp_path / "demo"
    env_cache = tmp_path / "cache"  # empty cache: the shipped low-preset policy must be used, not rebuilt
    p = timing.run(
        [
            sys.executable,
            "-m",
            "gapo.cli",
            "demo",
            "--out",
            str(out),
            "--steps",
            "1",  # one step per run: the demo's path end to end (its train steps are most of its CPU)
            "--eval-every",
            "0",
            "--eval-problems",
            "8",
            "--eval-samples",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        quiet_s=60,
        what="the shrunk gapo demo",
        env={"GAPO_CACHE": str(env_cache), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "| fixed |" in p.stdout and "| gapo |" in p.stdout
    assert p.stdout.startswith("estimate: about ")  # said before anything runs
    for name in ("report.md", "passk.png", "clip_by_c.png", "reward.png", "entropy.png"):
        assert (out / "report" / name).is_file(), name
    assert not (env_cache / "base").exists()  # nothing was trained: the shipped policy served


def test_demo_estimate_scales_the_measured_default():
    from gapo.cli.demo import DEMO_MEASURED_S, demo_estimate

    assert demo_estimate(60, 20, 64, 16).startswith(f"estimate: about {DEMO_MEASURED_S / 60:.0f} min on 2 quiet")
    assert "4 evaluations of 64 x 16" in demo_estimate(60, 20, 64, 16)
    assert "2 runs x 120 steps and 5 evaluations" in demo_estimate(120, 30, 64, 16)
    assert demo_estimate(2, 0, 8, 4).startswith("estimate: about 1")  # about 10-15 s: mostly start-up
