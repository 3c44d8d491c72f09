"""``gapo compare`` (gapo.experiments.grid, .cell, .report): a tiny grid end to end (cells, skip,
resume, failure isolation, report) and bad input."""

import json
import os
from pathlib import Path

import pytest

from gapo.experiments.grid import run_grid
from gapo.experiments.grid_spec import load_grid
from gapo.experiments.report import grid_report

TASK = {"n_numbers": 2, "num_range": [1, 10]}
# the tiny base of tests/test_trainer.py (EASY): 2-number Countdown, micro Llama, 150 SFT steps
EASY = {
    "name": "test-easy",
    "task": "countdown",
    "sft_mix": [[TASK, 1.0]],
    "rl_task": TASK,
    "model_preset": "micro",
    "pool_size": 300,
    "batch_size": 32,
    "max_steps": 150,
    "time_budget_s": None,
    "lr": 1e-2,
    "warmup_steps": 10,
}
COMMON = {
    "train.steps": 2,
    "train.prompts": 4,
    "train.group_size": 4,
    "train.mini_batches": 2,
    "train.checkpoint_every": 1,
    "task.train_size": 200,
    "eval.problems": 6,
    "eval.samples": 4,
    "eval.every": 0,
    "optim.lr": 1e-3,
}


def _grid(**kw):
    g = {
        "name": "test",
        "regimes": ["easy"],
        "regime_defs": {"easy": {"base": EASY}},
        "methods": ["drgrpo", "gapo"],
        "seeds": [0],
        "common": dict(COMMON),
        "workers": 2,
    }
    g.update(kw)
    return g


def _occupy(out: Path, method: str = "boom") -> Path:
    """Make the cell ``easy/<method>/seed0`` fail in its own process: its run folder holds a file
    that is not a gapo run, which the grid's up-front checks do not look at and the cell refuses
    to overwrite (it fails before it imports torch, so in about a second)."""
    d = out / "easy" / method / "seed0"
    d.mkdir(parents=True)
    (d / "notes.txt").write_text("not a gapo run")
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GAPO_CACHE", str(tmp_path_factory.getbasetemp() / "compare-cache"))


@pytest.fixture
def easy_cache(easy_policy, monkeypatch):
    """The cache that holds tests/conftest.py's session policy: EASY here is the same pretraining
    (one cache key), so a grid of regime ``easy`` finds its base there instead of training it again."""
    monkeypatch.setenv("GAPO_CACHE", str(Path(easy_policy).parents[1]))


def test_unknown_names_are_listed():
    with pytest.raises(ValueError, match=r"unknown method 'gapoo'.*'gapo'"):
        load_grid(_grid(methods=["gapoo"]))
    with pytest.raises(ValueError, match=r"unknown regime 'thre'.*'three'"):
        load_grid(_grid(regimes=["thre"]))
    with pytest.raises(ValueError, match=r"unknown task.*'cuontdown'.*'countdown'"):
        load_grid(_grid(regime_defs={"easy": {"base": {**EASY, "task": "cuontdown"}}}))
    with pytest.raises(ValueError, match=r"unknown config key"):
        load_grid(_grid(common={"train.stepz": 3}))
    with pytest.raises(ValueError, match=r"unknown grid key"):
        load_grid({**_grid(), "methodz": []})
    with pytest.raises(ValueError, match=r"unknown method \(regime 'easy'.*'dapo'"):
        load_grid(_grid(regime_defs={"easy": {"base": EASY, "methods": ["dapo"]}}))


def test_regime_method_subsets():
    from gapo.experiments.grid_spec import grid_cells

    g = load_grid(
        _grid(
            regimes=["easy", "easy2"],
            seeds=[0, 1],
            regime_defs={"easy": {"base": EASY}, "easy2": {"base": EASY, "methods": ["gapo"]}},
        )
    )
    cells = grid_cells(g)
    assert len(cells) == 2 * (2 + 1) and ("easy2", "drgrpo", 0) not in cells
    assert cells[:3] == [("easy", "drgrpo", 0), ("easy", "gapo", 0), ("easy2", "gapo", 0)]  # seed-major


