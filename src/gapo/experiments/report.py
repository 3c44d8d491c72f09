"""Reports: tables, markdown and figures from run folders and from a grid's cells.

    gapo report runs/demo/fixed runs/demo/gapo --out runs/demo/report
    gapo compare --config configs/grid.yaml --out runs/grid --report-only

``write_report`` (``gapo report``, ``gapo demo``): PNG figures (pass@k before/after, reward and
pass rate over training, entropy over training, clip fraction of positive-advantage tokens per
group-success count ``c``, and ε_high per ``c``) and ``report.md`` with the summary table.

``grid_report`` (``gapo compare``): reads a grid's finished cells and writes ``summary.json``,
``cells.csv``, ``tables.md`` and PNG figures: mean and 95% t-interval over seeds of held-out
pass@k, coverage, first-move entropy, token entropy, clip fractions (overall and per
group-success count ``c``), wall-clock per step, paired (same seed) differences of each method
against its fixed-clipping baseline, and the claim rows (:mod:`gapo.experiments.claims`).

Both speak the summary vocabulary of :mod:`gapo.experiments.stats`: ``before/<metric>``,
``after/<metric>``, ``train/<key>`` and the per-``c`` metrics under their own keys
(``clip/frac_high_by_c/<c>``, ``stats.BY_C_SUMMARY``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path

from gapo.experiments.claims import claim_rows, independent_between, verdict
from gapo.experiments.dose import dose_report, write_per_problem
from gapo.experiments.figures import GRID_CAPTIONS, RUN_CAPTIONS, grid_figures, run_figures
from gapo.experiments.grid_spec import BASELINE_OF, cell_dir, grid_cells, write_json
from gapo.experiments.stats import by_c_entries, load_cell, mean_ci, paired_diffs, run_summary

__all__ = [
    "summarise",
    "write_report",
    "format_table",
    "format_samples",
    "grid_report",
    "default_report_dir",
    "below_base",
]

# the training diagnostics of the single-run table (``train/<key>``, NaN when never logged)
_RUN_TRAIN_KEYS = ("loss/clipfrac", "clip/frac_high_pos", "loss/approx_kl", "policy/entropy", "time/step_s")


# --------------------------------------------------------------------------------- single runs
def summarise(run: dict) -> dict:
    """One run's table row, a selection of ``stats.run_summary``: ``before/<metric>`` and
    ``after/<metric>`` (first and last evaluation: pass@k, coverage, first-move entropy) and
    ``train/<key>`` (the mean over training steps of a diagnostic), and ``steps``."""
    s = run_summary(run["train"], run["eval"])
    out = {"name": run["name"]}
    for k in sorted(int(m.group(1)) for key in s if (m := re.fullmatch(r"after/pass@(\d+)", key))):
        out[f"before/pass@{k}"] = s.get(f"before/pass@{k}")
        out[f"after/pass@{k}"] = s[f"after/pass@{k}"]
    for name in ("coverage", "first_move_entropy"):
        if f"after/{name}" in s:
            out[f"before/{name}"], out[f"after/{name}"] = s.get(f"before/{name}"), s[f"after/{name}"]
    if run["train"]:
        for key in _RUN_TRAIN_KEYS:
            out[f"train/{key}"] = s.get(f"train/{key}", float("nan"))
        out["steps"] = run["train"][-1]["step"]
    return out


def format_table(summaries: list[dict], keys: list[str] | None = None) -> str:
    """A plain-text table (markdown pipe syntax) of ``summaries``."""
    if not summaries:
        return "(no runs)"
    keys = keys or [k for k in summaries[0] if k != "name"]
    head = "| run | " + " | ".join(keys) + " |"
    sep = "|---|" + "---|" * len(keys)
    rows = []
    for s in summaries:
        cells = []
        for k in keys:
            v = s.get(k)
            cells.append(f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v)))
        rows.append(f"| {s['name']} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *rows])


def default_report_dir(run_dirs: list[str | Path]) -> Path:
    """Where ``gapo report`` writes without ``--out``: one run's own ``RUN/report/``; for several
    runs ``report-<name>-<name>…`` in their common parent folder (so reports of different sets of
    runs do not overwrite each other), the names shortened past 80 characters."""
    dirs = [Path(d).resolve() for d in run_dirs]
    if len(dirs) == 1:
        return dirs[0] / "report"
    parent = Path(os.path.commonpath([str(d.parent) for d in dirs]))
    names = "-".join(re.sub(r"[^\w.-]+", "_", d.name) for d in dirs)
    if len(names) > 80:
        import hashlib

        names = names[:70] + "-" + hashlib.sha1(names.encode()).hexdigest()[:8]
    return parent / f"report-{names}"


def below_base(summary: dict, tol: float = 0.0) -> list[tuple[int, float, float]]:
    """``(k, after, before)`` for every k where the run's last held-out pass@k is below its first
    (the base policy's, when the run started at step 0) by more than ``tol``."""
    out = []
    for key, after in summary.items():
        m = re.fullmatch(r"after/pass@(\d+)", key)
        before = summary.get(f"before/pass@{m.group(1)}") if m else None
        if m and isinstance(after, float) and isinstance(before, float) and after < before - tol:
            out.append((int(m.group(1)), after, before))
    return sorted(out)


def _below_base_md(runs: list[dict], summaries: list[dict]) -> list[str]:
    lines = []
    for run, s in zip(runs, summaries):
        worse = below_base(s)
        if worse and run["eval"] and run["eval"][0].get("step") == 0:
            ks = ", ".join(f"pass@{k} {a:.3f} < {b:.3f}" for k, a, b in worse)
            at = ", ".join(str(k) for k, _, _ in worse)
            lines.append(f"- **{run['name']} ends below the base policy** at k = {at} (after RL vs before: {ks}).")
    if lines:
        lines.append(
            "- Falling below the base at large k while pass@1 rises is RL narrowing the policy onto fewer "
            "answers; with one seed and few problems, differences of a few points are also noise."
        )
    return lines


def write_report(runs: list[dict], out_dir: str | Path, *, title: str = "gapo report", notes: str = "") -> Path:
    """Write PNG figures and ``report.md`` comparing ``runs`` into ``out_dir``; returns the md path.

    ``report.md``: the summary table, a note for every run whose final held-out pass@k is below
    the base policy's at some k, each figure with a one-line caption (``figures.RUN_CAPTIONS``),
    and per run the best and the worst rollout of one group (``format_samples``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = run_figures(runs, out)
    summaries = [summarise(r) for r in runs]
    lines = [f"# {title}", "", *([notes, ""] if notes else []), format_table(summaries), ""]
    below = _below_base_md(runs, summaries)
    if below:
        lines += ["## Below the base policy", "", *below, ""]
    for name in figs:
        lines += [f"![{name[:-4]}]({name})", "", f"*{name}: {RUN_CAPTIONS[name]}*" if name in RUN_CAPTIONS else "", ""]
    shown = [format_samples(r) for r in runs if r.get("samples")]
    if shown:
        lines += ["## What the model wrote (samples.jsonl: the best and the worst rollout of one group)", "", *shown]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md


def _pick_group(rows: list[dict]) -> tuple[int, int, list[dict]]:
    """``(step, group, rows)``: the latest step's group whose rewards differ (best ≠ worst), else
    the last step's first group."""
    by: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["step"], r.get("group", 0)), []).append(r)
    mixed = [k for k, g in by.items() if len({x["reward"] for x in g}) > 1]
    last = max(r["step"] for r in rows)
    key = max(mixed, key=lambda k: (k[0], -k[1])) if mixed else min(k for k in by if k[0] == last)
    return key[0], key[1], by[key]


