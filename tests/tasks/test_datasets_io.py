"""Local datasets in every shape `math:PATH` takes: formats × the column sets of GSM8K, MATH,
MATH-500, DeepScaleR and NuminaMath, splits, and the errors. Every fixture is built here in
tmp_path (pandas / pyarrow / datasets); nothing touches the network (a guard makes sure)."""

from __future__ import annotations

import gzip
import json
import socket
import sys

import pytest

pytest.importorskip("math_verify")
datasets = pytest.importorskip("datasets")
pd = pytest.importorskip("pandas")

from gapo import tasks  # noqa: E402
from gapo.tasks.base import DataSplits, PromptFormat  # noqa: E402
from gapo.tasks.datasets_io import read_records  # noqa: E402
from gapo.tasks.math import MathTask  # noqa: E402

datasets.disable_progress_bars()

GSM8K = [  # question / answer with the final answer after ####
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72",
    },
    {
        "question": "A car costs 1,000 dollars and a bike 1,350 dollars. What do both cost?",
        "answer": "1000 + 1350 = 2350\n#### 2,350",
    },
    {"question": "It is 3 degrees and drops by 10. What is the temperature?", "answer": "3 - 10 = -7\n#### -7"},
]
GSM8K_GOLD = ["72", "2350", "-7"]
MATH = [  # Hendrycks MATH: problem / solution with \boxed{} (nested braces)
    {
        "problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "We add: $\\frac{1}{4}+\\frac{1}{4} = \\boxed{\\frac{1}{2}}$.",
    },
    {
        "problem": "Simplify $\\sqrt{8}$.",
        "level": "Level 2",
        "type": "Algebra",
        "solution": "$\\sqrt{8} = \\sqrt{4}\\sqrt{2} = \\boxed{2\\sqrt{2}}$.",
    },
    {"problem": "Solve $x + 3 = 7$.", "level": "Level 1", "type": "Algebra", "solution": "So $x = \\boxed{4}$."},
]
MATH_GOLD = ["\\frac{1}{2}", "2\\sqrt{2}", "4"]
MATH500 = [  # problem / solution / answer (the answer column wins)
    {
        "problem": r["problem"],
        "solution": r["solution"],
        "answer": g,
        "subject": "Algebra",
        "level": 1,
        "unique_id": f"test/{i}.json",
    }
    for i, (r, g) in enumerate(zip(MATH, MATH_GOLD))
]
DEEPSCALER = [  # problem / answer / solution
    {"problem": "Compute $2^{10}$.", "answer": "1024", "solution": "$2^{10} = \\boxed{1024}$."},
    {
        "problem": "What is $\\frac{3}{6}$ in lowest terms?",
        "answer": "\\frac{1}{2}",
        "solution": "Divide by 3: $\\boxed{\\frac{1}{2}}$.",
    },
    {"problem": "How many sides has a hexagon?", "answer": "6", "solution": "A hexagon has $\\boxed{6}$ sides."},
]
DEEPSCALER_GOLD = ["1024", "\\frac{1}{2}", "6"]
NUMINA = [  # problem / solution / messages (the chat turns repeat problem and solution)
    {
        "source": "synthetic_math",
        "problem": p,
        "solution": s,
        "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": s}],
    }
    for p, s in (
        ("What is $7 \\times 8$?", "$7 \\times 8 = \\boxed{56}$."),
        ("Evaluate $\\frac{\\frac{1}{2}}{2}$.", "It is $\\boxed{\\frac{1}{4}}$."),
        ("What is $100 - 1$?", "So the answer is $\\boxed{99}$."),
    )
]
NUMINA_GOLD = ["56", "\\frac{1}{4}", "99"]
MESSAGES = [{"messages": r["messages"]} for r in NUMINA]  # chat data only

