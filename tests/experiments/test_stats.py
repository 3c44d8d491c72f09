"""gapo.experiments.stats and .claims: intervals, paired differences, the shared run summary, verdicts."""

import math

import pytest

from gapo.experiments.claims import claim_rows, verdict
from gapo.experiments.report import summarise
from gapo.experiments.stats import by_c, mean_ci, paired_diffs, run_summary, t975


def test_mean_ci():
    assert mean_ci([]) == {
        "mean": pytest.approx(math.nan, nan_ok=True),
        "ci": pytest.approx(math.nan, nan_ok=True),
        "n": 0,
    }
    one = mean_ci([0.5, float("nan"), "x"])  # non-finite and non-numbers are dropped
    assert one["n"] == 1 and one["mean"] == 0.5 and math.isnan(one["ci"])
    d = mean_ci([1.0, 2.0, 3.0])
    assert d["n"] == 3 and d["mean"] == 2.0 and d["ci"] == pytest.approx(t975(2) * 1.0 / math.sqrt(3))
    assert t975(2) == 4.303 and t975(22) == 2.060 and t975(500) == 1.96  # next tabulated df up, then normal


def _cell(**summary):
    return {"summary": summary, "G": 4}


def test_paired_diffs_pair_by_seed_only():
    cells = {
        ("r", "a", 0): _cell(x=1.0),
        ("r", "b", 0): _cell(x=0.25),
        ("r", "a", 1): _cell(x=2.0),  # no partner: left out
        ("r", "a", 2): _cell(),
        ("r", "b", 2): _cell(x=1.0),
    }  # key missing: NaN, dropped by mean_ci
    d = paired_diffs(cells, "r", "a", "b", "x", [0, 1, 2])
    assert d[0] == 0.75 and len(d) == 2 and math.isnan(d[1])
    assert mean_ci(d) == {"mean": 0.75, "ci": pytest.approx(math.nan, nan_ok=True), "n": 1}


def test_verdict():
    assert verdict({"mean": 1.0, "ci": 0.5, "n": 3}) == "+"
    assert verdict({"mean": -1.0, "ci": 0.5, "n": 3}) == "−"
    assert verdict({"mean": 0.2, "ci": 0.5, "n": 3}) == "0"
    assert verdict({"mean": 1.0, "ci": math.nan, "n": 1}) == "n<2"


def test_claim_rows_use_roles_and_skip_missing_methods():
    cells = {}
    for s in (0, 1):
        cells[("cd-low", "gapo", s)] = _cell(**{"after/pass@1": 0.5 + s, "before/pass@1": 0.1})
        cells[("cd-low", "drgrpo", s)] = _cell(**{"after/pass@1": 0.25 + s, "before/pass@1": 0.1})
    grid = {"seeds": [0, 1], "regimes": ["cd-low"], "methods": ["drgrpo", "gapo"], "roles": {"low": "cd-low"}}
    rows = claim_rows(grid, cells)
    first = rows[0]
    assert (first["claim"], first["regime"], first["method"], first["vs"], first["key"]) == (
        "1 pass@1",
        "cd-low",
        "gapo",
        "drgrpo",
        "after/pass@1",
    )
    assert first["mean"] == 0.25 and first["n"] == 2 and first["ci"] == 0.0
    assert not [r for r in rows if r["vs"] in ("grpo", "dapo")]  # not in the grid: skipped
    base = [r for r in rows if r["vs"] == "base" and r["key"] == "pass@1"]
    assert [(r["method"], r["mean"]) for r in base] == [("drgrpo", pytest.approx(0.65)), ("gapo", pytest.approx(0.9))]


TRAIN = [
    {
        "step": i,
        "kind": "train",
        "policy/entropy": e,
        "loss/clipfrac": 0.1,
        "clip/frac_high_by_c/1": 0.5,
        "clip/tokens_pos_by_c/1": w,
        "clip/ratio_dev_by_c/2": 0.1 * i,
    }
    for i, (e, w) in enumerate([(4.0, 1.0), (3.0, 3.0), (2.0, 0.0), (1.0, 1.0)], 1)
]
EVAL = [
    {"step": 0, "kind": "eval", "eval/pass@1": 0.1, "eval/pass@2": 0.2, "eval/coverage": 0.3},
    {"step": 4, "kind": "eval", "eval/pass@1": 0.4, "eval/pass@2": 0.5, "eval/coverage": 0.6, "eval/correct": [1]},
]


