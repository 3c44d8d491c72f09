"""Statistics over seeds, and the summary of one finished run in the shared vocabulary.

A run's summary (``run_summary``) names every value ``before/<metric>`` or ``after/<metric>``
(the first and the last held-out evaluation), ``train/<key>`` (a mean over training steps) or,
for the per group-success-count diagnostics, the per-step metric's own key ``<metric>/<c>``
(``clip/frac_high_by_c/<c>``, …: ``BY_C_SUMMARY`` says how each is aggregated over training).
The grid's cells (``load_cell``) and the single-run report (``report.summarise``) both read it.

Over seeds, ``mean_ci`` gives the mean and the 95% Student-t half-width; ``paired_diffs`` the
same-seed differences between two methods, which is what every comparison of the grid uses.
``t_pvalue`` is the two-sided paired t-test p-value of such differences and ``holm`` the Holm
(1979) step-down adjustment of a family of p-values.

The seed-only t interval treats the held-out problems as fixed. ``seed_problem_bootstrap``
resamples both: seeds (paired, with replacement) and problems (with replacement, the same
problems for every seed and both methods, since every cell of a regime is evaluated on the same
problems), on the per-problem success counts every evaluation stores (``eval/correct``;
``load_cell`` returns them as ``correct``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from gapo.core.metrics import pass_at_k
from gapo.rl.run_records import load_run

__all__ = [
    "t975",
    "mean_ci",
    "paired_diffs",
    "TRAIN_KEYS",
    "BY_C_SUMMARY",
    "by_c",
    "by_c_entries",
    "run_summary",
    "load_cell",
    "t_pvalue",
    "holm",
    "per_problem_pass_at_k",
    "seed_problem_bootstrap",
    "paired_problem_diffs",
]

# two-sided 95% Student t quantiles t_{0.975, df}
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}

# the training diagnostics averaged over steps into ``train/<key>``
TRAIN_KEYS = (
    "clip/frac_high_pos",
    "loss/clipfrac",
    "policy/entropy",
    "time/step_s",
    "time/update_s",
    "rollout/pass_rate",
    "loss/approx_kl",
    "clip/ratio_adv_corr",
)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (the next tabulated df up)."""
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975)
    return next((_T975[k] for k in keys if k >= df), 1.96)


def mean_ci(xs: list[float]) -> dict:
    """Mean and 95% t-interval half-width over seeds (``ci`` is NaN with one value)."""
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return {"mean": float("nan"), "ci": float("nan"), "n": 0}
    m = sum(xs) / n
    if n == 1:
        return {"mean": m, "ci": float("nan"), "n": 1}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return {"mean": m, "ci": t975(n - 1) * sd / math.sqrt(n), "n": n}


def paired_diffs(cells: dict, regime: str, a: str, b: str, key: str, seeds: list[int]) -> list[float]:
    """``a − b`` of summary ``key`` for every seed where both cells finished (NaN where one lacks
    the key, which ``mean_ci`` then drops). ``cells`` maps ``(regime, method, seed)`` to
    ``load_cell``'s result."""
    nan = float("nan")
    return [
        cells[(regime, a, s)]["summary"].get(key, nan) - cells[(regime, b, s)]["summary"].get(key, nan)
        for s in seeds
        if (regime, a, s) in cells and (regime, b, s) in cells
    ]


def _numbers(xs) -> list:
    return [x for x in xs if isinstance(x, (int, float))]


def by_c(records: list[dict], prefix: str) -> dict[int, float]:
    """Training mean of ``{prefix}{c}`` for every c seen, by increasing c."""
    acc: dict[int, list[float]] = {}
    for r in records:
        for k, v in r.items():
            if k.startswith(prefix) and isinstance(v, (int, float)):
                acc.setdefault(int(k[len(prefix) :]), []).append(v)
    return {c: sum(v) / len(v) for c, v in sorted(acc.items())}


def _eval_summary(evals: list[dict]) -> dict:
    """``before/<m>`` and ``after/<m>``: every numeric ``eval/<m>`` of the first and last evaluation."""
    s = {}
    for when, rec in (("after", evals[-1] if evals else {}), ("before", evals[0] if evals else {})):
        for k, v in rec.items():
            if k.startswith("eval/") and isinstance(v, (int, float)):
                s[f"{when}/{k[5:]}"] = v
    return s


