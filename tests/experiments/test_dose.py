"""gapo.experiments.dose: the dose-response analysis on synthetic cell summaries, its verdict
words, the family-wise (Holm) adjustment over the planned tests, the grid's regime-major order,
the report hook and the raw-record archive."""

import json
import math

import pytest

from gapo.experiments.dose import (
    analyse,
    dose_markdown,
    dose_report,
    trend_line,
    verdict_words,
)
from gapo.experiments.grid_spec import dose_spec, grid_cells, load_grid
from gapo.experiments.stats import mean_ci, t_pvalue

COMMON = {
    "train.epochs": 2,
    "train.prompts": 8,
    "train.group_size": 8,
    "train.steps": 4,
    "eval.problems": 4,
    "eval.samples": 4,
    "eval.every": 4,
}


def _grid(**kw):
    g = {
        "name": "dose-test",
        "seeds": [0, 1, 2],
        "order": "regime",
        "methods": ["drgrpo", "dapo", "gapo", "gapo_w40", "dapo_w40"],
        "method_defs": {
            "gapo_w40": {"algo.eps_schedule": "linear", "algo.eps_low": 0.2, "algo.eps_high_max": 0.4},
            "dapo_w40": {"algo.eps_schedule": "fixed", "algo.eps_low": 0.2, "algo.eps_high_max": 0.4},
        },
        "regimes": ["u32", "u4", "w"],
        "regime_defs": {
            "u32": {
                "base": "low",
                "methods": ["drgrpo", "dapo", "gapo"],
                "overrides": {"train.mini_batches": 16, "optim.lr": 5e-5},
            },
            "u4": {
                "base": "low",
                "methods": ["drgrpo", "dapo", "gapo"],
                "overrides": {"train.mini_batches": 2, "optim.lr": 2e-5},
            },
            "w": {
                "base": "low",
                "methods": ["gapo_w40", "dapo_w40"],
                "overrides": {"train.mini_batches": 16, "optim.lr": 5e-5},
            },
        },
        "dose": {
            "keys": ["after/pass@1", "after/pass@4"],
            "bootstrap": 200,
            "width": {"regime": "w", "at": "u32", "pairs": [["gapo", "dapo", 0.28], ["gapo_w40", "dapo_w40", 0.4]]},
        },
        "common": dict(COMMON),
    }
    g.update(kw)
    return load_grid(g)


def _cell(p1, clip, correct, clip_c1=None, before=0.1):
    s = {
        "after/pass@1": p1,
        "before/pass@1": before,
        "after/pass@4": min(1.0, 2 * p1),
        "train/clip/frac_high_pos": clip,
        "train/pass_rate_rise": 0.05,
        "clip/frac_high_by_c/1": clip if clip_c1 is None else clip_c1,
        "clip/frac_high_by_c/7": clip / 2,
    }
    return {"summary": s, "G": 8, "correct": {"before": [0, 0, 0, 0], "after": correct, "n": 4}}


def _cells():
    cells = {}
    for s, (ref, gap) in enumerate([(0.10, 0.13), (0.12, 0.16), (0.11, 0.12)]):
        cells[("u32", "drgrpo", s)] = _cell(ref, 0.08 + 0.01 * s, [1, 0, 0, 0], clip_c1=0.20)
        cells[("u32", "dapo", s)] = _cell(ref + 0.01, 0.05, [1, 0, 0, 0])
        cells[("u32", "gapo", s)] = _cell(gap, 0.06, [1, 1, 0, 0], clip_c1=0.15)
        cells[("w", "gapo_w40", s)] = _cell(gap + 0.02, 0.03, [1, 1, 1, 0])
        cells[("w", "dapo_w40", s)] = _cell(gap, 0.03, [1, 1, 0, 0])
    cells[("u4", "drgrpo", 0)] = _cell(0.1, 0.02, [0, 0, 0, 0])  # u4: one seed only -- not measured
    cells[("u4", "gapo", 0)] = _cell(0.1, 0.02, [0, 0, 0, 0])
    return cells


def test_order_regime_runs_every_seed_of_a_regime_first():
    g = _grid()
    cells = grid_cells(g)
    assert cells[:4] == [("u32", "drgrpo", 0), ("u32", "dapo", 0), ("u32", "gapo", 0), ("u32", "drgrpo", 1)]
    assert cells[9][0] == "u4" and cells[-1] == ("w", "dapo_w40", 2)
    seed_major = grid_cells(_grid(order="seed"))
    assert seed_major[3] == ("u4", "drgrpo", 0) and sorted(seed_major) == sorted(cells)
    with pytest.raises(ValueError, match="grid key 'order' is 'cell'"):
        _grid(order="cell")