def test_run_summary_vocabulary():
    s = run_summary(TRAIN, EVAL)
    assert s["before/pass@1"] == 0.1 and s["after/pass@2"] == 0.5 and s["after/coverage"] == 0.6
    assert "after/correct" not in s  # not a number
    assert s["train/policy/entropy"] == 2.5 and s["train/entropy_late"] == 1.0  # last quarter: one step
    assert s["clip/frac_high_by_c/1"] == 0.5 and s["clip/ratio_dev_by_c/2"] == pytest.approx(0.25)
    assert "train/time/step_s" not in s  # never logged: absent
    assert by_c(TRAIN, "clip/ratio_dev_by_c/") == {2: pytest.approx(0.25)}


def test_single_run_summary_is_a_selection_of_the_run_summary():
    row = summarise({"name": "r", "train": TRAIN, "eval": EVAL})
    s = run_summary(TRAIN, EVAL)
    assert list(row) == [
        "name",
        "before/pass@1",
        "after/pass@1",
        "before/pass@2",
        "after/pass@2",
        "before/coverage",
        "after/coverage",
        "train/loss/clipfrac",
        "train/clip/frac_high_pos",
        "train/loss/approx_kl",
        "train/policy/entropy",
        "train/time/step_s",
        "steps",
    ]
    assert all(row[k] == s[k] for k in row if k in s)
    assert math.isnan(row["train/time/step_s"]) and row["steps"] == 4  # the table shows a never-logged key as NaN


def test_premise_and_learning_rows_hand_computed():
    """G = 8. The premise row is |ρ−1| of A>0 tokens at c = 1 minus its mean over c >= 4; the
    learning row counts the runs whose training pass rate rose."""
    cells = {}
    for seed, (d1, d4, d6, rise, corr) in enumerate(
        [(0.30, 0.10, 0.20, 0.02, 0.5), (0.20, 0.20, 0.10, -0.01, 0.3), (0.40, 0.10, 0.10, 0.03, 0.7)]
    ):
        cells[("low", "drgrpo", seed)] = {
            "G": 8,
            "summary": {
                "clip/ratio_dev_pos_by_c/1": d1,
                "clip/ratio_dev_pos_by_c/2": 9.9,
                "clip/ratio_dev_pos_by_c/4": d4,
                "clip/ratio_dev_pos_by_c/6": d6,
                "train/pass_rate_rise": rise,
                "train/clip/ratio_adv_corr": corr,
            },
        }
    grid = {"seeds": [0, 1, 2], "regimes": ["low"], "methods": ["drgrpo"]}
    rows = {r["claim"]: r for r in claim_rows(grid, cells) if r["regime"] == "low"}
    premise = rows["8 premise: ratio deviation of A>0 tokens, c=1 − c≥G/2"]
    assert premise["mean"] == pytest.approx(((0.30 - 0.15) + (0.20 - 0.15) + (0.40 - 0.10)) / 3) and premise["n"] == 3
    assert rows["8 premise: corr(ratio deviation, A), windowed"]["mean"] == pytest.approx(0.5)
    learns = rows["0 RL learns: training pass-rate rise"]
    assert learns["k"] == 2 and learns["n"] == 3 and learns["mean"] == pytest.approx(0.04 / 3)


def test_pass_rate_rise_is_last_quarter_minus_first():
    rates = [0.1, 0.2, 0.0, 0.3, 0.4, 0.5, 0.2, 0.6]
    train = [{"step": i, "kind": "train", "rollout/pass_rate": v} for i, v in enumerate(rates, 1)]
    s = run_summary(train, [])
    assert s["train/pass_rate_rise"] == pytest.approx((0.2 + 0.6) / 2 - (0.1 + 0.2) / 2)
    assert "train/pass_rate_rise" not in run_summary(train[:1], [])


