"""Dose-response on the clip: where does GAPO's effect live (issue 25)?

A grid with a ``dose`` block (``configs/dose-response.yaml``) runs the same methods at several
update settings ("dose cells": updates per rollout batch × learning rate). For each cell this
module reports

- the **clip-binding share**: the share of positive-advantage tokens that fixed clipping
  (``dose.reference``, Dr.GRPO) clipped, over training (``train/clip/frac_high_pos``), and the
  same per group success count ``c`` (``clip/frac_high_by_c/<c>``, token-weighted; the level's
  field of that name in ``dose.json``, ``c → mean_ci``);
- the **primary comparisons** (``dose.comparisons`` × ``dose.keys``, e.g. GAPO − Dr.GRPO and
  GAPO − DAPO on pass@1, pass@8, pass@64): the mean of the same-seed differences with its 95%
  Student-t interval, the two-sided paired t-test p-value, its Holm-adjusted value over the whole
  primary family (every cell × comparison × key the plan names; a comparison with fewer than two
  seeds counts with p = 1, so an unfinished grid is adjusted as strictly as the finished one), and
  a seed × problem bootstrap interval (:func:`gapo.experiments.stats.seed_problem_bootstrap`);
- a verdict in the plan's words (:func:`verdict_words`);
- width sensitivity (``dose.width``): GAPO at upper width w against clip-higher at the same w;
- the **trend**: does the effect grow with the clip-binding share? The least-squares slope of the
  same-seed differences on their cell's clip-binding share, pooled over the cells (all cells, and
  the cells that learn by the plan's rule), with its 95% t interval (secondary, unadjusted).

and the figure users need: GAPO's effect (mean, 95% CI) against the clip-binding share, one point
per cell (``dose_response.png``). ``gapo compare --config configs/dose-response.yaml
--report-only`` writes ``dose.md``, ``dose.json`` and the figure next to the grid report; a grid's
raw records are kept and restored with :mod:`gapo.experiments.raw_records`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from gapo.experiments.clip_family import comparator, family_report
from gapo.experiments.grid_spec import cell_config, dose_spec, methods_of, write_json
from gapo.experiments.stats import (
    holm,
    mean_ci,
    ols_slope,
    paired_diffs,
    paired_problem_diffs,
    seed_problem_bootstrap,
    t_pvalue,
)

__all__ = [
    "dose_levels",
    "analyse",
    "verdict_words",
    "dose_markdown",
    "dose_figure",
    "dose_report",
    "write_per_problem",
]

_CLIP = "train/clip/frac_high_pos"
_CLIP_BY_C = "clip/frac_high_by_c"  # the summary's per-c key (stats.BY_C_SUMMARY)


# --------------------------------------------------------------------------------- the spec
def dose_levels(grid: dict) -> list[str]:
    """The dose cells: every regime but the width block's."""
    w = dose_spec(grid)["width"]
    return [r for r in grid["regimes"] if not w or r != w["regime"]]


def _axes(grid: dict, regime: str) -> dict:
    cfg = cell_config(grid, regime, methods_of(grid, regime)[0], grid["seeds"][0], base_path="<base>")
    return {
        "updates": cfg.train.mini_batches * cfg.train.epochs,
        "mini_batches": cfg.train.mini_batches,
        "epochs": cfg.train.epochs,
        "lr": cfg.optim.lr,
        "eps_high_max": cfg.algo.eps_high_max,
    }


def _k_of(key: str) -> int | None:
    head, _, k = key.rpartition("pass@")
    return int(k) if head in ("after/", "before/") and k.isdigit() else None


