"""GAPO against the adaptive clips (issue 36, item 4; ``configs/adaptive-clips.yaml``).

A grid whose ``dose`` block compares several rules with one comparator (every pair ``[X, dapo]``:
"does any rule beat clip-higher?") gets, beside :mod:`gapo.experiments.dose`'s ``dose.md``, the
study's own report ``clip_family.md``, ``clip_family.json`` and two figures:

- its **first lines** answer the plan's question: which rule, if any, beat the comparator (a
  primary test surviving Holm with a gain, :func:`gapo.experiments.dose.verdict_words`) and what
  each rule did to the tokens of groups with c = 1 success of G (GAPO, arXiv 2609.00444, puts its
  effect there); a grid with unfinished runs says that it is partial and how far it got;
- **the c = 1 table**, per cell and method: seeds done, held-out pass@1, and at c = 1 and 2 the
  clipped share of positive-advantage tokens ``clip/frac_high_by_c/<c>`` (token-weighted over
  training), its same-seed difference from the comparator, the mean ``|ρ − 1|`` of
  positive-advantage tokens before clipping ``clip/ratio_dev_pos_by_c/<c>`` (the same measure for
  every rule, whether it clips, gates or penalises) and the gate weight ``clip/gate_by_c/<c>`` (a
  token's policy-gradient weight relative to the unclipped PPO gradient A·∇ρ) where the runs log it;
  every value the mean over seeds with its 95% Student-t interval;
- secondary, unadjusted and counted: each method − Dr.GRPO (``dose.reference``) on pass@1;
- ``pass1_by_method.png``: held-out pass@1 (95% t) per method, one panel per cell, the
  comparator's mean dashed; ``per_c_by_method.png``: the per-c clip share, ratio deviation and
  (where logged) gate weight, one line per method, one column per cell.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from gapo.experiments.grid_spec import dose_spec, methods_of, write_json
from gapo.experiments.stats import by_c, mean_ci, paired_diffs

__all__ = [
    "comparator",
    "PER_C",
    "analyse_family",
    "family_markdown",
    "pass1_figure",
    "per_c_figure",
    "per_c_plot",
    "family_figures",
    "family_report",
]

# the per-c metrics of the c = 1 table and the figure: summary key prefix -> label
PER_C = {
    "clip/frac_high_by_c": "clipped share of A>0 tokens (%)",
    "clip/ratio_dev_pos_by_c": "mean |ρ−1| of A>0 tokens",
    "clip/gate_by_c": "gate weight (PPO = 1)",
}


def comparator(grid: dict) -> str | None:
    """The one method every ``dose.comparisons`` pair compares with, when there are two or more pairs
    and it is not ``dose.reference`` (a family of rules against one comparator); else None (the
    dose-response's GAPO − Dr.GRPO and GAPO − DAPO pairs are not such a family)."""
    pairs = dose_spec(grid)["comparisons"]
    bs = {b for _, b in pairs}
    if len(pairs) < 2 or len(bs) != 1:
        return None
    b = bs.pop()
    return None if b == dose_spec(grid)["reference"] else b


def _per_c(cell: dict, metric: str, c: int) -> float:
    """``<metric>/<c>`` of a cell: its summary's (``stats.BY_C_SUMMARY``), else the mean over the
    training steps that logged it (metrics the summary does not aggregate, e.g. the gate)."""
    v = cell["summary"].get(f"{metric}/{c}")
    if v is None:
        v = by_c(cell.get("train") or [], metric + "/").get(c)
    return math.nan if v is None else float(v)


def _method_row(grid: dict, cells: dict, r: str, m: str, b: str, G: int) -> dict:
    """One method in one cell: seeds done, pass@1, each per-c metric at every c (mean_ci over seeds)
    and, at c = 1 and 2, the same-seed difference from the comparator ``b`` in the clip share."""
    seeds = [s for s in grid["seeds"] if (r, m, s) in cells]
    row = {
        "regime": r,
        "method": m,
        "n_done": len(seeds),
        "pass@1": mean_ci([cells[(r, m, s)]["summary"].get("after/pass@1", math.nan) for s in seeds]),
    }
    for metric in PER_C:
        row[metric] = {c: mean_ci([_per_c(cells[(r, m, s)], metric, c) for s in seeds]) for c in range(1, G)}
    clip = "clip/frac_high_by_c"
    row["clip_minus_comparator"] = {
        c: mean_ci(
            [
                _per_c(cells[(r, m, s)], clip, c) - _per_c(cells[(r, b, s)], clip, c)
                for s in grid["seeds"]
                if (r, m, s) in cells and (r, b, s) in cells
            ]
        )
        for c in (1, 2)
        if m != b
    }
    return row


def analyse_family(grid: dict, cells: dict, res: dict) -> dict:
    """Everything :func:`family_markdown` and :func:`family_figures` draw; ``res`` is
    :func:`gapo.experiments.dose.analyse`'s result on the same cells (its Holm-adjusted primary family)."""
    b, spec = comparator(grid), dose_spec(grid)
    if b is None:
        raise ValueError("dose.comparisons is not a family of rules against one comparator (see comparator())")
    ref, regimes = spec["reference"], [lv["regime"] for lv in res["levels"]]
    rows = []
    for r in regimes:
        G = next((cells[k]["G"] for k in cells if k[0] == r), 8)
        rows += [_method_row(grid, cells, r, m, b, G) for m in methods_of(grid, r)]
    vs_ref = [
        {"regime": r, "method": m, **mean_ci(paired_diffs(cells, r, m, ref, "after/pass@1", grid["seeds"]))}
        for r in regimes
        for m in methods_of(grid, r)
        if m != ref
    ]
    planned = {(r, m, s) for r in regimes for m in methods_of(grid, r) for s in grid["seeds"]}
    primary = [p for p in res["primary"] if p["b"][1] == b]
    return {
        "grid": grid.get("name"),
        "comparator": b,
        "reference": ref,
        "rules": [a for a, _ in spec["comparisons"]],
        "regimes": regimes,
        "rows": rows,
        "vs_reference": vs_ref,
        "primary": primary,
        "family_size": res["family_size"],
        "runs_done": len(planned & set(cells)),
        "runs_planned": len(planned),
        # secondary, unadjusted: X − comparator clip share at c = 1, 2 and X − reference pass@1
        "n_secondary_intervals": sum(len(x["clip_minus_comparator"]) for x in rows) + len(vs_ref),
    }


# --------------------------------------------------------------------------------- markdown
def _winners(fam: dict, word: str) -> list[str]:
    return [
        f"{p['a'][1]} at `{p['a'][0]}` on {p['key'].split('/')[-1]}: {p['verdict']}"
        for p in fam["primary"]
        if p["verdict"].startswith(word)
    ]


def _answer(fam: dict) -> list[str]:
    """The report's first lines: the partial-run warning, which rule beat the comparator, and what each
    rule did to c = 1 tokens (clipped share, %, and its difference from the comparator, points)."""
    b, L = fam["comparator"], []
    if fam["runs_done"] < fam["runs_planned"]:
        L += [
            f"**Partial**: {fam['runs_done']} of {fam['runs_planned']} planned runs finished (seeds done per "
            "method in the table); tests still missing seeds count as p = 1 in the Holm family.",
            "",
        ]
    won = _winners(fam, "a gain")
    if won:
        L.append(f"**Which rule beat {b} here:** " + "; ".join(won) + ".")
    else:
        L.append(
            f"**Which rule beat {b} here: none.** No primary test of {fam['family_size']} survives Holm with a "
            f"gain; each rule's pass@1 verdicts are below."
        )
    lost = _winners(fam, "a loss")
    if lost:
        L.append("Losses that survive Holm: " + "; ".join(lost) + ".")
    L += ["", f"**What each rule did to c = 1 tokens** (clipped share of A>0 tokens, %; − {b} in points):", ""]
    for r in fam["regimes"]:
        parts = []
        for x in (x for x in fam["rows"] if x["regime"] == r):
            d = x["clip_minus_comparator"].get(1)
            if not x["n_done"]:
                parts.append(f"{x['method']} not run yet")
                continue
            diff = f" ({_pts(d)})" if d else ""
            parts.append(f"{x['method']} {_pct(x['clip/frac_high_by_c'].get(1))}{diff}")
        L.append(f"- `{r}`: " + ", ".join(parts))
    L += ["", "Each rule's pass@1 verdict against " + b + ":", ""]
    for a in fam["rules"]:
        ps = [p for p in fam["primary"] if p["a"][1] == a and p["key"].endswith("pass@1")]
        L.append(f"- {a}: " + "; ".join(f"`{p['a'][0]}` {p['verdict']}" for p in ps))
    return L


def family_markdown(fam: dict) -> str:
    """``clip_family.md``: the answer first, then the c = 1 table, then the secondary pass@1 differences."""
    b = fam["comparator"]
    L = [f"# GAPO against the adaptive clips ({fam['grid']})", "", *_answer(fam)]
    L += [
        "",
        "## What each rule did to low-success groups",
        "",
        "Mean over seeds [95% t]; clip shares and their differences in percent / points, ratio deviation "
        "and gate as logged. '–': not logged or no seed finished.",
        "",
        f"| cell | method | seeds | held-out pass@1 | clip c = 1 (%) | − {b} c = 1 | clip c = 2 (%) | − {b} c = 2 | "
        "|ρ−1| A>0 c = 1 | c = 2 | gate c = 1 | c = 2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in fam["rows"]:
        dev, gate = x["clip/ratio_dev_pos_by_c"], x["clip/gate_by_c"]
        L.append(
            f"| `{x['regime']}` | {x['method']} | {x['n_done']} | {_pct(x['pass@1'])} | "
            f"{_pct(x['clip/frac_high_by_c'].get(1))} | {_pts(x['clip_minus_comparator'].get(1))} | "
            f"{_pct(x['clip/frac_high_by_c'].get(2))} | {_pts(x['clip_minus_comparator'].get(2))} | "
            f"{_num(dev.get(1))} | {_num(dev.get(2))} | {_num(gate.get(1))} | {_num(gate.get(2))} |"
        )
    L += [
        "",
        f"## Each method − {fam['reference']}, held-out pass@1 (secondary, unadjusted)",
        "",
        "| cell | method | mean [95% t] (points) | n |",
        "|---|---|---|---|",
    ]
    L += [f"| `{x['regime']}` | {x['method']} | {_pts(x)} | {x['n']} |" for x in fam["vs_reference"]]
    n = fam["n_secondary_intervals"]
    L += [
        "",
        f"{n} secondary intervals in this file (unadjusted; dose.md counts its own): at 95% about {n / 20:.1f} "
        "would exclude zero by chance alone.",
        "",
    ]
    return "\n".join(L)


def _num(d: dict | None, scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
    """``mean_ci`` as "mean [lo, hi]" (95% t) times ``scale``, "mean" with one seed, "–" with none;
    ``sign`` "+" for differences."""
    if not d or d.get("n", 0) == 0 or not math.isfinite(d["mean"]):
        return "–"
    f = f"{sign}.{digits}f"
    m = d["mean"] * scale
    if d["n"] < 2 or not math.isfinite(d["ci"]):
        return format(m, f)
    h = d["ci"] * scale
    return f"{format(m, f)} [{format(m - h, f)}, {format(m + h, f)}]"


def _pct(d: dict | None) -> str:
    """A share or pass@1 in percent."""
    return _num(d, 100.0, 1)


def _pts(d: dict | None) -> str:
    """A difference of shares or pass@1 in points."""
    return _num(d, 100.0, 1, "+")


# --------------------------------------------------------------------------------- figures
def _colors(fam: dict) -> dict:
    methods = list(dict.fromkeys(x["method"] for x in fam["rows"]))
    return {m: f"C{i % 10}" for i, m in enumerate(methods)}


def pass1_figure(fam: dict, fdir: Path, name: str = "pass1_by_method.png") -> str:
    """Held-out pass@1 (mean, 95% t interval, percent) per method, one panel per cell; the
    comparator's mean dashed across the panel."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(fam["regimes"]), 4))
    axes = fig.subplots(1, len(fam["regimes"]), squeeze=False)[0]
    colors = _colors(fam)
    for ax, r in zip(axes, fam["regimes"]):
        rows = [x for x in fam["rows"] if x["regime"] == r]
        for i, x in enumerate(rows):
            d = x["pass@1"]
            if d["n"]:
                ci = d["ci"] * 100 if math.isfinite(d["ci"]) else 0
                ax.errorbar([i], [d["mean"] * 100], yerr=[ci], fmt="o", capsize=3, color=colors[x["method"]])
        base = next((x["pass@1"] for x in rows if x["method"] == fam["comparator"]), None)
        if base and base["n"]:
            ax.axhline(base["mean"] * 100, ls="--", lw=0.8, color="k", label=f"{fam['comparator']} mean")
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"{x['method']}\n(n={x['n_done']})" for x in rows], fontsize=7, rotation=45)
        ax.set_title(f"{r}: held-out pass@1")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("pass@1 (%, mean and 95% t over seeds)")
    fig.tight_layout()
    Path(fdir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(fdir) / name, dpi=100, bbox_inches="tight")
    return name


def per_c_figure(fam: dict, fdir: Path, name: str = "per_c_by_method.png") -> str:
    """:func:`per_c_plot` saved as ``name`` in ``fdir``."""
    fig = per_c_plot(fam)
    Path(fdir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(fdir) / name, dpi=100, bbox_inches="tight")
    return name


def per_c_plot(fam: dict):
    """One row per logged per-c metric (:data:`PER_C`), one column per cell: the metric's mean over
    seeds against c (clip shares in percent), one line per method; a ``matplotlib`` Figure."""
    from matplotlib.figure import Figure

    metrics = [m for m in PER_C if any(d["n"] for x in fam["rows"] for d in x[m].values())]
    metrics = metrics or list(PER_C)[:1]
    fig = Figure(figsize=(5 * len(fam["regimes"]), 3.2 * len(metrics)))
    axes = fig.subplots(len(metrics), len(fam["regimes"]), squeeze=False)
    colors = _colors(fam)
    for i, metric in enumerate(metrics):
        for j, r in enumerate(fam["regimes"]):
            ax = axes[i][j]
            for x in (x for x in fam["rows"] if x["regime"] == r):
                scale = 100.0 if metric == "clip/frac_high_by_c" else 1.0
                pts = [
                    (c, d["mean"] * scale) for c, d in sorted(x[metric].items()) if d["n"] and math.isfinite(d["mean"])
                ]
                if pts:
                    ax.plot(*zip(*pts), marker=".", lw=1, color=colors[x["method"]], label=x["method"])
            ax.set_title(f"{r}: {PER_C[metric]}", fontsize=9)
            ax.set_xlabel("c = correct rollouts in the group")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
            else:  # say so rather than draw an empty frame
                ax.text(0.5, 0.5, "not logged / no run finished", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def family_figures(fam: dict, fdir: Path) -> list[str]:
    """Both figures into ``fdir``; their names."""
    return [pass1_figure(fam, fdir), per_c_figure(fam, fdir)]


def family_report(grid: dict, cells: dict, res: dict, rdir: Path, fdir: Path) -> str:
    """Write ``clip_family.json``, ``clip_family.md`` (in ``rdir``) and the figures (in ``fdir``);
    returns a markdown paragraph linking them (for the grid's ``tables.md``)."""
    fam = analyse_family(grid, cells, res)
    write_json(Path(rdir) / "clip_family.json", fam)
    figs = family_figures(fam, fdir)
    rel = os.path.relpath(fdir, rdir)
    md = family_markdown(fam) + "".join(f"\n![{f}]({rel}/{f})\n" for f in figs)
    (Path(rdir) / "clip_family.md").write_text(md)
    return "\n## GAPO against the adaptive clips\n\nSee [clip_family.md](clip_family.md).\n"
