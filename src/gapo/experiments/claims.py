"""The claims of issue 4 item 5 as paired (same seed) comparisons over a grid's finished cells,
and their verdicts.

A claim row is ``{"claim", "regime", "method", "vs", "key", "mean", "ci", "n"}``: the mean and
95% t-interval over seeds of ``method − vs`` (``vs`` is ``""`` for a within-method contrast and
``"base"`` for after − before RL). ``verdict`` reads its sign off the interval.
"""

from __future__ import annotations

import math

from gapo.experiments.grid_spec import BASELINE_OF
from gapo.experiments.stats import by_c_entries, mean_ci, paired_diffs, paired_problem_diffs, seed_problem_bootstrap

# the per-c summary keys the mechanism and premise claims read (stats.BY_C_SUMMARY)
FRAC_HIGH, RATIO_DEV, RATIO_DEV_POS = "clip/frac_high_by_c", "clip/ratio_dev_by_c", "clip/ratio_dev_pos_by_c"

__all__ = ["ROLES", "CLAIM_TESTS", "VARIANT_OF", "claim_rows", "verdict", "identical_runs", "independent_between"]

# Methods reported as a variant of another: GAPO-log's schedule differs from GAPO-linear's by at
# most 0.0007 in ε at G = 8, and where no token's clip decision falls between the two bounds the
# two train identically (RESULTS.md: 4 of 5 seeds in `low` and `three`). Their rows carry
# ``variant_of`` and ``identical`` ("k of n seeds"), and are not counted as independent intervals
# where the variant trained identically in most seeds (``independent_between``).
VARIANT_OF = {"gapo_log": "gapo"}

# The claims of issue 4 item 5 as paired (same seed) comparisons: (claim, role, method, against, key).
# A role names the regime a claim is about: "low" and "low2" (two low-pass-rate regimes), "high",
# or "*" (every regime); ``ROLES`` maps them to regimes, a grid's ``roles`` overrides the map.
# Where a regime or method is missing from the grid the comparison is skipped.
ROLES = {"low": "low", "low2": "three", "high": "high"}
CLAIM_TESTS = [
    *[("1 pass@1", role, "gapo", vs, "after/pass@1") for role in ("low", "low2") for vs in ("drgrpo", "grpo", "dapo")],
    *[("1 pass@1", role, "gapo_seq", "gspo_asym", "after/pass@1") for role in ("low", "low2")],
    *[
        ("2 pass@k", role, "gapo", vs, key)
        for role in ("low", "low2")
        for vs, key in (("drgrpo", "after/pass@8"), ("drgrpo", "after/pass@64"), ("dapo", "after/pass@64"))
    ],
    *[("2 pass@k", role, "gapo_seq", "gspo_asym", "after/pass@64") for role in ("low", "low2")],
    *[
        ("3 vs shaping", role, "gapo", vs, key)
        for role in ("low", "low2")
        for vs in ("fgrpo", "passk")
        for key in ("after/pass@1", "after/pass@64")
    ],
    ("5 stability (high)", "high", "gapo", "drgrpo", "after/pass@1"),
    ("5 stability (high)", "high", "gapo", "drgrpo", "after/pass@64"),
    ("5 stability (high)", "high", "gapo", "drgrpo", "train/entropy_late"),
    ("5 stability (high)", "high", "gapo_seq", "gspo_asym", "after/pass@1"),
    *[
        ("6 coverage", role, m, vs, key)
        for role in ("low", "low2", "high")
        for m, vs in (("gapo", "drgrpo"), ("gapo_seq", "gspo_asym"))
        for key in ("after/coverage", "after/first_move_entropy")
    ],
    ("7 overhead", "*", "gapo", "drgrpo", "train/time/update_s"),
    ("7 overhead", "*", "gapo_seq", "gspo_asym", "train/time/update_s"),
]


