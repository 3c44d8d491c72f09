"""Reading a local dataset in any of the usual shapes, as rows of one split.

``read_records(path, split=None, required=())`` accepts

- JSONL (``.jsonl``, ``.ndjson``, optionally ``.gz``): one object per line
  (:func:`gapo.tasks.base.read_jsonl`; needs nothing but the standard library),
- JSON (``.json``, optionally ``.gz``): a list of objects, an object holding that list under
  ``data`` / ``rows`` / ``records`` / ``examples`` / ``instances`` / ``problems``, or an object
  of splits (``{"train": [...], "test": [...]}``); a ``.json`` file that is really JSON lines is
  read as JSONL. Standard library only.
- Parquet, CSV, TSV and Arrow files (``.parquet``, ``.csv``, ``.tsv``, ``.arrow``),
- a folder written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``),
- a folder of data files as downloaded from the hub (GSM8K's ``main/train-00000-of-00001.parquet``
  and ``main/test-00000-of-00001.parquet``, DeepScaleR's ``deepscaler.json``, ...), whose splits
  ``datasets.load_dataset(folder)`` infers from the file names (and from a README's ``configs``).

The last three go through the ``datasets`` library (the optional ``math`` extra), imported only
here and only for them. Paths are local only: a path that does not exist is an error naming it
and never a hub lookup (``datasets`` is given the absolute path of an existing file or folder,
which it reads locally, and is held in offline mode during the call). Data folders and data files
are read in streaming mode: nothing is written to the ``datasets`` cache.

Splits: a source with named splits (a ``DatasetDict``, a data folder, a JSON object of splits)
gives ``split`` (default: ``train``, or the only split there is). A source without splits (one
file, a saved ``Dataset``) is its own ``train`` split.

Errors are ``ValueError`` s naming the file (and split): a missing path, an unknown format, a
malformed file, an unknown split, a missing required column (listing the columns present), an
empty split.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gapo.tasks.base import read_jsonl

__all__ = ["FORMATS", "Records", "check_required", "read_records"]

FORMATS = (
    ".jsonl, .json, .parquet, .csv, .tsv, .arrow (optionally .gz for JSON/JSONL), a save_to_disk folder "
    "or a folder of data files"
)
_JSON_LIST_KEYS = ("data", "rows", "records", "examples", "instances", "problems")
_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
_FORMAT_NAMES = {".parquet": "Parquet", ".csv": "CSV", ".tsv": "TSV", ".arrow": "Arrow"}
_BATCH = 1024


@dataclass
class Records:
    """The rows of one split of a dataset.

    ``source`` names it in messages (the path, plus ``[split 'test']`` when the source has named
    splits); ``split`` is that split's name (``None`` for a source without splits);
    ``columns`` the column names (for JSON/JSONL: the keys of the first record); ``tabular``
    whether every row has every column (Parquet, CSV, ``datasets``) or records may differ
    (JSON/JSONL, checked per record). ``rows`` holds ``(position, record)`` pairs: the line
    number for JSONL, the 1-based record or row number otherwise.
    """

    source: str
    split: str | None
    columns: list[str]
    tabular: bool
    rows: list[tuple[int, dict]] = field(repr=False)
    jsonl: bool = False

    @property
    def noun(self) -> str:
        return "column" if self.tabular else "field"

    def where(self, pos: int | None = None) -> str:
        """``source`` or the location of the record at ``pos`` (``path:line`` for JSONL)."""
        if pos is None:
            return self.source
        if self.jsonl:
            return f"{self.source}:{pos}"
        return f"{self.source} {'row' if self.tabular else 'record'} {pos}"

    def __len__(self) -> int:
        return len(self.rows)


def read_records(
    path,
    *,
    split: str | None = None,
    required: Sequence[str] = (),
    columns: Sequence[str] | Callable[[list[str]], Sequence[str]] | None = None,
) -> Records:
    """The rows of ``split`` of the local dataset at ``path`` (see the module docstring).

    ``required``: fields every record must have (a ``ValueError`` naming the file and listing the
    fields present otherwise). ``columns``: for ``datasets`` sources, read only these columns
    (those present; the others are ignored), or a function of the column names that says which;
    this saves time and memory on wide datasets. ``Records.columns`` still lists them all.
    """
    path = os.fspath(path)
    if split is not None and (not isinstance(split, str) or not split):
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    if not os.path.exists(path):
        raise ValueError(
            f"{path}: dataset file not found (no such file or folder; gapo reads local "
            "datasets only and never downloads one)"
        )
    name = path.lower()
    base = name[:-3] if name.endswith(".gz") else name
    if os.path.isdir(path):
        recs = _read_with_datasets(path, split, None, columns)
    elif base.endswith((".jsonl", ".ndjson")):
        _no_splits(path, split)
        rows = read_jsonl(path, required)
        return Records(path, None, list(rows[0][1]), False, rows, jsonl=True)
    elif base.endswith(".json"):
        recs = _read_json(path, split)
    elif name.endswith(tuple(_BUILDERS)):
        recs = _read_with_datasets(path, split, os.path.splitext(name)[1], columns)
    else:
        raise ValueError(f"{path}: unknown dataset format (expected {FORMATS})")
    check_required(recs, required)
    return recs


def _no_splits(path: str, split: str | None) -> None:
    if split not in (None, "train"):
        raise ValueError(
            f"{path}: this dataset has no splits, so split={split!r} cannot be chosen "
            "(all of it is the 'train' split; for named splits use a folder with one file "
            "per split, a JSON object of splits or a saved DatasetDict)"
        )


def _pick_split(path: str, splits: Sequence[str], split: str | None) -> str:
    splits = list(splits)
    if split is not None:
        if split not in splits:
            raise ValueError(f"{path}: no split {split!r} (splits: {splits})")
        return split
    if "train" in splits:
        return "train"
    if len(splits) == 1:
        return splits[0]
    raise ValueError(
        f"{path}: the dataset has splits {splits} and none is 'train'; choose one with split= (task.params.split=...)"
    )


def check_required(recs: Records, required: Sequence[str]) -> None:
    """A ``ValueError`` naming the file (and record) unless every record has every ``required``
    field: for tabular sources a missing column, listing the columns present."""
    for fld in required:
        if recs.tabular:
            if fld not in recs.columns:
                raise ValueError(f"{recs.where()}: missing column {fld!r} (columns present: {recs.columns})")
            continue
        for pos, rec in recs.rows:
            if fld not in rec:
                raise ValueError(f"{recs.where(pos)}: missing field {fld!r} (fields present: {sorted(rec)})")


# ----------------------------------------------------------------------------- JSON


def _read_json(path: str, split: str | None) -> Records:
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read dataset ({e})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON lines in a .json file (common on the hub)
            _no_splits(path, split)
            rows = read_jsonl(path)
            return Records(path, None, list(rows[0][1]), False, rows, jsonl=True)
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if isinstance(obj, list):
        _no_splits(path, split)
        return _json_records(path, None, obj)
    if isinstance(obj, dict):
        key = next((k for k in _JSON_LIST_KEYS if isinstance(obj.get(k), list)), None)
        if key is not None:
            _no_splits(path, split)
            return _json_records(path, None, obj[key])
        if obj and all(isinstance(v, list) for v in obj.values()):  # {"train": [...], "test": [...]}
            name = _pick_split(path, list(obj), split)
            return _json_records(f"{path} [split {name!r}]", name, obj[name])
        raise ValueError(
            f"{path}: expected a JSON list of records, an object with the list under one of "
            f"{list(_JSON_LIST_KEYS)}, or an object of splits; got an object with keys "
            f"{sorted(obj)[:20]}"
        )
    raise ValueError(f"{path}: expected a JSON list of records, got {type(obj).__name__}")


def _json_records(source: str, split: str | None, items: list) -> Records:
    rows = []
    for i, rec in enumerate(items, 1):
        if not isinstance(rec, dict):
            raise ValueError(f"{source} record {i}: expected a JSON object, got {type(rec).__name__}")
        rows.append((i, rec))
    if not rows:
        raise ValueError(f"{source}: dataset is empty (no records)")
    return Records(source, split, list(rows[0][1]), False, rows)


# ----------------------------------------------------------------------------- datasets


@contextlib.contextmanager
def _quiet_offline(datasets):
    """``datasets`` (and huggingface_hub) in offline mode with their logging quieted, restored
    afterwards. Both read ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` when first imported, so the
    flags are set on their config modules here; the environment variables are set too, for
    anything that reads them later during the call."""
    saved_env = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update({k: "1" for k in saved_env})
    flags = []
    try:
        import huggingface_hub.constants as hub_constants

        flags.append((hub_constants, "HF_HUB_OFFLINE"))
    except ImportError:  # pragma: no cover - datasets depends on huggingface_hub
        pass
    flags += [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE")]
    saved_flags = [(mod, attr, getattr(mod, attr)) for mod, attr in flags if hasattr(mod, attr)]
    for mod, attr, _ in saved_flags:
        setattr(mod, attr, True)
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # it logs "Failed to read file ..." before raising; we say it once
    try:
        yield
    finally:
        logger.setLevel(level)
        for mod, attr, value in saved_flags:
            setattr(mod, attr, value)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _import_datasets():
    try:  # lazy: `datasets` is the optional [math] extra, needed only for non-JSON formats
        import datasets
    except ImportError as e:
        raise ImportError(
            "reading Parquet, CSV, Arrow or dataset folders needs the `datasets` package: "
            "pip install 'gapo[math]' (JSON and JSONL need nothing)"
        ) from e
    return datasets


def _cause(e: BaseException) -> str:
    """The innermost message of a chained exception (``datasets`` wraps the reader's error)."""
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _read_with_datasets(path: str, split: str | None, ext: str | None, columns) -> Records:
    datasets = _import_datasets()
    apath = os.path.abspath(path)  # never a hub id, never a packaged builder's name
    saved = os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")
    )
    what = "a save_to_disk folder" if saved else "a dataset folder" if ext is None else f"a {_FORMAT_NAMES[ext]} file"
    with _quiet_offline(datasets):
        try:
            if saved:
                ds = datasets.load_from_disk(apath)
            elif ext is None:
                ds = datasets.load_dataset(apath, streaming=True)
            else:
                kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
                ds = datasets.load_dataset(_BUILDERS[ext], data_files={"train": apath}, streaming=True, **kwargs)
        except Exception as e:  # noqa: BLE001 - datasets raises many kinds; all mean "cannot read this"
            raise ValueError(_folder_hint(path, what, e)) from None
        if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            if not ds:
                raise ValueError(f"{path}: {what} with no splits")
            if ext is not None:  # one data file: datasets calls it "train"
                _no_splits(path, split)
                name, source = None, path
                part = ds["train"]
            else:
                name = _pick_split(path, list(ds), split)
                source = f"{path} [split {name!r}]"
                part = ds[name]
        else:  # a saved Dataset: no splits
            _no_splits(path, split)
            name, source, part = None, path, ds
        try:
            rows, cols = _materialise(part, columns)
        except Exception as e:  # noqa: BLE001 - malformed data surfaces while reading (streaming)
            if "BatchSize must be greater than 0" in str(e):  # how streaming Parquet says "no rows"
                raise ValueError(f"{source}: dataset is empty (no rows)") from None
            raise ValueError(f"{source}: cannot read {what} ({_cause(e)})") from None
    if not rows:
        raise ValueError(f"{source}: dataset is empty (no rows)")
    return Records(source, name, cols, True, rows)


def _folder_hint(path: str, what: str, e: BaseException) -> str:
    msg = _cause(e)
    if "Config name is missing" in str(e) or "available configs" in str(e):
        configs = re.search(r"available configs: (\[[^\]]*\])", str(e))
        return (
            f"{path}: this dataset folder holds several configurations"
            f"{' ' + configs.group(1) if configs else ''}; point at the folder of one of them "
            "instead (e.g. gsm8k/main rather than gsm8k)"
        )
    if what == "a dataset folder" and ("data files" in msg.lower() or isinstance(e, FileNotFoundError)):
        return f"{path}: no data files found in this folder (expected {FORMATS})"
    return f"{path}: cannot read {what} ({msg})"


def _materialise(part, columns) -> tuple[list[tuple[int, dict]], list[str]]:
    cols = part.column_names
    if cols is None:  # streaming JSON/CSV: the columns are those of the first row
        first = next(iter(part), None)
        cols = list(first) if first is not None else []
    cols = list(cols)
    if callable(columns):
        columns = columns(cols)
    if columns is not None:
        keep = [c for c in cols if c in set(columns)] or cols[:1]  # one column at least, to count rows
        if keep != cols:
            part = part.select_columns(keep)
    rows: list[tuple[int, dict]] = []
    for batch in part.iter(batch_size=_BATCH):
        names = list(batch)
        n = len(batch[names[0]]) if names else 0
        for j in range(n):
            rows.append((len(rows) + 1, {k: batch[k][j] for k in names}))
    return rows, cols


def conversation(value, where: str) -> tuple[dict, ...]:
    """A message list checked: non-empty, ``{role: str, content: str}`` messages, the user's last."""
    if not value:
        raise ValueError(f"{where}: the conversation is empty (a prompt needs a user turn)")
    for i, m in enumerate(value, 1):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {i} is not {{role: str, content: str}} (got {m!r:.120})")
    if value[-1]["role"] != "user":
        raise ValueError(
            f"{where}: the conversation's last turn is {value[-1]['role']!r}, not 'user'; a prompt ends "
            "with the question the model answers (a conversation with its answers is training text, "
            "not a prompt: drop the turns after the last user turn)"
        )
    return tuple(value)