def format_samples(run: dict, n: int = 2, width: int = 160) -> str:
    """The best and the worst rollout of one group of ``run`` (``n`` = 2; more shows the next best
    ones too): the latest logged step's group whose rewards differ, else the last step's first
    group. Each with the prompt's end as the model read it (after any chat template), the
    completion and its reward, as a markdown block."""
    rows = run.get("samples") or []
    if not rows:
        return ""
    step, group, g = _pick_group(rows)
    ranked = sorted(g, key=lambda r: -r["reward"])  # stable: the first logged of equal rewards
    worst = min(g, key=lambda r: r["reward"])  # the first logged of the lowest reward
    rest = [r for r in ranked if r is not worst]
    pick = rest[: max(n - 1, 1)] + [worst] if len(ranked) > 1 and n > 1 else ranked[:1]
    same = len({r["reward"] for r in g}) == 1
    what = (
        f"all {len(g)} logged rollouts of this group have reward {g[0]['reward']:g}"
        if same
        else f"best and worst of the {len(g)} logged rollouts of group {group}"
    )
    prompt = pick[0]["prompt"] if len(pick[0]["prompt"]) <= width else "…" + pick[0]["prompt"][-width:]
    out = [f"{run['name']}, step {step} ({what}):", "", "```", f"prompt: {prompt!r}"]
    for label, r in zip(["best", *["next"] * (len(pick) - 2), "worst"] if len(pick) > 1 else ["shown"], pick):
        out += [f"[{label}, reward {r['reward']:g}] completion: {r['completion'][:width]!r}"]
    return "\n".join(out + ["```", ""])