def claim_rows(grid: dict, cells: dict) -> list[dict]:
    """Paired differences for ``CLAIM_TESTS``, the mechanism test (claim 4) and improvement over
    the base policy (after − before) per method. ``cells``: ``(regime, method, seed)`` →
    ``stats.load_cell``."""
    seeds = grid["seeds"]
    out = []
    roles = {**ROLES, **(grid.get("roles") or {})}  # e.g. {low: cd-low}: which regime plays a role
    for claim, r, a, b, key in CLAIM_TESTS:
        for reg in grid["regimes"] if r == "*" else [roles[r]]:
            d = paired_diffs(cells, reg, a, b, key, seeds)
            if d:
                out.append(
                    {
                        "claim": claim,
                        "regime": reg,
                        "method": a,
                        "vs": b,
                        "key": key,
                        **mean_ci(d),
                        **_problem_interval(cells, reg, a, b, key, seeds),
                    }
                )
    for reg in grid["regimes"]:
        out += _mechanism(grid, cells, reg)
    for reg in grid["regimes"]:
        out += _premise(grid, cells, reg)
    for reg in grid["regimes"]:
        out += _rl_vs_base(grid, cells, reg)
    for reg in grid["regimes"]:
        out += _learns(grid, cells, reg)
    for row in out:
        if row["method"] in VARIANT_OF and VARIANT_OF[row["method"]] in grid["methods"]:
            k, n = identical_runs(cells, row["regime"], row["method"], VARIANT_OF[row["method"]], seeds)
            row.update(variant_of=VARIANT_OF[row["method"]], identical=[k, n])
    return out


def _final_eval(cell: dict) -> object:
    """What a cell's final evaluation was, sample for sample as far as stored: its per-problem
    success counts where stored, else every ``after/*`` value of its summary."""
    c = cell.get("correct")
    if c and c.get("after") is not None:
        return ("correct", tuple(c["after"]))
    return ("after", tuple(sorted((k, v) for k, v in cell["summary"].items() if k.startswith("after/"))))


def identical_runs(cells: dict, regime: str, a: str, b: str, seeds: list[int]) -> tuple[int, int]:
    """``(k, n)``: of the ``n`` seeds where both cells finished, ``k`` whose final evaluations of
    ``a`` and ``b`` are identical (per-problem success counts; every ``after/*`` value where the
    counts are not stored) -- the runs trained the same."""
    pairs = [
        (cells[(regime, a, s)], cells[(regime, b, s)])
        for s in seeds
        if (regime, a, s) in cells and (regime, b, s) in cells
    ]
    return sum(_final_eval(x) == _final_eval(y) for x, y in pairs), len(pairs)


def independent_between(rows: list[dict]) -> list[dict]:
    """The between-method rows (``vs`` another method) that count as independent intervals: a
    variant's rows (``variant_of``) are left out where it trained identically to its parent in
    more than half of the seeds."""

    def dup(r):
        k, n = r.get("identical", (0, 0))
        return "variant_of" in r and n > 0 and 2 * k > n

    return [r for r in rows if r["vs"] not in ("", "base") and not dup(r)]


def _problem_interval(cells: dict, reg: str, a: str, b: str, key: str, seeds: list[int]) -> dict:
    """``boot_lo``/``boot_hi``: the seed × problem bootstrap interval of a pass@k difference
    (``stats.seed_problem_bootstrap``, 2000 resamples) where the cells store per-problem counts;
    empty otherwise (older run folders, other keys)."""
    head, _, k = key.rpartition("pass@")
    if head != "after/" or not k.isdigit():
        return {}
    rows = paired_problem_diffs(cells, (reg, a), (reg, b), seeds, int(k))
    if not rows:
        return {}
    bs = seed_problem_bootstrap(rows, resamples=2000, seed=0)
    return {"boot_lo": bs["lo"], "boot_hi": bs["hi"]}


def _low_minus_high_dev(cell: dict) -> float | None:
    """Mean |ρ−1| of positive-advantage tokens at c = 1 minus its mean over c >= G/2 (c < G)."""
    G = cell["G"]
    byc = by_c_entries(cell["summary"], RATIO_DEV_POS)
    hi = [v for k, v in byc.items() if G / 2 <= k < G]
    if 1 in byc and hi:
        return byc[1] - sum(hi) / len(hi)
    return None


def _premise(grid: dict, cells: dict, reg: str) -> list[dict]:
    """The paper's premise in regime ``reg``: positive-advantage tokens of c = 1 groups move
    further from the behaviour policy (larger |ρ−1|, before clipping) than those of c >= G/2
    groups; and the windowed ratio-advantage correlation ``clip/ratio_adv_corr`` (docs/design.md
    §2.11), averaged over training."""
    seeds, out = grid["seeds"], []
    for m in grid["methods"]:
        runs = [cells[(reg, m, s)] for s in seeds if (reg, m, s) in cells]
        vals = [v for v in map(_low_minus_high_dev, runs) if v is not None]
        if vals:
            out.append(
                {
                    "claim": "8 premise: ratio deviation of A>0 tokens, c=1 − c≥G/2",
                    "regime": reg,
                    "method": m,
                    "vs": "",
                    "key": RATIO_DEV_POS,
                    **mean_ci(vals),
                }
            )
        corr = [r["summary"]["train/clip/ratio_adv_corr"] for r in runs if "train/clip/ratio_adv_corr" in r["summary"]]
        if corr:
            out.append(
                {
                    "claim": "8 premise: corr(ratio deviation, A), windowed",
                    "regime": reg,
                    "method": m,
                    "vs": "",
                    "key": "train/clip/ratio_adv_corr",
                    **mean_ci(corr),
                }
            )
    return out


