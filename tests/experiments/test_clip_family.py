"""gapo.experiments.clip_family: the adaptive-clips report on synthetic cells (hand-computed
means and intervals, the first lines' answer, partial grids, the figures) and the pre-registered
plan configs/adaptive-clips.yaml."""

import json
import math
from pathlib import Path

import pytest
import yaml

from gapo.experiments.clip_family import analyse_family, comparator, family_markdown, per_c_plot
from gapo.experiments.dose import analyse, dose_report
from gapo.experiments.grid_spec import grid_cells, load_grid
from gapo.experiments.stats import t975

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "configs" / "adaptive-clips.yaml"
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
        "name": "family-test",
        "seeds": [0, 1, 2],
        "order": "regime",
        "methods": ["drgrpo", "dapo", "gapo", "soft"],
        "method_defs": {"soft": {"algo.eps_schedule": "fixed", "algo.eps_low": 0.2, "algo.eps_high_max": 0.4}},
        "regimes": ["bound", "cal"],
        "regime_defs": {
            "bound": {"base": "low", "overrides": {"train.mini_batches": 8, "optim.lr": 5e-5}},
            "cal": {"base": "low", "overrides": {"train.mini_batches": 8, "optim.lr": 2e-5}},
        },
        "dose": {"comparisons": [["gapo", "dapo"], ["soft", "dapo"]], "keys": ["after/pass@1"], "bootstrap": 0},
        "common": dict(COMMON),
    }
    g.update(kw)
    return load_grid(g)


def _cell(p1, c1, c2=0.01, dev1=0.1, gates=None):
    s = {
        "after/pass@1": p1,
        "before/pass@1": 0.05,
        "clip/frac_high_by_c/1": c1,
        "clip/frac_high_by_c/2": c2,
        "clip/ratio_dev_pos_by_c/1": dev1,
    }
    train = [{"clip/gate_by_c/1": g} for g in gates or []]  # the gate is read from the steps
    return {"summary": s, "train": train, "G": 8}


def _cells():
    """`bound` complete; `cal` has Dr.GRPO and DAPO at seed 0 only, GAPO and `soft` not at all."""
    cells = {}
    for s in range(3):
        cells[("bound", "drgrpo", s)] = _cell(0.10, 0.09)
        cells[("bound", "dapo", s)] = _cell(0.10, 0.06, c2=0.03)
        cells[("bound", "gapo", s)] = _cell(0.10 + 0.01 * s, 0.05)
        # soft: +10 points of pass@1 over DAPO at every seed (survives Holm), clip c = 1 2/3/4 %
        soft = _cell(0.20 + 0.001 * (s - 1), 0.02 + 0.01 * s, dev1=0.2 + 0.1 * s, gates=[0.5, 0.7])
        cells[("bound", "soft", s)] = soft
    cells[("cal", "drgrpo", 0)] = _cell(0.12, 0.04)
    cells[("cal", "dapo", 0)] = _cell(0.12, 0.03)
    return cells


def _family():
    g, cells = _grid(), _cells()
    return analyse_family(g, cells, analyse(g, cells))


def test_comparator_is_the_one_method_every_pair_is_compared_with():
    assert comparator(_grid()) == "dapo"
    # the dose-response's pairs (against Dr.GRPO and against DAPO) are not a family of rules
    assert comparator(_grid(dose={"comparisons": [["gapo", "drgrpo"], ["gapo", "dapo"]]})) is None
    assert comparator(_grid(dose={"comparisons": [["gapo", "dapo"]]})) is None  # one pair
    assert comparator(_grid(dose={"comparisons": [["gapo", "drgrpo"], ["soft", "drgrpo"]]})) is None  # the reference
    with pytest.raises(ValueError, match="not a family of rules"):
        analyse_family(_grid(dose={"comparisons": [["gapo", "drgrpo"]]}), {}, {"primary": [], "family_size": 0})


def test_hand_computed_table_values():
    fam = _family()
    row = {(x["regime"], x["method"]): x for x in fam["rows"]}
    soft = row[("bound", "soft")]
    assert soft["n_done"] == 3
    assert soft["clip/frac_high_by_c"][1]["mean"] == pytest.approx(0.03)
    # soft − DAPO at c = 1: -0.04, -0.03, -0.02 -> mean -0.03, sd 0.01, 95% t half-width t_2 · 0.01 / √3
    d = soft["clip_minus_comparator"][1]
    assert d["mean"] == pytest.approx(-0.03) and d["ci"] == pytest.approx(t975(2) * 0.01 / math.sqrt(3))
    assert soft["clip_minus_comparator"][2]["mean"] == pytest.approx(0.01 - 0.03)
    assert soft["clip/ratio_dev_pos_by_c"][1]["mean"] == pytest.approx(0.3)
    assert soft["clip/gate_by_c"][1] == {"mean": pytest.approx(0.6), "ci": pytest.approx(0.0), "n": 3}
    assert soft["pass@1"]["mean"] == pytest.approx(0.20)
    assert row[("bound", "dapo")]["clip_minus_comparator"] == {}  # the comparator against itself: nothing
    assert row[("bound", "dapo")]["clip/gate_by_c"][1]["n"] == 0  # not logged
    # GAPO − Dr.GRPO pass@1 (secondary): 0.00, 0.01, 0.02
    vs = {(x["regime"], x["method"]): x for x in fam["vs_reference"]}
    assert vs[("bound", "gapo")]["mean"] == pytest.approx(0.01) and vs[("bound", "gapo")]["n"] == 3
    # 3 non-comparator methods x 2 c in each of 2 cells + 3 methods − Dr.GRPO x 2 cells
    assert fam["n_secondary_intervals"] == 12 + 6