# --------------------------------------------------------------------------------- the grid
def grid_report(
    grid: dict, out: str | Path, report_dir: str | Path | None = None, figures_dir: str | Path | None = None, say=print
) -> Path:
    """Aggregate finished cells into ``summary.json``, ``cells.csv``, ``tables.md`` and figures;
    returns the path of ``tables.md``."""
    out = Path(out)
    rdir = Path(report_dir or grid.get("report_dir") or out / "report")
    fdir = Path(figures_dir or grid.get("figures_dir") or rdir)
    rdir.mkdir(parents=True, exist_ok=True)
    fdir.mkdir(parents=True, exist_ok=True)
    cells, rows, failed = _load_cells(grid, out)
    if not rows:
        raise ValueError(f"no finished cells under {str(out)!r}")
    keys = sorted({k for row in rows for k in row} - {"regime", "method", "seed"})
    _write_csv(rdir / "cells.csv", rows, keys)
    agg = _aggregate(grid, rows, keys)
    summary = {
        "grid": grid.get("name"),
        "seeds": grid["seeds"],
        "regimes": grid["regimes"],
        "methods": grid["methods"],
        "n_cells_done": len(rows),
        "n_cells_total": len(grid_cells(grid)),
        "failed": failed,
        "aggregate": agg,
        "paired": _paired(grid, cells, keys),
        "claims": claim_rows(grid, cells),
        "common": grid["common"],
        "method_defs": {m: grid["_methods"][m] for m in grid["methods"]},
    }
    write_json(rdir / "summary.json", summary)
    md = _tables_md(summary)
    figs = grid_figures(grid, cells, agg, fdir)
    rel = os.path.relpath(fdir, rdir)
    captioned = [
        f"![{f}]({rel}/{f})" + (f"\n\n*{f}: {GRID_CAPTIONS[f]}*\n" if f in GRID_CAPTIONS else "") for f in figs
    ]
    md += "\n## Figures\n\n" + "\n".join(captioned) + "\n"
    write_per_problem(cells, rdir / "per_problem.json")  # per-problem success counts of every cell
    if grid.get("dose"):  # a dose-response grid (configs/dose-response.yaml): dose.md, dose.json, its figure
        md += dose_report(grid, cells, rdir, fdir)
    (rdir / "tables.md").write_text(md)
    say(f"report: {rdir / 'tables.md'} ({len(rows)} finished cells, {len(failed)} failed)")
    return rdir / "tables.md"


def _load_cells(grid: dict, out: Path) -> tuple[dict, list[dict], list[dict]]:
    """Finished cells by ``(regime, method, seed)``, their summary rows (grid order) and the failed ones."""
    cells, rows, failed = {}, [], []
    order = lambda x: (grid["regimes"].index(x[0]), grid["methods"].index(x[1]), x[2])  # noqa: E731
    for r, m, s in sorted(grid_cells(grid), key=order):
        d = cell_dir(out, r, m, s)
        if (d / "failed.json").is_file():
            err = json.loads((d / "failed.json").read_text())
            failed.append({"cell": f"{r}/{m}/seed{s}", **{k: v for k, v in err.items() if k == "error"}})
        c = load_cell(d)
        if c is None:
            continue
        cells[(r, m, s)] = c
        rows.append({"regime": r, "method": m, "seed": s, **c["summary"]})
    return cells, rows, failed


