"""What ``gapo train`` prints when it ends: after an interruption, the step it stopped at, which
evaluation the pass@k figures are (the step-0 one is labelled "before training", never shown as
the result), and the exact resume command with --out."""

import json

from gapo.cli.train import last_eval_record, say_train_result


def _run(tmp_path, records, partial=""):
    d = tmp_path / "my run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + partial)
    return d


EVAL0 = {"kind": "eval", "step": 0, "eval/pass@1": 0.034, "eval/pass@16": 0.406}
EVAL6 = {"kind": "eval", "step": 6, "eval/pass@1": 0.25, "eval/pass@16": 0.5}


def test_stopped_run_names_step_last_eval_and_resume_command(tmp_path, capsys):
    d = _run(tmp_path, [EVAL0] + [{"kind": "train", "step": i} for i in range(1, 10)])
    say_train_result(d, {"step": 9, "stopped": True, "eval": EVAL0}, 200)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"stopped at step 9 of 200; checkpoint saved in {d}"
    assert out[1] == "last evaluation at step 0 (before training): pass@1=0.034  pass@16=0.406"
    assert out[2] == f"resume with: gapo train --out '{d}' --resume"  # quoted: the folder has a space


def test_resumed_then_stopped_run_reads_the_last_eval_from_the_run(tmp_path, capsys):
    # this session evaluated nothing; the figures come from the run's own metrics.jsonl, with their step
    d = _run(tmp_path, [EVAL0, {"kind": "train", "step": 6}, EVAL6], partial='{"kind": "ev')
    assert last_eval_record(d)["step"] == 6
    say_train_result(d, {"step": 8, "stopped": True, "eval": None}, 20)
    out = capsys.readouterr().out
    assert "last evaluation at step 6: pass@1=0.250" in out and "before training" not in out


def test_finished_run_and_a_run_without_evaluation(tmp_path, capsys):
    d = _run(tmp_path, [EVAL0, EVAL6])
    say_train_result(d, {"step": 6, "stopped": False, "eval": EVAL6}, 6)
    out = capsys.readouterr().out
    assert "finished: step 6 of 6" in out and "evaluation at step 6: pass@1=0.250" in out
    assert "resume" not in out
    e = _run(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, [])
    say_train_result(e, {"step": 3, "stopped": True, "eval": None}, 10)
    out = capsys.readouterr().out
    assert "no evaluation yet" in out and "pass@" not in out and "resume with:" in out
