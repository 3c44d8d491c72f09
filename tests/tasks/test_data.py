"""data:PATH (gapo.tasks.data) on TRL's dataset formats as they ship: standard prompt-only rows
``{"prompt": "..."}``, conversational ones ``{"prompt": [{"role", "content"}, ...]}`` kept whole,
extra columns handed on; a conversation that is not a prompt is an error naming its row."""

import json

import pytest

from gapo.tasks.base import DataSplits, PromptFormat
from gapo.tasks.data import DataTask

# TRL's dataset-formats page: a prompt-only row in each format
STANDARD = {"prompt": "The sky is"}
CONVERSATIONAL = {"prompt": [{"role": "user", "content": "What color is the sky?"}]}
FEW_SHOT = [
    {"role": "system", "content": "Answer with a number only."},
    {"role": "user", "content": "1 + 1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "3 + 4?"},
]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def problems(task):
    return [p for s in ("train", "eval") if task.split_size(s) for p in task.generate(s, task.split_size(s), 0)]


def by_line(task):
    return {p.meta["line"]: p for p in problems(task)}


def test_trl_rows_as_they_ship(tmp_path):
    """No task.params: TRL's ``prompt`` column is found; extra columns reach the rewards."""
    rows = [
        {**STANDARD, "solution": "blue"},
        {**CONVERSATIONAL, "solution": "blue"},
        {"prompt": FEW_SHOT, "solution": "7"},
    ]
    task = DataTask(write(tmp_path / "trl.jsonl", rows), splits=DataSplits(eval_fraction=0.0))
    assert task.prompt_field == "prompt"
    got = by_line(task)
    assert got[1].prompt == "The sky is" and "messages" not in got[1].meta
    assert got[2].prompt == "What color is the sky?"
    assert got[2].meta["messages"] == tuple(CONVERSATIONAL["prompt"])
    # the whole conversation, not its first user turn ("1 + 1?", the old reading)
    assert got[3].prompt == "3 + 4?" and got[3].meta["messages"] == tuple(FEW_SHOT)
    assert got[3].meta["fields"] == {"prompt": FEW_SHOT, "solution": "7"}


def test_the_template_wraps_the_last_user_turn(tmp_path):
    task = DataTask(
        write(tmp_path / "d.jsonl", [{"prompt": FEW_SHOT}]),
        splits=DataSplits(eval_fraction=0.0),
        prompt_format=PromptFormat("Q: {prompt}"),
    )
    (p,) = problems(task)
    assert p.prompt == "Q: 3 + 4?"
    assert p.meta["messages"] == (*FEW_SHOT[:3], {"role": "user", "content": "Q: 3 + 4?"})
    assert FEW_SHOT[3]["content"] == "3 + 4?"  # the row itself is left as it was


@pytest.mark.parametrize(
    "prompt, match",
    [
        (FEW_SHOT[:3], r"the conversation's last turn is 'assistant', not 'user'"),
        ([], r"the conversation is empty"),
        ([{"role": "user"}], r"message 1 is not \{role: str, content: str\}"),
        ([{"role": "user", "content": ["a", "b"]}], r"message 1 is not"),
        (["What color is the sky?"], r"message 1 is not"),
    ],
)
def test_a_conversation_that_is_not_a_prompt_names_its_row(tmp_path, prompt, match):
    path = write(tmp_path / "d.jsonl", [STANDARD, CONVERSATIONAL, {"prompt": prompt}])
    with pytest.raises(ValueError, match=rf"d\.jsonl:3: field 'prompt': {match}"):
        DataTask(path)


def test_a_language_modelling_messages_column(tmp_path):
    """TRL's conversational language-modelling rows (``messages``, the answer last) are training
    text, not prompts: an error, where the first user turn used to be taken silently."""
    lm = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    path = write(tmp_path / "lm.jsonl", [lm])
    with pytest.raises(ValueError, match=r"lm\.jsonl:1: field 'messages': the conversation's last turn is 'assistant'"):
        DataTask(path)


def test_parquet_and_json_rows(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("datasets")
    rows = [{"prompt": FEW_SHOT, "answer": "7"}, {"prompt": FEW_SHOT[1:], "answer": "7"}]
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    for name in ("d.parquet", "d.json"):
        got = by_line(DataTask(tmp_path / name, splits=DataSplits(eval_fraction=0.0)))
        assert [dict(m) for m in got[1].meta["messages"]] == FEW_SHOT, name
        assert [dict(m) for m in got[2].meta["messages"]] == FEW_SHOT[1:], name
    pd.DataFrame([*rows, {"prompt": FEW_SHOT[:3], "answer": "2"}]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet row 3: column 'prompt': the conversation's last turn is 'ass"):
        DataTask(tmp_path / "bad.parquet")
