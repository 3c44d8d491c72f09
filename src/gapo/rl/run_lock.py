"""One writer per folder: an exclusive ``flock`` on ``<folder>/.gapo-lock`` (design §5.2 rule 2).

The lock file is inside the folder it locks, so the lock belongs to the folder itself (its inode),
not to one of its names: the same folder reached by a second path (a symlinked parent, a bind
mount, a second mount of a network share, a folder renamed while it is held) meets the same lock,
and a read-only parent does not stop a writable folder from being locked. It is a file rather
than the folder's own descriptor because NFS emulates ``flock`` with byte-range locks, which need
a file open for writing.

``flock`` locks are per open file and dropped by the kernel when the holder dies, so the lock file
of a killed process is simply unlocked and the next :meth:`RunLock.acquire` takes it. The holder
deletes the file when it lets go; a process that locked the file just before it was deleted (or
just before its folder was moved) sees that the path no longer names its file and starts again,
so only one process can hold the lock of a folder at a time. The file carries the holder's PID,
start time and arguments, for the error of a second writer (:class:`RunLocked`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["RunLock", "RunLocked", "LOCK_NAME"]

LOCK_NAME = ".gapo-lock"


class RunLocked(ValueError):
    """Another process holds the folder's lock (it is writing the run)."""


class RunLock:
    """The lock of ``folder``: ``<folder>/.gapo-lock``. ``name`` is the path its errors show (the
    run's own path, for the lock of a run that ``--overwrite`` moved aside); ``what`` says what the
    folder is ("run folder", "grid folder")."""

    def __init__(self, folder: str | Path, what: str = "run folder", *, name: str | Path | None = None):
        self.folder, self.what = Path(folder), what
        self.name = Path(name) if name is not None else self.folder
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    @property
    def held(self) -> bool:
        return self._fd is not None

    def moved(self, folder: str | Path) -> None:
        """Its holder renamed the locked folder to ``folder`` (the lock went along with it)."""
        self.folder = Path(folder)

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunLocked` naming the holder. The folder must exist."""
        if self._fd is not None:
            return
        for _ in range(100):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunLocked(self._busy(holder)) from None
            except OSError as e:
                os.close(fd)
                raise OSError(e.errno, f"cannot lock {self.what} {str(self.name)!r}: {e.strerror or e}") from None
            if not self._names(fd):  # its holder deleted or moved it as it let go: try the one there now
                os.close(fd)
                continue
            record = {"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv[:8]}
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(record) + "\n").encode())
            self._fd = fd
            return
        raise OSError(errno.EAGAIN, f"cannot lock {self.what} {str(self.name)!r}: {str(self.path)!r} keeps changing")

    def _open(self) -> int:
        try:
            # not through a symlink planted at the lock's name; not inherited by exec'd children
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            why = "it does not exist" if e.errno == errno.ENOENT and not self.folder.exists() else None
            raise OSError(
                e.errno,
                f"cannot lock {self.what} {str(self.name)!r}: "
                + (why or f"cannot create {str(self.path)!r}: {e.strerror or e}"),
            ) from None

    def _names(self, fd: int) -> bool:
        """Whether the lock's path still names the file open as ``fd``."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False

    def _busy(self, holder: dict) -> str:
        pid = holder.get("pid")
        who = f"pid {pid}" if pid else "a process that has not written its pid yet"
        if isinstance(pid, int) and not _alive(pid):  # the lock is inherited by a child that outlived it
            who = f"a child process of pid {pid} (which has exited)"
        since = f", since {holder['since']}" if holder.get("since") else ""
        args = f", {' '.join(map(str, holder['argv']))!r}" if isinstance(holder.get("argv"), list) else ""
        return (
            f"{self.what} {str(self.name)!r} is in use by another gapo process ({who}{since}{args}; lock file "
            f"{str(self.path)!r}). Two writers would corrupt it: wait for that process to finish or stop it"
            + (f" (kill {pid})" if pid else "")
            + ", or choose another folder"
        )

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:  # delete the file only while it is still ours (see the module docstring)
            if self._names(fd):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()


def _holder(fd: int) -> dict:
    """The holder's record in the lock file; it writes it right after locking, so wait briefly."""
    for _ in range(50):
        try:
            data = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "null")
            if isinstance(data, dict):
                return data
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
