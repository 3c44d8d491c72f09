"""The benchmark commands still run and keep their machine-readable last lines (BENCHMARKS.md).

Smallest settings: these check that the scripts work end to end (gapo and TRL side by side, the
GEMM rate and the limit fraction, the memory paths), not the figures, which are benchmarks.

Each script's ``main`` runs here with the command's arguments and starts its children through
``_Children``: one child per command in a fresh interpreter (the protocol: ``python <script>
--one …`` prints its result as the last stdout line, which the parent parses), the others
through the same ``main`` in this process, from the command line the parent built, their stdout
parsed the same way. A fresh torch + transformers (+ TRL) interpreter costs ~10-14 s of CPU in
imports alone; these tests used to start nine."""

import contextlib
import io
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # whole benchmark commands at their smallest settings


def _script(name: str):
    """``benchmarks/<name>.py`` as a module (the directory is on ``sys.path`` while it imports)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


class _Children:
    """Stands in for ``subprocess`` in a benchmark script whose children are ``[sys.executable,
    <script>, *args]``: a child that ``fresh(args)`` selects runs as it would (a fresh
    interpreter); any other runs the script's ``main`` here with ``sys.argv = [<script>, *args]``
    and answers with what the process would have printed (stdout captured, exit status 0; an
    error raises here; its ``env`` is not needed: the scripts' children set their thread counts
    themselves). ``calls`` records every child's arguments."""

    def __init__(self, script, fresh):
        self.script, self.fresh, self.calls = script, fresh, []

    def run(self, cmd, *, env=None, capture_output=False, text=False, check=False):
        assert list(cmd[:2]) == [sys.executable, self.script.__file__], cmd
        args = [str(a) for a in cmd[2:]]
        self.calls.append(args)
        if self.fresh(args):
            out = timing.run(
                list(cmd),
                env=env,
                capture_output=capture_output,
                text=text,
                timeout=600,
                quiet_s=30,
                what=" ".join(args),
            )
            assert out.returncode == 0, (out.stderr or "")[-3000:]
            return out
        buf, argv = io.StringIO(), sys.argv
        sys.argv = [self.script.__file__, *args]
        try:
            with contextlib.redirect_stdout(buf):
                self.script.main()
        finally:
            sys.argv = argv
        return subprocess.CompletedProcess(cmd, 0, buf.getvalue() if capture_output else None, "")


@pytest.fixture
def in_process(monkeypatch):
    """``in_process(script, fresh)``: run ``script.main()`` with its children through ``_Children``,
    leaving this process's torch threads, RNG, task registry and transformers' log level as they
    were."""
    torch = pytest.importorskip("torch")
    from transformers.utils import logging as hf_logging

    from gapo import tasks

    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))  # bench_step registers its tasks
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # as the scripts' children have it
    threads = torch.get_num_threads()

    def go(script, fresh, *args):
        children = _Children(script, fresh)
        monkeypatch.setattr(script, "subprocess", children)
        monkeypatch.setattr(sys, "argv", [script.__file__, *args])
        buf = io.StringIO()
        try:
            with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(buf):
                script.main()
        finally:
            torch.set_num_threads(threads)
        return buf.getvalue().strip().splitlines()[-1], children.calls

    verbosity = hf_logging.get_verbosity()  # bench_trl_step.run_trl sets it to errors only
    yield go
    hf_logging.set_verbosity(verbosity)


def test_bench_step_both_sizes_last_line(in_process):
    """Both sizes, gapo and TRL: the GEMM rate's child runs in a fresh interpreter (torch alone:
    the cheapest), the policies' and the four systems' children here."""
    pytest.importorskip("trl")
    bench_step = _script("bench_step")
    line, calls = in_process(
        bench_step,
        lambda args: args[:2] == ["--one", "gemm"],
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
    assert calls[0][0] == "--make-policy" and [c[:2] for c in calls[1:]] == [
        ["--one", s] for s in ("gapo", "trl", "gemm", "gapo", "trl")
    ], calls
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


def test_bench_memory_last_line(in_process):
    """The command's protocol (a process per path, the ratio line) with the three paths the last
    line needs: ``chunked`` in a fresh interpreter, ``bounded`` and ``naive`` here (their updates
    are checked against ``chunked`` below; ``chunked+ent`` too)."""
    bench_memory = _script("bench_memory")
    line, calls = in_process(
        bench_memory,
        lambda args: args[:2] == ["--one", "chunked"],
        "--V",
        "512",
        "--T",
        "16",
        "--B",
        "2",
        "--paths",
        "chunked",
        "bounded",
        "naive",
    )
    assert [c[:2] for c in calls] == [["--one", p] for p in ("chunked", "bounded", "naive")], calls
    # the protocol, not the figures: ``bounded`` and ``naive`` ran in this warm process, whose peak
    # RSS (ru_maxrss, a lifetime high-water mark read lazily) is not their update's, so their
    # "MB" and the ratios can be any sign here
    m = re.fullmatch(r"ratio peak naive/chunked=(-?[\d.]+) naive/bounded=(-?[\d.]+) at T=16", line)
    assert m, line


def test_bench_memory_paths_compute_the_same_update():
    """Every path of ``bench_memory.one`` (in this process): the same loss and entropy from the
    chunked, checkpointed and full-logits log-probs; ``chunked+ent`` subtracts 0.01 × the
    token-mean entropy."""
    torch = pytest.importorskip("torch")
    bench_memory = _script("bench_memory")
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


def test_bench_reward_worker_last_line(monkeypatch, capsys):
    """benchmarks/bench_reward_worker.py at its smallest: the three paths agree on every reward
    (the script asserts it) and the last line has its four finite, positive ratios."""
    bench = _script("bench_reward_worker")
    monkeypatch.setattr(sys, "argv", ["bench_reward_worker.py", "--n", "4", "--reps", "1"])
    bench.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(re.findall(r"(\w+)=(\S+)", last))
    assert last.startswith("ratio ") and set(fields) == {"light", "light_batched", "heavy", "heavy_batched"}, last
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in fields.values()), last


