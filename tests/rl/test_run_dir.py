"""Run folders are sacred: every way a careless user can point gapo at a finished run, tried.

Each scenario asserts on the folder's contents afterwards (a hash of every file), not only on
the error: a clear message that leaves a run emptied is still a lost run.
"""

import errno
import hashlib
import json
from pathlib import Path

import pytest
import torch

from checkpoints import RUN_BASE as BASE
from checkpoints import train_run
from gapo.cli import main
from gapo.rl.config import load_config
from gapo.rl.run_dir import MARKER, RunFolder
from gapo.rl.trainer import RunExists, Trainer


def snapshot(folder: Path) -> dict:
    """Relative path -> sha256 of every file under ``folder`` (and its siblings' names)."""
    files = {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    return {"files": files, "siblings": sorted(p.name for p in folder.parent.iterdir())}


train = train_run  # the tiny run (tests/checkpoints.py), in this process


@pytest.fixture
def finished(finished_run):
    """The session's finished 2-step run (tests/conftest.py), shared with test_run_lock: read only."""
    return finished_run


@pytest.fixture
def run(finished, tmp_path):
    """A private copy of a finished run, for a test to try to break."""
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


# ------------------------------------------------------------------ --overwrite
BAD_INPUTS = {
    "nan lr": ["optim.lr=nan"],
    "inf lr": ["optim.lr=inf"],
    "negative warmup": ["optim.warmup_steps=-5"],
    "flipped grad clip": ["optim.grad_clip=-1"],
    "zero grad clip": ["optim.grad_clip=0"],
    "negative kl": ["algo.kl_coef=-1"],
    "nan entropy": ["algo.entropy_coef=nan"],
    "zero train size": ["task.train_size=0"],
    "negative workers": ["task.scoring_workers=-1"],
    "negative threads": ["model.threads=-1"],
    "unknown advantage param": ["algo.advantage_params={kk: 1}"],
    "unknown task param": ["task.params.n_numbrs=3"],
    "bad task param value": ["task.params.n_numbers=0"],
    "missing model": ["model.path=/nonexistent/model"],
    "unknown device": ["model.device=tpu9"],
    "unavailable device": ["model.device=cuda:7"],
    "huge max_new_tokens": ["sampling.max_new_tokens=100000000"],
    "max_new_tokens past context": ["sampling.max_new_tokens=100000"],
    "bad reward range": ["algo.reward_range=[1,0]"],
    "missing dataset": ["task.name=math", "task.params={path: /nonexistent.jsonl}"],
    "task param of the wrong type": ["task.params.n_numbers=abc"],
    "rollout batch past memory": ["train.prompts=60000", "train.group_size=1000"],
}


@pytest.mark.parametrize("bad", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_overwrite_with_bad_input_leaves_the_run_untouched(run, easy_policy, bad, capsys):
    before = snapshot(run)
    assert train(run, easy_policy, "train.steps=1", *bad, flags=["--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert snapshot(run) == before


def test_overwrite_with_a_raising_reward_function_leaves_the_run_untouched(run, easy_policy, monkeypatch, capsys):
    from gapo.tasks.countdown import CountdownTask

    def broken(self, problem, completion):
        raise KeyError("answer")

    monkeypatch.setattr(CountdownTask, "score", broken)
    before = snapshot(run)
    assert train(run, easy_policy, "train.steps=1", flags=["--overwrite"]) == 2
    assert "countdown" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), 1e30, -3.0, "yes"])
def test_overwrite_with_an_out_of_range_reward_leaves_the_run_untouched(run, easy_policy, monkeypatch, capsys, reward):
    from gapo.tasks.countdown import CountdownTask

    monkeypatch.setattr(CountdownTask, "score", lambda self, problem, completion: reward)
    before = snapshot(run)
    assert train(run, easy_policy, "train.steps=1", flags=["--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "countdown" in err and "Traceback" not in err
    assert snapshot(run) == before


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, easy_policy, capsys):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("precious")
    before = snapshot(mine)
    assert train(mine, easy_policy, "train.steps=1", flags=["--overwrite"]) == 2
    assert "not a gapo run folder" in capsys.readouterr().err
    assert snapshot(mine) == before


def test_overwrite_replaces_a_run_once_the_new_one_is_under_way(run, easy_policy):
    (run / "stale.txt").write_text("from the old run")
    assert train(run, easy_policy, "train.steps=1", flags=["--overwrite"]) == 0
    assert not (run / "stale.txt").exists() and (run / MARKER).is_file() and (run / "policy").is_dir()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in recs) == 1  # the new run's, not the old one's 2
    assert not [p for p in run.parent.iterdir() if ".replaced-" in p.name]  # nothing left aside


def test_overwrite_that_fails_in_its_first_step_puts_the_old_run_back(run, easy_policy, monkeypatch):
    before = snapshot(run)

    def boom(self):
        raise RuntimeError("out of memory in the first step")

    monkeypatch.setattr(Trainer, "train_step", boom)
    with pytest.raises(RuntimeError, match="first step"):
        Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=1"]), run, overwrite=True).fit()
    assert snapshot(run) == before


def test_existing_run_without_flags_is_refused(run, easy_policy):
    before = snapshot(run)
    with pytest.raises(RunExists, match="--resume"):
        Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=1"]), run)
    assert snapshot(run) == before


def test_a_run_inside_another_run_is_refused(run, easy_policy, tmp_path, capsys, monkeypatch):
    """An --overwrite of the outer run would delete it (and a second run's files would mix with the
    first's): refused at any depth, through a symlink too, before the model loads; so is a grid."""
    import gapo.rl.trainer as trainer_mod
    from gapo.experiments.grid import run_grid
    from gapo.experiments.grid_spec import QUICK_GRID, load_grid

    monkeypatch.setattr(trainer_mod, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "link").symlink_to(run)
    before = snapshot(run)
    for out in (run / "sub", run / "policy" / "a" / "b", tmp_path / "link" / "x"):
        for flags in ([], ["--overwrite"]):
            assert train(out, easy_policy, "train.steps=1", flags=flags) == 2
            err = capsys.readouterr().err
            assert f"is inside the gapo run folder {str(run)!r}" in err and err.count("error:") == 1, err
    with pytest.raises(ValueError, match="grid folder .* is inside the gapo run folder"):
        run_grid(load_grid(QUICK_GRID), run / "grid", say=lambda s: None)
    assert snapshot(run) == before


@pytest.mark.parametrize("target", ["file", "under a file", "read-only"])
def test_unusable_out_is_a_clear_error(tmp_path, easy_policy, capsys, target):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    out = {"file": f, "under a file": f / "run", "read-only": Path("/proc/gapo-run")}[target]
    assert train(out, easy_policy, "train.steps=1") == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert f.read_text() == "x"


# ------------------------------------------------------------------ --resume
def test_resume_of_a_finished_run_is_refused_and_changes_nothing(run, easy_policy, capsys):
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume"]) == 2
    assert "is finished" in capsys.readouterr().err
    assert snapshot(run) == before


def test_resume_uses_the_runs_own_config(run, easy_policy, capsys):
    """No --config: the saved one (its task and model), not the defaults."""
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume", "train.steps=3"]) == 2  # a change: asked for?
    err = capsys.readouterr().err
    assert "train.steps (run: 2, now: 3)" in err and "--allow-change" in err
    assert snapshot(run) == before
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3", "optim.lr=1e-4"]) == 0
    saved = (run / "config.yaml").read_text()
    assert "steps: 3" in saved and "lr: 0.0001" in saved and "n_numbers: 2" in saved
    event = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert event["changed"]["optim.lr"] == {"old": 5e-05, "new": 0.0001} and event["step"] == 2
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["optim/lr"] for r in recs if r["kind"] == "train"}
    assert lr == {1: 5e-05, 2: 5e-05, 3: 1e-4}  # the new learning rate is in force, not ignored


