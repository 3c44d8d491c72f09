"""The single-run report (``gapo report``, the demo's report.md): figures with captions, a note
when a run ends below the base policy at some k, the best and the worst rollout of a group, and
a report folder that belongs to the runs it describes."""

from __future__ import annotations

import json
import re

from gapo.experiments.figures import RUN_CAPTIONS
from gapo.experiments.report import below_base, default_report_dir, format_samples, summarise, write_report


def _run(name, after, *, samples=None):
    ev0 = {"kind": "eval", "step": 0, "eval/pass@1": 0.10, "eval/pass@4": 0.30, "eval/pass@16": 0.40}
    ev1 = {"kind": "eval", "step": 4, **{f"eval/pass@{k}": v for k, v in zip((1, 4, 16), after)}}
    train = [
        {
            "kind": "train",
            "step": s,
            "rollout/reward": 0.1 * s,
            "policy/entropy": 1.0 - 0.1 * s,
            "clip/frac_high_pos": 0.01,
            "clip/ratio_adv_corr": 0.3,
            "clip/frac_high_by_c/1": 0.02,
            "clip/eps_high_pos_by_c/1": 0.28,
            "loss/clipfrac": 0.01,
            "loss/approx_kl": 1e-4,
            "time/step_s": 1.0,
        }
        for s in range(1, 5)
    ]
    return {"name": name, "dir": f"runs/{name}", "train": train, "eval": [ev0, ev1], "samples": samples or []}


def _rows(step, group, rewards):
    return [
        {
            "step": step,
            "group": group,
            "prompt": f"Numbers: 3 5 7 9 Target: {step}{group}\n",
            "completion": f"c{step}.{group}.{i}",
            "reward": r,
        }
        for i, r in enumerate(rewards)
    ]


def test_report_has_captions_below_base_note_and_best_worst_samples(tmp_path):
    samples = _rows(3, 0, [0.0, 1.0, 0.0, 0.0]) + _rows(4, 0, [0.0, 0.0, 0.0, 0.0])  # step 4: all failures
    runs = [_run("fixed", (0.20, 0.35, 0.38), samples=samples), _run("gapo", (0.15, 0.32, 0.41))]
    md = write_report(runs, tmp_path / "rep").read_text()
    figs = re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", md, flags=re.M)
    assert "ratio_adv_corr.png" in figs and "passk.png" in figs
    for f in figs:  # every figure has its one-line caption right under it
        assert (tmp_path / "rep" / f).is_file()
        assert f"![{f[:-4]}]({f})\n\n*{f}: {RUN_CAPTIONS[f]}*" in md, f
    assert "Pearson's r" in md and "§2.11" in md  # the windowed r(|ρ−1|, A) is explained where it is shown
    # fixed ends below the base at k = 16 (0.38 < 0.40); gapo does not (0.41)
    assert "**fixed ends below the base policy** at k = 16 (after RL vs before: pass@16 0.380 < 0.400)" in md
    assert "gapo ends below" not in md
    # the latest step whose logged group has both outcomes (step 3), its best and its worst
    assert "fixed, step 3 (best and worst of the 4 logged rollouts of group 0):" in md
    assert "[best, reward 1] completion: 'c3.0.1'" in md and "[worst, reward 0] completion: 'c3.0.0'" in md


def test_below_base_and_a_group_without_spread():
    s = summarise(_run("a", (0.05, 0.30, 0.40)))
    assert below_base(s) == [(1, 0.05, 0.10)]  # equal at k = 4 and 16 is not below
    out = format_samples({"name": "a", "samples": _rows(2, 1, [0.0, 0.0, 0.0])})
    assert "a, step 2 (all 3 logged rollouts of this group have reward 0):" in out
    assert out.count("completion:") == 2  # still the first and the last


def test_default_report_dir_is_the_runs_own(tmp_path):
    a, b = tmp_path / "demo" / "fixed", tmp_path / "demo" / "gapo"
    assert default_report_dir([a]) == a.resolve() / "report"
    assert default_report_dir([a, b]) == (tmp_path / "demo").resolve() / "report-fixed-gapo"
    other = tmp_path / "x" / "gapo"
    assert default_report_dir([a, other]) == tmp_path.resolve() / "report-fixed-gapo"  # common parent
    long = [tmp_path / ("r" * 50 + str(i)) for i in range(3)]
    d = default_report_dir(long)
    assert d.parent == tmp_path.resolve() and len(d.name) < 100 and d != default_report_dir(long[:2])


def test_gapo_report_writes_into_the_run_and_says_where(tmp_path, capsys):
    from gapo.cli import main

    run = tmp_path / "runs" / "gapo"
    run.mkdir(parents=True)
    r = _run("gapo", (0.2, 0.35, 0.45))
    records = r["eval"][:1] + r["train"] + r["eval"][1:]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert (run / "report" / "report.md").is_file()
    assert f"report written to {run.resolve() / 'report'}" in out
    assert not (tmp_path / "runs" / "report").exists()  # not a folder shared with the next report
