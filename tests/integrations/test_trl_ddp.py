"""GAPOTrainer on 2 real processes (gloo, CPU): per-``c`` sums across ranks = single-process totals.

``tests/integrations/_trl_ddp_worker.py`` (a launch like ``torchrun --standalone --nproc_per_node
2``, the two ranks forked after one import of torch and TRL) trains a tiny random Qwen2 for 4
optimiser steps (one generation batch, split in 2 micro-batches, each used for 2 iterations) on 2
ranks and records, on each rank, the gathered rewards, its own slice of ε_high and c, the tensors
of every loss micro-batch, and the pooled ``clip/*_by_c/{c}`` values at every log. Here, in one
process, we recompute from the raw tensors of both ranks: ε_high and c from the whole gathered
groups, and the per-``c`` sums of each logging window with ``gapo.core.metrics.clip_counts_by_c`` on
the union of both ranks' rows; the values each rank logged must be those totals (about 14 s of CPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import timing  # tests/timing.py: timeouts that say they are timeouts

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.trl, pytest.mark.slow]

WORKER = Path(__file__).with_name("_trl_ddp_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = timing.run(
        [sys.executable, str(WORKER), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        quiet_s=60,
        what="two TRL ranks",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    recs = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["rank"] for r in recs] == [0, 1] and all(r["world"] == 2 for r in recs)
    return [r["events"] for r in recs]


def _of(events, kind):
    return [e[1:] if len(e) > 2 else e[1] for e in events if e[0] == kind]


def test_eps_and_c_come_from_whole_gathered_groups(ranks):
    from gapo.core.advantages import success_count
    from gapo.core.clipping import gapo_eps_high

    rewards = [_of(ev, "rewards") for ev in ranks]
    assert len(rewards[0]) == len(rewards[1]) == 1  # one generation batch, used for 4 optimiser steps
    mbs = [_of(ev, "mb") for ev in ranks]
    (r0, g0), (r1, g1) = rewards[0][0], rewards[1][0]
    assert g0 == g1 == 4 and torch.equal(r0, r1) and r0.numel() == 16  # both ranks gathered all 16
    eps = gapo_eps_high(r0, 4, eps_low=0.2, eps_high_max=0.28, reward_range="group")
    c = success_count(r0, 4, reward_range="group")
    assert (eps > 0.2).any() and (eps == 0.2).any()
    for rank in range(2):
        # micro-batches A, B, A, B (steps_per_generation=2, num_iterations=2): A and B hold the rank's 8 rows
        assert len(mbs[rank]) == 4
        for k in (0, 1):
            assert torch.equal(mbs[rank][k]["gapo_eps_high"], mbs[rank][k + 2]["gapo_eps_high"])
        got_eps = torch.cat([m["gapo_eps_high"] for m in mbs[rank][:2]])
        got_c = torch.cat([m["gapo_success_count"] for m in mbs[rank][:2]])
        mine = slice(8 * rank, 8 * rank + 8)  # the slice TRL takes for this rank's advantages
        # TRL shuffles the rows of a generation batch: compare as multisets of (ε, c) pairs
        pairs = sorted(zip(got_eps.tolist(), got_c.tolist()))
        ref = sorted(zip(eps[mine].tolist(), c[mine].tolist()))
        assert pairs == ref  # the same float32 computation on the same rewards


def test_per_c_sums_across_ranks_equal_single_process_totals(ranks):
    from gapo.core.metrics import clip_counts_by_c, clip_stats_from_counts, merge_counts

    def windows(events):
        out, cur = [], []
        for e in events:
            if e[0] == "mb":
                cur.append(e[1])
            elif e[0] == "log" and cur:  # (the end-of-training summary log follows no micro-batch)
                out.append((cur, e[1]))
                cur = []
        return out

    w0, w1 = windows(ranks[0]), windows(ranks[1])
    assert len(w0) == len(w1) == 4  # one log per optimiser step (logging_steps=1, no grad accumulation)
    differs = False
    for (mb0, logged0), (mb1, logged1) in zip(w0, w1):
        assert logged0 == logged1  # every rank logs the cross-process totals
        total, local0 = {}, {}
        for m in mb0 + mb1:
            old = m["old_per_token_logps"]
            ratio = torch.exp(m["logps"] - old)
            counts = clip_counts_by_c(
                ratio.float(),
                m["advantages"],
                m["completion_mask"].float(),
                m["gapo_success_count"],
                eps_low=0.2,
                eps_high=m["gapo_eps_high"].float(),
            )
            merge_counts(total, counts)
            if any(m is x for x in mb0):
                merge_counts(local0, counts)
        expected = clip_stats_from_counts(total)
        assert logged0.keys() == expected.keys()
        for k, v in expected.items():
            assert logged0[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        differs |= clip_stats_from_counts(local0) != expected
    assert differs, "rank 0's own rows gave the same statistics as both ranks': the test would not see a missing reduce"
