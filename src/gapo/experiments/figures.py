"""PNG figures of the reports: one function per figure.

``run_figures`` draws the single-run report's figures (``gapo report``, ``gapo demo``) from run
records; ``grid_figures`` the grid report's from aggregated cells (``gapo compare``). Figures are
``matplotlib.figure.Figure`` objects saved straight to PNG (Agg rendering) without pyplot: no
backend is selected and no global figure state is touched, so importing this module changes
nothing for a caller that uses matplotlib itself. The command line imports it only inside the
report commands, so ``gapo --help`` never loads matplotlib.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from gapo.experiments.grid_spec import BASELINE_OF
from gapo.experiments.stats import by_c, by_c_entries, mean_ci, paired_diffs

__all__ = ["run_figures", "grid_figures"]


def _save(fig: Figure, fdir: Path, name: str, dpi: int = 100) -> str:
    fig.savefig(Path(fdir) / name, dpi=dpi, bbox_inches="tight")
    return name


def _row(n: int, height: float) -> tuple[Figure, list]:
    """A figure of ``n`` panels side by side, 5 inches each."""
    fig = Figure(figsize=(5 * n, height))
    return fig, fig.subplots(1, n, squeeze=False)[0]


def _ci(d: dict) -> float:
    """An interval half-width to draw: 0 where there is none (one seed)."""
    return d["ci"] if math.isfinite(d["ci"]) else 0


def _smooth(xs: list[float], w: int) -> list[float]:
    """Running mean over the last ``w`` values."""
    out, s = [], 0.0
    for i, x in enumerate(xs):
        s += x
        if i >= w:
            s -= xs[i - w]
        out.append(s / min(i + 1, w))
    return out


# --------------------------------------------------------------------------------- single runs
def _ks(rec: dict) -> list[int]:
    return sorted(int(m.group(1)) for k in rec if (m := re.fullmatch(r"eval/pass@(\d+)", k)))


# one-line captions of the single-run report's figures (report.md puts each under its figure)
RUN_CAPTIONS = {
    "passk.png": "Held-out pass@k (unbiased, from n samples per problem) of the base policy (gray, dashed: the "
    "first evaluation, before RL) and of each run after RL (solid); k on a log scale.",
    "reward.png": "Mean reward of each step's training rollouts (running mean over 10 steps).",
    "entropy.png": "Mean token entropy of the sampled completions, in nats (running mean over 10 steps); "
    "a fast fall is the policy collapsing onto few answers.",
    "clipfrac.png": "Share of positive-advantage tokens whose ratio ρ lay above 1 + ε_high and so was clipped "
    "(running mean over 10 steps).",
    "ratio_adv_corr.png": "r(|ρ−1|, A), windowed: Pearson's r, over every (step, c) pair of the last 8 steps, "
    "between the mean |ρ−1| of positive-advantage tokens of groups with c correct "
    "rollouts and their mean advantage (the paper's diagnostic, docs/design.md §2.11); "
    "r > 0: the rare successes of hard groups moved further from the behaviour policy.",
    "eval_curve.png": "Held-out pass@1 (solid) and pass@(largest k) (dashed) at each evaluation during training.",
    "clip_by_c.png": "Per group-success count c (correct rollouts in the group): the clipped share of "
    "positive-advantage tokens (left) and their ε_high (right), over the whole run. Fixed "
    "clipping has one ε_high for every c; GAPO's grows as c falls.",
}


# the grid report's figures (tables.md): one panel per regime, means over seeds
GRID_CAPTIONS = {
    "passk.png": "Held-out pass@k after RL per method (mean over seeds, 95% t-interval) and the base policy "
    "(black, dashed); k on a log scale.",
    "clip_by_c.png": "Per group-success count c: the clipped share of positive-advantage tokens, mean over seeds.",
    "ratio_dev_by_c.png": "Per group-success count c: mean |ρ−1| of all response tokens, mean over seeds.",
    "ratio_dev_pos_by_c.png": "Per group-success count c: mean |ρ−1| of positive-advantage tokens (before "
    "clipping); the paper's premise is that it is largest at small c.",
    "pass1_curve.png": "Held-out pass@1 at each evaluation, mean over seeds.",
    "entropy.png": "Mean token entropy of the sampled completions over training, mean over seeds (smoothed).",
    "clipfrac.png": "Share of positive-advantage tokens clipped at 1 + ε_high over training, mean over seeds.",
    "ratio_adv_corr.png": RUN_CAPTIONS["ratio_adv_corr.png"].replace("r > 0", "mean over seeds; r > 0"),
    "train_pass_rate.png": "Pass rate of the training rollouts over training, mean over seeds (smoothed).",
    "coverage.png": "Share of each held-out problem's distinct solutions found (Countdown), mean over seeds.",
    "time_per_step.png": "Wall-clock seconds per training step, mean over seeds (one CPU thread per cell).",
}


def run_figures(runs: list[dict], out: Path) -> list[str]:
    """The single-run report's figures of ``runs`` (``load_run`` records) into ``out``; their names."""
    names = [_run_passk(runs, out)]
    for key, fname, label in (
        ("rollout/reward", "reward.png", "mean reward (training rollouts)"),
        ("policy/entropy", "entropy.png", "token entropy (nats)"),
        ("clip/frac_high_pos", "clipfrac.png", "clipped share of A>0 tokens"),
        ("clip/ratio_adv_corr", "ratio_adv_corr.png", "r(|ρ−1|, A), windowed"),
    ):
        if not any(key in r for run in runs for r in run["train"]):
            continue  # never logged (e.g. runs from before clip/ratio_adv_corr existed)
        names.append(_run_train_curve(runs, out, key, fname, label))
    names.append(_run_eval_curve(runs, out))
    names.append(_run_by_c(runs, out))
    return names