def _train_summary(train: list[dict]) -> dict:
    """``train/<key>`` means over steps, ``train/entropy_late`` (the last quarter of the steps) and
    ``train/pass_rate_rise`` (mean training pass rate of the last quarter minus the first)."""
    s = {}
    for k in TRAIN_KEYS:
        vals = _numbers(r.get(k) for r in train)
        if vals:
            s[f"train/{k}"] = sum(vals) / len(vals)
    ents = _numbers(r.get("policy/entropy") for r in train)
    if ents:
        q = ents[-max(1, len(ents) // 4) :]
        s["train/entropy_late"] = sum(q) / len(q)
    rates = _numbers(r.get("rollout/pass_rate") for r in train)
    if len(rates) >= 2:  # did RL learn at all: the last quarter of rollout batches against the first
        q = max(1, len(rates) // 4)
        s["train/pass_rate_rise"] = sum(rates[-q:]) / q - sum(rates[:q]) / q
    return s


# the per-c metrics (docs/design.md §7) a summary keeps under their own keys ``<metric>/<c>``,
# and how each is aggregated over the training steps s that logged it:
#   "tokens": Σ_s x_s · n_s / Σ_s n_s, n_s = clip/tokens_pos_by_c/<c> (the share over all of
#             training's positive-advantage tokens, not a mean of per-step shares)
#   "steps":  the mean over those steps
BY_C_SUMMARY = {
    "clip/frac_high_by_c": "tokens",  # clipped share of positive-advantage tokens
    "clip/ratio_dev_by_c": "steps",  # mean |ρ−1| of all response tokens
    "clip/eps_high_by_c": "steps",  # mean ε_high of the rollouts
    "clip/adv_by_c": "steps",  # mean |A|
    "clip/ratio_dev_pos_by_c": "steps",  # mean |ρ−1| of positive-advantage tokens, before clipping
    "clip/gate_by_c": "tokens",  # mean gradient weight of positive-advantage tokens (§2.13)
}


def by_c_entries(summary: dict, metric: str) -> dict[int, object]:
    """``c -> value`` of the entries ``<metric>/<c>`` of a summary (or of an aggregate), by c."""
    pre = metric + "/"
    return dict(
        sorted((int(k[len(pre) :]), v) for k, v in summary.items() if k.startswith(pre) and k[len(pre) :].isdigit())
    )


def _by_c_summary(train: list[dict]) -> dict:
    """``<metric>/<c>`` for every metric of ``BY_C_SUMMARY``, aggregated over training as it says."""
    s = {}
    for metric, how in BY_C_SUMMARY.items():
        if how == "steps":
            s.update({f"{metric}/{c}": v for c, v in by_c(train, metric + "/").items()})
            continue
        acc: dict[int, list[float]] = {}
        for r in train:
            for c, v in by_c_entries(r, metric).items():
                w = r.get(f"clip/tokens_pos_by_c/{c}", 0.0)
                num_den = acc.setdefault(c, [0.0, 0.0])
                num_den[0] += v * w
                num_den[1] += w
        s.update({f"{metric}/{c}": num / den for c, (num, den) in acc.items() if den})
    return s


def run_summary(train: list[dict], evals: list[dict]) -> dict:
    """One run's summary: ``before/*``, ``after/*``, ``train/*`` and ``<metric>/<c>`` (module docstring)."""
    return {**_eval_summary(evals), **_train_summary(train), **_by_c_summary(train)}


def load_cell(d: Path) -> dict | None:
    """A finished cell (``done.json``): its records, ``done.json``, group size ``G``, summary and
    ``correct`` -- ``{"before": [c_j], "after": [c_j], "n": samples}``, the per-problem success
    counts of the first and last evaluation (``None`` where the records lack them); ``None`` while
    unfinished."""
    if not (d / "done.json").is_file():
        return None
    run = load_run(d)
    done = json.loads((d / "done.json").read_text())
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    tr, ev = run["train"], run["eval"]
    correct = None
    if ev and isinstance(ev[-1].get("eval/correct"), list):
        correct = {
            "before": ev[0].get("eval/correct"),
            "after": ev[-1]["eval/correct"],
            "n": int(ev[-1].get("eval/n") or cfg["eval"]["samples"]),
        }
    return {
        "train": tr,
        "eval": ev,
        "done": done,
        "G": cfg["train"]["group_size"],
        "summary": run_summary(tr, ev),
        "correct": correct,
    }


# --------------------------------------------------------------------------------- tests and intervals
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_pvalue(xs: list[float]) -> float:
    """Two-sided one-sample t-test of mean 0: ``p = I_{df/(df+t²)}(df/2, 1/2)`` with
    ``t = mean / (sd/√n)``, ``df = n − 1`` (NaN with fewer than 2 finite values; 0 or 1 when every
    value is the same nonzero or zero number)."""
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    n = len(xs)
    if n < 2:
        return float("nan")
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    if sd == 0.0:
        return 1.0 if m == 0.0 else 0.0
    t, df = m / (sd / math.sqrt(n)), n - 1
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def ols_slope(xs: list[float], ys: list[float]) -> dict:
    """Least-squares slope of ``ys`` on ``xs`` with its 95% t interval and two-sided p-value:
    ``b = Sxy / Sxx`` (``intercept = ȳ − b x̄``), ``se = sqrt(SSE / (n − 2) / Sxx)``, ``ci = t_{0.975, n−2} se``,
    ``p = I_{df/(df+t²)}(df/2, 1/2)`` with ``t = b / se``, ``df = n − 2``. Pairs with a non-finite
    member are dropped; ``slope`` is NaN with fewer than two distinct ``x``, ``ci`` and ``p`` with
    fewer than three points."""
    pts = [
        (float(x), float(y))
        for x, y in zip(xs, ys)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(x) and math.isfinite(y)
    ]
    n, nan = len(pts), float("nan")
    out = {"slope": nan, "intercept": nan, "ci": nan, "p": nan, "n": n}
    if n < 2:
        return out
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0.0:
        return out
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    out["slope"], out["intercept"] = b, my - b * mx
    if n < 3:
        return out
    df = n - 2
    sse = sum((y - my - b * (x - mx)) ** 2 for x, y in pts)
    se = math.sqrt(sse / df / sxx)
    out["ci"] = t975(df) * se
    out["p"] = (1.0 if b == 0.0 else 0.0) if se == 0.0 else _betainc(df / 2.0, 0.5, df / (df + (b / se) ** 2))
    return out


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: with the m finite p-values sorted,
    ``p̃_(i) = max_{j <= i} min(1, (m − j + 1) p_(j))``; rejecting ``p̃ < α`` keeps the family-wise
    error at α. NaN entries stay NaN and do not count in m."""
    idx = sorted(
        (i for i, p in enumerate(pvalues) if isinstance(p, (int, float)) and math.isfinite(p)), key=lambda i: pvalues[i]
    )
    m, out, run = len(idx), [float("nan")] * len(pvalues), 0.0
    for rank, i in enumerate(idx):
        run = max(run, min(1.0, (m - rank) * pvalues[i]))
        out[i] = run
    return out


def per_problem_pass_at_k(n: int, correct: list[int], k: int) -> list[float]:
    """Unbiased pass@k of every problem from its success count (``mean`` of it is ``eval/pass@k``)."""
    return [pass_at_k(n, int(n_correct), k) for n_correct in correct]


def paired_problem_diffs(
    cells: dict, a: tuple[str, str], b: tuple[str, str], seeds: list[int], k: int, when: str = "after"
) -> list[list[float]]:
    """Rows (one per seed where both cells have per-problem counts) of per-problem pass@k of
    ``a − b``; ``a`` and ``b`` are ``(regime, method)`` (regimes may differ when they evaluate the
    same problems, e.g. two regimes with the same base and task). Seeds whose evaluation drew
    fewer than k samples (pass@k undefined) are left out. Raises ValueError when the two
    evaluations do not have the same problems or samples."""
    rows = []
    for s in seeds:
        ca, cb = cells.get((*a, s)), cells.get((*b, s))
        if not ca or not cb or not ca.get("correct") or not cb.get("correct"):
            continue
        xa, xb = ca["correct"], cb["correct"]
        if xa.get(when) is None or xb.get(when) is None or min(xa["n"], xb["n"]) < k:
            continue
        if len(xa[when]) != len(xb[when]) or xa["n"] != xb["n"]:
            raise ValueError(
                f"seed {s}: {a} and {b} were evaluated on different problems or samples "
                f"({len(xa[when])}x{xa['n']} against {len(xb[when])}x{xb['n']})"
            )
        pa, pb = per_problem_pass_at_k(xa["n"], xa[when], k), per_problem_pass_at_k(xb["n"], xb[when], k)
        rows.append([u - v for u, v in zip(pa, pb)])
    return rows


def seed_problem_bootstrap(
    diffs: list[list[float]], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> dict:
    """Two-way (seed × problem) percentile bootstrap of the mean of ``diffs[s][j]``, the paired
    difference of seed s on problem j: each resample draws S seeds and J problems with
    replacement (independently; the same problems for every drawn seed) and takes the mean of the
    S × J sub-table. Returns ``{"mean", "lo", "hi", "n_seeds", "n_problems"}`` (``lo``/``hi``: the
    (1 ± level)/2 quantiles). The seed-only t interval is the special case that holds problems
    fixed; this one adds the uncertainty of which problems were drawn."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or d.size == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n_seeds": 0, "n_problems": 0}
    S, J = d.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for b in range(resamples):
        si, pj = rng.integers(0, S, S), rng.integers(0, J, J)
        stats[b] = d[np.ix_(si, pj)].mean()
    a = (1.0 - level) / 2.0
    return {
        "mean": float(d.mean()),
        "lo": float(np.quantile(stats, a)),
        "hi": float(np.quantile(stats, 1 - a)),
        "n_seeds": S,
        "n_problems": J,
    }