def test_scale_figure_draws_the_paired_gapo_difference_per_size(tmp_path, monkeypatch):
    """The points drawn are the hand-computed paired GAPO − Dr.GRPO means (in points) at each
    regime's size, with the 95% t half-widths as error bars, read back from the figure's axes."""
    from gapo.experiments import figures

    drawn = []
    save = figures._save
    monkeypatch.setattr(
        figures, "_save", lambda fig, fdir, name, **kw: drawn.append(fig) or save(fig, fdir, name, **kw)
    )
    cells = {}
    for s_ in (0, 1, 2):
        # small: pass@1 diffs 0, .03, .06 (mean 3 points); pass@64 diffs 0, 0, 0
        cells[("small", "gapo", s_)] = _cell(**{"after/pass@1": 0.20 + 0.03 * s_, "after/pass@64": 0.5})
        cells[("small", "drgrpo", s_)] = _cell(**{"after/pass@1": 0.20, "after/pass@64": 0.5})
        # big: pass@1 diffs 0, .01, .02 (mean 1 point); pass@64 diffs 0, .02, .04 (mean 2 points)
        cells[("big", "gapo", s_)] = _cell(**{"after/pass@1": 0.30, "after/pass@64": 0.6 + 0.01 * s_})
        cells[("big", "drgrpo", s_)] = _cell(**{"after/pass@1": 0.30 - 0.01 * s_, "after/pass@64": 0.6 - 0.01 * s_})
        cells[("other", "gapo", s_)] = _cell(**{"after/pass@1": 0.9, "after/pass@64": 0.9})  # not in grid["scale"]
        cells[("other", "drgrpo", s_)] = _cell(**{"after/pass@1": 0.1, "after/pass@64": 0.1})
    grid = {"seeds": [0, 1, 2], "regimes": ["big", "small", "other"], "scale": {"big": 5e6, "small": 1e6, "gone": 1e9}}
    assert figures._grid_scale(grid, cells, tmp_path) == "scale.png"
    assert (tmp_path / "scale.png").is_file() and len(drawn) == 1
    t2 = 4.303  # t_{0.975} with 2 degrees of freedom, as tabulated (4.3027 exactly)
    half = lambda sd: 100 * t2 * sd / math.sqrt(3)  # noqa: E731  (points)
    expected = {
        "pass@1": [(1e6, 3.0, half(0.03)), (5e6, 1.0, half(0.01))],
        "pass@64": [(1e6, 0.0, 0.0), (5e6, 2.0, half(0.02))],
    }
    axes = drawn[0].axes
    assert [ax.get_title() for ax in axes] == ["GAPO − Dr.GRPO, pass@1 (points)", "GAPO − Dr.GRPO, pass@64 (points)"]
    for ax, key in zip(axes, ("pass@1", "pass@64")):
        got = []
        for bars in ax.containers:  # one errorbar per regime, in the order drawn (by size)
            line, _, (vlines,) = bars
            (x,), (y,) = line.get_xdata(), line.get_ydata()
            (seg,) = vlines.get_segments()
            assert seg[0][0] == seg[1][0] == x and (seg[0][1] + seg[1][1]) / 2 == pytest.approx(y)
            got.append((x, y, abs(seg[1][1] - seg[0][1]) / 2))
        assert [g[0] for g in got] == [e[0] for e in expected[key]], key
        for g, e in zip(got, expected[key]):
            assert g[1:] == pytest.approx(e[1:], abs=1e-9), key
        assert [t.get_text() for t in ax.texts] == ["small (n=3)", "big (n=3)"]
        assert ax.get_xscale() == "log"


# --------------------------------------------------------------------------------- issue 25: tests, Holm, bootstrap
def test_t_pvalue_hand_computed():
    from gapo.experiments.stats import t_pvalue

    # df = 2 has a closed form: two-sided p = 1 − t/√(t² + 2); [1, 2, 3]: t = 2/(1/√3) = 2√3
    t = 2 * math.sqrt(3)
    assert t_pvalue([1.0, 2.0, 3.0]) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    # df = 1 is Cauchy: P(|T| > 1) = 1/2; [0, 2]: mean 1, sd √2, t = 1
    assert t_pvalue([0.0, 2.0]) == pytest.approx(0.5, rel=1e-9)
    # at the tabulated 97.5% quantile the p-value is 0.05: values with mean t975(9)·sd/√10
    xs = [1.0, -1.0] * 5
    sd = math.sqrt(sum(x * x for x in xs) / 9)
    shifted = [x + t975(9) * sd / math.sqrt(10) for x in xs]
    assert t_pvalue(shifted) == pytest.approx(0.05, abs=2e-4)
    assert math.isnan(t_pvalue([1.0])) and t_pvalue([0.0, 0.0]) == 1.0 and t_pvalue([0.5, 0.5]) == 0.0


def test_holm_hand_computed():
    from gapo.experiments.stats import holm

    # sorted 0.005, 0.01, 0.03, 0.04 -> 4·0.005, 3·0.01, 2·0.03, max(that, 1·0.04): in input order
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.2, float("nan"), 0.9])  # NaN stays NaN and is not counted in m (= 2)
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.9)
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1