def _run_passk(runs: list[dict], out: Path) -> str:
    """pass@k before / after RL; "before" drawn once when every run starts from the same policy."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for i, run in enumerate(runs):
        if not run["eval"]:
            continue
        color = f"C{i}"
        for rec, style, when in ((run["eval"][0], "--", "before"), (run["eval"][-1], "-", "after")):
            ks = _ks(rec)
            if when == "before" and i > 0 and run["eval"][0].get("step") == 0 and runs[0]["eval"]:
                continue  # every run starts from the same base policy: draw "before" once
            after = when == "after"
            ax.plot(
                ks,
                [rec[f"eval/pass@{k}"] for k in ks],
                style,
                marker="o",
                color=color if after else "gray",
                label=f"{run['name']} ({when}, step {rec['step']})" if after else f"base (step {rec['step']})",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (held out)")
    ax.set_title("pass@k before and after RL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "passk.png", dpi=110)


def _run_train_curve(runs: list[dict], out: Path, key: str, fname: str, label: str) -> str:
    """A training metric over steps (running mean over 10 steps), one line per run."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for i, run in enumerate(runs):
        xs = [r["step"] for r in run["train"] if key in r]
        ys = [r[key] for r in run["train"] if key in r]
        if xs:
            ax.plot(xs, _smooth(ys, 10), color=f"C{i}", label=run["name"])
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, fname, dpi=110)


