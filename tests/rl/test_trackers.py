"""Completions logged to TensorBoard (text) and W&B (a table) every log.samples_every steps,
beside samples.jsonl."""

import json
import sys
import types

import pytest

from checkpoints import build_instruct_checkpoint, small_instruct_config  # tests/checkpoints.py (tests/ is on sys.path)
from gapo.rl.config import load_config
from gapo.rl.trackers import Trackers, samples_markdown
from gapo.rl.trainer import Trainer


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return str(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct")))


def _cfg(model, *extra):
    return small_instruct_config(model, "train.checkpoint_every=0", "train.steps=3", "log.samples=3", *extra)


def test_tensorboard_gets_the_completions_as_text(instruct, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    Trainer(_cfg(instruct, "log.tensorboard=true", "log.samples_every=2"), run).fit()
    acc = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = acc.Tensors("samples/text_summary")
    assert [e.step for e in texts] == [2]  # every 2 steps of 3
    text = texts[0].tensor_proto.string_val[0].decode()
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if json.loads(x)["step"] == 2]
    assert len(samples) == 3
    for s in samples:  # the exact prompt (chat template) and completion of samples.jsonl
        assert "\n".join("    " + ln for ln in s["completion"].split("\n")) in text
        assert "    <|im_start|>user" in text and f"reward {s['reward']}" in text
    assert "rollout/reward" in acc.Tags()["scalars"]


def test_wandb_gets_a_table(instruct, tmp_path, monkeypatch):
    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    fake = types.SimpleNamespace(
        init=lambda **kw: None, finish=lambda: None, Table=Table, log=lambda d, step: logged.append((step, d))
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    Trainer(_cfg(instruct, "log.wandb=true", "log.samples_every=1"), run).fit()
    tables = [(step, d["samples"]) for step, d in logged if "samples" in d]
    assert [s for s, _ in tables] == [1, 2, 3]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    for step, t in tables:
        assert t.columns == ["step", "group", "reward", "prompt", "completion"]
        assert t.data == [[s[c] for c in t.columns] for s in samples if s["step"] == step]


def test_samples_every_zero_and_no_tracker_log_nothing(tmp_path):
    calls = []

    class Writer:
        def add_text(self, *a):
            calls.append(a)

    for extra, n in ((["log.samples_every=0"], 0), (["log.samples_every=3"], 1)):
        cfg = load_config(None, ["log.tensorboard=true", *extra])
        tr = Trackers(cfg, tmp_path)
        tr._open = {"tb": Writer()}
        calls.clear()
        for step in range(1, 5):
            tr.log_samples(step, [{"step": step, "group": 0, "reward": 1.0, "prompt": "p", "completion": "c"}])
        assert len(calls) == n and all(c[0] == "samples" and c[2] == 3 for c in calls)
    tr = Trackers(load_config(None, []), tmp_path)  # neither tracker on: nothing is started
    tr.log_samples(10, [{"prompt": "p", "completion": "c"}])
    assert tr._open is None


def test_markdown_keeps_text_verbatim():
    md = samples_markdown([{"group": 1, "reward": 0.5, "prompt": "a | *b*\nline2", "completion": "# not a title"}])
    assert "    a | *b*\n    line2" in md and "    # not a title" in md and "group 1, reward 0.5" in md


def _fake_wandb(monkeypatch, ids):
    """A wandb module whose init records its keywords and returns a run with the next id of ``ids``."""
    inits, logged = [], []

    def init(**kw):
        inits.append(kw)
        return types.SimpleNamespace(id=kw.get("id") or ids.pop(0))

    fake = types.SimpleNamespace(
        init=init, finish=lambda: None, Table=None, log=lambda d, step: logged.append((step, d))
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return inits, logged


def test_a_resumed_run_continues_the_same_wandb_run(instruct, tmp_path, monkeypatch):
    inits, logged = _fake_wandb(monkeypatch, ["first", "second"])
    run = tmp_path / "run"
    cfg = lambda: _cfg(instruct, "log.wandb=true", "log.samples_every=0")  # noqa: E731
    Trainer(cfg(), run).fit(stop_after=1)
    assert "id" not in inits[0] and "resume" not in inits[0]  # the first start: W&B picks the id
    assert (run / "wandb_id.txt").read_text() == "first\n"
    Trainer(cfg(), run, resume=True).fit()
    assert inits[1]["id"] == "first" and inits[1]["resume"] == "allow"
    assert [s for s, _ in logged] == [1, 2, 3]  # one W&B run, every step once
    assert (run / "wandb_id.txt").read_text() == "first\n"
    # --overwrite starts a new run folder, so a new W&B run
    Trainer(cfg(), run, overwrite=True).fit(stop_after=1)
    assert "id" not in inits[2] and (run / "wandb_id.txt").read_text() == "second\n"


def test_without_wandb_no_id_is_written(instruct, tmp_path):
    run = tmp_path / "run"
    Trainer(_cfg(instruct, "train.steps=1"), run).fit()
    assert not (run / "wandb_id.txt").exists()