def test_decode_products_reports_each_timing(monkeypatch, capsys):
    """benchmarks/decode_products.py at its smallest: the three timings, each with a finite,
    positive rate, and the products' share of the decoding step."""
    bench = _script("decode_products")
    monkeypatch.setattr(sys, "argv", ["decode_products.py", "--shape", "tiny", "--reps", "2", "--tokens", "3"])
    bench.main()
    out = capsys.readouterr().out
    rates = re.findall(r"^\s*(.+?): .* ms per token, +(\S+) GFLOP/s", out, re.M)
    assert [name for name, _ in rates] == ["layers' products alone", "head's product alone", "FastLM.step"], out
    assert all(math.isfinite(float(r)) and float(r) > 0 for _, r in rates), out
    assert re.search(r"products alone are \d+\.\d% of the decoding step's time", out), out


def test_profile_step_ranges_are_exclusive():
    """``profile_step.Ranges`` on a hand-driven clock: a range keeps its own time less the ranges
    opened inside it, and a wrapped function outside its ``inside`` ranges is not a range."""
    profile_step = _script("profile_step")
    now = [0.0]
    r = profile_step.Ranges(clock=lambda: now[0])

    def work(dt):
        now[0] += dt

    inner = r.wrap(work, "inner", inside=frozenset({"outer"}))
    r.enter("outer")  # t = 0
    work(1.0)
    inner(2.0)  # inside "outer": its own range
    r.enter("mid")
    inner(4.0)  # inside "mid": stays with "mid"
    r.exit()
    r.exit()  # t = 7
    inner(8.0)  # no range open: not timed
    assert dict(r.excl) == {"inner": 2.0, "mid": 4.0, "outer": 1.0}
    assert r.calls == {"inner": 1, "mid": 1, "outer": 1}


def test_profile_step_parts_add_up(monkeypatch, tmp_path):
    """benchmarks/profile_step.py at its smallest (both sizes, the compute-bound one at shape 5m
    and 4 tokens), in this process: every part of the table is there, no part is negative, the
    shares add up to the step, and the decode counts are per decoded token."""
    torch = pytest.importorskip("torch")
    from gapo import tasks

    profile_step = _script("profile_step")
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))  # run_gapo registers its tasks
    out = tmp_path / "profile.json"
    args = ["--configs", "tiny", "big", "--steps", "1", "--big-shape", "5m", "--big-tokens", "4"]
    monkeypatch.setattr(sys, "argv", ["profile_step.py", *args, "--gemm-n", "256", "--json", str(out)])
    threads, buf = torch.get_num_threads(), io.StringIO()
    try:
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(buf):
            profile_step.main()
    finally:
        torch.set_num_threads(threads)
    results = __import__("json").loads(out.read_text())
    assert set(results) == {"tiny", "big"}
    for name, r in results.items():
        parts = r["parts"]
        assert list(parts) == [k for k, _, _ in profile_step.PARTS], name
        assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0, abs=1e-9), name
        assert sum(r["groups"].values()) == pytest.approx(1.0, abs=1e-9), name
        assert all(p["cpu_s"] >= -1e-3 * r["step_cpu_s"] for p in parts.values()), (name, parts)
        for k in ("sampling.decode.layers", "sampling.decode.head", "update.forward.decoder", "update.backward"):
            assert parts[k]["share"] > 0, (name, k)
        assert 0 < r["head_share_of_decode"] < r["vocab_share_of_decode"] < 1, name
        assert r["ops_per_token_total"] == pytest.approx(sum(r["ops_per_token"].values())), name
        assert r["ops_per_token"]["sampling.decode.layers"] > 0, name
        assert all(0 < x for x in r["matmul_rates"].values()), name
    assert results["big"]["decode_steps"] == 4  # 5m's random model: no EOS within 4 tokens
    last = buf.getvalue().strip().splitlines()[-1]
    assert re.fullmatch(r"profile tiny:(\w+=[\d.]+,?){4} big:(\w+=[\d.]+,?){4}", last), last