def _run_eval_curve(runs: list[dict], out: Path) -> str:
    """Held-out pass@1 and pass@(largest k) over training."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for i, run in enumerate(runs):
        ks = _ks(run["eval"][-1]) if run["eval"] else []
        for k, style in ((1, "-"), (max(ks) if ks else 1, "--")):
            xs = [r["step"] for r in run["eval"]]
            ax.plot(
                xs,
                [r.get(f"eval/pass@{k}") for r in run["eval"]],
                style,
                marker=".",
                color=f"C{i}",
                label=f"{run['name']} pass@{k}",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("held-out pass@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "eval_curve.png", dpi=110)


def _run_by_c(runs: list[dict], out: Path) -> str:
    """Clip fraction and ε_high of positive-advantage rollouts per group-success count c."""
    fig = Figure(figsize=(10, 3.5))
    axes = fig.subplots(1, 2)
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        for ax, prefix, label in (
            (axes[0], "clip/frac_high_by_c/", "clipped share of A>0 tokens"),
            (axes[1], "clip/eps_high_pos_by_c/", "ε_high of A>0 rollouts"),
        ):
            d = by_c(run["train"], prefix)
            ax.bar(
                [c + (i - (len(runs) - 1) / 2) * width for c in d],
                list(d.values()),
                width=width,
                color=f"C{i}",
                label=run["name"],
            )
            ax.set_xlabel("c = correct rollouts in the group")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "clip_by_c.png", dpi=110)


# --------------------------------------------------------------------------------- the grid
def grid_figures(grid: dict, cells: dict, agg: dict, fdir: Path) -> list[str]:
    """The grid report's figures into ``fdir``; their names. ``cells``: ``(regime, method, seed)``
    → ``stats.load_cell``; ``agg``: regime → method → key → ``mean_ci``."""
    regimes = [r for r in grid["regimes"] if r in agg]
    methods = grid["methods"]
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    names = [_grid_passk(agg, regimes, colors, fdir)]
    for key, fname, ylabel in (
        ("clip/frac_high_by_c", "clip_by_c.png", "clipped share of A>0 tokens"),
        ("clip/ratio_dev_by_c", "ratio_dev_by_c.png", "mean |ρ−1|"),
        ("clip/ratio_dev_pos_by_c", "ratio_dev_pos_by_c.png", "mean |ρ−1| of A>0 tokens"),
    ):
        names.append(_grid_by_c(agg, regimes, methods, colors, key, fname, ylabel, fdir))
    for key, kind, fname, ylabel in (
        ("eval/pass@1", "eval", "pass1_curve.png", "held-out pass@1"),
        ("policy/entropy", "train", "entropy.png", "token entropy (nats)"),
        ("clip/frac_high_pos", "train", "clipfrac.png", "clipped share of A>0 tokens"),
        ("clip/ratio_adv_corr", "train", "ratio_adv_corr.png", "r(|ρ−1|, A), windowed"),
        ("rollout/pass_rate", "train", "train_pass_rate.png", "training pass rate"),
    ):
        names.append(_grid_curve(grid, cells, regimes, colors, _Curve(key, kind, fname, ylabel), fdir))
    names.append(_grid_coverage(agg, regimes, methods, colors, fdir))
    names.append(_grid_time(agg, regimes, methods, fdir))
    if grid.get("scale"):
        names.append(_grid_scale(grid, cells, fdir))
    return names


def _grid_passk(agg: dict, regimes: list[str], colors: dict, fdir: Path) -> str:
    """pass@k curves after RL per regime, with the base policy's."""
    fig, axes = _row(len(regimes), 4)
    for ax, r in zip(axes, regimes):
        by_m = agg[r]
        any_m = next(iter(by_m.values()))
        ks = sorted(int(k.split("@")[1]) for k in any_m if k.startswith("after/pass@"))
        bks = [k for k in ks if f"before/pass@{k}" in any_m]
        ax.plot(bks, [any_m[f"before/pass@{k}"]["mean"] for k in bks], "k--", marker="o", label="base")
        for m, v in by_m.items():
            ax.errorbar(
                ks,
                [v[f"after/pass@{k}"]["mean"] for k in ks],
                yerr=[_ci(v[f"after/pass@{k}"]) for k in ks],
                color=colors[m],
                marker=".",
                capsize=2,
                label=m,
                lw=1,
            )
        ax.set_xscale("log", base=2)
        ax.set_title(f"{r}: held-out pass@k after RL")
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("pass@k (mean, 95% CI)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, fdir, "passk.png")


def _grid_by_c(
    agg: dict, regimes: list[str], methods: list[str], colors: dict, key: str, fname: str, ylabel: str, fdir: Path
) -> str:
    """``key/<c>`` bars per c: each GAPO variant next to its fixed-clipping baseline."""
    pairs = [(b, g) for g, b in BASELINE_OF.items() if g in methods and b in methods]
    show = list(dict.fromkeys(m for p in pairs for m in p)) or methods[:2]
    fig, axes = _row(len(regimes), 3.6)
    for ax, r in zip(axes, regimes):
        here = [m for m in show if m in agg[r]]
        width = 0.8 / max(len(here), 1)
        for i, m in enumerate(here):
            v = agg[r].get(m, {})
            cs = list(by_c_entries(v, key))
            mean = [v[f"{key}/{c}"]["mean"] for c in cs]
            ci = [_ci(v[f"{key}/{c}"]) for c in cs]
            top = 1.0 if key == "clip/frac_high_by_c" else math.inf  # intervals cut at the possible range
            yerr = [[min(e, y) for y, e in zip(mean, ci)], [min(e, top - y) for y, e in zip(mean, ci)]]
            ax.bar(
                [c + (i - (len(here) - 1) / 2) * width for c in cs],
                mean,
                yerr=yerr,
                width=width,
                color=colors[m],
                label=m,
                capsize=1,
            )
        ax.set_title(r)
        ax.set_xlabel("c = correct rollouts in the group")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    axes[0].set_ylabel(ylabel)
    fig.tight_layout()
    return _save(fig, fdir, fname)


def _seed_mean_curve(runs: list[list[dict]], key: str) -> tuple[list[int], list[float]]:
    """Steps at which any run logged ``key``, and the mean over runs at each."""
    steps = sorted({x["step"] for run in runs for x in run if key in x})
    ys = []
    for st in steps:
        vals = [x[key] for run in runs for x in run if x["step"] == st and isinstance(x.get(key), (int, float))]
        ys.append(sum(vals) / len(vals) if vals else float("nan"))
    return steps, ys


@dataclass(frozen=True)
class _Curve:
    """One curve figure of the grid: metric ``key`` of the ``kind`` log (``train`` or ``eval``),
    drawn into ``fname`` with y label ``ylabel``."""

    key: str
    kind: str
    fname: str
    ylabel: str


def _grid_curve(grid: dict, cells: dict, regimes: list[str], colors: dict, curve: _Curve, fdir: Path) -> str:
    """A metric over training, seed means per method (training metrics smoothed over 5 steps)."""
    key, kind, fname, ylabel = curve.key, curve.kind, curve.fname, curve.ylabel
    fig, axes = _row(len(regimes), 3.6)
    for ax, r in zip(axes, regimes):
        for m in grid["methods"]:
            runs = [cells[(r, m, s)][kind] for s in grid["seeds"] if (r, m, s) in cells]
            if not runs:
                continue
            steps, ys = _seed_mean_curve(runs, key)
            if kind == "train":
                ys = _smooth(ys, 5)
            ax.plot(steps, ys, color=colors[m], label=m, lw=1, marker="." if kind == "eval" else None)
        ax.set_title(r)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, fdir, fname)