def test_quick_grid_file_is_valid():
    g = load_grid(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grid-quick.yaml"))
    assert g["methods"] and g["regimes"] and g["seeds"]
    full = load_grid(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grid.yaml"))
    assert len(full["seeds"]) >= 5
    assert set(full["regimes"]) == {"low", "three", "high"} and len(full["methods"]) == 10
    # the learning rates the calibration's rule picked (configs/calibrate-regimes.yaml)
    from gapo.experiments.grid_spec import cell_config

    lrs = {r: cell_config(full, r, "gapo", 0, base_path="x").optim.lr for r in full["regimes"]}
    assert lrs == {"low": 2e-5, "three": 1e-5, "high": 5e-5}


def test_every_committed_grid_file_loads():
    """RESULTS.md's commands name these files: each must still load (methods, regimes, keys)."""
    import glob

    files = [
        f
        for f in glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "*.yaml"))
        if "name:" in open(f).read() and "methods:" in open(f).read()
    ]
    assert len(files) >= 5
    for f in files:
        g = load_grid(f)
        assert g["methods"] and g["regimes"] and g["seeds"], f


@pytest.mark.slow
def test_grid_runs_skips_resumes_and_isolates_failures(tmp_path, easy_cache, monkeypatch):
    from gapo.experiments.grid_spec import cell_config, cell_dir
    from gapo.rl.trainer import Trainer

    g = load_grid(_grid(method_defs={"boom": {}}, methods=["drgrpo", "gapo", "boom"]))
    out = tmp_path / "grid"
    _occupy(out)
    # an interrupted cell: one of two steps done and checkpointed before the grid starts
    from gapo.experiments.grid_spec import pretrain_config
    from gapo.policy.base_policy import get_base_policy

    base = str(get_base_policy(pretrain_config(g["_regimes"]["easy"]), progress=False))
    d = cell_dir(out, "easy", "gapo", 0)
    # one torch thread, as a cell process gets (experiments.pool.spawn): the run records it and its resume in
    # the cell keeps it; without it the trainer would time its thread probe here (machine/threads.py)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    Trainer(cell_config(g, "easy", "gapo", 0, base_path=base), d).fit(stop_after=1)
    assert (d / "checkpoint.pt").is_file()

    said = []
    stats = run_grid(g, out, say=said.append)
    assert stats["done"] == 2 and stats["failed"] == 1, stats
    # it says what phase 1 does and estimates phase 2 before it starts (no cell finished yet here)
    assert any(s.startswith("regime easy: base policy") and "is cached" in s for s in said), said
    assert any(s.startswith("estimate: no cell time known yet") for s in said), said
    # the base evaluation records which weights it evaluated (what a resume elsewhere checks against)
    from gapo.experiments.grid_bases import weights_sha256

    rec = json.loads((out / "easy" / "base_eval.json").read_text())
    assert rec["policy"] == base and rec["weights_sha256"] == weights_sha256(base) is not None
    for m in ("drgrpo", "gapo"):
        done = json.loads((cell_dir(out, "easy", m, 0) / "done.json").read_text())
        assert done["step"] == 2 and "eval/pass@1" in done["eval"]
    assert json.loads((d / "done.json").read_text())["resumed"] is True
    failed = json.loads((cell_dir(out, "easy", "boom", 0) / "failed.json").read_text())
    assert "refusing to overwrite" in failed["error"], failed
    assert "refusing to overwrite" in cell_dir(out, "easy", "boom", 0).with_name("seed0.log").read_text()
    # the pre-training evaluation is shared: identical in every cell
    evals = [
        json.loads((cell_dir(out, "easy", m, 0) / "metrics.jsonl").read_text().splitlines()[0])
        for m in ("drgrpo", "gapo")
    ]
    assert evals[0]["eval/pass@1"] == evals[1]["eval/pass@1"] and evals[0]["step"] == 0

    # a second invocation redoes nothing
    mtime = (cell_dir(out, "easy", "drgrpo", 0) / "done.json").stat().st_mtime
    stats = run_grid(g, out, say=lambda s: None)
    assert stats["done"] == 0 and stats["skipped"] == 3
    assert (cell_dir(out, "easy", "drgrpo", 0) / "done.json").stat().st_mtime == mtime

    # a grid that would run a finished cell differently stops before anything runs or is written
    def snapshot():
        return {str(f): f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()}

    before = snapshot()
    lr = load_grid(
        _grid(
            common={**COMMON, "optim.lr": 2e-3},
            method_defs={"boom": {}},
            methods=["drgrpo", "gapo", "boom"],
        )
    )
    with pytest.raises(ValueError, match=r"easy/drgrpo/seed0 \(optim.lr: 0.001 -> 0.002\)"):
        run_grid(lr, out, say=lambda s: None)
    rebased = load_grid(_grid(regime_defs={"easy": {"base": {**EASY, "max_steps": 149}}}))
    with pytest.raises(ValueError, match=r"base policy of regime\(s\) \['easy'\] changed"):
        run_grid(rebased, out, say=lambda s: None)
    assert snapshot() == before

    md = grid_report(g, out, tmp_path / "rep", say=lambda s: None)
    text = md.read_text()
    assert "| gapo |" in text and "boom" in text  # the failed cell is listed
    assert "\n\n*passk.png: Held-out pass@k after RL per method" in text  # figures come with captions
    assert "*ratio_adv_corr.png: r(|ρ−1|, A), windowed: Pearson's r" in text
    # every table row has its header's number of cells (a '|' inside a name would break one)
    import re

    ncols = None
    for line in text.splitlines():
        if not line.startswith("|"):
            ncols = None
            continue
        n = len(re.split(r"(?<!\\)\|", line)) - 2
        ncols = n if ncols is None else ncols
        assert n == ncols, line
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["n_cells_done"] == 2
    assert summary["paired"]["easy"]["gapo"]["vs"] == "drgrpo"
    # the per-c aggregates under their metric's keys, in summary.json and cells.csv alike
    agg = summary["aggregate"]["easy"]["gapo"]
    assert "clip/frac_high_by_c/1" in agg and "clip/ratio_dev_pos_by_c/1" in agg and "clip/eps_high_by_c/1" in agg
    header = (tmp_path / "rep" / "cells.csv").read_text().splitlines()[0].split(",")
    assert {k for k in agg if "_by_c/" in k} <= set(header)
    assert "Clipped share of positive-advantage tokens (%) by c" in text
    assert (tmp_path / "rep" / "passk.png").is_file() and (tmp_path / "rep" / "clip_by_c.png").is_file()