# --------------------------------------------------------------------------------- analysis
def _compare(cells: dict, a: tuple, b: tuple, key: str, seeds: list[int], resamples: int) -> dict:
    """``a − b`` (each ``(regime, method)``) on summary ``key``, paired by seed: mean, t interval,
    p-value, seed × problem bootstrap (pass@k keys with per-problem counts)."""
    d = [
        cells[(*a, s)]["summary"].get(key, math.nan) - cells[(*b, s)]["summary"].get(key, math.nan)
        for s in seeds
        if (*a, s) in cells and (*b, s) in cells
    ]
    row = {"a": list(a), "b": list(b), "key": key, **mean_ci(d), "p": t_pvalue(d)}
    k = _k_of(key)
    if k is not None and resamples:
        rows = paired_problem_diffs(cells, a, b, seeds, k, when=key.split("/")[0])
        if rows:
            bs = seed_problem_bootstrap(rows, resamples=resamples, seed=0)
            row.update(boot_lo=bs["lo"], boot_hi=bs["hi"], boot_n=bs["n_seeds"], boot_problems=bs["n_problems"])
    return row


def _share(cells, regime, method, seeds, key) -> dict:
    return mean_ci(
        [cells[(regime, method, s)]["summary"].get(key, math.nan) for s in seeds if (regime, method, s) in cells]
    )


def verdict_words(row: dict, alpha: float = 0.05, scale: float = 100.0, unit: str = "points") -> str:
    """The plan's wording for one comparison (``scale``: values are fractions, said in points):
    Holm-adjusted p < alpha and interval above 0 -> "a gain of +X [lo, hi] points"; below 0 ->
    "a loss of X [lo, hi] points"; otherwise "no gain above +hi points" (the upper end of the 95%
    t interval, rounded up to 0.1), or "no gain (upper end X points)" when that end is <= 0."""
    if row.get("n", 0) < 2 or not math.isfinite(row.get("ci", math.nan)):
        return f"not measured (n = {row.get('n', 0)})"
    m, lo, hi = row["mean"] * scale, (row["mean"] - row["ci"]) * scale, (row["mean"] + row["ci"]) * scale
    hp = row.get("p_holm", row.get("p", math.nan))
    if math.isfinite(hp) and hp < alpha and lo > 0:
        return f"a gain of {m:+.1f} [{lo:+.1f}, {hi:+.1f}] {unit}"
    if math.isfinite(hp) and hp < alpha and hi < 0:
        return f"a loss of {m:+.1f} [{lo:+.1f}, {hi:+.1f}] {unit}"
    up = math.ceil(hi * 10 - 1e-9) / 10
    return f"no gain above {up:+.1f} {unit}" if up > 0 else f"no gain (upper end {up:+.1f} {unit})"


def analyse(grid: dict, cells: dict) -> dict:
    """Everything :func:`dose_markdown` and :func:`dose_figure` draw (the module docstring);
    ``cells``: ``(regime, method, seed)`` → ``stats.load_cell``."""
    spec, seeds = dose_spec(grid), grid["seeds"]
    ref, B = spec["reference"], int(spec["bootstrap"])
    levels = [_level(grid, cells, r, spec) for r in dose_levels(grid)]
    primary = [
        _compare(cells, (lv["regime"], a), (lv["regime"], b), key, seeds, B)
        for lv in levels
        for a, b in spec["comparisons"]
        for key in spec["keys"]
    ]
    # the family is every planned test: one not yet measured counts as p = 1 (never rejected)
    adj = holm([p["p"] if p["n"] >= 2 and math.isfinite(p["p"]) else 1.0 for p in primary])
    for p, h in zip(primary, adj):
        p["p_holm"] = h
        p["verdict"] = verdict_words(p, spec["alpha"])
    width = _width_rows(grid, cells, spec) if spec["width"] else []
    # a grid of one cell (configs/confirm-medium.yaml) has no dose axis: no slope to fit or to count
    trend = (
        [
            {"a": a, "b": b, "key": key, "cells": which, **_trend(cells, levels, a, b, key, seeds, which)}
            for which in ("all", "learning")
            for a, b in spec["comparisons"]
            for key in spec["keys"]
        ]
        if len(levels) >= 2
        else []
    )
    n_secondary = (
        # each a − reference clip comparison once (a method compared with two baselines has one)
        sum(len(lv.get(f"{a}_clip_c", {})) for lv in levels for a in {a for a, b in spec["comparisons"] if b == ref})
        + sum(1 for x in width if x.get("b"))
        + len(trend)
    )
    return {
        "grid": grid.get("name"),
        "seeds": seeds,
        "reference": ref,
        "levels": levels,
        "primary": primary,
        "width": width,
        "trend": trend,
        "family_size": len(primary),
        "alpha": spec["alpha"],
        "bootstrap": B,
        "n_secondary_intervals": n_secondary,
    }