def test_markdown_answers_first_and_says_partial():
    fam = _family()
    md = family_markdown(fam)
    lines = md.splitlines()
    assert lines[0] == "# GAPO against the adaptive clips (family-test)"
    assert lines[2].startswith("**Partial**: 14 of 24 planned runs finished")
    answer = next(x for x in lines if x.startswith("**Which rule beat dapo here"))
    assert "soft at `bound` on pass@1: a gain of +10.0" in answer and "gapo" not in answer
    bound = "drgrpo 9.0 [9.0, 9.0] (+3.0 [+3.0, +3.0]), dapo 6.0 [6.0, 6.0], gapo 5.0 [5.0, 5.0] (-1.0 [-1.0, -1.0])"
    assert f"- `bound`: {bound}" in md
    assert "- `cal`: drgrpo 4.0 (+1.0), dapo 3.0, gapo not run yet, soft not run yet" in md
    assert "soft 3.0 [0.5, 5.5] (-3.0 [-5.5, -0.5])" in md
    assert "| `bound` | soft | 3 | 20.0 [19.8, 20.2] | 3.0 [0.5, 5.5] | -3.0 [-5.5, -0.5] |" in md
    assert "| 0.600 [0.600, 0.600] | – |" in md  # soft's gate at c = 1, none at c = 2
    assert "| `cal` | soft | 0 | – | – | – |" in md  # planned, never run
    assert "- soft: `bound` a gain of +10.0" in md and "`cal` not measured (n = 0)" in md
    assert "18 secondary intervals" in md


def test_per_c_figure_draws_each_methods_means():
    fig = per_c_plot(_family())
    clip_bound, clip_cal, dev_bound, _, gate_bound, gate_cal = fig.axes  # rows: clip, |ρ−1|, gate
    lines = {ln.get_label(): ln for ln in clip_bound.get_lines()}
    assert list(lines) == ["drgrpo", "dapo", "gapo", "soft"]
    assert list(lines["soft"].get_xdata()) == [1, 2]
    assert list(lines["soft"].get_ydata()) == pytest.approx([3.0, 1.0])  # percent
    assert [ln.get_label() for ln in clip_cal.get_lines()] == ["drgrpo", "dapo"]  # nothing of a method not run
    assert {ln.get_label(): ln.get_ydata()[0] for ln in dev_bound.get_lines()}["soft"] == pytest.approx(0.3)
    assert [ln.get_label() for ln in gate_bound.get_lines()] == ["soft"]
    assert not gate_cal.get_lines() and "not logged" in gate_cal.texts[0].get_text()


def test_no_winner_is_said_as_none():
    g, cells = _grid(), _cells()
    for s in range(3):
        cells[("bound", "soft", s)] = _cell(0.10 + 0.01 * (s - 1), 0.05)
    md = family_markdown(analyse_family(g, cells, analyse(g, cells)))
    assert "**Which rule beat dapo here: none.** No primary test of 4 survives Holm with a gain" in md


def test_dose_report_adds_the_family_report_and_its_figures(tmp_path):
    g, cells = _grid(), _cells()
    link = dose_report(g, cells, tmp_path / "r", tmp_path / "f")
    assert "clip_family.md" in link and "dose.md" in link
    assert (tmp_path / "r" / "clip_family.md").read_text().startswith("# GAPO against the adaptive clips")
    for f in ("pass1_by_method.png", "per_c_by_method.png"):
        assert (tmp_path / "f" / f).stat().st_size > 1000
    fam = json.loads((tmp_path / "r" / "clip_family.json").read_text())
    assert fam["comparator"] == "dapo" and fam["runs_done"] == 14 and fam["family_size"] == 4
    # a dose-response grid gets no family report
    g2 = _grid(dose={"comparisons": [["gapo", "drgrpo"], ["gapo", "dapo"]], "keys": ["after/pass@1"], "bootstrap": 0})
    assert "clip_family" not in dose_report(g2, cells, tmp_path / "r2", tmp_path / "f2")
    assert not (tmp_path / "r2" / "clip_family.md").exists()


# --------------------------------------------------------------------------------- the plan
def _yaml(p):
    return yaml.safe_load(Path(p).read_text())


def test_plan_cells_are_the_dose_cells_and_its_seeds_are_fresh():
    plan, dose = _yaml(PLAN), _yaml(ROOT / "configs" / "dose-response.yaml")
    assert plan["common"] == dose["common"]  # comparable with the dose-response
    for mine, theirs in (("bound_u16_5e-5", "u16_5e-5"), ("cal_u16_2e-5", "u16_2e-5")):
        assert plan["regime_defs"][mine]["overrides"] == dose["regime_defs"][theirs]["overrides"]
        assert plan["regime_defs"][mine]["base"] == dose["regime_defs"][theirs]["base"]
    assert plan["seeds"] == list(range(400, 410)) and plan["order"] == "regime"
    for other in (ROOT / "configs").glob("*.yaml"):
        if other != PLAN:
            seeds = _yaml(other).get("seeds") or []
            seeds = range(seeds) if isinstance(seeds, int) else seeds
            assert not set(seeds) & set(plan["seeds"]), other.name
    rules = ["gapo", "sapo", "cegppo", "clip_cov", "kl_cov", "bapo", "dcpo"]
    assert plan["dose"]["comparisons"] == [[x, "dapo"] for x in rules]
    assert plan["dose"]["keys"] == ["after/pass@1", "after/pass@8", "after/pass@64"]


def test_plan_loads_with_its_rivals():
    g = load_grid(PLAN)
    cells = grid_cells(g)
    assert len(cells) == 9 * 2 * 10
    assert {r for r, _, _ in cells[:90]} == {"bound_u16_5e-5"}  # the clip-bound cell first, whole
    assert comparator(g) == "dapo"
    assert analyse(g, {})["family_size"] == 7 * 3 * 2