def test_dose_spec_rejects_bad_blocks_before_anything_runs():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['keyz'\] under 'dose'"):
        _grid(dose={"keyz": []})
    with pytest.raises(ValueError, match=r"dose.comparisons: \['gapo', 'grpo'\]"):
        _grid(dose={"comparisons": [["gapo", "grpo"]]})
    with pytest.raises(ValueError, match=r"dose.width.regime: 'nope'"):
        _grid(dose={"width": {"regime": "nope", "at": "u32", "pairs": []}})
    with pytest.raises(ValueError, match=r"dose.keys: 'pass@1'"):
        _grid(dose={"keys": ["pass@1"]})
    assert dose_spec(_grid())["reference"] == "drgrpo"


def test_analyse_hand_computed():
    g, cells = _grid(), _cells()
    res = analyse(g, cells)
    u32, u4 = res["levels"]
    assert (u32["regime"], u32["updates"], u32["lr"]) == ("u32", 32, 5e-5)
    assert (u4["updates"], u4["mini_batches"]) == (4, 2)
    assert u32["clip"]["mean"] == pytest.approx(0.09) and u32["clip"]["n"] == 3  # Dr.GRPO's clip-binding share
    assert u32["clip/frac_high_by_c"][1]["mean"] == pytest.approx(0.20)
    assert u32["gapo_clip_c"][1]["mean"] == pytest.approx(-0.05)  # GAPO − Dr.GRPO at c = 1
    assert u32["n_done"] == {"drgrpo": 3, "dapo": 3, "gapo": 3} and u4["n_done"]["dapo"] == 0
    assert u32["rose"] == [3, 3]
    # the plan's rule: rose in >= 70% of the planned seeds and a held-out gain whose interval is above 0
    gains = [0.10 - 0.1, 0.12 - 0.1, 0.11 - 0.1]
    assert mean_ci(gains)["mean"] - mean_ci(gains)["ci"] < 0 and u32["learns"] == "no"
    assert u4["learns"] == "undetermined (1 of 3 seeds)"
    # the primary family is every planned test: 2 cells x 2 comparisons x 2 keys
    assert res["family_size"] == 8 and len(res["primary"]) == 8
    p = next(
        x
        for x in res["primary"]
        if x["a"] == ["u32", "gapo"] and x["b"] == ["u32", "drgrpo"] and x["key"] == "after/pass@1"
    )
    d = [0.03, 0.04, 0.01]
    assert p["mean"] == pytest.approx(mean_ci(d)["mean"]) and p["ci"] == pytest.approx(mean_ci(d)["ci"])
    assert p["p"] == pytest.approx(t_pvalue(d))
    # per-problem pass@1 difference is (0, .25, 0, 0) for every seed: the bootstrap sees the problems
    assert p["boot_lo"] == pytest.approx(0.0) and p["boot_hi"] > 0.0
    # Holm: unmeasured tests count as p = 1, so the smallest p is multiplied by the whole family
    ps = sorted(x["p"] for x in res["primary"] if x["n"] >= 2)
    assert min(x["p_holm"] for x in res["primary"]) == pytest.approx(min(1.0, 8 * ps[0]))
    assert all(x["p_holm"] == 1.0 for x in res["primary"] if x["n"] < 2)
    assert next(x for x in res["primary"] if x["a"][0] == "u4")["verdict"].startswith("not measured")


def test_trend_is_the_slope_of_the_differences_on_the_clip_share():
    res = analyse(_grid(), _cells())
    t = next(
        x for x in res["trend"] if (x["cells"], x["a"], x["b"], x["key"]) == ("all", "gapo", "drgrpo", "after/pass@1")
    )
    # u32: differences 0.03, 0.04, 0.01 at share 0.09; u4: one seed, difference 0 at share 0.02.
    # mean x 0.0725, mean y 0.02: Sxx 0.003675, Sxy 0.0014, slope 8/21
    assert t["slope"] == pytest.approx(8 / 21) and t["n"] == 4 and t["regimes"] == ["u32", "u4"]
    assert math.isfinite(t["ci"]) and 0 < t["p"] < 1
    dapo = next(x for x in res["trend"] if (x["cells"], x["b"], x["key"]) == ("all", "dapo", "after/pass@1"))
    assert dapo["regimes"] == ["u32"] and math.isnan(dapo["slope"])  # u4 ran no DAPO: one share, no slope
    # no cell learns here (u32 fails the rule, u4 is undetermined): the learning-cells trend is empty
    assert all(x["n"] == 0 for x in res["trend"] if x["cells"] == "learning")
    # 2 cell-sets x 2 comparisons x 2 keys, counted among the secondary intervals
    assert len(res["trend"]) == 8
    # GAPO − Dr.GRPO clipping at c = 1, 2 in both cells (once, though GAPO has two comparators), the width
    # block's between-method rows, the trend rows
    assert res["n_secondary_intervals"] == 2 * 2 + sum(1 for x in res["width"] if x.get("b")) + 8


