"""A resumed ``gapo compare`` must not mix base policies: a regime's base, rebuilt on a machine that
lacks it, is checked against the one its finished cells trained from (grid_bases.prepare_regimes).
The build itself is replaced by a stand-in that writes what ``cell --prepare`` writes."""

import hashlib
import json
from pathlib import Path

import pytest

from gapo.experiments import grid as G
from gapo.experiments import grid_bases as B
from gapo.experiments.grid_bases import base_eval_cfg, weights_sha256
from gapo.experiments.grid_spec import cell_config, load_grid, write_json

TASK = {"n_numbers": 2, "num_range": [1, 10]}
BASE = {"name": "test-identity", "task": "countdown", "sft_mix": [[TASK, 1.0]], "rl_task": TASK}


def _grid():
    return load_grid(
        {
            "name": "identity",
            "regimes": ["r"],
            "regime_defs": {"r": {"base": BASE}},
            "methods": ["drgrpo"],
            "seeds": [0],
            "common": {"eval.problems": 4, "eval.samples": 2},
        }
    )


def _policy(d: Path, weights: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(weights)
    return d


def _record(policy: Path, ev: dict, pass1: float, digest=True) -> dict:
    rec = {"policy": str(policy), "eval_cfg": ev, "eval": {"eval/pass@1": pass1, "time/eval_s": 1.0}}
    if digest:
        rec["weights_sha256"] = weights_sha256(policy)
    return rec


@pytest.fixture
def rebuild(tmp_path, monkeypatch):
    """Phase 1's jobs replaced: each 'rebuilds' the base with the weights in ``state['weights']``
    and writes base_eval.json as cell --prepare does; ``state['built']`` lists the regimes built."""
    state = {"weights": b"A" * 64, "pass1": 0.1, "digest": True, "built": []}

    def pool(jobs, workers, say, tick=None):
        for r, argv, _log, _ in jobs:
            out, ev = Path(argv[1]), json.loads(argv[4])
            p = _policy(tmp_path / "cache" / r, state["weights"])
            write_json(out / r / "base_eval.json", _record(p, ev, state["pass1"], state["digest"]))
            state["built"].append(r)

    monkeypatch.setattr(B, "run_jobs", pool)
    monkeypatch.setenv("GAPO_CACHE", str(tmp_path / "gapo-cache"))
    return state


def _finished_cell(out: Path):
    d = out / "r" / "drgrpo" / "seed0"
    d.mkdir(parents=True)
    (d / "done.json").write_text("{}")


def _started_cell(out: Path):
    d = out / "r" / "drgrpo" / "seed0"
    d.mkdir(parents=True)
    (d / "checkpoint.pt").write_bytes(b"weights trained on the old base")


def test_weights_sha256_is_the_digest_of_the_weight_files_in_name_order(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "b.safetensors").write_bytes(b"second")
    (d / "a.safetensors").write_bytes(b"first")
    (d / "config.json").write_text("{}")  # not weights
    assert weights_sha256(d) == hashlib.sha256(b"firstsecond").hexdigest()
    assert weights_sha256(tmp_path) is None


def test_a_rebuilt_base_that_differs_stops_the_resume_and_leaves_the_record(tmp_path, rebuild):
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    gone = _policy(tmp_path / "elsewhere", b"B" * 64)  # the machine the finished cells ran on
    old = _record(gone, ev, 0.2)
    write_json(out / "r" / "base_eval.json", old)
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    _finished_cell(out)
    with pytest.raises(RuntimeError, match=r"regime r: the base policy rebuilt at .* is not the one .*mix two base"):
        B.prepare_regimes(g, out, 0.0, lambda *a: None)
    assert rebuild["built"] == ["r"]
    assert json.loads((out / "r" / "base_eval.json").read_text()) == old  # put back as it was


def test_a_rebuilt_base_with_the_same_weights_resumes(tmp_path, rebuild):
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    gone = _policy(tmp_path / "elsewhere", rebuild["weights"])
    write_json(out / "r" / "base_eval.json", _record(gone, ev, 0.3))  # eval differs: the digest decides
    (gone / "config.json").unlink()
    _finished_cell(out)
    bases = B.prepare_regimes(g, out, 0.0, lambda *a: None)
    assert rebuild["built"] == ["r"] and bases["r"]["policy"] == str(tmp_path / "cache" / "r")


def test_without_a_digest_the_base_evaluation_decides(tmp_path, rebuild):
    # base_eval.json files written before the digest existed (the dose-response's raw records)
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    old = {"policy": str(tmp_path / "gone"), "eval_cfg": ev, "eval": {"eval/pass@1": 0.1, "time/eval_s": 9.0}}
    write_json(out / "r" / "base_eval.json", old)
    _finished_cell(out)
    rebuild["digest"] = False
    B.prepare_regimes(g, out, 0.0, lambda *a: None)  # same values, other timing: the same base
    write_json(out / "r" / "base_eval.json", old)
    rebuild["pass1"] = 0.12
    with pytest.raises(RuntimeError, match="base pass@1 0.12, recorded 0.1"):
        B.prepare_regimes(g, out, 0.0, lambda *a: None)


def test_a_base_still_in_place_is_reused_and_changed_weights_are_rebuilt(tmp_path, rebuild):
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    here = _policy(tmp_path / "here", b"C" * 64)
    write_json(out / "r" / "base_eval.json", _record(here, ev, 0.1))
    _finished_cell(out)
    assert B.prepare_regimes(g, out, 0.0, lambda *a: None)["r"]["policy"] == str(here)
    assert rebuild["built"] == []
    (here / "model.safetensors").write_bytes(b"D" * 64)  # the cached weights changed under the folder
    with pytest.raises(RuntimeError, match="mix two base policies"):
        B.prepare_regimes(g, out, 0.0, lambda *a: None)
    assert rebuild["built"] == ["r"]


def test_without_finished_cells_a_rebuilt_base_is_simply_used(tmp_path, rebuild):
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    write_json(out / "r" / "base_eval.json", _record(_policy(tmp_path / "x", b"E"), ev, 0.5))
    (tmp_path / "x" / "config.json").unlink()
    bases = B.prepare_regimes(g, out, 0.0, lambda *a: None)
    assert rebuild["built"] == ["r"] and bases["r"]["weights_sha256"] == weights_sha256(tmp_path / "cache" / "r")


def test_a_resume_on_a_machine_without_the_base_gets_to_the_rebuild(tmp_path, rebuild):
    # the whole resume, as `gapo compare` runs it: a finished cell's recorded config names a base
    # folder that is not on this machine; the config check must not stop there (phase 1
    # rebuilds that base and decides by its weights), and a changed key still stops it
    from gapo.rl.config import to_dict

    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    gone = _policy(tmp_path / "elsewhere", rebuild["weights"])
    write_json(out / "r" / "base_eval.json", _record(gone, ev, 0.1))
    spec = {"config": to_dict(cell_config(g, "r", "drgrpo", 0, base_path=str(gone)))}
    write_json(out / "r" / "drgrpo" / "seed0.json", spec)
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    _finished_cell(out)
    stats = G.run_grid(g, out, say=lambda *a: None)
    assert rebuild["built"] == ["r"] and stats["skipped"] == 1
    spec["config"]["algo"]["eps_low"] = 0.1
    write_json(out / "r" / "drgrpo" / "seed0.json", spec)
    with pytest.raises(ValueError, match=r"r/drgrpo/seed0 \(algo.eps_low"):
        G.run_grid(g, out, say=lambda *a: None)


def test_a_started_cell_pins_the_base_as_a_finished_one_does(tmp_path, rebuild):
    # a checkpointed cell resumes from weights trained on the recorded base: a rebuilt base that
    # differs must stop the grid here too, not only once some cell has finished
    g, out = _grid(), tmp_path / "out"
    ev = base_eval_cfg(g, "r")
    old = {"policy": str(tmp_path / "gone"), "eval_cfg": ev, "eval": {"eval/pass@1": 0.1}, "weights_sha256": "0" * 64}
    write_json(out / "r" / "base_eval.json", old)
    _started_cell(out)
    with pytest.raises(RuntimeError, match="finished or started cells .* mix two base policies"):
        B.prepare_regimes(g, out, 0.0, lambda *a: None)
    assert rebuild["built"] == ["r"]
    assert json.loads((out / "r" / "base_eval.json").read_text()) == old


def test_the_base_is_evaluated_with_the_cells_eval_top_p_and_stop_strings():
    """eval.top_p and sampling.stop reach the regime's shared step-0 evaluation as they reach the
    cells' own (were dropped: step 0 sampled at top_p 1 without stop strings); a grid that sets
    neither records what it recorded before, so its earlier base evaluations are still reused."""
    from gapo.experiments.cell import base_eval_params
    from gapo.rl.config import load_config
    from gapo.rl.evaluate import eval_params
    from gapo.tasks import get

    plain = base_eval_cfg(_grid(), "r")
    assert "top_p" not in plain and "stop" not in plain
    common = {"eval.problems": 4, "eval.samples": 2, "eval.top_p": 0.5, "sampling.stop": ["END"]}
    spec = {"name": "i", "regimes": ["r"], "regime_defs": {"r": {"base": BASE}}, "methods": ["drgrpo"], "seeds": [0]}
    ev = base_eval_cfg(load_grid({**spec, "common": common}), "r")
    assert ev["top_p"] == 0.5 and ev["stop"] == ["END"]
    task = get("countdown", **TASK)
    cfg = load_config(None, ["eval.top_p=0.5", "sampling.stop=[END]"])
    assert base_eval_params(ev, task) == eval_params(cfg, task.max_completion_len + 1)
    assert base_eval_params(plain, task) == eval_params(load_config(None, []), task.max_completion_len + 1)