COLUMN_SETS = {
    "gsm8k": (GSM8K, GSM8K_GOLD, "question"),
    "math": (MATH, MATH_GOLD, "problem"),
    "math500": (MATH500, MATH_GOLD, "problem"),
    "deepscaler": (DEEPSCALER, DEEPSCALER_GOLD, "problem"),
    "numina": (NUMINA, NUMINA_GOLD, "problem"),
    "messages": (MESSAGES, NUMINA_GOLD, None),
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test: local datasets never reach the hub."""

    def refuse(*a, **k):
        raise AssertionError(f"network access attempted: {a}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def write(fmt: str, rows: list[dict], tmp_path, name: str = "data"):
    """``rows`` stored in format ``fmt``; returns the path to give ``math:PATH``."""
    if fmt == "jsonl":
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "jsonl.gz":
        p = tmp_path / f"{name}.jsonl.gz"
        with gzip.open(p, "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(rows))
    elif fmt == "json-data":
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"version": "1.0", "data": rows}))
    elif fmt == "parquet":
        p = tmp_path / f"{name}.parquet"
        pd.DataFrame(rows).to_parquet(p)
    elif fmt == "csv":
        p = tmp_path / f"{name}.csv"
        pd.DataFrame(rows).to_csv(p, index=False)
    elif fmt == "save_to_disk":
        p = tmp_path / name
        datasets.Dataset.from_list(rows).save_to_disk(str(p))
    elif fmt == "save_to_disk_dict":
        p = tmp_path / name
        datasets.DatasetDict(
            {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
        ).save_to_disk(str(p))
    elif fmt == "parquet_folder":  # as GSM8K ships: main/{train,test}-00000-of-00001.parquet
        p = tmp_path / name / "main"
        p.mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(p / "train-00000-of-00001.parquet")
        pd.DataFrame(rows[:1]).to_parquet(p / "test-00000-of-00001.parquet")
    elif fmt == "json_folder":  # as DeepScaleR ships: one deepscaler.json
        p = tmp_path / name
        p.mkdir()
        (p / "deepscaler.json").write_text(json.dumps(rows))
    else:
        raise AssertionError(fmt)
    return p


FORMATS = [
    "jsonl",
    "jsonl.gz",
    "json",
    "json-data",
    "parquet",
    "csv",
    "save_to_disk",
    "save_to_disk_dict",
    "parquet_folder",
    "json_folder",
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cols", list(COLUMN_SETS))
def test_formats_and_column_sets(tmp_path, fmt, cols):
    rows, gold, qfield = COLUMN_SETS[cols]
    if fmt == "csv" and cols in ("numina", "messages"):
        pytest.skip("CSV holds no lists of chat turns")
    task = MathTask(write(fmt, rows, tmp_path), splits=DataSplits(eval_fraction=0.0))
    probs = sorted(task.generate("train", task.split_size("train"), 0), key=lambda p: p.meta["line"])
    assert [p.answer for p in probs] == gold
    want_q = [r[qfield] if qfield else r["messages"][0]["content"] for r in rows]
    assert [p.meta["question"] for p in probs] == want_q
    assert [p.meta["line"] for p in probs] == [1, 2, 3]  # line of JSONL, else record / row number
    assert all(p.prompt.startswith(p.meta["question"]) for p in probs)
    if fmt in ("parquet", "save_to_disk_dict"):  # the demonstrations are correct answers
        assert all(task.score(p, task.demonstration(p)) == 1.0 for p in probs)


def test_field_mapping_and_numbers_in_tables(tmp_path):
    rows = [
        {"q": "What is 6 times 7?", "final": 42, "question": "decoy", "answer": "#### 0"},
        {"q": "What is 12 / 4?", "final": 3, "question": "decoy 2", "answer": "#### 0"},
    ]
    for fmt in ("parquet", "csv", "json"):
        task = MathTask(
            write(fmt, rows, tmp_path, f"m_{fmt}"),
            prompt_field="q",
            answer_field="final",
            splits=DataSplits(eval_fraction=0.0),
            prompt_format=PromptFormat("Q: {question} A:"),
        )
        by_line = {p.meta["line"]: p for p in task.generate("train", 2, 0)}
        assert by_line[1].prompt == "Q: What is 6 times 7? A:" and by_line[1].answer == "42"
        assert by_line[2].answer == "3" and task.score(by_line[2], "\\boxed{3.0}") == 1.0


def test_read_records_columns_selection(tmp_path):
    path = write("parquet", NUMINA, tmp_path)
    recs = read_records(path, columns=["problem"])
    assert recs.columns == ["source", "problem", "solution", "messages"]  # all columns, for messages
    assert list(recs.rows[0][1]) == ["problem"]  # only those asked for are read
    assert recs.tabular and recs.split is None and recs.source == str(path)


# ----------------------------------------------------------------------------- splits


def gsm8k_folder(tmp_path):
    """A GSM8K-like folder: main/train has 6 problems, main/test 2 others plus one train question."""
    train = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(6)]
    test = [{"question": f"What is {i} times 3?", "answer": f"#### {3 * i}"} for i in (7, 8)] + [train[0]]
    main = tmp_path / "gsm8k" / "main"
    main.mkdir(parents=True)
    pd.DataFrame(train).to_parquet(main / "train-00000-of-00001.parquet")
    pd.DataFrame(test).to_parquet(main / "test-00000-of-00001.parquet")
    return main


def test_splits_of_a_parquet_folder(tmp_path):
    main = gsm8k_folder(tmp_path)
    default = MathTask(main, splits=DataSplits(eval_fraction=0.0))
    assert default.split == "train" and default.split_size("train") == 6
    assert default.generate("train", 1, 0)[0].meta["source"] == f"{main} [split 'train']"
    test = MathTask(main, splits=DataSplits(split="test", eval_fraction=0.0))
    assert test.split == "test" and test.split_size("train") == 3
    # eval_split: held-out problems from the same folder; train drops the question both share
    held = MathTask(main, splits=DataSplits(split="train", eval_split="test"))
    assert held.split_size("eval") == 3 and held.split_size("train") == 5 and held.n_dropped_overlap == 1
    assert {p.answer for p in held.generate("eval", 3, 0)} == {"21", "24", "0"}
    assert held.generate("eval", 1, 0)[0].meta["source"] == f"{main} [split 'test']"
    # the folder above works too (datasets finds the files below it)
    assert MathTask(main.parent, splits=DataSplits(eval_fraction=0.0)).split_size("train") == 6
    with pytest.raises(ValueError, match=r"main: no split 'validation' \(splits: \['train', 'test'\]\)"):
        MathTask(main, splits=DataSplits(split="validation"))
    with pytest.raises(ValueError, match="eval_split='train' is the training split too"):
        MathTask(main, splits=DataSplits(eval_split="train"))
    # an eval_path in another format, with its own split
    other = write("save_to_disk_dict", GSM8K, tmp_path, "other")
    t = MathTask(main, splits=DataSplits(eval_path=other, eval_split="test"))
    assert t.split_size("eval") == 1 and t.eval_split == "test" and t.split_size("train") == 6


def test_splits_of_saved_dataset_dict_and_json_object(tmp_path):
    dd = write("save_to_disk_dict", GSM8K, tmp_path)
    assert MathTask(dd, splits=DataSplits(eval_fraction=0.0)).split_size("train") == 3
    assert MathTask(dd, splits=DataSplits(split="test", eval_fraction=0.0)).split_size("train") == 1
    assert MathTask(dd, splits=DataSplits(eval_split="test")).split_size("eval") == 1
    js = tmp_path / "splits.json"
    js.write_text(json.dumps({"train": GSM8K, "test": GSM8K[:2]}))
    assert MathTask(js, splits=DataSplits(split="test", eval_fraction=0.0)).split_size("train") == 2
    # no 'train' and several splits: say so and list them
    dd2 = tmp_path / "nt"
    datasets.DatasetDict(
        {"validation": datasets.Dataset.from_list(GSM8K), "test": datasets.Dataset.from_list(GSM8K)}
    ).save_to_disk(str(dd2))
    with pytest.raises(ValueError, match=r"splits \['validation', 'test'\] and none is 'train'"):
        MathTask(dd2)
    # the only split is the default (MATH-500 ships test.jsonl alone)
    solo = tmp_path / "math500"
    solo.mkdir()
    (solo / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MATH500))
    t = MathTask(solo, splits=DataSplits(eval_fraction=0.0))
    assert t.split == "test" and t.split_size("train") == 3


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv", "save_to_disk"])
def test_sources_without_splits(tmp_path, fmt):
    path = write(fmt, GSM8K, tmp_path)
    assert (
        MathTask(path, splits=DataSplits(split="train", eval_fraction=0.0)).split_size("train") == 3
    )  # all of it is train
    with pytest.raises(ValueError, match=r"has no splits, so split='test' cannot be chosen") as e:
        MathTask(path, splits=DataSplits(split="test"))
    assert str(path) in str(e.value)


# ----------------------------------------------------------------------------- errors


def test_missing_column_names_file_split_and_columns(tmp_path):
    rows = [{"text": "What is 1+1?", "label": "2"}]
    pq = write("parquet", rows, tmp_path)
    with pytest.raises(ValueError) as e:
        MathTask(pq)
    assert str(e.value) == (
        f"{pq}: no question column (tried ['question', 'problem', 'prompt', 'messages']; "
        "columns present: ['text', 'label']); pass prompt_field="
    )
    with pytest.raises(
        ValueError, match=r"no answer column .*columns present: \['text', 'label'\]\); pass answer_field="
    ):
        MathTask(pq, prompt_field="text")
    with pytest.raises(ValueError) as e:
        MathTask(pq, prompt_field="text", answer_field="final")
    assert str(e.value) == f"{pq}: missing column 'final' (columns present: ['text', 'label'])"
    main = tmp_path / "f" / "main"
    main.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(main / "train-00000-of-00001.parquet")
    pd.DataFrame(rows).to_parquet(main / "test-00000-of-00001.parquet")
    with pytest.raises(ValueError) as e:
        MathTask(main, splits=DataSplits(split="test"), prompt_field="question")
    assert str(e.value) == f"{main} [split 'test']: missing column 'question' (columns present: ['text', 'label'])"
    # a JSON list: per record, like JSONL
    js = write("json", [GSM8K[0], {"question": "x"}], tmp_path)
    with pytest.raises(
        ValueError, match=r"data\.json record 2: missing field 'answer' \(fields present: \['question'\]\)"
    ):
        MathTask(js)
    # bad values name the row
    bad = write("parquet", [GSM8K[0], {"question": "  ", "answer": "#### 1"}], tmp_path, "bad")
    with pytest.raises(ValueError, match=r"bad\.parquet row 2: column 'question' must be a non-empty string"):
        MathTask(bad)
    nogold = write("csv", [GSM8K[0], {"question": "q", "answer": None}], tmp_path, "nogold")
    with pytest.raises(ValueError, match=r"nogold\.csv row 2: column 'answer' holds no usable answer"):
        MathTask(nogold)


def test_missing_path_malformed_and_unknown_files(tmp_path):
    missing = tmp_path / "gsm8k" / "main"
    with pytest.raises(ValueError) as e:
        MathTask(missing)
    assert str(e.value).startswith(f"{missing}: dataset file not found") and "never downloads" in str(e.value)
    with pytest.raises(ValueError, match="dataset file not found"):
        MathTask("openai/gsm8k")  # a hub id is just a path that does not exist
    cases = {
        "bad.parquet": (
            b"PAR1 this is not a parquet file",
            r"bad\.parquet: cannot read a Parquet file \(ArrowInvalid: ",
        ),
        "bad.csv": (b'question,answer\n"unterminated,1\n', r"bad\.csv: cannot read a CSV file \(ParserError: "),
        "bad.json": (b'[{"question": "a", "answer": "1"},', r"bad\.json: not valid JSON \(Expecting value at line 1"),
        "scalar.json": (b"42", r"scalar\.json: expected a JSON list of records, got int"),
        "keys.json": (b'{"a": 1}', r"keys\.json: expected a JSON list of records.* keys \['a'\]"),
        "ints.json": (b"[1, 2]", r"ints\.json record 1: expected a JSON object, got int"),
        "empty.json": (b"[]", r"empty\.json: dataset is empty"),
        "data.txt": (b"hello", r"data\.txt: unknown dataset format \(expected \.jsonl, \.json, \.parquet"),
        "bin.json": (b"\xff\xfe\x00", r"bin\.json: not UTF-8 text"),
    }
    for name, (data, pattern) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(ValueError, match=pattern):
            MathTask(p)
    empty_pq = tmp_path / "empty.parquet"
    pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(empty_pq)
    with pytest.raises(ValueError, match=r"empty\.parquet: dataset is empty \(no rows\)"):
        MathTask(empty_pq)
    (tmp_path / "nodata").mkdir()
    (tmp_path / "nodata" / "README.md").write_text("# nothing here\n")
    with pytest.raises(ValueError, match=r"nodata: no data files found in this folder"):
        MathTask(tmp_path / "nodata")
    # a broken Parquet file inside a dataset folder
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "train-00000-of-00001.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(ValueError, match=r"broken.*cannot read a dataset folder \(ArrowInvalid"):
        MathTask(broken)
    # JSON lines in a .json file are read as JSONL
    jl = tmp_path / "lines.json"
    jl.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    assert MathTask(jl, splits=DataSplits(eval_fraction=0.0)).split_size("train") == 3


def test_folder_with_several_configurations(tmp_path):
    """The GSM8K download's root: main/ and socratic/ declared as configs in its README."""
    root = tmp_path / "gsm8k"
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        pd.DataFrame(GSM8K).to_parquet(root / config / "train-00000-of-00001.parquet")
        pd.DataFrame(GSM8K[:1]).to_parquet(root / config / "test-00000-of-00001.parquet")
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
            f"  - split: test\n    path: {c}/test-*\n"
            for c in ("main", "socratic")
        )
        + "---\n# gsm8k\n"
    )
    with pytest.raises(ValueError) as e:
        MathTask(root)
    assert str(e.value) == (
        f"{root}: this dataset folder holds several configurations ['main', 'socratic']; "
        "point at the folder of one of them instead (e.g. gsm8k/main rather than gsm8k)"
    )
    t = MathTask(root / "main", splits=DataSplits(eval_split="test"))
    assert t.split_size("eval") == 1 and t.split_size("train") == 2