@pytest.mark.parametrize("key", ["train.seed=7", "task.params.n_numbers=3", "model.path=org/elsewhere"])
def test_resume_cannot_change_what_defines_the_run(run, key, capsys):
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume", "--allow-change", "train.steps=3", key]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert snapshot(run) == before


def test_resume_with_a_differing_config_file_lists_the_keys(run, tmp_path, capsys):
    f = tmp_path / "other.yaml"
    f.write_text("optim:\n  lr: 0.001\ntrain:\n  steps: 5\n")
    assert main(["train", "--out", str(run), "--resume", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "optim.lr (run: 5e-05, now: 0.001)" in err and "train.steps" in err


def test_resume_drops_a_partial_last_line(easy_policy, tmp_path):
    run = tmp_path / "r"
    cfg = load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=3"])
    Trainer(cfg, run).fit(stop_after=1)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 2, "rollout/rew')  # killed mid-write
    assert main(["train", "--out", str(run), "--resume"]) == 0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3]


def test_resume_names_a_corrupt_middle_line(easy_policy, tmp_path, capsys):
    run = tmp_path / "r"
    Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=3"]), run).fit(stop_after=1)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:1] + ["{garbage"] + lines[1:]) + "\n")
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume"]) == 2
    assert "metrics.jsonl:2 is not JSON" in capsys.readouterr().err
    assert snapshot(run) == before


def test_truncated_checkpoint_is_a_clear_error(easy_policy, tmp_path, capsys):
    run = tmp_path / "r"
    Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=3"]), run).fit(stop_after=1)
    ck = run / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "unreadable" in err and "Traceback" not in err
    assert snapshot(run) == before


def test_full_disk_while_checkpointing_leaves_no_temporary_file(easy_policy, tmp_path, monkeypatch):
    run = tmp_path / "r"
    tr = Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=3"]), run)
    tr.fit(stop_after=1)
    good = (run / "checkpoint.pt").read_bytes()
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        real_save(obj, f, *a, **k)  # part of the file is written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left on device") as e:
        tr.fit(stop_after=1)
    assert "checkpoint.pt" in str(e.value) and "intact" in str(e.value)
    assert (run / "checkpoint.pt").read_bytes() == good
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_records_up_to_keeps_only_complete_records(tmp_path):
    f = RunFolder(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3, "x"')
    assert f.records_up_to(1) == ['{"step": 0}', '{"step": 1}']
    assert f.records_up_to(10) == ['{"step": 0}', '{"step": 1}', '{"step": 2}']


def test_resume_keeps_the_thread_count_the_run_started_with(easy_policy, tmp_path, monkeypatch):
    """model.threads: null picks a count per machine and load; a resumed run must not pick
    another one (its floats would differ from the straight run in the last bits)."""
    import gapo.rl.trainer as trainer_mod

    run = tmp_path / "r"
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(trainer_mod, "default_threads", lambda: 2)
    Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=2"]), run).fit(stop_after=1)
    assert torch.load(run / "checkpoint.pt", weights_only=False)["threads"] == 2
    monkeypatch.setattr(trainer_mod, "default_threads", lambda: 1)  # the machine got busier
    tr = Trainer(load_config(None, [f"model.path={easy_policy}", *BASE, "train.steps=2"]), run, resume=True)
    assert torch.get_num_threads() == 2
    tr.fit()
    torch.set_num_threads(1)
