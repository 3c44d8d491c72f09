"""gapo.rl.checkpoint's kept checkpoints (train.keep_checkpoints, TRL's save_total_limit): the last N
checkpointed steps stay on disk as checkpoints/step-<s>.pt, gapo export --step reads any of them,
old ones go only after the new one is on disk, and the space check asks room for them."""

import errno
import os
from types import SimpleNamespace

import pytest
import torch

from checkpoints import build_instruct_checkpoint, small_instruct_config  # tests/checkpoints.py (tests/ is on sys.path)
from gapo.cli import main
from gapo.rl import checkpoint
from gapo.rl.export import export
from gapo.rl.trainer import Trainer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return str(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct")))


def _cfg(model, *extra):
    return small_instruct_config(model, "optim.lr=1e-2", "train.checkpoint_every=1", "train.steps=5", *extra)


def _steps(run):
    return {s: torch.load(p, weights_only=False)["step"] for s, p in checkpoint.kept(run).items()}


def test_the_last_n_checkpoints_are_kept_and_exported(instruct, tmp_path, capsys):
    run = tmp_path / "run"
    tr = Trainer(_cfg(instruct, "train.keep_checkpoints=3"), run)
    tr.fit(stop_after=4)
    assert _steps(run) == {2: 2, 3: 3, 4: 4}  # each file holds its own step
    # checkpoint.pt is the newest kept one (a hard link: no second copy)
    assert os.path.samefile(run / "checkpoint.pt", run / "checkpoints" / "step-4.pt")
    out, info = export(run, step=2)
    assert info == {**info, "source": "checkpoint", "step": 2} and out == tmp_path / "run-step2"
    weights = torch.load(run / "checkpoints" / "step-2.pt", weights_only=False)["model"]
    m = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for k, v in m.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert main(["export", str(run), "--step", "1"]) == 2
    err = capsys.readouterr().err
    assert "no model at step 1" in err and "kept checkpoints (steps 2, 3, 4)" in err
    # a resume keeps counting; lowering the count (--allow-change) deletes the extra ones only at
    # its first checkpoint, the new one being on disk
    Trainer(_cfg(instruct, "train.keep_checkpoints=1"), run, resume=True, allow_change=True).fit()
    assert _steps(run) == {} and torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 5


@pytest.mark.parametrize("keep", [0, 1])
def test_zero_or_one_keeps_only_checkpoint_pt(instruct, tmp_path, keep):
    run = tmp_path / "run"
    Trainer(_cfg(instruct, f"train.keep_checkpoints={keep}", "train.steps=2"), run).fit()
    assert not (run / "checkpoints").exists() and (run / "checkpoint.pt").is_file()


class _Folder:
    """A RunFolder's checkpoint writes, on a plain folder: ``fail`` makes the write fail as a full disk."""

    def __init__(self, path, fail=False):
        self.path, self.checkpoint, self.fail = path, path / "checkpoint.pt", fail

    def save_checkpoint(self, state, need):
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        tmp = self.path / ".checkpoint.tmp"  # a new file renamed over the old one, as RunFolder's
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint)

    def check_space(self, need):
        pass


def test_old_ones_go_only_after_the_new_one_is_on_disk(tmp_path):
    folder = _Folder(tmp_path)
    for s in (1, 2, 3):
        checkpoint.save(folder, {"step": s}, need=1, keep=2)
    assert _steps(tmp_path) == {2: 2, 3: 3}
    folder.fail = True  # the write of step 4 fails: nothing kept is deleted
    with pytest.raises(OSError):
        checkpoint.save(folder, {"step": 4}, need=1, keep=2)
    assert _steps(tmp_path) == {2: 2, 3: 3}
    folder.fail = False  # the same step written again replaces its own kept file
    checkpoint.save(folder, {"step": 3, "again": True}, need=1, keep=2)
    assert torch.load(tmp_path / "checkpoints" / "step-3.pt", weights_only=False)["again"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temporary file


def test_the_space_check_counts_the_kept_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 2500)
    folder = _Folder(tmp_path)
    checkpoint.check_room(folder, 1000, 2, resume=False)  # room for 2 of 1000 bytes
    with pytest.raises(OSError, match=r"train.keep_checkpoints \(run.yaml:3\)=3 keeps 3 checkpoints") as e:
        checkpoint.check_room(folder, 1000, 3, resume=False, key="train.keep_checkpoints (run.yaml:3)")
    assert e.value.errno == errno.ENOSPC and "nothing was changed" in str(e.value)
    # a resumed run already has two of them on disk (checkpoint.pt is the newest one's link): one more
    for s in (1, 2):
        checkpoint.save(folder, {"step": s}, need=1, keep=3)
    checkpoint.check_room(folder, 1000, 3, resume=True)
    with pytest.raises(OSError, match="keeps 5 checkpoints of about"):
        checkpoint.check_room(folder, 1000, 5, resume=True)  # 3 more
    # an --overwrite's old run is not the new run's: all 3 are needed
    with pytest.raises(OSError):
        checkpoint.check_room(folder, 1000, 3, resume=False)
    checkpoint.check_room(SimpleNamespace(path=tmp_path / "new", check_space=lambda n: None), 1000, 1, resume=False)