def test_errors_through_the_trainers_task_builder(tmp_path):
    pq = write("parquet", [{"text": "q", "label": "1"}], tmp_path)
    with pytest.raises(ValueError) as e:
        tasks.build("math", {"path": str(pq), "split": "train"})
    assert str(e.value).startswith(
        f"task 'math' with task.params={{'path': '{pq}', 'split': 'train'}}: {pq}: no question column"
    )


def test_jsonl_and_json_need_no_datasets(tmp_path, monkeypatch):
    jsonl, js, pq = write("jsonl", GSM8K, tmp_path), write("json", GSM8K, tmp_path), write("parquet", GSM8K, tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    assert MathTask(jsonl, splits=DataSplits(eval_fraction=0.0)).split_size("train") == 3
    assert MathTask(js, splits=DataSplits(eval_fraction=0.0)).split_size("train") == 3
    with pytest.raises(ImportError, match=r"needs the `datasets` package: pip install 'gapo\[math\]'"):
        MathTask(pq)
    with pytest.raises(ValueError, match=r"task 'math' needs an optional package: .*gapo\[math\]"):
        tasks.build("math", {"path": str(pq)})


def test_offline_flags_are_restored(tmp_path):
    import huggingface_hub.constants as hub

    before = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
    MathTask(write("parquet_folder", GSM8K, tmp_path), splits=DataSplits(eval_fraction=0.0))
    assert (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE) == before


def test_split_rows_is_the_one_train_eval_split():
    """The math and data tasks' split (``gapo.tasks.base.split_rows``), by hand: a held-out split
    drops training rows whose question it holds (whitespace and case aside) and is read only when
    it is not the training split; without one, each row goes where ``split_of`` puts its question."""
    from gapo.tasks.base import question_key, split_of, split_rows

    rows = [(i, q) for i, q in enumerate(["What is 2+2?", "what  is 3+3?", "Name a prime."], 1)]
    ev = [(1, "WHAT IS 3+3?\n")]
    got = split_rows(DataSplits(eval_split="test"), ("a.jsonl", rows, "train"), lambda: ("b.jsonl", ev), "a.jsonl")
    assert got == {"train": ("a.jsonl", [rows[0], rows[2]]), "eval": ("b.jsonl", ev)}

    def unread():
        raise AssertionError("eval was read before the check")

    with pytest.raises(ValueError, match=r"a.jsonl: eval_split='train' is the training split too"):
        split_rows(DataSplits(eval_split="train"), ("a.jsonl", rows, "train"), unread, "a.jsonl")
    # another file may hold a split of the training split's name
    assert split_rows(DataSplits(eval_split="train", eval_path="b"), ("a", rows, "train"), lambda: ("b", ev), "a")
    many = [(i, f"question {i}") for i in range(200)]
    got = split_rows(DataSplits(eval_fraction=0.3), ("a", many, "train"), unread, "a")
    expect = [r for r in many if split_of(question_key(r[1]), 0.3) == "eval"]
    assert got["eval"] == ("a", expect) and 30 < len(expect) < 90
    assert sorted(got["train"][1] + got["eval"][1]) == many


@pytest.mark.parametrize("task_name", ["math", "data"])
def test_eval_fraction_is_the_one_name(tmp_path, task_name):
    """The hash split's share is ``eval_fraction`` in every task; 0.2's ``eval_frac`` of the math
    and data tasks is gone: an error (the config's names ``eval_fraction``), never a second name."""
    from gapo.rl.config import load_config

    rows = [{"question": f"What is {i} plus one?", "answer": f"{i} + 1\n#### {i + 1}"} for i in range(40)]
    path = write("jsonl", rows, tmp_path)
    extra = {} if task_name == "math" else {"prompt_field": "question"}
    task = tasks.get(task_name, path=str(path), eval_fraction=0.5, **extra)
    assert task.eval_fraction == 0.5 and 10 < task.split_size("eval") < 30  # not the 0.1 default
    with pytest.raises(ValueError, match=f"task {task_name!r}.*'eval_frac'"):
        tasks.build(task_name, {"path": str(path), "eval_frac": 0.5, **extra})
    keys = ["task.name=math", f"task.params.path={path}", "task.params.eval_frac=0.5"]
    with pytest.raises(ValueError, match="unknown entry 'eval_frac'.*Did you mean eval_fraction"):
        load_config(None, keys)


@pytest.mark.parametrize("task_name", ["math", "data"])
def test_the_flat_split_keys_build_the_task_the_groups_build(tmp_path, task_name):
    """``split``/``eval_split``/``eval_path``/``eval_fraction`` and ``template``/
    ``max_completion_len`` as keys of their own (the task.params spelling, through the registry)
    build the same task as a DataSplits and a PromptFormat; the constructor takes only the
    groups; a bad field is named."""
    main = tmp_path / "main"
    main.mkdir()
    write("jsonl", GSM8K[:2], main, "train")
    write("jsonl", GSM8K[2:], main, "test")
    cls = tasks.factory(task_name)
    tpl = "Q: {question}" if task_name == "math" else "P: {prompt}"
    extra = {} if task_name == "math" else {"prompt_field": "question", "answer_fields": ["answer"]}
    flat = tasks.get(
        task_name, path=main, split="train", eval_split="test", template=tpl, max_completion_len=99, **extra
    )
    grouped = cls(
        main,
        splits=DataSplits(split="train", eval_split="test"),
        prompt_format=PromptFormat(tpl, max_completion_len=99),
        **extra,
    )
    assert vars(flat) == vars(grouped)
    for split in ("train", "eval"):
        a, b = flat.generate(split, flat.split_size(split), 0), grouped.generate(split, flat.split_size(split), 0)
        assert [(p.prompt, p.answer, p.meta) for p in a] == [(p.prompt, p.answer, p.meta) for p in b]
    assert (flat.split_size("train"), flat.split_size("eval"), flat.max_completion_len) == (2, 1, 99)
    assert flat.generate("eval", 1, 0)[0].prompt.startswith(tpl.split("{")[0])
    with pytest.raises(ValueError, match="eval_fraction"):
        cls(main, splits=DataSplits(eval_fraction=-0.1), **extra)
    with pytest.raises(ValueError, match="max_completion_len"):
        tasks.get(task_name, path=main, max_completion_len=0, **extra)
    with pytest.raises(TypeError, match="unexpected keyword argument 'split'"):
        cls(main, split="train", **extra)
    with pytest.raises(ValueError, match=f"task {task_name!r}.*'eval_splt'"):
        tasks.build(task_name, {"path": str(main), "eval_splt": "test", **extra})