def _write_csv(path: Path, rows: list[dict], keys: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["regime", "method", "seed", *keys])
        w.writeheader()
        for row in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})


def _aggregate(grid: dict, rows: list[dict], keys: list[str]) -> dict:
    """regime → method → key → ``mean_ci`` over seeds."""
    agg: dict = {}
    for r in grid["regimes"]:
        for m in grid["methods"]:
            rs = [row for row in rows if row["regime"] == r and row["method"] == m]
            if rs:
                agg.setdefault(r, {})[m] = {k: mean_ci([row.get(k) for row in rs]) for k in keys}
    return agg


def _paired(grid: dict, cells: dict, keys: list[str]) -> dict:
    """regime → method → ``{"vs": baseline, key: mean_ci of same-seed differences}``."""
    base = grid.get("baseline", "drgrpo")
    paired: dict = {}
    for r in grid["regimes"]:
        for m in grid["methods"]:
            b = BASELINE_OF.get(m, base)
            if m == b:
                continue
            for k in keys:
                diffs = paired_diffs(cells, r, m, b, k, grid["seeds"])
                if diffs:
                    paired.setdefault(r, {}).setdefault(m, {"vs": b})[k] = mean_ci(diffs)
    return paired


# --------------------------------------------------------------------------------- tables.md
# (summary key, column title, shown in %)
_MAIN_COLS = [
    ("after/pass@1", "pass@1", True),
    ("after/pass@8", "pass@8", True),
    ("after/pass@64", "pass@64", True),
    ("after/coverage", "coverage", True),
    ("after/first_move_entropy", "1st-move H", False),
    ("train/entropy_late", "token H (late)", False),
    ("train/clip/frac_high_pos", "clip A>0", True),
    ("train/pass_rate_rise", "train pass rise", True),
    ("train/clip/ratio_adv_corr", "r(ratio dev., A)", False),
    ("train/time/step_s", "s/step", False),
    ("train/time/update_s", "update s/step", False),
]
_BASE_COLS = [
    ("before/pass@1", True),
    ("before/pass@8", True),
    ("before/pass@64", True),
    ("before/coverage", True),
    ("before/first_move_entropy", False),
]


def _fmt(d: dict | None, pct: bool = False) -> str:
    if not d or d["n"] == 0:
        return "–"
    f = 100.0 if pct else 1.0
    if d["n"] == 1 or not math.isfinite(d["ci"]):
        return f"{d['mean'] * f:.2f}"
    return f"{d['mean'] * f:.2f} ± {d['ci'] * f:.2f}"


def _tables_md(summary: dict) -> str:
    lines = [
        f"# grid `{summary['grid']}`: {summary['n_cells_done']}/{summary['n_cells_total']} cells finished",
        "",
        "Mean ± 95% t-interval half-width over seeds. pass@k, coverage and clip fractions in %.",
        "",
    ]
    for r, by_m in summary["aggregate"].items():
        lines += _regime_md(r, by_m, summary["paired"].get(r))
    if summary.get("claims"):
        shown = {c[0] for c in _MAIN_COLS[:7]}  # the paired tables' columns (_regime_md)
        n_paired = sum(
            1
            for v in summary["paired"].values()
            for by_k in v.values()
            for k, d in by_k.items()
            if k in shown and d.get("n", 0) >= 2
        )
        lines += _claims_md(summary["claims"], n_paired)
    if summary["failed"]:
        lines += ["## failed cells", ""] + [f"- {f['cell']}: {f.get('error', '')}" for f in summary["failed"]] + [""]
    return "\n".join(lines)


