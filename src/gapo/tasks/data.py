"""``data:PATH``: prompts from any local dataset, scored by rewards of your own (``--reward``).

    gapo train --task data:./my_data.jsonl task.params.prompt_field=instruction \\
        task.params.answer_fields=[reference,tests] --reward my_rewards.py:score ...

One problem per row of the dataset (every format of :mod:`gapo.tasks.datasets_io`: JSONL, JSON,
Parquet, CSV/TSV, Arrow, a ``save_to_disk`` folder, a folder of data files; ``split`` picks a
split). ``prompt_field`` names the prompt column (default: the first of ``prompt``, ``question``,
``problem``, ``instruction``, ``messages`` present, so TRL's ``prompt`` needs no setting);
``answer_fields`` the columns handed to the reward functions beside the prompt (default: every
column). ``template`` wraps the prompt (``{prompt}`` is replaced by it).

A prompt is a string (TRL's standard format) or a conversation (TRL's conversational format: a
list of ``{"role", "content"}`` messages, e.g. a system turn, few-shot exchanges and the
question last). A conversation is kept whole: the problem's ``prompt`` is its last turn, which
must be the user's, wrapped by ``template``, and ``meta["messages"]`` the conversation with that
turn so wrapped, which the chat template renders whole (:mod:`gapo.policy.chat`). A conversation
that is empty, holds a message that is not ``{role: str, content: str}`` or ends in a turn other
than the user's (TRL's language-modelling ``messages``, with their answers) is an error naming
the row.

The task has no verifier of its own: it needs ``--reward`` (``reward.funcs``,
:mod:`gapo.tasks.custom`), which receives ``prompt``, ``completion`` and the row's prompt and
answer columns as keyword fields. Splits follow ``math:PATH``: ``eval_path`` or ``eval_split``
name the held-out data (training rows whose prompt also appears there are dropped), else a stable
hash of the prompt puts ``eval_fraction`` of the rows in eval (:func:`gapo.tasks.base.split_of`).
"""

from __future__ import annotations

import random
from pathlib import Path

from gapo.tasks.base import (
    DataSplits,
    Problem,
    PromptFormat,
    as_group,
    draw_from_split,
    split_rows,
)
from gapo.tasks.datasets_io import conversation, read_records

__all__ = ["DataTask"]

_PROMPT_FIELDS = ("prompt", "question", "problem", "instruction")


