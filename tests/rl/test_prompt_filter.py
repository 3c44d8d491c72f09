"""task.max_prompt_tokens on a locally built Qwen2 checkpoint (ChatML template): an over-long row
is named by the context check (no negative advice), and with the key set it is dropped from the
training and evaluation pools, counted, printed and kept in events.jsonl."""

import json

import pytest

from checkpoints import build_instruct_checkpoint  # tests/checkpoints.py (tests/ is on sys.path)
from gapo.cli import main
from gapo.rl.config import load_config
from gapo.rl.trainer import Trainer

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    return str(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2-instruct")))


@pytest.fixture()
def data(tmp_path):
    """40 short problems and, on line 7, one far longer than the model's 512-token context."""
    rows = [{"question": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(40)]
    rows.insert(6, {"question": "What is one plus one? " * 200, "answer": "2"})
    p = tmp_path / "data.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _cfg(model, data, *extra):
    return load_config(
        None,
        [
            f"model.path={model}",
            "task.name=math",
            f"task.params.path={data}",
            "task.params.eval_fraction=0.5",
            "train.prompts=2",
            "train.group_size=2",
            "train.mini_batches=1",
            "train.steps=1",
            "train.progress=false",
            "eval.problems=4",
            "eval.samples=2",
            "sampling.max_new_tokens=8",
            "train.checkpoint_every=0",
            *extra,
        ],
    )


def test_an_over_long_row_is_named_and_max_prompt_tokens_is_offered(instruct, data, tmp_path):
    with pytest.raises(ValueError) as e:
        Trainer(_cfg(instruct, data, "train.steps=40", "eval.problems=0"), tmp_path / "run")  # the pool: every row
    msg = str(e.value)
    assert f"{data}:7" in msg and "task.max_prompt_tokens=504" in msg, msg
    assert "at most -" not in msg  # no negative advice
    assert not (tmp_path / "run").exists()


def test_max_prompt_tokens_drops_long_prompts_from_both_pools(instruct, data, tmp_path, capsys):
    run = tmp_path / "run"
    tr = Trainer(_cfg(instruct, data, "task.train_size=100", "task.max_prompt_tokens=200"), run)
    assert all(len(tr.encoder.ids(p)) <= 200 for p in tr.pool + tr.eval_problems)
    assert len(tr.eval_problems) == 4 and len(tr.pool) == 2  # prompts × steps: the pool keeps its size
    f = tr.filtered
    assert f["train_dropped"] + f["eval_dropped"] == 1 and f["train_prompts"] + f["eval_prompts"] == 41
    tr.fit()
    err = capsys.readouterr().err
    assert f"dropped {f['train_dropped']} of {f['train_prompts']} training prompts" in err
    (ev,) = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert ev["event"] == "filter_prompts" and ev["max_prompt_tokens"] == 200
    assert ev["train_dropped"] + ev["eval_dropped"] == 1


def test_max_prompt_tokens_that_drops_everything_is_an_error(instruct, data, tmp_path):
    with pytest.raises(
        ValueError, match=r"task.max_prompt_tokens.*: 5 drops every training prompt \(the shortest has \d+ tokens"
    ):
        Trainer(_cfg(instruct, data, "task.max_prompt_tokens=5"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_gapo_eval_filters_too(instruct, data, capsys):
    from gapo import tasks

    task = tasks.get("math", path=str(data), eval_fraction=0.5)
    split = (
        "train" if any(len(p.prompt) > 1000 for p in task.generate("train", task.split_size("train"), 0)) else "eval"
    )
    n = task.split_size(split) - 1  # every short problem of the split holding the long row
    args = [
        "eval",
        "--model",
        instruct,
        "--task",
        f"math:{data}",
        "--split",
        split,
        "--problems",
        str(n),
        "--n",
        "1",
        "task.params.eval_fraction=0.5",
        "sampling.max_new_tokens=4",
    ]
    assert main(args) == 2
    assert f"{data}:7" in capsys.readouterr().err
    assert main(args + ["task.max_prompt_tokens=200"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert json.loads(out.out)["eval/problems"] == n and f"dropped 1 of {n + 1} {split} prompts" in out.err