def _regime_md(r: str, by_m: dict, paired: dict | None) -> list[str]:
    """One regime's section: base policy, methods table, paired differences, per-c tables."""
    base = next(iter(by_m.values()))
    lines = [f"## regime `{r}`", ""]
    lines.append("base policy: " + ", ".join(f"{k[7:]} = {_fmt(base.get(k), p)}" for k, p in _BASE_COLS if k in base))
    lines.append("")
    cols = [c for c in _MAIN_COLS if any(c[0] in v for v in by_m.values())]
    lines.append("| method | n | " + " | ".join(c[1] for c in cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    for m, v in by_m.items():
        n = max(x["n"] for x in v.values())
        lines.append(f"| {m} | {n} | " + " | ".join(_fmt(v.get(k), p) for k, _, p in cols) + " |")
    lines.append("")
    if any(v.get("train/pass_rate_rise", {}).get("n") for v in by_m.values()):
        lines += [
            "`train pass rise`: mean training pass rate of the last quarter of rollout batches minus the "
            "first quarter (points); `r(ratio dev., A)`: the windowed ratio-advantage correlation "
            "(docs/design.md §2.11), averaged over training.",
            "",
        ]
    if paired is not None:
        lines += ["Paired differences (method − baseline, same seed):", ""]
        pcols = [c for c in _MAIN_COLS[:7] if any(c[0] in v for v in paired.values())]
        lines.append("| method | vs | " + " | ".join(f"Δ {c[1]}" for c in pcols) + " |")
        lines.append("|---|---|" + "---|" * len(pcols))
        for m, v in paired.items():
            lines.append(f"| {m} | {v['vs']} | " + " | ".join(_fmt(v.get(k), p) for k, _, p in pcols) + " |")
        lines.append("")
    return lines + _by_c_md(by_m)


def _by_c_md(by_m: dict) -> list[str]:
    """Clipped share of A>0 tokens and mean |ρ−1| per group-success count c (empty without per-c data)."""
    cs = sorted({c for v in by_m.values() for c in by_c_entries(v, "clip/frac_high_by_c")})
    if not cs:
        return []
    head = ["| method | " + " | ".join(f"c={c}" for c in cs) + " |", "|---|" + "---|" * len(cs)]
    lines = ["Clipped share of positive-advantage tokens (%) by c (correct rollouts in the group):", "", *head]
    for m, v in by_m.items():
        lines.append(f"| {m} | " + " | ".join(_fmt(v.get(f"clip/frac_high_by_c/{c}"), True) for c in cs) + " |")
    for key, title in (
        ("clip/ratio_dev_by_c", "Mean |ρ−1| by c (all tokens):"),
        ("clip/ratio_dev_pos_by_c", "Mean |ρ−1| of positive-advantage tokens by c (before clipping):"),
    ):
        if not any(v.get(f"{key}/{c}", {}).get("n") for v in by_m.values() for c in cs):
            continue
        lines += ["", title, "", *head]
        for m, v in by_m.items():
            lines.append(
                f"| {m} | "
                + " | ".join(f"{v[f'{key}/{c}']['mean']:.4f}" if v.get(f"{key}/{c}", {}).get("n") else "–" for c in cs)
                + " |"
            )
    lines.append("")
    return lines


def _claims_md(claims: list[dict], n_paired: int = 0) -> list[str]:
    lines = [
        "## Claims (issue 4 item 5): paired differences, mean ± 95% t-interval; sign by the CI",
        "",
        "| claim | regime | method | vs | measure | Δ "
        "| 95% CI (t; seed×problem bootstrap where counts are stored) | n | sign |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        lo, hi = c["mean"] - c["ci"], c["mean"] + c["ci"]
        n = f"{c['k']} of {c['n']} rose" if "k" in c else c["n"]
        m = c["method"]
        if "variant_of" in c:  # e.g. GAPO-log: say how often it trained exactly as its parent
            m += f" (variant of {c['variant_of']}; identical in {c['identical'][0]} of {c['identical'][1]})"
        boot = f" (seed×problem [{c['boot_lo']:.4f}, {c['boot_hi']:.4f}])" if "boot_lo" in c else ""
        lines.append(
            f"| {c['claim']} | {c['regime']} | {m} | {c['vs']} | {c['key']} | {c['mean']:.4f} | "
            f"[{lo:.4f}, {hi:.4f}]{boot} | {n} | {verdict(c)} |"
        )
    between = [c for c in claims if c["vs"] not in ("", "base")]
    indep = independent_between(claims)
    total = len(indep) + n_paired
    lines += [
        f"{len(between)} between-method intervals above ({len(between) - len(indep)} of them a variant's that "
        f"trained as its parent in most seeds, not counted), plus {n_paired} in the paired tables of the "
        f"regimes: {total} independent intervals in this report; at 95% about {total / 20:.1f} of them "
        "would exclude zero by chance alone, so a lone '+' or '−' is a lead, not a finding.",
        "",
    ]
    return lines