def _level(grid: dict, cells: dict, r: str, spec: dict) -> dict:
    """One dose cell: its axes, seeds done, the reference's clip-binding share (overall and per
    ``c``), its held-out gain and training rise, whether it learns, and each compared method's
    per-``c`` clip difference from the reference."""
    seeds, ref = grid["seeds"], spec["reference"]
    G = cell_config(grid, r, methods_of(grid, r)[0], seeds[0], base_path="<base>").train.group_size
    ran = [s for s in seeds if (r, ref, s) in cells]
    summary = {s: cells[(r, ref, s)]["summary"] for s in ran}
    lv = {
        "regime": r,
        **_axes(grid, r),
        "n_done": {m: sum((r, m, s) in cells for s in seeds) for m in methods_of(grid, r)},
        "clip": _share(cells, r, ref, seeds, _CLIP),
        _CLIP_BY_C: {c: _share(cells, r, ref, seeds, f"{_CLIP_BY_C}/{c}") for c in range(1, G)},
        "gain_pass@1": mean_ci(
            [summary[s].get("after/pass@1", math.nan) - summary[s].get("before/pass@1", math.nan) for s in ran]
        ),
        "rose": [sum(summary[s].get("train/pass_rate_rise", 0) > 0 for s in ran), len(ran)],
    }
    lv["learns"] = _learns(lv, len(seeds))
    for a, b in spec["comparisons"]:
        if b == ref and a in methods_of(grid, r):
            lv[f"{a}_clip_c"] = {c: _compare(cells, (r, a), (r, b), f"{_CLIP_BY_C}/{c}", seeds, 0) for c in (1, 2)}
    return lv


def _width_rows(grid: dict, cells: dict, spec: dict) -> list[dict]:
    """Width sensitivity (secondary, unadjusted): each ``[method, against, width]`` pair on every
    key, the method against the reference at the dose cell, and the comparator's clip share."""
    seeds, ref, w, B = grid["seeds"], spec["reference"], spec["width"], int(spec["bootstrap"])
    planned = _planned(grid)
    rows = []
    for a, b, wd in w.get("pairs") or []:
        # a pair the dose cell itself runs (the 0.28 one) is read there, the others in the width block
        reg = w["at"] if {(w["at"], a, seeds[0]), (w["at"], b, seeds[0])} <= planned else w["regime"]
        for key in spec["keys"]:
            row = _compare(cells, (reg, a), (reg, b), key, seeds, B)
            row.update(width=wd, verdict=verdict_words(row, spec["alpha"]))  # unadjusted: secondary
            rows.append(row)
        rows.append({**_compare(cells, (reg, a), (w["at"], ref), "after/pass@1", seeds, B), "width": wd})
        rows.append({"a": [reg, b], "b": [], "key": _CLIP, "width": wd, **_share(cells, reg, b, seeds, _CLIP)})
    return rows


def _trend(cells: dict, levels: list, a: str, b: str, key: str, seeds: list[int], which: str) -> dict:
    """Slope of the same-seed ``a − b`` differences on ``key`` against their cell's clip-binding share
    (both fractions: points of difference per point of share), pooled over the dose cells where
    both methods ran (``which`` = "learning": only the cells that learn by the plan's rule)."""
    xs, ys, used = [], [], []
    for lv in levels:
        r = lv["regime"]
        if which == "learning" and lv["learns"] != "yes":
            continue
        if not lv["clip"]["n"] or not math.isfinite(lv["clip"]["mean"]):
            continue
        d = paired_diffs(cells, r, a, b, key, seeds)
        if d:
            used.append(r)
        xs += [lv["clip"]["mean"]] * len(d)
        ys += d
    return {**ols_slope(xs, ys), "regimes": used}