def test_a_single_cell_grid_has_no_trend_and_counts_none():
    # the shape of configs/confirm-medium.yaml: one regime, no width block
    g = _grid(regimes=["u32"], methods=["drgrpo", "dapo", "gapo"], dose={"keys": ["after/pass@1"], "bootstrap": 50})
    cells = {k: v for k, v in _cells().items() if k[0] == "u32"}
    res = analyse(g, cells)
    assert [lv["regime"] for lv in res["levels"]] == ["u32"] and res["trend"] == [] and res["width"] == []
    assert res["family_size"] == 2
    assert res["n_secondary_intervals"] == 2  # GAPO − Dr.GRPO clipping at c = 1, 2 only
    md = dose_markdown(res)
    assert "## Trend" not in md and md.startswith("# Pre-registered comparison (dose-test)")
    assert dose_markdown(analyse(_grid(), _cells())).startswith("# Dose-response on the clip (dose-test)")


def test_the_figure_draws_the_trend_tables_line():
    res = analyse(_grid(), _cells())
    # the hand-computed trend above: slope 8/21, through (mean x 0.0725, mean y 0.02)
    (xs, ys), label = trend_line(res, "gapo", "drgrpo", "after/pass@1", [0.09, 0.02])
    assert xs == pytest.approx([2.0, 9.0])
    assert ys == pytest.approx([(0.02 + 8 / 21 * (x - 0.0725)) * 100 for x in (0.02, 0.09)])
    assert label.startswith("gapo − drgrpo: slope +0.38 [")
    assert trend_line(res, "gapo", "dapo", "after/pass@1", [0.09]) is None  # one share: no slope


def test_width_pairs_read_the_dose_cell_and_the_width_block():
    res = analyse(_grid(), _cells())
    w28 = [x for x in res["width"] if x["width"] == 0.28 and x.get("b")]
    w40 = [x for x in res["width"] if x["width"] == 0.4 and x.get("b")]
    assert w28[0]["a"] == ["u32", "gapo"] and w28[0]["b"] == ["u32", "dapo"]
    assert w40[0]["a"] == ["w", "gapo_w40"] and w40[0]["b"] == ["w", "dapo_w40"]
    assert w40[0]["mean"] == pytest.approx(0.02) and w40[0]["key"] == "after/pass@1"
    vs_ref = next(x for x in w40 if x["b"] == ["u32", "drgrpo"])  # GAPO at 0.4 against fixed 0.2, across regimes
    assert vs_ref["n"] == 3


def test_verdict_words():
    gain = {"mean": 0.02, "ci": 0.01, "n": 10, "p_holm": 0.01}
    assert verdict_words(gain) == "a gain of +2.0 [+1.0, +3.0] points"
    assert verdict_words({**gain, "mean": -0.02}) == "a loss of -2.0 [-3.0, -1.0] points"
    # interval above 0 but not surviving Holm: not a gain, and the words say how large a gain is ruled out
    assert verdict_words({**gain, "p_holm": 0.2}) == "no gain above +3.0 points"
    assert verdict_words({"mean": 0.004, "ci": 0.0151, "n": 10, "p_holm": 1.0}) == "no gain above +2.0 points"
    assert verdict_words({"mean": -0.02, "ci": 0.005, "n": 10, "p_holm": 0.3}) == "no gain (upper end -1.5 points)"
    assert verdict_words({"mean": 0.1, "ci": math.nan, "n": 1}) == "not measured (n = 1)"


def test_dose_report_writes_tables_and_figure(tmp_path):
    g, cells = _grid(), _cells()
    link = dose_report(g, cells, tmp_path / "r", tmp_path / "f")
    md = (tmp_path / "r" / "dose.md").read_text()
    assert "dose.md" in link and (tmp_path / "f" / "dose_response.png").stat().st_size > 1000
    assert "Holm over all 8 planned tests" in md and "| `u32` | 32 (16 × 2) | 5e-05 | 3 / 3 / 3 |" in md
    assert "no gain above" in md or "a gain of" in md
    res = json.loads((tmp_path / "r" / "dose.json").read_text())
    assert res["family_size"] == 8


def _write_cell(d, pass1, clip, correct):
    d.mkdir(parents=True)
    train = [
        {
            "step": i,
            "kind": "train",
            "rollout/pass_rate": 0.1 * i,
            "clip/frac_high_pos": clip,
            "clip/frac_high_by_c/1": clip,
            "clip/tokens_pos_by_c/1": 10.0,
            "time/step_s": 1.0,
        }
        for i in (1, 2)
    ]
    evals = [
        {"kind": "eval", "step": 0, "eval/pass@1": 0.05, "eval/pass@4": 0.1, "eval/n": 4, "eval/correct": [0, 0, 1, 0]},
        {
            "kind": "eval",
            "step": 2,
            "eval/pass@1": pass1,
            "eval/pass@4": min(1, 2 * pass1),
            "eval/n": 4,
            "eval/correct": correct,
        },
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [evals[0], *train, evals[1]]))
    (d / "config.yaml").write_text("train: {group_size: 8}\neval: {samples: 4}\n")
    (d / "done.json").write_text(json.dumps({"step": 2, "correct": correct}))