def _grid_coverage(agg: dict, regimes: list[str], methods: list[str], colors: dict, fdir: Path) -> str:
    """Coverage and first-move entropy: the base policy's and each method's after RL, per regime."""
    fig = Figure(figsize=(11, 3.6))
    axes = fig.subplots(1, 2)
    for ax, key, ylabel in (
        (axes[0], "coverage", "share of distinct solutions found"),
        (axes[1], "first_move_entropy", "first-move entropy (nats)"),
    ):
        width = 0.8 / (len(methods) + 1)
        for j, r in enumerate(regimes):
            v0 = next(iter(agg[r].values())).get(f"before/{key}")
            if v0:
                ax.bar(j - 0.4 + width / 2, v0["mean"], width=width, color="k", label="base" if j == 0 else None)
            for i, m in enumerate(methods):
                v = agg[r].get(m, {}).get(f"after/{key}")
                if v:
                    ax.bar(
                        j - 0.4 + (i + 1.5) * width,
                        v["mean"],
                        width=width,
                        color=colors[m],
                        yerr=_ci(v),
                        capsize=1,
                        label=m if j == 0 else None,
                    )
        ax.set_xticks(range(len(regimes)), regimes)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, fdir, "coverage.png")


def _grid_time(agg: dict, regimes: list[str], methods: list[str], fdir: Path) -> str:
    """Update wall-clock per step, per method and regime."""
    fig = Figure(figsize=(max(6, len(methods)), 3.6))
    ax = fig.subplots()
    width = 0.8 / max(len(regimes), 1)
    for j, r in enumerate(regimes):
        for i, m in enumerate(methods):
            v = agg[r].get(m, {}).get("train/time/update_s")
            if v:
                ax.bar(
                    i + (j - (len(regimes) - 1) / 2) * width,
                    v["mean"],
                    width=width,
                    color=f"C{j}",
                    yerr=_ci(v),
                    capsize=1,
                    label=r if i == 0 else None,
                )
    ax.set_xticks(range(len(methods)), methods, rotation=30, fontsize=8)
    ax.set_ylabel("update wall-clock per step (s)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, fdir, "time_per_step.png")


def _grid_scale(grid: dict, cells: dict, fdir: Path) -> str:
    """The scale trend: GAPO − Dr.GRPO (paired by seed) held-out pass@1 and pass@64 with 95%
    intervals, one point per regime of ``grid["scale"]`` (regime → policy parameters)."""
    scale = {r: float(n) for r, n in grid["scale"].items() if r in grid["regimes"]}
    fig, axes = _row(2, 3.6)
    for ax, key in zip(axes, ("after/pass@1", "after/pass@64")):
        for r, n in sorted(scale.items(), key=lambda x: x[1]):
            d = mean_ci(paired_diffs(cells, r, "gapo", BASELINE_OF["gapo"], key, grid["seeds"]))
            if d["n"]:
                ax.errorbar([n], [100 * d["mean"]], yerr=[100 * _ci(d)], fmt="o", capsize=4, color="C0")
                ax.annotate(
                    f"{r} (n={d['n']})", (n, 100 * d["mean"]), textcoords="offset points", xytext=(6, 4), fontsize=8
                )
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("policy parameters")
        ax.set_title(f"GAPO − Dr.GRPO, {key.split('/')[1]} (points)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, fdir, "scale.png")
