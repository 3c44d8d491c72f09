"""Run summaries keep the per-c metric keys verbatim (docs/design.md §7); reports written with
the old names read through the one map ``stats.OLD_SUMMARY_KEYS``."""

import csv
import json
import re
from pathlib import Path

import pytest

from gapo.experiments.claims import claim_rows
from gapo.experiments.report import _tables_md
from gapo.experiments.stats import (
    BY_C_SUMMARY,
    OLD_SUMMARY_KEYS,
    mean_ci,
    migrate_keys,
    read_cells,
    read_summary,
    renamed_key,
    run_summary,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "gapo"
OLD = re.compile(r"(?<![\w/])(clip_by_c|dev_by_c|eps_by_c|adv_by_c|dev_pos_by_c)(?!\.png)")

# three steps; c = 1 logged in all, c = 3 only in the last two
TRAIN = [
    {
        "kind": "train",
        "step": 1,
        "clip/frac_high_by_c/1": 0.5,
        "clip/tokens_pos_by_c/1": 2.0,
        "clip/ratio_dev_by_c/1": 0.1,
        "clip/eps_high_by_c/1": 0.3,
        "clip/adv_by_c/1": 0.9,
        "clip/ratio_dev_pos_by_c/1": 0.2,
    },
    {
        "kind": "train",
        "step": 2,
        "clip/frac_high_by_c/1": 0.0,
        "clip/tokens_pos_by_c/1": 6.0,
        "clip/ratio_dev_by_c/1": 0.3,
        "clip/eps_high_by_c/1": 0.3,
        "clip/adv_by_c/1": 0.6,
        "clip/ratio_dev_pos_by_c/1": 0.4,
        "clip/frac_high_by_c/3": 0.25,
        "clip/tokens_pos_by_c/3": 4.0,
        "clip/ratio_dev_by_c/3": 0.05,
    },
    {
        "kind": "train",
        "step": 3,
        "clip/frac_high_by_c/1": 1.0,
        "clip/tokens_pos_by_c/1": 0.0,  # no positive-advantage token: no weight
        "clip/ratio_dev_by_c/1": 0.2,
        "clip/eps_high_by_c/1": 0.24,
        "clip/adv_by_c/1": 0.3,
        "clip/ratio_dev_pos_by_c/1": 0.3,
        "clip/frac_high_by_c/3": 0.5,
        "clip/tokens_pos_by_c/3": 4.0,
        "clip/ratio_dev_by_c/3": 0.15,
    },
]


def test_a_summary_keeps_the_metric_keys_with_hand_computed_aggregates():
    s = run_summary(TRAIN, [])
    by_c = {k: v for k, v in s.items() if "_by_c/" in k}
    assert by_c == {
        # token-weighted: (0.5·2 + 0·6 + 1·0) / (2 + 6 + 0) = 1/8 (the step mean would be 0.5)
        "clip/frac_high_by_c/1": pytest.approx(0.125),
        "clip/frac_high_by_c/3": pytest.approx((0.25 * 4 + 0.5 * 4) / 8),  # 0.375
        "clip/ratio_dev_by_c/1": pytest.approx((0.1 + 0.3 + 0.2) / 3),  # step means
        "clip/ratio_dev_by_c/3": pytest.approx((0.05 + 0.15) / 2),  # over the steps that logged c = 3
        "clip/eps_high_by_c/1": pytest.approx((0.3 + 0.3 + 0.24) / 3),
        "clip/adv_by_c/1": pytest.approx((0.9 + 0.6 + 0.3) / 3),
        "clip/ratio_dev_pos_by_c/1": pytest.approx((0.2 + 0.4 + 0.3) / 3),
    }
    assert {k.rsplit("/", 1)[0] for k in by_c} == set(BY_C_SUMMARY)
    assert "clip/tokens_pos_by_c/1" not in s  # a weight, not a summary value


def test_renamed_key_maps_old_names_and_leaves_the_rest():
    assert renamed_key("clip_by_c/3") == "clip/frac_high_by_c/3"
    assert renamed_key("dev_pos_by_c") == "clip/ratio_dev_pos_by_c"
    assert renamed_key("dev_by_c/12") == "clip/ratio_dev_by_c/12"
    for same in ("after/pass@1", "train/clip/frac_high_pos", "clip/frac_high_by_c/3", "regime", "xdev_by_c/1"):
        assert renamed_key(same) == same
    assert set(OLD_SUMMARY_KEYS.values()) == set(BY_C_SUMMARY)  # every old name has its metric


def _report_summary(names: dict) -> dict:
    """A grid summary.json (aggregates sorted by key, as grid_report writes them) under ``names``."""

    def agg(x):
        keys = {
            "after/pass@1": 0.3 + x,
            f"{names['clip']}/1": 0.2 - x,
            f"{names['clip']}/3": 0.1,
            f"{names['dev']}/1": 0.04 + x,
            f"{names['dev_pos']}/1": 0.05,
            f"{names['eps']}/1": 0.28,
            "train/clip/frac_high_pos": 0.1,
        }
        return {k: mean_ci([v, v + 0.01]) for k, v in sorted(keys.items())}

    return {
        "grid": "g",
        "n_cells_done": 4,
        "n_cells_total": 4,
        "failed": [],
        "aggregate": {"low": {"drgrpo": agg(0.0), "gapo": agg(0.05)}},
        "paired": {"low": {"gapo": {"vs": "drgrpo", **agg(0.05)}}},
        "claims": [
            {
                "claim": "4 mechanism: GAPO lowers low-c clipping",
                "regime": "low",
                "method": "gapo",
                "vs": "drgrpo",
                "key": f"{names['clip']}/1",
                **mean_ci([-0.05, -0.04]),
            },
            {
                "claim": "8 premise: ratio deviation of A>0 tokens, c=1 − c≥G/2",
                "regime": "low",
                "method": "gapo",
                "vs": "",
                "key": names["dev_pos"],
                **mean_ci([0.01, 0.02]),
            },
        ],
    }


NEW = {"clip": "clip/frac_high_by_c", "dev": "clip/ratio_dev_by_c", "dev_pos": "clip/ratio_dev_pos_by_c"}
NEW["eps"] = "clip/eps_high_by_c"
OLD_NAMES = {"clip": "clip_by_c", "dev": "dev_by_c", "dev_pos": "dev_pos_by_c", "eps": "eps_by_c"}


def test_an_old_named_summary_reads_as_todays_and_gives_the_same_report(tmp_path):
    new, old = _report_summary(NEW), _report_summary(OLD_NAMES)
    (tmp_path / "summary.json").write_text(json.dumps(old, indent=1))
    read = read_summary(tmp_path / "summary.json")
    assert json.dumps(read) == json.dumps(new)  # the same keys, values and order
    md = _tables_md(read)
    assert md == _tables_md(new)
    assert "Clipped share of positive-advantage tokens (%) by c" in md and "| clip/frac_high_by_c/1 |" in md
    assert not OLD.search(md)
    # read without the map, the old file loses its per-c tables: the map is what keeps it readable
    assert "Clipped share" not in _tables_md(json.loads((tmp_path / "summary.json").read_text()))


def test_old_cells_csv_columns_are_renamed(tmp_path):
    p = tmp_path / "cells.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["regime", "method", "seed", "after/pass@1", "clip_by_c/1", "dev_pos_by_c/2"])
        w.writeheader()
        w.writerow({"regime": "low", "method": "gapo", "seed": 0, "after/pass@1": 0.5, "clip_by_c/1": 0.25})
    assert read_cells(p) == [
        {
            "regime": "low",
            "method": "gapo",
            "seed": "0",
            "after/pass@1": "0.5",
            "clip/frac_high_by_c/1": "0.25",
            "clip/ratio_dev_pos_by_c/2": "",
        }
    ]


def test_migrate_keys_keeps_unsorted_dicts_in_their_order():
    row = {"regime": "low", "key": "clip_by_c", "mean": 0.1, "ci": 0.0, "n": 1}
    assert list(migrate_keys(row)) == list(row) and migrate_keys(row)["key"] == "clip/frac_high_by_c"
    level = {"regime": "u32", "clip_by_c": {"1": {"mean": 0.2}}, "gapo_clip_c": {}}  # dose.json
    assert list(migrate_keys(level)) == ["regime", "clip/frac_high_by_c", "gapo_clip_c"]


def test_claims_read_the_verbatim_keys():
    cells = {
        ("low", m, s): {"G": 8, "summary": {"clip/frac_high_by_c/1": v + s / 100, "clip/frac_high_by_c/7": 0.01}}
        for m, v in (("drgrpo", 0.2), ("gapo", 0.15))
        for s in range(2)
    }
    grid = {"seeds": [0, 1], "regimes": ["low"], "methods": ["drgrpo", "gapo"]}
    rows = claim_rows(grid, cells)
    mech = [r for r in rows if r["claim"] == "4 mechanism: clip(low c) - clip(high c)" and r["method"] == "drgrpo"]
    assert mech[0]["key"] == "clip/frac_high_by_c" and mech[0]["mean"] == pytest.approx(0.2 + 0.005 - 0.01)
    lower = [r for r in rows if r["claim"] == "4 mechanism: GAPO lowers low-c clipping"]
    assert lower[0]["key"] == "clip/frac_high_by_c/1" and lower[0]["mean"] == pytest.approx(-0.05)


def test_the_map_is_the_only_place_old_names_appear_in_src():
    hits = [
        f"{p.relative_to(SRC)}:{i}: {line.strip()}"
        for p in SRC.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if OLD.search(line)
    ]
    stats = (SRC / "experiments" / "stats.py").read_text().splitlines()
    start = next(i for i, ln in enumerate(stats, 1) if ln.startswith("OLD_SUMMARY_KEYS = {"))
    end = next(i for i, ln in enumerate(stats, 1) if i > start and ln == "}")
    allowed = {f"experiments/stats.py:{i}: {stats[i - 1].strip()}" for i in range(start + 1, end)}
    assert hits and set(hits) <= allowed, sorted(set(hits) - allowed)