def test_cli_report_only_without_cells_fails_clearly(tmp_path, capsys):
    import yaml

    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(_grid()))
    from gapo.cli import main as cli_main

    rc = cli_main(["compare", "--config", str(p), "--out", str(tmp_path / "none"), "--report-only"])
    assert rc == 2 and "no finished cells" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_retry_failed_reruns_failed_cells(tmp_path, capsys, easy_policy):
    import yaml

    from gapo.cli import main as cli_main
    from gapo.experiments.grid_bases import base_eval_cfg
    from gapo.experiments.grid_spec import write_json

    grid = _grid(method_defs={"boom": {}}, methods=["boom"])
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(grid))
    out = tmp_path / "grid"
    _occupy(out)
    # the regime's base evaluation as phase 1 leaves it (phase 1 itself: the test above), so that
    # only the failing cell runs here
    write_json(
        out / "easy" / "base_eval.json",
        {"policy": str(easy_policy), "eval_cfg": base_eval_cfg(load_grid(grid), "easy"), "eval": {}},
    )
    args = ["compare", "--config", str(p), "--out", str(out)]
    assert cli_main(args) == 2  # the only cell fails, so there is nothing to report
    said = capsys.readouterr().out
    assert "grid: 0 cells run, 1 failed, 0 skipped of 1" in said and "base policy" not in said  # no phase 1
    failed = out / "easy" / "boom" / "seed0" / "failed.json"
    mtime = failed.stat().st_mtime_ns
    assert cli_main(args) == 2  # skipped, not retried
    assert "grid: 0 cells run, 1 failed, 1 skipped of 1" in capsys.readouterr().out
    assert failed.stat().st_mtime_ns == mtime
    assert cli_main(args + ["--retry-failed"]) == 2
    assert "grid: 0 cells run, 1 failed, 0 skipped of 1" in capsys.readouterr().out
    assert failed.stat().st_mtime_ns != mtime