def test_seed_problem_bootstrap_hand_enumerated():
    from gapo.experiments.stats import seed_problem_bootstrap

    # 2 seeds x 2 problems, only (seed 0, problem 0) differs: a resample's mean is (k/2)(l/2), k and l
    # the times seed 0 and problem 0 are drawn (Binomial(2, 1/2) each): 0 w.p. 7/16, 1/4 w.p. 1/4,
    # 1/2 w.p. 1/4, 1 w.p. 1/16 -- so the 2.5% quantile is 0 and the 97.5% one is 1.
    b = seed_problem_bootstrap([[1.0, 0.0], [0.0, 0.0]], resamples=4000, seed=1)
    assert b["mean"] == 0.25 and b["lo"] == 0.0 and b["hi"] == 1.0
    assert (b["n_seeds"], b["n_problems"]) == (2, 2)
    c = seed_problem_bootstrap([[0.5] * 3] * 4, resamples=200)
    assert c["lo"] == c["hi"] == c["mean"] == 0.5  # no variation anywhere: a point
    assert math.isnan(seed_problem_bootstrap([])["mean"])


def test_seed_problem_bootstrap_includes_problem_sampling():
    """Every seed the same difference row: the seed-only t interval has zero width, the problems
    still vary, and the two-way bootstrap says so."""
    from gapo.experiments.stats import seed_problem_bootstrap

    row = [0.2, -0.1, 0.3, 0.0, 0.5, -0.2, 0.1, 0.4]
    rows = [row] * 6
    seed_only = mean_ci([sum(r) / len(r) for r in rows])
    assert seed_only["ci"] == 0.0
    b = seed_problem_bootstrap(rows, resamples=2000, seed=0)
    assert b["lo"] < seed_only["mean"] - 0.05 and b["hi"] > seed_only["mean"] + 0.05
    assert b == seed_problem_bootstrap(rows, resamples=2000, seed=0)  # reproducible from its seed


def test_paired_problem_diffs_per_problem_pass_at_k():
    from gapo.experiments.stats import paired_problem_diffs, per_problem_pass_at_k

    assert per_problem_pass_at_k(4, [0, 1, 4], 1) == [0.0, 0.25, 1.0]
    assert per_problem_pass_at_k(4, [0, 1, 4], 4) == [0.0, 1.0, 1.0]

    def cell(after, n=4):
        return {"correct": {"before": [0] * len(after), "after": after, "n": n}}

    cells = {
        ("r", "a", 0): cell([2, 0]),
        ("r", "b", 0): cell([1, 1]),
        ("q", "b", 1): cell([0, 0]),
        ("r", "a", 1): cell([4, 4]),  # cross-regime pairing
        ("r", "a", 2): cell([1, 1]),
    }  # no partner: left out
    assert paired_problem_diffs(cells, ("r", "a"), ("r", "b"), [0, 1, 2], 1) == [[0.25, -0.25]]
    assert paired_problem_diffs(cells, ("r", "a"), ("q", "b"), [0, 1, 2], 1) == [[1.0, 1.0]]
    cells[("r", "b", 2)] = cell([1, 1, 1])
    with pytest.raises(ValueError, match="seed 2: .*different problems"):
        paired_problem_diffs(cells, ("r", "a"), ("r", "b"), [2], 1)


def test_load_cell_returns_per_problem_counts(tmp_path):
    import json

    from gapo.experiments.stats import load_cell

    d = tmp_path / "seed0"
    d.mkdir()
    recs = [
        {"kind": "eval", "step": 0, "eval/pass@1": 0.25, "eval/n": 4, "eval/correct": [1, 0]},
        {"step": 1, "rollout/pass_rate": 0.1},
        {"kind": "eval", "step": 1, "eval/pass@1": 0.5, "eval/n": 4, "eval/correct": [3, 1]},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "config.yaml").write_text("train: {group_size: 8}\neval: {samples: 4}\n")
    assert load_cell(d) is None  # unfinished
    (d / "done.json").write_text("{}")
    c = load_cell(d)
    assert c["correct"] == {"before": [1, 0], "after": [3, 1], "n": 4}
    assert c["summary"]["after/pass@1"] == 0.5 and "after/correct" not in c["summary"]


