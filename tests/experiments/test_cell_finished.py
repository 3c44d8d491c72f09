"""A grid cell whose run finished but has no done.json (a signal after its last step) is recorded
from its own folder, not resumed: the trainer refuses to resume a finished run, so the cell used to
be marked failed (seen in the dose-response grid)."""

import json
import shutil

from gapo.experiments.cell import _finished_run


def _copy(finished_run, tmp_path):
    run = tmp_path / "seed0"
    shutil.copytree(finished_run, run)
    return run


def _final_eval(run, step):
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in recs if r.get("kind") == "eval" and r.get("step") == step]
    return {k: v for k, v in evals[-1].items() if k.startswith("eval/")} if evals else None


def test_a_finished_run_is_recorded_with_its_final_evaluation(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    assert (run / "checkpoint.pt").is_file() and (run / "policy").is_dir()
    want = _final_eval(run, 2)
    got = _finished_run(run, 2, evaluates=want is not None)
    assert got == {"eval": want}
    if want is not None:
        assert "eval/pass@1" in got["eval"] and "kind" not in got["eval"]


def test_an_unfinished_or_policyless_run_is_resumed_as_before(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    assert _finished_run(run, 3, evaluates=False) is None  # trained 2 of 3 steps
    (run / "checkpoint.pt").rename(run / "moved.pt")
    assert _finished_run(run, 2, evaluates=False) is None  # no checkpoint: the cell starts over
    (run / "moved.pt").rename(run / "checkpoint.pt")
    shutil.rmtree(run / "policy")
    assert _finished_run(run, 2, evaluates=False) is None  # the policy was never written


def test_a_run_that_evaluates_needs_its_final_evaluation(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    lines = [x for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    kept = [x for x in lines if not (json.loads(x).get("kind") == "eval" and json.loads(x).get("step") == 2)]
    (run / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    assert _finished_run(run, 2, evaluates=True) is None
