"""Free space on a run's filesystem, for the errors of a full disk (docs/design.md §5.2, rule 8)."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["space_note", "free_bytes", "mb"]


def mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB" if n < 2**30 else f"{n / 2**30:.2f} GB"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem of ``path`` (or of its nearest existing ancestor)."""
    for a in (path, *path.parents):
        if a.exists():
            try:
                du = shutil.disk_usage(a)
            except OSError:
                return None
            return du.free if du.total else None  # a pseudo filesystem (/proc): unknown
    return None


def space_note(folder: Path, need: int) -> str:
    """'a checkpoint needs about N MB; M MB free in FOLDER' (for the errors of a full disk)."""
    free = free_bytes(Path(folder))
    return (
        f"a checkpoint needs about {mb(need)}; {mb(free) if free is not None else 'an unknown amount'} "
        f"free in {str(folder)!r}"
    )