def test_a_cell_that_fails_its_checks_ends_without_importing_torch(tmp_path):
    """The cell's checks (spec, config, its run folder) come before torch and the trainer load:
    such a cell records its failure in about a second, not after ~10 s of imports."""
    import subprocess
    import sys

    from gapo.experiments.grid_spec import cell_config, cell_file, write_json
    from gapo.rl.config import to_dict

    g = load_grid(_grid(method_defs={"boom": {}}, methods=["boom"]))
    d = _occupy(tmp_path / "grid")
    cfg = to_dict(cell_config(g, "easy", "boom", 0, base_path="x"))
    write_json(cell_file(d, "json"), {"regime": "easy", "method": "boom", "seed": 0, "config": cfg})
    code = (
        "import json, sys; from gapo.experiments.cell import main; rc = main(['--cell', sys.argv[1]]); "
        "print(json.dumps({'rc': rc, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))"
    )
    p = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=300)
    assert json.loads(p.stdout.splitlines()[-1]) == {"rc": 1, "heavy": []}, p.stdout + p.stderr
    assert "refusing to overwrite" in json.loads((d / "failed.json").read_text())["error"]
    assert (d / "notes.txt").read_text() == "not a gapo run"  # left as it was


def test_estimate_from_finished_cells_then_from_cell_s(tmp_path):
    from gapo.experiments.grid import _cell_seconds, estimate_line
    from gapo.experiments.grid_spec import cell_dir

    g = load_grid(_grid(methods=["drgrpo", "gapo"], cell_s=50))
    assert _cell_seconds(g, tmp_path) == (50.0, "the grid's cell_s")
    for m, wall in (("drgrpo", 30.0), ("gapo", 90.0)):
        d = cell_dir(tmp_path, "easy", m, 0)
        d.mkdir(parents=True)
        (d / "done.json").write_text(json.dumps({"wall_s": wall}))
    cell_s, src = _cell_seconds(g, tmp_path)
    assert cell_s == 60.0 and "2 finished cells" in src
    assert estimate_line(8, 2, 60.0, src).startswith("estimate: 8 cells x ~60 s / 2 workers = about 4 min")
    assert "about 30 s" in estimate_line(1, 2, 30.0, "x")  # one cell: one worker busy
    with pytest.raises(ValueError, match="unknown grid key 'cell_seconds'"):
        load_grid(_grid(cell_seconds=50))


def test_prepare_bar_follows_the_logs(tmp_path):
    from gapo.experiments.grid_bases import _PrepareBar

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("pretrain base (x): step 50, 20% done, loss 1.0\npretrain base (x): step 100, 45% done, loss 0.9\n")
    bar = _PrepareBar([("a", a), ("b", b)])  # b not written yet
    bar.refresh()
    assert bar.done == 45 and bar.total == 200
    b.write_text("pretrain base (y): done, 100% done, 10 steps\n")
    bar.refresh()
    assert bar.done == 145
    bar.close()