def test_compare_report_only_writes_the_dose_report_from_run_folders(tmp_path):
    """`gapo compare --report-only` on a dose grid's folders: the grid tables plus dose.md, dose.json,
    the figure and every cell's per-problem counts; resumable in the sense that it reads whatever
    cells have finished (here u32 only)."""
    from gapo.experiments.report import grid_report

    g = _grid()
    out = tmp_path / "runs"
    for s in g["seeds"]:
        _write_cell(out / "u32" / "drgrpo" / f"seed{s}", 0.10 + 0.01 * s, 0.08, [1, 0, 0, 0])
        _write_cell(out / "u32" / "dapo" / f"seed{s}", 0.11, 0.05, [1, 0, 0, 0])
        _write_cell(out / "u32" / "gapo" / f"seed{s}", 0.14 + 0.01 * s, 0.06, [1, 1, 0, 0])
    grid_report(g, out, tmp_path / "rep", tmp_path / "rep" / "fig", say=lambda s: None)
    md = (tmp_path / "rep" / "dose.md").read_text()
    assert "| `u32` | 32 (16 × 2) | 5e-05 | 3 / 3 / 3 | 8.0 ± 0.0 |" in md
    assert "| `u4` | 4 (2 × 2) | 2e-05 | 0 / 0 / 0 | – |" in md  # planned, not run: shown as such
    assert (tmp_path / "rep" / "fig" / "dose_response.png").is_file()
    assert "dose.md" in (tmp_path / "rep" / "tables.md").read_text()
    pp = json.loads((tmp_path / "rep" / "per_problem.json").read_text())
    assert pp["u32/gapo/seed0"] == {"before": [0, 0, 1, 0], "after": [1, 1, 0, 0], "n": 4} and len(pp) == 9
    res = json.loads((tmp_path / "rep" / "dose.json").read_text())
    row = next(
        p
        for p in res["primary"]
        if p["a"] == ["u32", "gapo"] and p["b"] == ["u32", "drgrpo"] and p["key"] == "after/pass@1"
    )
    assert row["mean"] == pytest.approx(0.04) and row["boot_lo"] == pytest.approx(0.0)


def test_a_rerun_reuses_every_regimes_base_evaluation(tmp_path, monkeypatch):
    """A rerun of a grid (resuming it) must not re-evaluate the base of every regime: the recorded
    eval_cfg is compared as JSON (the task's num_range tuple comes back from the file as a list).
    Before the fix every invocation re-ran one 64 x 64-sample evaluation per regime."""
    from gapo.experiments import grid_bases, grid_spec

    g = _grid()
    for r in g["regimes"]:
        spec = g["_regimes"][r]
        ev = {
            **grid_bases._eval_cfg(g, r),
            "base_key": grid_spec.pretrain_config(spec).cache_key(),
            "task": grid_spec.regime_task(spec),
        }
        assert isinstance(ev["task"]["params"]["num_range"], tuple)  # what made the old comparison fail
        policy = tmp_path / "policy"  # the base is still on this machine (else phase 1 rebuilds it)
        policy.mkdir(exist_ok=True)
        (policy / "config.json").write_text("{}")
        grid_spec.write_json(
            tmp_path / r / "base_eval.json", {"policy": str(policy), "eval_cfg": ev, "eval": {"eval/pass@1": 0.1}}
        )
    jobs = []
    monkeypatch.setattr(grid_bases, "run_jobs", lambda prep, workers, say, *a, **kw: jobs.extend(prep))
    bases = grid_bases.prepare_regimes(g, tmp_path, 0.0, lambda s: None)
    assert jobs == [] and set(bases) == set(g["regimes"])


def test_learns_rule():
    from gapo.experiments.dose import _learns

    lv = {"rose": [7, 10], "gain_pass@1": {"mean": 0.05, "ci": 0.02, "n": 10}}
    assert _learns(lv, 10) == "yes"
    assert _learns({**lv, "rose": [6, 10]}, 10) == "no"  # rose in fewer than 70% of the seeds
    assert _learns({**lv, "gain_pass@1": {"mean": 0.05, "ci": 0.06, "n": 10}}, 10) == "no"  # gain's interval reaches 0
    assert _learns({**lv, "rose": [7, 9]}, 10) == "undetermined (9 of 10 seeds)"
