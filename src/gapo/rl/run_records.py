"""A finished (or running) run's records, read back: ``metrics.jsonl``'s training steps and
evaluations, and ``samples.jsonl`` (what the model was trained on), for ``gapo report``,
``gapo demo``'s summary and the grid's statistics. Reading writes nothing and takes no lock;
torch is not needed."""

from __future__ import annotations

import json
from pathlib import Path

from gapo.rl.run_dir import RunFolder

__all__ = ["load_run"]


def load_run(run_dir: str | Path) -> dict:
    """``{"name", "dir", "train": [records], "eval": [records], "samples": [records]}`` of one
    run folder (``samples``: ``samples.jsonl``, what the model was trained on; may be empty)."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        aside = RunFolder(run_dir).asides() if run_dir.parent.is_dir() else []
        hint = (
            f"; an interrupted --overwrite left the run it replaced at {str(aside[-1])!r}: `gapo train --out "
            f"{str(run_dir)} --resume` puts it back"
            if aside
            else ""
        )
        raise ValueError(f"{str(run_dir)!r} is not a gapo run folder (no metrics.jsonl){hint}")
    train, evals = [], []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e})") from e
        (evals if rec.get("kind") == "eval" else train).append(rec)
    samples = []
    sp = run_dir / "samples.jsonl"
    if sp.is_file():
        for line in sp.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:  # a run killed mid-write: the last line may be cut
                continue
    return {"name": run_dir.name, "dir": run_dir, "train": train, "eval": evals, "samples": samples}
