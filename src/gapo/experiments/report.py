"""Plots and a markdown report from run folders (``metrics.jsonl`` written by the trainer).

    gapo report runs/demo/fixed runs/demo/gapo --out runs/demo/report

Figures (PNG): pass@k before/after, reward and pass rate over training, entropy over
training, clip fraction of positive-advantage tokens per group-success count ``c``, and
ε_high per ``c``. ``report.md`` holds the summary table and links the figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["summarise", "write_report", "format_table"]


def _ks(rec: dict) -> list[int]:
    return sorted(int(m.group(1)) for k in rec if (m := re.fullmatch(r"eval/pass@(\d+)", k)))


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(run: dict) -> dict:
    """One run in the summary vocabulary shared with the grid: ``before/<metric>`` and
    ``after/<metric>`` (first and last evaluation: pass@k, coverage, first-move entropy) and
    ``train/<key>`` (the mean over training steps of a diagnostic)."""
    out = {"name": run["name"]}
    if run["eval"]:
        first, last = run["eval"][0], run["eval"][-1]
        for k in _ks(last):
            out[f"before/pass@{k}"] = first.get(f"eval/pass@{k}")
            out[f"after/pass@{k}"] = last.get(f"eval/pass@{k}")
        for key in ("eval/coverage", "eval/first_move_entropy"):
            if key in last:
                out[f"before/{key[5:]}"], out[f"after/{key[5:]}"] = first.get(key), last[key]
    tr = run["train"]
    if tr:
        for key in ("loss/clipfrac", "clip/frac_high_pos", "loss/approx_kl", "policy/entropy", "time/step_s"):
            out[f"train/{key}"] = _mean(r.get(key) for r in tr)
        out["steps"] = tr[-1]["step"]
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


def _by_c(records: list[dict], prefix: str) -> dict[int, float]:
    """Training mean of ``{prefix}{c}`` for every c seen."""
    acc: dict[int, list[float]] = {}
    for r in records:
        for k, v in r.items():
            if k.startswith(prefix) and isinstance(v, (int, float)):
                acc.setdefault(int(k[len(prefix):]), []).append(v)
    return {c: sum(v) / len(v) for c, v in sorted(acc.items())}


def _smooth(xs: list[float], w: int) -> list[float]:
    out, s = [], 0.0
    for i, x in enumerate(xs):
        s += x
        if i >= w:
            s -= xs[i - w]
        out.append(s / min(i + 1, w))
    return out


def write_report(runs: list[dict], out_dir: str | Path, *, title: str = "gapo report", notes: str = "") -> Path:
    """Write PNG figures and ``report.md`` comparing ``runs`` into ``out_dir``; returns the md path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = []

    # pass@k before / after
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, run in enumerate(runs):
        if not run["eval"]:
            continue
        color = f"C{i}"
        for rec, style, when in ((run["eval"][0], "--", "before"), (run["eval"][-1], "-", "after")):
            ks = _ks(rec)
            if when == "before" and i > 0 and run["eval"][0].get("step") == 0 and runs[0]["eval"]:
                continue  # every run starts from the same base policy: draw "before" once
            ax.plot(ks, [rec[f"eval/pass@{k}"] for k in ks], style, marker="o", color=color if when == "after" else "gray",
                    label=f"{run['name']} ({when}, step {rec['step']})" if when == "after" else f"base (step {rec['step']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (held out)")
    ax.set_title("pass@k before and after RL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figs.append(("passk.png", fig))

    # reward / pass rate and entropy over training
    for key, fname, label in (("rollout/reward", "reward.png", "mean reward (training rollouts)"),
                              ("policy/entropy", "entropy.png", "token entropy (nats)"),
                              ("clip/frac_high_pos", "clipfrac.png", "clipped share of A>0 tokens")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, run in enumerate(runs):
            xs = [r["step"] for r in run["train"] if key in r]
            ys = [r[key] for r in run["train"] if key in r]
            if xs:
                ax.plot(xs, _smooth(ys, 10), color=f"C{i}", label=run["name"])
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        figs.append((fname, fig))

    # eval pass@1 over training
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, run in enumerate(runs):
        ks = _ks(run["eval"][-1]) if run["eval"] else []
        for k, style in ((1, "-"), (max(ks) if ks else 1, "--")):
            xs = [r["step"] for r in run["eval"]]
            ax.plot(xs, [r.get(f"eval/pass@{k}") for r in run["eval"]], style, marker=".", color=f"C{i}",
                    label=f"{run['name']} pass@{k}")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out pass@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figs.append(("eval_curve.png", fig))

    # clip fraction and eps_high per group-success count c
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        for ax, prefix, label in ((axes[0], "clip/frac_high_by_c/", "clipped share of A>0 tokens"),
                                  (axes[1], "clip/eps_high_pos_by_c/", "ε_high of A>0 rollouts")):
            d = _by_c(run["train"], prefix)
            ax.bar([c + (i - (len(runs) - 1) / 2) * width for c in d], list(d.values()), width=width,
                   color=f"C{i}", label=run["name"])
            ax.set_xlabel("c = correct rollouts in the group")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    figs.append(("clip_by_c.png", fig))

    for name, fig in figs:
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)

    summaries = [summarise(r) for r in runs]
    lines = [f"# {title}", "", *([notes, ""] if notes else []), format_table(summaries), ""]
    for name, _ in figs:
        lines += [f"![{name[:-4]}]({name})", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md
