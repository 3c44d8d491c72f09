"""A grid's raw records, kept small: what ``gapo compare --report-only`` needs to rebuild its
report (each finished cell's ``metrics.jsonl``, ``config.yaml``, ``done.json`` and spec, each
regime's ``base_eval.json``), without checkpoints or logs, in one tar.xz archive.

    python -m gapo.experiments.raw_records pack RUNS_DIR ARCHIVE.tar.xz   # keep the raw records
    python -m gapo.experiments.raw_records unpack ARCHIVE.tar.xz DIR      # restore them, then
    gapo compare --config GRID.yaml --out DIR --report-only                # rebuilds the report
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

__all__ = ["pack", "unpack"]

_RAW = ("metrics.jsonl", "config.yaml", "done.json")


def pack(runs: str | Path, archive: str | Path) -> int:
    """Archive (tar.xz) the raw records of every finished cell under ``runs`` -- each run folder's
    ``metrics.jsonl``, ``config.yaml`` and ``done.json``, each cell's spec ``seed<k>.json`` and each
    regime's ``base_eval.json``: what the report needs, without checkpoints or logs. Returns the
    number of cells packed."""
    runs = Path(runs)
    if not runs.is_dir():
        raise ValueError(f"{str(runs)!r} is not a folder")
    Path(archive).parent.mkdir(parents=True, exist_ok=True)  # results/<grid>/ may not exist yet
    n = 0
    with tarfile.open(archive, "w:xz") as tar:
        for be in sorted(runs.glob("*/base_eval.json")):
            tar.add(be, arcname=str(be.relative_to(runs)))
        for done in sorted(runs.glob("*/*/seed*/done.json")):
            d = done.parent
            for f in _RAW:
                if (d / f).is_file():
                    tar.add(d / f, arcname=str((d / f).relative_to(runs)))
            spec = d.with_name(f"{d.name}.json")
            if spec.is_file():
                tar.add(spec, arcname=str(spec.relative_to(runs)))
            n += 1
    return n


def unpack(archive: str | Path, dest: str | Path) -> None:
    """Extract an archive of :func:`pack` into ``dest`` (refusing members that would land outside
    it); ``gapo compare --config ... --out dest --report-only`` then rebuilds the tables."""
    archive = Path(archive)
    if not archive.is_file():
        raise ValueError(f"archive {str(archive)!r} does not exist")
    with tarfile.open(archive, "r:*") as tar:
        tar.extractall(dest, filter="data")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gapo.experiments.raw_records", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="archive the raw records of a grid's finished cells")
    p.add_argument("runs")
    p.add_argument("archive")
    p = sub.add_parser("unpack", help="extract such an archive (then run gapo compare --report-only on it)")
    p.add_argument("archive")
    p.add_argument("dest")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "pack":
            print(f"{pack(a.runs, a.archive)} cells -> {a.archive}")
        else:
            unpack(a.archive, a.dest)
            print(f"extracted into {a.dest}")
    except (ValueError, OSError, tarfile.TarError) as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