def _learns(lv: dict, n_planned: int) -> str:
    """The plan's rule for "the setting learns": the reference's training pass rate rose in >= 70%
    of the planned seeds and its held-out pass@1 gain over the base has a 95% interval above 0;
    "undetermined" until every planned seed of the reference has finished."""
    k, n = lv["rose"]
    if n < n_planned:
        return f"undetermined ({n} of {n_planned} seeds)"
    g = lv["gain_pass@1"]
    ok = 10 * k >= 7 * n and g["n"] >= 2 and g["mean"] - g["ci"] > 0
    return "yes" if ok else "no"


def _planned(grid: dict) -> set:
    return {(r, m, s) for r in grid["regimes"] for m in methods_of(grid, r) for s in grid["seeds"]}


# --------------------------------------------------------------------------------- markdown
def _pt(d: dict, scale: float = 100.0, digits: int = 1) -> str:
    if not d or d.get("n", 0) == 0 or not math.isfinite(d.get("mean", math.nan)):
        return "–"
    m = d["mean"] * scale
    if d["n"] < 2 or not math.isfinite(d["ci"]):
        return f"{m:+.{digits}f}"
    return f"{m:+.{digits}f} [{m - d['ci'] * scale:+.{digits}f}, {m + d['ci'] * scale:+.{digits}f}]"


def _share_txt(d: dict) -> str:
    if not d or d.get("n", 0) == 0:
        return "–"
    ci = f" ± {d['ci'] * 100:.1f}" if d["n"] >= 2 and math.isfinite(d["ci"]) else ""
    return f"{d['mean'] * 100:.1f}{ci}"


def _boot(d: dict) -> str:
    return f"[{d['boot_lo'] * 100:+.1f}, {d['boot_hi'] * 100:+.1f}]" if "boot_lo" in d else "–"


