"""Rename the old per-c summary keys in stored reports to their metric keys, once.

    python benchmarks/migrate_summary_keys.py results            # migrate every report under results/
    python benchmarks/migrate_summary_keys.py results --check    # only say what would change

Reports written before the summaries kept the per-step metric keys verbatim named the per-c
aggregates apart (``gapo.experiments.stats.OLD_SUMMARY_KEYS``). For every report folder under the
given roots this rewrites, through that one map:

- ``summary.json`` and ``dose.json``: ``stats.migrate_keys`` (dictionary keys and claim rows'
  ``"key"``), written as the report writes JSON (``grid.write_json``);
- ``cells.csv``: the columns renamed and put in the order the report writes them (regime,
  method, seed, then the keys sorted), every cell's text unchanged;
- ``tables.md``: the key names where they appear as text (a figure's file name, e.g.
  ``clip_by_c.png``, stays).

Then it checks that no value changed: every JSON leaf and every CSV cell of the new file equals
the old file's under the renamed key (NaN equal to NaN), and tables.md keeps the same sequence
of numbers. A file without old names is left untouched. A file in an unexpected form stops the
run before anything is written.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from pathlib import Path

from gapo.experiments.grid import write_json
from gapo.experiments.stats import OLD_SUMMARY_KEYS, migrate_keys, renamed_key

OLD = re.compile(r"(?<![\w/])(" + "|".join(map(re.escape, OLD_SUMMARY_KEYS)) + r")(?=/\d+\b|\b)(?!\.png)(/\d+)?")
NEW = re.compile("(" + "|".join(map(re.escape, OLD_SUMMARY_KEYS.values())) + r")(/\d+)?")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _leaves(obj, path=()):
    """``(path, leaf)`` of a JSON value; a path step is a key, a list index, or ``("key", s)``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    else:
        yield path, obj


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _check_json(old, new, name: str) -> int:
    def key_of(path):  # the old path with each key renamed; a "key" field's value is renamed too
        return tuple(renamed_key(p) if isinstance(p, str) else p for p in path)

    want = {}
    for path, v in _leaves(old):
        want[key_of(path)] = renamed_key(v) if path and path[-1] == "key" and isinstance(v, str) else v
    got = dict(_leaves(new))
    if set(want) != set(got):
        raise SystemExit(f"{name}: the migrated file has other entries ({sorted(set(want) ^ set(got), key=str)[:3]})")
    bad = [p for p in want if not _same(want[p], got[p])]
    if bad:
        raise SystemExit(f"{name}: values changed at {bad[:3]}")
    return len(want)


def _json(path: Path, apply: bool) -> str | None:
    text = path.read_text()
    old = json.loads(text)
    new = migrate_keys(old)
    if json.dumps(new) == json.dumps(old):
        return None
    if json.dumps(old, indent=1, default=str) != text:
        raise SystemExit(f"{path}: not in the report's JSON form; migrate it by hand")
    n = _check_json(old, new, str(path))
    if apply:
        write_json(path, new)
    return f"{path}: {n} values, the same under the new keys"


def _csv(path: Path, apply: bool) -> str | None:
    text = path.read_text()
    rows = list(csv.reader(io.StringIO(text)))
    head, body = rows[0], rows[1:]
    if head[:3] != ["regime", "method", "seed"]:
        raise SystemExit(f"{path}: not a grid report's cells.csv (header {head[:3]})")
    new_head = [renamed_key(k) for k in head]
    if new_head == head:
        return None
    if len(set(new_head)) != len(new_head):
        raise SystemExit(f"{path}: renaming would merge columns")
    order = head[:3] + sorted(new_head[3:])
    idx = [new_head.index(k) for k in order]
    out = io.StringIO(newline="")
    w = csv.writer(out, lineterminator="\r\n" if "\r\n" in text else "\n")
    w.writerow(order)
    for r in body:
        w.writerow([r[i] for i in idx])
    check = list(csv.DictReader(io.StringIO(out.getvalue())))
    for a, b in zip(body, check, strict=True):
        if {nk: v for nk, v in zip(new_head, a)} != b:
            raise SystemExit(f"{path}: a row changed: {a[:3]}")
    if apply:
        path.write_text(out.getvalue())
    return f"{path}: {len(body)} rows x {len(head)} columns, every cell the same"


def _md(path: Path, apply: bool) -> str | None:
    text = path.read_text()
    new = OLD.sub(lambda m: renamed_key(m.group(0)), text)
    if new == text:
        return None

    # with every key name taken out (old and new), the two texts are the same, number for number
    def bare(t):
        return NEW.sub("", OLD.sub("", t))

    if bare(text) != bare(new):
        raise SystemExit(f"{path}: more than the key names changed")
    n = len(NUMBER.findall(bare(text)))
    if apply:
        path.write_text(new)
    return f"{path}: {len(OLD.findall(text))} key names renamed, the rest of the text ({n} numbers) the same"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="only say what would change")
    args = ap.parse_args(argv)
    handlers = {"summary.json": _json, "dose.json": _json, "per_problem.json": _json, "cells.csv": _csv}
    files = sorted(p for r in args.roots for p in r.rglob("*") if p.name in handlers or p.name == "tables.md")
    for apply in (False,) if args.check else (False, True):  # every file is checked before any is written
        for p in files:
            msg = (_md if p.name == "tables.md" else handlers[p.name])(p, apply)
            if msg and (apply or args.check):
                print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
