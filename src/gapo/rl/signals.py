"""Ctrl-C and SIGTERM during training: finish the step, checkpoint, stop (docs/design.md §5.3)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

__all__ = ["stop_on_signals"]


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], None]):
    """SIGINT/SIGTERM call ``request_stop`` (the training loop then finishes its step, saves a
    checkpoint and returns); a second signal gives up at once. Only the main thread can install
    handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    seen = []

    def on_signal(signum, frame):
        if seen:
            signal.signal(signum, old[signum])
            raise KeyboardInterrupt
        seen.append(signum)
        request_stop()

    for s in old:
        signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
