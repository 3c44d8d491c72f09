"""glibc's allocator, tuned for a CPU training step (``model.malloc_tuning``, on by default on CPU).

A CPU RL step allocates and frees the same activations every step: at the embedded policy's
size, tensors of 0.5–2 MB (a (960 × 512) float32 MLP activation is 1.9 MB). glibc serves
those with fresh ``mmap`` regions or returns the heap's top to the kernel as soon as it is freed
(its trim threshold follows the mmap threshold, 2 × ≈ 2 MB), so every step page-faults them in
again: 4–7 thousand minor faults and 4–30 ms of system time per 0.13 s step (BENCHMARKS.md,
section 9.4). Raising the two thresholds keeps that memory in the heap, where the next step
reuses it: ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's own upper bound for it on 64-bit) and
``M_TRIM_THRESHOLD`` to 64 MiB (at most that much free heap top is kept). Larger tensors (a
compute-bound model's logits) are still ``mmap``-ed and returned when freed.

This changes where memory comes from, never a value: the trainer's results are bit for bit the
same with and without it (tested). It is process-wide, so it is done once, by the trainer, and
only where the process runs on glibc; ``GAPO_MALLOC_TUNING=0`` or ``model.malloc_tuning: false``
leaves the allocator alone (the setting is then glibc's defaults, or the user's own
``MALLOC_*_`` environment variables, which glibc reads at start-up).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["tune_malloc", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 64 * 2**20
_done: bool | None = None


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl, macOS: no mallopt tuning)
        return libc
    except (OSError, AttributeError):
        return None


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds once per process; True if they are set (now or
    before), False where this is not glibc or ``GAPO_MALLOC_TUNING=0``."""
    global _done
    if _done is not None:
        return _done
    if os.environ.get("GAPO_MALLOC_TUNING", "1") == "0" or (libc := _libc()) is None:
        _done = False
        return False
    # mallopt returns 1 on success; a refused value leaves glibc's own behaviour in place
    _done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _done
