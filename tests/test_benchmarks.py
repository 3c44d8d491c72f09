"""The benchmark commands still run and keep their machine-readable last lines (BENCHMARKS.md).

Smallest settings: these check that the scripts work end to end (gapo and TRL side by side, the
GEMM rate and the limit fraction, the memory paths), not the figures, which are benchmarks."""

import math
import os
import re
import sys
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # six and three fresh processes (torch, transformers, TRL each)


def _last_line(*args: str) -> str:
    out = timing.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        quiet_s=120,
        what=" ".join(args),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_bench_step_both_sizes_last_line():
    pytest.importorskip("trl")
    line = _last_line(
        "benchmarks/bench_step.py",
        "--configs",
        "tiny",
        "big",
        "--reps",
        "1",
        "--steps",
        "1",
        "--mu",
        "1",
        "--big-reps",
        "1",
        "--big-shape",
        "5m",
        "--big-tokens",
        "4",
        "--gemm-n",
        "512",
    )
    fields = dict(re.findall(r"(\w+)=([^\s]+)", line))
    assert line.startswith("ratio ") and set(fields) == {
        "step_time",
        "peak_rss",
        "big_step_time",
        "big_peak_rss",
        "big_limit_frac",
    }, line
    for k, v in fields.items():
        assert math.isfinite(float(v)) and float(v) > 0, (k, v)
    assert float(fields["big_limit_frac"]) < 1.5  # a fraction of the measured GEMM rate, not a raw rate


def test_bench_memory_last_line():
    """The command's protocol (a fresh process per path, the ratio line) with the three paths the
    last line needs; ``chunked+ent`` runs in-process below (one fresh torch + transformers
    interpreter less)."""
    line = _last_line(
        "benchmarks/bench_memory.py", "--V", "512", "--T", "16", "--B", "2", "--paths", "chunked", "bounded", "naive"
    )
    m = re.fullmatch(r"ratio peak naive/chunked=([\d.]+) naive/bounded=([\d.]+) at T=16", line)
    assert m, line


def test_bench_memory_paths_compute_the_same_update():
    """Every path of ``bench_memory.one`` (in this process): the same loss and entropy from the
    chunked, checkpointed and full-logits log-probs; ``chunked+ent`` subtracts 0.01 × the
    token-mean entropy."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_memory
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        r = {p: bench_memory.one(p, V=512, B=2, T=16, threads=threads) for p in bench_memory.PATHS}
    torch.set_num_threads(threads)
    base = r["chunked"]
    for p in ("bounded", "naive"):
        assert r[p]["loss"] == pytest.approx(base["loss"], rel=1e-5, abs=1e-6), p
        assert r[p]["entropy"] == pytest.approx(base["entropy"], rel=1e-5), p
    assert r["chunked+ent"]["entropy"] == pytest.approx(base["entropy"], rel=1e-5)
    assert base["entropy"] > 0
    # token-mean entropy = entropy sum / response tokens; each row has T/2..T of them (B·T/2..B·T)
    gap = base["loss"] - r["chunked+ent"]["loss"]
    assert 0.01 * base["entropy"] / 32 - 1e-6 <= gap <= 0.01 * base["entropy"] / 16 + 1e-6, gap