def _p(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def dose_markdown(res: dict) -> str:
    """``dose.md``: the cells, the primary family with verdicts, the width block, the trend, the counts."""
    L = _cells_table(res) + _primary_table(res) + _width_table(res) + _trend_table(res)
    L += [
        "",
        f"{res['n_secondary_intervals']} secondary between-method intervals above (unadjusted): at 95% about "
        f"{res['n_secondary_intervals'] / 20:.1f} would exclude zero by chance alone.",
        "",
    ]
    return "\n".join(L)


def _cells_table(res: dict) -> list[str]:
    ref = res["reference"]
    L = [
        # one cell is a pre-registered comparison, not a dose-response (configs/confirm-medium.yaml)
        f"# {'Dose-response on the clip' if len(res['levels']) >= 2 else 'Pre-registered comparison'} ({res['grid']})",
        "",
        f"Seeds planned: {len(res['seeds'])} ({res['seeds'][0]}–{res['seeds'][-1]}). Values in points (pass@k) "
        f"or percent (clip shares); intervals: 95% Student t over seeds; 'seed×problem': the two-way bootstrap "
        f"({res['bootstrap']} resamples) that also resamples the held-out problems.",
        "",
        "## Cells",
        "",
        "| cell | updates/batch | lr | "
        f"seeds done ({', '.join(res['levels'][0]['n_done']) if res['levels'] else ''}) | "
        f"{ref} clip A>0 (%) | {ref} clip A>0 at c = 1 / 2 / 4 / 7 (%) | {ref} held-out pass@1 gain | "
        f"training pass rate rose | learns (plan's rule) | GAPO − {ref} clip at c = 1 (points) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in res["levels"]:
        byc = " / ".join(_share_txt(lv[_CLIP_BY_C].get(c, {})) for c in (1, 2, 4, 7))
        gc = next((v for k, v in lv.items() if k.endswith("_clip_c")), {}).get(1, {})
        L.append(
            f"| `{lv['regime']}` | {lv['updates']} ({lv['mini_batches']} × {lv['epochs']}) | {lv['lr']:.0e} | "
            f"{' / '.join(str(v) for v in lv['n_done'].values())} | {_share_txt(lv['clip'])} | {byc} | "
            f"{_pt(lv['gain_pass@1'])} | {lv['rose'][0]} of {lv['rose'][1]} | {lv['learns']} | {_pt(gc)} |"
        )
    return L


def _primary_table(res: dict) -> list[str]:
    L = [
        "",
        f"## Primary comparisons (Holm over all {res['family_size']} planned tests, α = {res['alpha']})",
        "",
        "| cell | comparison | metric | mean [95% t] | seed×problem | n | p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res["primary"]:
        L.append(
            f"| `{p['a'][0]}` | {p['a'][1]} − {p['b'][1]} | {p['key'].split('/')[-1]} | {_pt(p)} | {_boot(p)} | "
            f"{p['n']} | {_p(p['p'])} | {_p(p['p_holm'])} | {p['verdict']} |"
        )
    return L


def _width_table(res: dict) -> list[str]:
    if not res["width"]:
        return []
    L = [
        "",
        "## Width sensitivity (secondary, unadjusted)",
        "",
        "| width | comparison | metric | mean [95% t] | seed×problem | n | reading |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in res["width"]:
        if not x.get("b"):
            L.append(f"| {x['width']} | {x['a'][1]} clip A>0 (%) | – | {_share_txt(x)} | – | {x['n']} | – |")
            continue
        L.append(
            f"| {x['width']} | {x['a'][1]} − {x['b'][1]} (`{x['b'][0]}`) | {x['key'].split('/')[-1]} | "
            f"{_pt(x)} | {_boot(x)} | {x['n']} | {x.get('verdict') or verdict_words(x)} |"
        )
    return L


def _trend_table(res: dict) -> list[str]:
    if not res.get("trend"):
        return []
    L = [
        "",
        f"## Trend: does the effect grow with {res['reference']}'s clip-binding share? (secondary, unadjusted)",
        "",
        "Least-squares slope of the same-seed differences on their cell's clip-binding share: points of "
        "difference per percentage point of share, 95% t interval (n − 2 degrees of freedom).",
        "",
        "| cells | comparison | metric | slope [95% t] | cells used | n | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in res["trend"]:
        sl = (
            "–"
            if not math.isfinite(x["slope"])
            else f"{x['slope']:+.2f}"
            + (f" [{x['slope'] - x['ci']:+.2f}, {x['slope'] + x['ci']:+.2f}]" if math.isfinite(x["ci"]) else "")
        )
        L.append(
            f"| {x['cells']} | {x['a']} − {x['b']} | {x['key'].split('/')[-1]} | {sl} | {len(x['regimes'])} | "
            f"{x['n']} | {_p(x['p'])} |"
        )
    return L


# --------------------------------------------------------------------------------- the figure
def trend_line(res: dict, a: str, b: str, key: str, shares: list[float]):
    """The trend table's least-squares line of ``a − b`` on ``key`` over all cells, drawn across the
    cells' clip-binding ``shares`` (fractions): ``((xs, ys), label)`` in percent and points, or None
    when there is no finite slope."""
    fit = next((t for t in res.get("trend", []) if (t["cells"], t["a"], t["b"], t["key"]) == ("all", a, b, key)), None)
    if not fit or not math.isfinite(fit["slope"]) or not shares:
        return None
    x = [min(shares), max(shares)]
    y = [(fit["intercept"] + fit["slope"] * v) * 100 for v in x]
    ci = f" [{fit['slope'] - fit['ci']:+.2f}, {fit['slope'] + fit['ci']:+.2f}]" if math.isfinite(fit["ci"]) else ""
    return ([v * 100 for v in x], y), f"{a} − {b}: slope {fit['slope']:+.2f}{ci}"


def dose_figure(res: dict, fdir: Path, name: str = "dose_response.png") -> str | None:
    """GAPO's effect (mean, 95% t CI, points) against the reference's clip-binding share (%), one
    point per dose cell and comparison, one panel per primary metric."""
    from matplotlib.figure import Figure

    keys = list(dict.fromkeys(p["key"] for p in res["primary"]))
    if not keys:
        return None
    clip = {lv["regime"]: lv["clip"] for lv in res["levels"]}
    fig = Figure(figsize=(5 * len(keys), 4))
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    comps = list(dict.fromkeys((p["a"][1], p["b"][1]) for p in res["primary"]))
    for ax, key in zip(axes, keys):
        _panel(ax, res, key, comps, clip)
    fig.suptitle("GAPO's effect (95% t CI over seeds) against how much fixed clipping binds")
    Path(fdir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(fdir) / name, dpi=100, bbox_inches="tight")
    return name


def _panel(ax, res: dict, key: str, comps: list, clip: dict) -> None:
    """One metric's panel of :func:`dose_figure`: each comparison's points with their trend line,
    or a note when no cell has both methods finished."""
    drawn = False
    for i, (a, b) in enumerate(comps):
        pts = [
            (clip[p["a"][0]], p)
            for p in res["primary"]
            if p["key"] == key and (p["a"][1], p["b"][1]) == (a, b) and p["n"] >= 1 and clip[p["a"][0]]["n"]
        ]
        if not pts:
            continue
        xs = [c["mean"] * 100 * (1 + 0.01 * i) for c, _ in pts]  # a hair apart so the bars do not overlap
        ys = [p["mean"] * 100 for _, p in pts]
        ye = [p["ci"] * 100 if math.isfinite(p["ci"]) else 0 for _, p in pts]
        xe = [c["ci"] * 100 if math.isfinite(c["ci"]) else 0 for c, _ in pts]
        eb = ax.errorbar(xs, ys, yerr=ye, xerr=xe, fmt="os"[i % 2], capsize=3, label=f"{a} − {b}")
        drawn = True
        line = trend_line(res, a, b, key, [c["mean"] for c, _ in pts])
        if line:
            (px, py), label = line
            ax.plot(px, py, ls="--", lw=1, color=eb[0].get_color(), label=label)
        for x, y, (_, p) in zip(xs, ys, pts):
            ax.annotate(p["a"][0], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel(f"{res['reference']}: clipped share of A>0 tokens (%)")
    ax.set_ylabel(f"difference in {key.split('/')[-1]} (points)")
    ax.set_title(key.split("/")[-1])
    if drawn:
        ax.legend(fontsize=7)
    else:  # say so rather than draw an empty frame
        ax.text(
            0.5,
            0.5,
            "no cell has GAPO and its\ncomparator finished yet",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )


def write_per_problem(cells: dict, path: Path) -> None:
    """Every finished cell's per-problem success counts, first and last evaluation:
    ``{"<regime>/<method>/seed<k>": {"before", "after", "n"}}``."""
    write_json(
        path, {f"{r}/{m}/seed{s}": c["correct"] for (r, m, s), c in sorted(cells.items(), key=str) if c.get("correct")}
    )


def dose_report(grid: dict, cells: dict, rdir: Path, fdir: Path) -> str:
    """Write ``dose.json``, ``dose.md`` (in ``rdir``) and the figure (in ``fdir``); returns a
    markdown paragraph linking them (for the grid's ``tables.md``)."""
    res = analyse(grid, cells)
    write_json(Path(rdir) / "dose.json", res)
    fig = dose_figure(res, fdir)
    md = dose_markdown(res)
    if fig:
        md += f"\n![GAPO's effect against the clip-binding share]({os.path.relpath(fdir, rdir)}/{fig})\n"
    (Path(rdir) / "dose.md").write_text(md)
    link = "\n## Dose-response\n\nSee [dose.md](dose.md)" + (f" and the figure `{fig}`." if fig else ".") + "\n"
    if comparator(grid) is not None:  # rules against one comparator (configs/adaptive-clips.yaml)
        link += family_report(grid, cells, res, rdir, fdir)
    return link