def test_gapo_log_is_reported_as_a_variant_and_not_counted_where_identical():
    from gapo.experiments.claims import identical_runs, independent_between

    cells = {}
    for s in (0, 1, 2):
        cells[("cd-low", "drgrpo", s)] = {**_cell(**{"after/pass@1": 0.2}), "correct": {"after": [1, 0], "n": 4}}
        cells[("cd-low", "gapo", s)] = {**_cell(**{"after/pass@1": 0.3 + s}), "correct": {"after": [s, 1], "n": 4}}
        # seeds 0 and 1: the same sample-for-sample final evaluation as GAPO; seed 2 differs
        same = [s, 1] if s < 2 else [0, 0]
        cells[("cd-low", "gapo_log", s)] = {**_cell(**{"after/pass@1": 0.3 + s}), "correct": {"after": same, "n": 4}}
    assert identical_runs(cells, "cd-low", "gapo_log", "gapo", [0, 1, 2]) == (2, 3)
    # without stored counts, every after/* value must agree
    bare = {k: {"summary": v["summary"], "G": 4} for k, v in cells.items()}
    assert identical_runs(bare, "cd-low", "gapo_log", "gapo", [0, 1, 2]) == (3, 3)
    grid = {
        "seeds": [0, 1, 2],
        "regimes": ["cd-low"],
        "methods": ["drgrpo", "gapo", "gapo_log"],
        "roles": {"low": "cd-low"},
    }
    rows = claim_rows(grid, cells)
    logs = [r for r in rows if r["method"] == "gapo_log"]
    assert logs and all(r["variant_of"] == "gapo" and r["identical"] == [2, 3] for r in logs)
    indep = independent_between(rows)
    assert indep and not [r for r in indep if r["method"] == "gapo_log"]
    assert [r for r in indep if r["method"] == "gapo" and r["vs"] == "drgrpo"]
    # trained identically in at most half the seeds: counted
    rows2 = [{**r, "identical": [1, 3]} if r["method"] == "gapo_log" else r for r in rows]
    assert [r for r in independent_between(rows2) if r["method"] == "gapo_log"]


def test_claim_rows_carry_a_seed_problem_interval_where_counts_are_stored():
    cells = {}
    for s in (0, 1, 2):
        cells[("cd-low", "drgrpo", s)] = {**_cell(**{"after/pass@1": 0.25}), "correct": {"after": [1, 1, 0, 0], "n": 4}}
        cells[("cd-low", "gapo", s)] = {**_cell(**{"after/pass@1": 0.5}), "correct": {"after": [4, 1, 0, 0], "n": 4}}
    grid = {"seeds": [0, 1, 2], "regimes": ["cd-low"], "methods": ["drgrpo", "gapo"], "roles": {"low": "cd-low"}}
    row = next(r for r in claim_rows(grid, cells) if r["key"] == "after/pass@1" and r["vs"] == "drgrpo")
    # every seed the same: the t interval is a point, the problems (one of four differs by 0.75) are not
    assert row["ci"] == 0.0 and row["boot_lo"] == 0.0 and row["boot_hi"] > 0.25
    bare = {k: {"summary": v["summary"], "G": 4} for k, v in cells.items()}
    assert "boot_lo" not in next(r for r in claim_rows(grid, bare) if r["key"] == "after/pass@1")


def test_paired_problem_diffs_skip_undefined_pass_at_k():
    from gapo.experiments.stats import paired_problem_diffs

    cells = {
        ("r", "a", 0): {"correct": {"after": [1, 0], "n": 4}},
        ("r", "b", 0): {"correct": {"after": [0, 0], "n": 4}},
    }
    assert paired_problem_diffs(cells, ("r", "a"), ("r", "b"), [0], 8) == []  # 4 samples: no pass@8
    assert paired_problem_diffs(cells, ("r", "a"), ("r", "b"), [0], 4) == [[1.0, 0.0]]


def test_ols_slope_hand_computed():
    from gapo.experiments.stats import ols_slope

    # mean x 1.5, mean y 2.75, Sxx 5, Sxy 5.5: slope 1.1; residuals -0.1, 0.8, -1.3, 0.6 (SSE 2.7)
    r = ols_slope([0, 1, 2, 3], [1, 3, 2, 5])
    assert r["slope"] == pytest.approx(1.1) and r["n"] == 4
    assert r["intercept"] == pytest.approx(2.75 - 1.1 * 1.5)
    se = math.sqrt(2.7 / 2 / 5)
    assert r["ci"] == pytest.approx(4.303 * se)
    t = 1.1 / se  # with 2 degrees of freedom the two-sided p is 1 - t / sqrt(2 + t^2) exactly
    assert r["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-6)
    exact = ols_slope([1, 2, 3], [4, 7, 10])  # on a line: slope 3, no residual
    assert exact["slope"] == pytest.approx(3.0) and exact["ci"] == 0.0 and exact["p"] == 0.0
    assert exact["intercept"] == pytest.approx(1.0)
    flat = ols_slope([1, 1, 1], [1, 2, 3])  # one x: no slope
    assert math.isnan(flat["slope"]) and flat["n"] == 3
    two = ols_slope([0, 1, float("nan")], [0, 2, 5])  # the NaN pair dropped; two points: slope, no interval
    assert two["slope"] == pytest.approx(2.0) and two["n"] == 2 and math.isnan(two["ci"])