def _learns(grid: dict, cells: dict, reg: str) -> list[dict]:
    """Does RL learn at all in ``reg``: the training pass rate's rise (last quarter of rollout
    batches − first quarter) per method, and in how many runs it rose (``k`` of ``n``)."""
    out = []
    for m in grid["methods"]:
        d = [
            cells[(reg, m, s)]["summary"]["train/pass_rate_rise"]
            for s in grid["seeds"]
            if (reg, m, s) in cells and "train/pass_rate_rise" in cells[(reg, m, s)]["summary"]
        ]
        if d:
            out.append(
                {
                    "claim": "0 RL learns: training pass-rate rise",
                    "regime": reg,
                    "method": m,
                    "vs": "",
                    "key": "train/pass_rate_rise",
                    **mean_ci(d),
                    "k": sum(v > 0 for v in d),
                }
            )
    return out


def _low_minus_high_clip(cell: dict) -> float | None:
    """Clip share of A>0 tokens in low-c groups (c <= G/4) minus high-c groups (3G/4 <= c < G)."""
    G = cell["G"]
    byc = by_c_entries(cell["summary"], FRAC_HIGH)
    lo = [v for k, v in byc.items() if k <= max(1, G // 4)]
    hi = [v for k, v in byc.items() if k >= 3 * G // 4 and k < G]
    if lo and hi:
        return sum(lo) / len(lo) - sum(hi) / len(hi)
    return None


def _mechanism(grid: dict, cells: dict, reg: str) -> list[dict]:
    """Claim 4 in regime ``reg``: clipping falls on low-c groups; GAPO lowers it there and lets
    their ratios move further than its fixed-clipping baseline."""
    seeds, out = grid["seeds"], []
    for m in grid["methods"]:
        vals = [_low_minus_high_clip(cells[(reg, m, s)]) for s in seeds if (reg, m, s) in cells]
        vals = [v for v in vals if v is not None]
        if vals:
            out.append(
                {
                    "claim": "4 mechanism: clip(low c) - clip(high c)",
                    "regime": reg,
                    "method": m,
                    "vs": "",
                    "key": FRAC_HIGH,
                    **mean_ci(vals),
                }
            )
    for m, b in BASELINE_OF.items():
        for c in range(1, 3):
            d = paired_diffs(cells, reg, m, b, f"{FRAC_HIGH}/{c}", seeds)
            if d:
                out.append(
                    {
                        "claim": "4 mechanism: GAPO lowers low-c clipping",
                        "regime": reg,
                        "method": m,
                        "vs": b,
                        "key": f"{FRAC_HIGH}/{c}",
                        **mean_ci(d),
                    }
                )
            d = paired_diffs(cells, reg, m, b, f"{RATIO_DEV}/{c}", seeds)
            if d:
                out.append(
                    {
                        "claim": "4 mechanism: GAPO lets low-c ratios move further",
                        "regime": reg,
                        "method": m,
                        "vs": b,
                        "key": f"{RATIO_DEV}/{c}",
                        **mean_ci(d),
                    }
                )
    return out


def _rl_vs_base(grid: dict, cells: dict, reg: str) -> list[dict]:
    """Does RL improve on the base policy at all? after − before per method in regime ``reg``."""
    nan, out = float("nan"), []
    for m in grid["methods"]:
        for key in ("pass@1", "pass@64"):
            d = [
                cells[(reg, m, s)]["summary"].get(f"after/{key}", nan)
                - cells[(reg, m, s)]["summary"].get(f"before/{key}", nan)
                for s in grid["seeds"]
                if (reg, m, s) in cells
            ]
            if d:
                out.append({"claim": "RL vs base", "regime": reg, "method": m, "vs": "base", "key": key, **mean_ci(d)})
    return out


def verdict(d: dict) -> str:
    """Sign of a paired difference by its 95% CI: '+' (CI above 0), '−' (below 0), '0' (contains 0)."""
    if d["n"] < 2 or not math.isfinite(d["ci"]):
        return "n<2"
    lo, hi = d["mean"] - d["ci"], d["mean"] + d["ci"]
    return "+" if lo > 0 else "−" if hi < 0 else "0"