class DataTask:
    """Rows of a local dataset as prompts (see the module docstring).

    ``splits`` (:class:`~gapo.tasks.base.DataSplits`) and ``prompt_format``
    (:class:`~gapo.tasks.base.PromptFormat`, placeholder ``{prompt}``) as for ``MathTask``: each an
    instance or a mapping of its fields; ``task.params`` may give a field on its own."""

    alphabet = None  # a real tokenizer
    needs_reward = True  # no verifier of its own: gapo.tasks.custom.with_rewards requires --reward
    param_groups = (DataSplits, PromptFormat)  # task.params may give their fields flat

    def __init__(
        self,
        path: str | Path,
        *,
        splits: DataSplits | None = None,
        prompt_field: str | None = None,
        answer_fields: list | None = None,
        prompt_format: PromptFormat | None = None,
        name: str = "data",
    ):
        splits = as_group(DataSplits, splits, DataSplits())
        fmt = as_group(PromptFormat, prompt_format, PromptFormat("{prompt}"))
        template, eval_fraction = fmt.template, splits.eval_fraction
        split, eval_split, eval_path = splits.split, splits.eval_split, splits.eval_path
        if "{prompt}" not in template:
            raise ValueError(f"template must contain '{{prompt}}', got {template!r}")
        if answer_fields is not None and (
            not isinstance(answer_fields, (list, tuple)) or not all(isinstance(f, str) for f in answer_fields)
        ):
            raise ValueError(f"answer_fields must be a list of column names, got {answer_fields!r}")
        self.name, self.path, self.template = name, Path(path), template
        self.eval_fraction, self.max_completion_len = eval_fraction, fmt.max_completion_len
        self.prompt_field, self.answer_fields = prompt_field, list(answer_fields) if answer_fields else None
        src, train = self._load(self.path, split)
        pools = split_rows(
            splits,
            (src, train, split or "train"),
            lambda: self._load(Path(eval_path) if eval_path is not None else self.path, eval_split),
            str(self.path),
        )
        self._pools = {s: [self._problem(src_, s, *r) for r in rows] for s, (src_, rows) in pools.items()}

    def _load(self, path: Path, split: str | None):
        pf, af = self.prompt_field, self.answer_fields

        def wanted(columns: list[str]) -> list[str]:
            p = pf or next((k for k in _PROMPT_FIELDS + ("messages",) if k in columns), "")
            return [p] + (af if af is not None else list(columns))

        recs = read_records(path, split=split, columns=wanted)
        if pf is None:
            pf = next((k for k in _PROMPT_FIELDS + ("messages",) if k in recs.columns), None)
            if pf is None:
                raise ValueError(
                    f"{recs.where()}: no prompt {recs.noun} (tried {list(_PROMPT_FIELDS) + ['messages']}; "
                    f"{recs.noun}s present: {recs.columns}); pass task.params.prompt_field="
                )
            self.prompt_field = pf
        for fld in [pf] + (af or []):
            if recs.tabular and fld not in recs.columns:
                raise ValueError(f"{recs.where()}: missing column {fld!r} (columns present: {recs.columns})")
        rows = []
        for pos, rec in recs.rows:
            for fld in [pf] + (af or []):
                if fld not in rec:
                    raise ValueError(f"{recs.where(pos)}: missing field {fld!r} (fields present: {sorted(rec)})")
            value, conv = rec[pf], None
            if isinstance(value, (list, tuple)):
                conv = conversation(value, f"{recs.where(pos)}: {recs.noun} {pf!r}")
                value = conv[-1]["content"]
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"{recs.where(pos)}: {recs.noun} {pf!r} must be a non-empty string or a list of "
                    "{role, content} messages ending with the user's"
                )
            keep = af if af is not None else list(rec)
            fields = {k: rec[k] for k in dict.fromkeys([pf] + keep)}
            rows.append((pos, value, fields, conv))
        return recs.source, rows

    def _problem(self, src: str, split: str, pos: int, prompt: str, fields: dict, conv) -> Problem:
        answer = fields.get(self.answer_fields[0]) if self.answer_fields else None
        prompt = self.template.replace("{prompt}", prompt)
        meta = {"source": str(src), "line": pos, "split": split, "fields": fields}
        if conv is not None:  # the whole conversation, its question wrapped as a plain prompt is
            meta["messages"] = (*conv[:-1], {**conv[-1], "content": prompt})
        return Problem(prompt=prompt, answer=_hashable(answer), meta=meta)

    def __getstate__(self):  # the pool pickles the task once per batch: leave the data behind
        state = dict(self.__dict__)
        state["_pools"] = None
        return state

    def split_size(self, split: str) -> int:
        return len(self._split(split))

    def _split(self, split: str) -> list[Problem]:
        if self._pools is None:
            raise RuntimeError("this DataTask was unpickled without its data; it can score but not generate")
        if split not in self._pools:
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        return self._pools[split]

    def generate(self, split: str, n: int, seed: int) -> list[Problem]:
        """``n`` problems of ``split`` in a seeded order (as ``math:PATH``: train cycles through
        reshuffled passes, eval refuses more than it has)."""
        return draw_from_split(
            self._split(split),
            split,
            n,
            seed,
            where=f"{self.path}: the {split} split is empty (eval_fraction={self.eval_fraction})",
        )

    def score(self, problem: Problem, completion: str) -> float:
        raise ValueError("task 'data' has no verifier of its own; give one with --reward module.path:function")

    def parse_ok(self, completion: str) -> bool:
        return True

    def first_move(self, completion: str):
        return None

    def demonstration(self, problem: Problem, rng: random.Random | None = None) -> str:
        raise ValueError("task 'data' has no reference completions")


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return str(v)
