"""Run folders: what gapo writes, and the rules that keep a user's run from being lost.

A run folder holds ``.gapo-run`` (the marker), ``config.yaml`` (the run's configuration, kept
current), ``metrics.jsonl`` (one JSON record a line), ``checkpoint.pt`` (which also carries the
configuration it was trained with), ``policy/`` (the final policy) and ``events.jsonl``
(configuration changes made on resume). The rules:

- **One writer.** A run folder is written by one process at a time: an exclusive ``flock`` on
  ``<folder>/.gapo-lock`` (:mod:`gapo.rl.run_lock`), held for the run's whole life. It is the lock
  of the folder itself, so every path to the folder meets it. An existing folder is locked when it
  is checked, before anything of it is read; a folder that does not exist yet is made when the run
  opens it, after validation (``mkdir``: of two creators one makes it), then locked and checked
  again under the lock.
- **Nothing inside another run.** A run folder (or an export, or a grid folder) inside a gapo run,
  at any depth, is refused: ``--overwrite`` of the outer run would take it along.
- Nothing is written before the whole run has validated (config, model, data, task, device,
  reward function, free space for a checkpoint): :meth:`RunFolder.check` only reads (the lock
  file and the restore of an interrupted ``--overwrite``, below, aside).
- ``--overwrite`` only replaces a folder that is a gapo run (marker, or the ``config.yaml`` +
  ``metrics.jsonl`` of runs made before the marker existed). The new run's folder is made and
  locked beside it (``.<name>.new-<pid>-<ns>``) first; then the old run is moved aside to
  ``.<name>.replaced-<pid>-<ns>`` (the name is printed), still locked by this process, and the new
  folder renamed into place. The old run is deleted only once the new run's first
  checkpoint is on disk (with ``train.checkpoint_every=0`` that is the checkpoint at the end, or
  at a stop by signal); if the new run fails before that, the old run is put back. If the process
  is killed in between, the next command that checks this folder (``gapo train`` in any mode, a
  grid cell) puts the old run back, or, if the new run had checkpointed, deletes the leftover.
- A symlinked ``--out`` is resolved: the run goes where the link points, and the link stays. A
  symlink (at ``--out`` or above it) whose target does not exist is an error before any work.
- Every file gapo replaces is written to a temporary file and renamed into place, and a failed
  write (full disk, read-only folder) removes the temporary file and raises one clear error; a
  checkpoint's error names the folder, the space a checkpoint needs and the space that is free.
- On resume, the requested config is compared with the one in the checkpoint (not with
  ``config.yaml``, which a user may have edited: an edit is a change like an override), a partial
  last line of ``metrics.jsonl`` (a run killed while writing) is dropped, and records after the
  checkpoint are dropped too: those steps are redone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

# torch is imported where a checkpoint is read or written, not here: a resumed run's config is
# read and checked before torch loads (a config error costs well under a second of CPU)
from gapo.rl.config import Config, diff, from_dict, to_dict
from gapo.rl.run_lock import LOCK_NAME, RunLock, RunLocked
from gapo.tasks.custom import absolute_spec

__all__ = [
    "RunFolder",
    "require_run",
    "RunExists",
    "MARKER",
    "refuse_inside_run",
    "atomic_write",
    "resume_changes",
    "trained_config",
    "Trackers",
    "load_run",
    "RESUME_FIXED",
    "stop_on_signals",
    "checkpoint_bytes",
    "space_note",
]

# Keys a resumed run cannot take a new value for: they define its data, its model and its random
# streams (restored from the checkpoint), so a new value would be silently ignored.
RESUME_FIXED = ("task.", "model.path", "model.base_preset", "train.seed")

MARKER = ".gapo-run"
WANDB_ID = "wandb_id.txt"  # the run's W&B id, so that a resumed run continues it (Trackers)
ASIDE_TAG = ".replaced-"  # .<name>.replaced-<pid>-<ns>: a run that --overwrite moved aside
NEW_TAG = ".new-"  # .<name>.new-<pid>-<ns>: the folder of an --overwrite's new run, before it is in place
TRASH_TAG = ".discarded-"  # .<name>.discarded-<pid>-<ns>: a replaced run being deleted


class RunExists(ValueError):
    """The run folder exists and neither ``--resume`` nor ``--overwrite`` was given."""


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB" if n < 2**30 else f"{n / 2**30:.2f} GB"


def _free_bytes(path: Path) -> int | None:
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
    free = _free_bytes(Path(folder))
    return (
        f"a checkpoint needs about {_mb(need)}; {_mb(free) if free is not None else 'an unknown amount'} "
        f"free in {str(folder)!r}"
    )


def checkpoint_bytes(model_state: dict, trainable: list) -> int:
    """The size of a checkpoint, estimated: the saved weights at their dtype, plus AdamW's two
    moments (float32, like the trained weights) per trainable parameter, plus 5% and 1 MB for
    the RNG states, the data order and pickling."""
    import torch

    weights = sum(t.numel() * t.element_size() for t in model_state.values() if isinstance(t, torch.Tensor))
    moments = sum(2 * p.numel() * 4 for p in trainable)
    return int((weights + moments) * 1.05) + 2**20


def _resolve_out(given: Path) -> Path:
    """``given`` with every symlink resolved (the run goes where a link points); a symlink at or
    above it whose target does not exist is an error."""
    p = Path(os.path.abspath(given))
    for a in (p, *p.parents):
        if os.path.islink(a) and not os.path.exists(a):
            raise ValueError(
                f"run folder {str(given)!r}: {str(a)!r} is a symlink to {os.readlink(a)!r}, which does "
                "not exist; create its target or choose another --out"
            )
    return Path(os.path.realpath(p))


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` then rename onto ``path``; on failure no temporary file is left and
    the error names the file and the cause (e.g. no space left on the device)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(
                e.errno, f"cannot write {str(path)!r}: {e.strerror or e}; the previous version (if any) is intact"
            ) from e
        raise


def _is_run_at(p: Path) -> bool:
    return (p / MARKER).is_file() or ((p / "config.yaml").is_file() and (p / "metrics.jsonl").is_file())


def refuse_inside_run(path: str | Path, what: str) -> None:
    """A ``ValueError`` if ``path`` (resolved through symlinks; it need not exist) lies inside a gapo
    run folder, at any depth: an ``--overwrite`` of that run would move it aside and delete it with
    the run, and a second run's files would mix with the first's. ``what`` names ``path`` ("--out")."""
    p = Path(os.path.realpath(path))
    run = next((a for a in p.parents if _is_run_at(a)), None)
    if run is not None:
        via = f" (which is {str(p)!r})" if str(p) != os.path.abspath(path) else ""
        raise ValueError(
            f"{what} {str(path)!r}{via} is inside the gapo run folder {str(run)!r}: nothing is written inside a "
            "run folder (an --overwrite of that run would delete it along with the run). Choose a folder "
            "outside any run"
        )


def require_run(path: str | Path) -> RunFolder:
    """The :class:`RunFolder` at ``path``, or a ``ValueError`` saying it is missing or not a gapo
    run (torch-free, so ``gapo export``/``eval`` name a wrong folder before torch loads)."""
    folder = RunFolder(path)
    if not folder.path.is_dir():
        raise ValueError(f"{str(folder.path)!r}: no such run folder")
    if not folder.is_run():
        raise ValueError(
            f"{str(folder.path)!r} is not a gapo run folder (no .gapo-run, nor config.yaml + metrics.jsonl); "
            "give the --out folder of a gapo train run"
        )
    return folder


class RunFolder:
    """One run folder: read-only checks first, writes only after :meth:`open`."""

    def __init__(self, path: str | Path):
        self.given = Path(path)
        self.path = _resolve_out(self.given)
        self.metrics = self.path / "metrics.jsonl"
        self.checkpoint = self.path / "checkpoint.pt"
        self.config = self.path / "config.yaml"
        self.lock = RunLock(self.path)
        self._aside: Path | None = None  # the run being replaced, until the new one is settled
        self._aside_lock: RunLock | None = None  # its lock, which this process keeps until then
        self._released_sig = None

    # ------------------------------------------------------------------ the lock
    def release(self) -> None:
        """Let go of the lock, and of a replaced run's (remembering the folder's state, see
        :meth:`reacquire`)."""
        if self.lock.held:
            self._released_sig = self._signature()
            self.lock.release()
        if self._aside_lock is not None:
            self._aside_lock.release()

    def reacquire(self) -> None:
        """Take the lock again for an object that let go of it; an error if another process wrote
        the run meanwhile (this object's state would be stale)."""
        if self.lock.held:
            return
        self.lock.acquire()
        if self._released_sig is not None and self._signature() != self._released_sig:
            self.lock.release()
            raise ValueError(
                f"run folder {str(self.path)!r} was written by another process since this trainer "
                "let go of it; start a new one with resume=True"
            )

    def _signature(self):
        out = []
        for f in (self.checkpoint, self.metrics):
            try:
                st = f.stat()
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return out

    def asides(self, tag: str = ASIDE_TAG) -> list[Path]:
        """Runs that an ``--overwrite`` of this folder moved aside and that are still there, oldest
        first (with ``tag=TRASH_TAG``: replaced runs whose deletion was cut short)."""
        parent, prefix = self.path.parent, f".{self.path.name}{tag}"
        try:
            found = [q for q in parent.iterdir() if q.name.startswith(prefix) and q.is_dir()]
        except OSError:
            return []

        def ns(q: Path) -> int:
            tail = q.name[len(prefix) :].rsplit("-", 1)[-1]
            return int(tail) if tail.isdigit() else 0

        return sorted(found, key=ns)

    def _recover(self) -> None:
        """Finish an ``--overwrite`` that a killed process left half done, holding the folder's lock
        (or, where there is no folder, the lock of the run to put back; a live ``--overwrite`` holds
        it, and is named). If the new run had written a checkpoint, it had settled: the old run's
        leftover goes; otherwise the old run is put back (the new run, which has no checkpoint,
        cannot be resumed anyway)."""
        asides = self.asides()
        locks = self._lock_asides(asides)
        for q in self.asides(TRASH_TAG) + self.asides(NEW_TAG):  # a cut-short deletion; a folder never put in place
            self._discard(q)
        if not asides:
            return
        p, say = self.path, lambda m: print(f"[gapo] {m}", file=sys.stderr, flush=True)
        if self.checkpoint.is_file() or (p / "policy").is_dir():
            for a, lock in zip(asides, locks):
                self._discard(a, lock)
            say(
                f"{str(p)!r}: removed {', '.join(repr(str(a)) for a in asides)}, the run that an --overwrite "
                "replaced (the new run had written its first checkpoint)"
            )
            return
        *older, last = asides
        if p.exists() and not self.is_empty() and not self.is_run():
            for lock in locks:
                lock.release()
            raise ValueError(
                f"{str(p)!r} holds files that are not a gapo run, and the run an interrupted --overwrite "
                f"moved aside is at {str(last)!r}; to restore it: mv {str(last)!r} {str(p)!r}"
            )
        if p.exists():
            self._discard(p, self.lock)
        os.rename(last, p)
        locks[-1].moved(p)
        self.lock = locks[-1]
        for a, lock in zip(older, locks):
            self._discard(a, lock)
        say(
            f"{str(p)!r}: an --overwrite was interrupted before its new run's first checkpoint; the run it "
            f"replaced is back in place (it had been moved to {str(last)!r})"
        )

    def _lock_asides(self, asides: list[Path]) -> list[RunLock]:
        """The locks of ``asides`` (runs an ``--overwrite`` moved aside), all taken, or none."""
        locks: list[RunLock] = []
        try:
            for a in asides:
                locks.append(RunLock(a, name=self.path))
                locks[-1].acquire()
        except BaseException:
            for lock in locks:
                lock.release()
            raise
        return locks

    def _discard(self, q: Path, lock: RunLock | None = None) -> None:
        """Delete ``q`` (a replaced run, or a leftover of an ``--overwrite``) under its lock: ``lock``
        (this process's), else taken here (a folder that a live process holds is left alone). It is
        renamed first to a name that marks it as garbage, so that a kill during the deletion leaves
        nothing that :meth:`_recover` could put back."""
        if lock is None:
            lock = RunLock(q, name=self.path)
            try:
                lock.acquire()
            except (RunLocked, OSError):
                return
        trash = q
        if TRASH_TAG not in q.name:
            trash = q.with_name(f".{self.path.name}{TRASH_TAG}{os.getpid()}-{time.time_ns()}")
            try:
                os.rename(q, trash)
                lock.moved(trash)
            except OSError:
                trash = q
        shutil.rmtree(trash, ignore_errors=True)
        lock.release()

    # ------------------------------------------------------------------ read-only
    def is_run(self) -> bool:
        return _is_run_at(self.path)

    def is_empty(self) -> bool:
        """No folder, or one that holds nothing but a lock file."""
        p = self.path
        return not p.exists() or (p.is_dir() and all(q.name == LOCK_NAME for q in p.iterdir()))

    def check(self, *, resume: bool, overwrite: bool) -> None:
        """Raise a clear ``ValueError`` if this folder may not be used as asked.

        An existing folder (or one with a run moved aside) is locked first, so that what is read
        here stays true; the lock is kept. Writes no user data: only the lock file, and the restore
        of an ``--overwrite`` that a killed process left half done (:meth:`_recover`)."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise ValueError(f"run folder {str(p)!r} is a file, not a folder; choose another --out")
        if not p.exists():
            parent = next((a for a in p.absolute().parents if a.exists()), None)
            if parent is not None and not parent.is_dir():
                raise ValueError(f"run folder {str(p)!r}: {str(parent)!r} is a file, not a folder")
        refuse_inside_run(p, "run folder")
        if not self.lock.held and p.is_dir():
            self.lock.acquire()
        self._recover()
        if resume:
            if not p.exists():
                raise ValueError(f"cannot resume: there is no run folder at {str(p)!r}")
            if not self.is_run():
                raise ValueError(
                    f"cannot resume: {str(p)!r} is not a gapo run folder (no {MARKER} or config.yaml + metrics.jsonl)"
                )
            if not self.checkpoint.is_file():
                raise ValueError(f"cannot resume: no checkpoint at {str(self.checkpoint)!r}")
            return
        if not self.is_empty():
            if not overwrite:
                raise RunExists(
                    f"run folder {str(p)!r} exists; pass --resume to continue it or --overwrite to replace it"
                )
            if not self.is_run():
                raise ValueError(
                    f"refusing to overwrite {str(p)!r}: it is not empty and not a gapo run folder "
                    f"(no {MARKER}); choose another --out or empty it yourself"
                )
        self._check_writable()

    def _check_writable(self) -> None:
        """The folder in which a new run's folder is made (the parent, or the nearest existing one)
        must be writable; an existing folder is, since its lock file was made in it."""
        p = self.path
        if p.is_dir() and self.is_empty():
            return
        where = next((a for a in (p.parent, *p.parent.parents) if a.exists()), None)
        if where is None or os.access(where, os.W_OK | os.X_OK):
            return
        try:
            why = "a read-only file system" if os.statvfs(where).f_flag & os.ST_RDONLY else "permission denied"
        except OSError:
            why = "permission denied"
        raise ValueError(
            f"cannot {'replace' if p.is_dir() else 'create'} run folder {str(p)!r}: {str(where)!r} is not "
            f"writable ({why}); choose another --out"
        )

    def saved_config(self, *, fallback: bool = True) -> dict:
        """The run's own ``config.yaml`` as a dict. A missing or unreadable one falls back to the
        config inside the checkpoint (with a note; not with ``fallback=False``); without that, a
        clear error."""
        try:
            data = yaml.safe_load(self.config.read_text(encoding="utf-8"))
            problem = None if isinstance(data, dict) else "is not a gapo config"
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            problem = f"is unreadable ({e})"
        if problem is None:
            return data
        ck = self._checkpoint_config() if fallback else None
        if ck is None:
            raise ValueError(f"cannot resume: {str(self.config)!r} {problem}")
        print(
            f"[gapo] note: {str(self.config)!r} {problem}; using the config inside {str(self.checkpoint)!r}",
            file=sys.stderr,
        )
        return ck

    def _checkpoint_config(self) -> dict | None:
        if not self.checkpoint.is_file():
            return None
        try:
            import torch

            ck = torch.load(self.checkpoint, map_location="cpu", weights_only=False).get("config")
        except Exception:  # noqa: BLE001 - a truncated checkpoint is reported by load_checkpoint
            return None
        return ck if isinstance(ck, dict) else None

    def load_checkpoint(self, map_location) -> dict:
        """The checkpoint's state dict; a truncated or foreign file is a clear error."""
        import torch

        try:
            state = torch.load(self.checkpoint, map_location=map_location, weights_only=False)
        except Exception as e:  # zip/pickle errors of a truncated or foreign file
            raise ValueError(
                f"cannot resume: checkpoint {str(self.checkpoint)!r} is unreadable "
                f"({type(e).__name__}: {e}); it may be truncated. Start over with --overwrite "
                "or restore the file"
            ) from None
        need = {"step", "pos", "order", "model", "opt", "sched", "py_rng", "gen", "torch_rng"}
        if not isinstance(state, dict) or not need <= set(state):
            missing = sorted(need - set(state)) if isinstance(state, dict) else sorted(need)
            raise ValueError(f"cannot resume: {str(self.checkpoint)!r} is not a gapo checkpoint (missing {missing})")
        return state

    def records_up_to(self, step: int, name: str = "metrics.jsonl") -> list[str]:
        """The lines of ``name`` (a JSONL log) with ``step <= step``; a partial last line (the run
        was killed while writing it) is dropped, a corrupt line elsewhere is an error."""
        path = self.path / name
        if not path.is_file():
            return []
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        keep = []
        for i, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError:
                if i == len(lines):  # no newline after it: the write was cut off
                    continue
                raise ValueError(f"cannot resume: {str(path)}:{i} is not JSON; fix or delete that line") from None
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
                keep.append(ln)
        return keep

    # ------------------------------------------------------------------ writes
    def check_space(self, need: int) -> None:
        """An ``OSError`` (ENOSPC) before anything is written if the folder's filesystem has less
        free space than one checkpoint of ``need`` bytes (an ``--overwrite`` keeps the old run
        until then, and a checkpoint is written beside the previous one, then renamed)."""
        free = _free_bytes(self.path)
        if free is not None and free < need:
            raise OSError(
                errno.ENOSPC,
                f"not enough free space for run folder {str(self.path)!r}: a checkpoint needs "
                f"about {_mb(need)}, {_mb(free)} are free there. Free some space or choose "
                "another --out; nothing was changed",
            )

    def open(self, *, overwrite: bool) -> None:
        """Create the folder (an old run, when overwriting, is replaced by :meth:`_replace`) and write
        the marker. A folder that did not exist at :meth:`check` is made here, then locked and
        checked again under the lock (another process may have made it in between)."""
        p = self.path
        if not self.lock.held:
            self._create(overwrite)
        try:
            if overwrite and not self.is_empty():
                self._replace()
            self.write_text(MARKER, json.dumps({"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        except OSError as e:
            self.abort()
            raise OSError(e.errno, f"cannot create the run folder {str(p)!r}: {e.strerror or e}") from None

    def _create(self, overwrite: bool) -> None:
        """``mkdir`` (of two processes one makes the folder), then :meth:`check` under its lock."""
        p = self.path
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.mkdir()
        except FileExistsError:
            pass  # made since check(): checked below, under its lock, like any existing folder
        except OSError as e:
            raise OSError(e.errno, f"cannot create the run folder {str(p)!r}: {e.strerror or e}") from None
        self.check(resume=False, overwrite=overwrite)

    def _replace(self) -> None:
        """Holding the old run's lock: make and lock the new run's folder beside it, move the old run
        aside (its lock goes along and stays this process's until :meth:`settle` deletes it or
        :meth:`abort` puts it back), then rename the new folder into place. The name is free only
        between the two renames, and a process that checks it then finds the run moved aside locked."""
        p, stamp = self.path, f"{os.getpid()}-{time.time_ns()}"
        new, aside = p.with_name(f".{p.name}{NEW_TAG}{stamp}"), p.with_name(f".{p.name}{ASIDE_TAG}{stamp}")
        new.mkdir()
        new_lock = RunLock(new, name=p)
        try:
            new_lock.acquire()
            os.rename(p, aside)
        except BaseException:
            self._discard(new, new_lock)
            raise
        self.lock.moved(aside)
        self._aside, self._aside_lock = aside, self.lock
        try:
            os.rename(new, p)  # fails if another process made a folder at p in between, and wrote in it
        except OSError:
            self._discard(new, new_lock)
            self.lock, self._aside, self._aside_lock = self._aside_lock, None, None
            raise OSError(
                errno.EEXIST,
                f"another process made a new folder at {str(p)!r} while the old run was being moved aside; the "
                f"old run is at {str(aside)!r} (the next `gapo train --out {str(p)}` puts it back)",
            ) from None
        new_lock.moved(p)
        self.lock = new_lock
        print(
            f"[gapo] --overwrite: the old run is kept at {str(aside)!r} until the new run's first checkpoint "
            f"is written. If this process is killed before then, the next `gapo train --out {str(p)}` puts "
            f"it back (by hand: rm -r {str(p)!r} && mv {str(aside)!r} {str(p)!r})",
            file=sys.stderr,
            flush=True,
        )

    def settle(self) -> None:
        """The new run's first checkpoint is on disk: delete the run it replaces (:meth:`_discard`)."""
        if self._aside is not None:
            aside, lock = self._aside, self._aside_lock
            self._aside = self._aside_lock = None
            self._discard(aside, lock)

    def save_checkpoint(self, state: dict, need: int) -> None:
        """``state`` to ``checkpoint.pt``, atomically and synced; then the replaced run (if any)
        is deleted. A failed write (a full disk: torch reports it as a ``RuntimeError`` of its zip
        writer, or an ``OSError``) is one ``OSError`` naming the folder, the space a checkpoint
        needs (``need`` bytes) and the space free; the previous checkpoint is intact."""
        import torch

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        try:
            atomic_write(self.checkpoint, write)
        except (OSError, RuntimeError) as e:
            cause = e.__cause__ if isinstance(e, OSError) and e.__cause__ is not None else e
            free = _free_bytes(self.path)
            full = getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or (
                free is not None and free < need
            )
            why = (
                os.strerror(errno.ENOSPC)
                if full
                else (
                    cause.strerror
                    if isinstance(cause, OSError) and cause.strerror
                    else f"{type(cause).__name__}: {cause}"
                )
            )
            then = "free some space, then" if full else "once that is fixed,"
            after = (
                f"the previous checkpoint is intact: {then} continue with --resume"
                if self.checkpoint.is_file()
                else f"there is no earlier checkpoint: {then} start the run again"
            )
            raise OSError(
                errno.ENOSPC if full else getattr(cause, "errno", None) or errno.EIO,
                f"cannot write the checkpoint {str(self.checkpoint)!r}: {why}; {space_note(self.path, need)}; " + after,
            ) from None
        with contextlib.suppress(OSError):  # the rename itself survives a power cut
            dfd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self.settle()

    def abort(self) -> None:
        """The new run failed before it settled: put the replaced run back. The new folder is renamed
        away first, so the name is free only between two renames, with both runs still locked."""
        if self._aside is None:
            return
        p, aside, old_lock = self.path, self._aside, self._aside_lock
        trash = p.with_name(f".{p.name}{TRASH_TAG}{os.getpid()}-{time.time_ns()}")
        os.rename(p, trash)
        self.lock.moved(trash)
        os.rename(aside, p)
        old_lock.moved(p)
        new_lock, self.lock, self._aside, self._aside_lock = self.lock, old_lock, None, None
        shutil.rmtree(trash, ignore_errors=True)
        new_lock.release()

    def write_text(self, name: str, text: str) -> None:
        atomic_write(self.path / name, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def write_config(self, cfg_dict: dict) -> None:
        self.write_text("config.yaml", yaml.safe_dump(cfg_dict, sort_keys=False))

    def truncate_logs(self, step: int) -> None:
        """On resume: keep the records of steps up to the checkpoint's, in every JSONL log."""
        for name in ("metrics.jsonl", "samples.jsonl"):
            if (self.path / name).is_file():
                self.write_text(name, "".join(ln + "\n" for ln in self.records_up_to(step, name)))

    def append_metrics(self, record: dict) -> None:
        """One JSON line; tensors become numbers or lists, non-finite floats strings ("nan")."""
        self._append("metrics.jsonl", [record])

    def append_samples(self, records: list[dict]) -> None:
        """What the model was trained on (``log.samples`` rows per step)."""
        if records:
            self._append("samples.jsonl", records)

    def _append(self, name: str, records: list[dict]) -> None:
        text = "".join(json.dumps({k: _jsonable(v) for k, v in r.items()}) + "\n" for r in records)
        try:
            with open(self.path / name, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise OSError(e.errno, f"cannot append to {str(self.path / name)!r}: {e.strerror or e}") from None

    def log_event(self, event: dict) -> None:
        """Append to ``events.jsonl`` (e.g. the keys a resume changed)."""
        try:
            with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(event, default=str) + "\n")
        except OSError as e:
            raise OSError(e.errno, f"cannot append to {str(self.path / 'events.jsonl')!r}: {e.strerror or e}") from None


def _jsonable(v):
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is loaded
    if torch is not None and isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _normalised(data: dict, where: str) -> dict:
    try:  # keys added since the run was made compare at their defaults
        cfg = from_dict(data, migrate=True)
        # reward specs as Config.validate records them (a run made before it did keeps my_rewards:fn)
        cfg.reward.funcs = [absolute_spec(s) for s in cfg.reward.funcs]
        return to_dict(cfg)
    except ValueError as e:
        raise ValueError(f"cannot resume: {where}: {e}") from None


def trained_config(folder: RunFolder, state: dict | None) -> tuple[dict | None, dict[str, tuple]]:
    """The config the run was trained with, the one inside its checkpoint ``state`` (normalised:
    keys added since compare at their defaults; None for a checkpoint made before checkpoints
    carried it), and the keys in which the run's ``config.yaml`` differs from it (a hand edit),
    ``key -> (checkpoint's, config.yaml's)``; none when config.yaml is missing or unreadable (the
    checkpoint's config is the reference anyway)."""
    ck = state.get("config") if isinstance(state, dict) else None
    if not isinstance(ck, dict):
        return None, {}
    saved = _normalised(ck, f"the config inside {str(folder.checkpoint)!r}")
    try:
        on_disk = _normalised(folder.saved_config(fallback=False), repr(str(folder.config)))
    except ValueError:
        return saved, {}
    return saved, diff(saved, on_disk)


def resume_changes(
    folder: RunFolder, cfg: Config, *, allow_change: bool, state: dict | None = None
) -> dict[str, tuple]:
    """The keys in which ``cfg`` differs from the config the run was trained with, ``key -> (old, new)``.

    That config is the one inside the checkpoint (``state["config"]``), so a hand-edited
    ``config.yaml`` (the base of a resumed run's config) shows up here like an override; a
    checkpoint made before checkpoints carried their config falls back to ``config.yaml``, with a
    note. A key in ``RESUME_FIXED`` is always an error; any other difference is an error unless
    ``allow_change`` (the caller then applies and logs it)."""
    saved, edits = trained_config(folder, state)
    edited = set(edits)
    if saved is None:
        if state is not None:
            print(
                f"[gapo] note: {str(folder.checkpoint)!r} does not carry its config (made by an older gapo); "
                f"comparing with {str(folder.config)!r} instead",
                file=sys.stderr,
            )
        saved, edited = _normalised(folder.saved_config(), repr(str(folder.config))), set()
    changes = diff(saved, to_dict(cfg))
    by_hand = [k for k in changes if k in edited]
    hand_note = (
        (
            f" ({', '.join(by_hand)}: {str(folder.config)!r} says so, but the checkpoint was trained with the "
            "'run' value; config.yaml was edited after the run started)"
        )
        if by_hand
        else ""
    )
    fixed = [k for k in changes if k.startswith(RESUME_FIXED)]
    if fixed:
        raise ValueError(
            f"cannot resume {str(folder.path)!r} with a different "
            + ", ".join(f"{k} (run: {changes[k][0]!r}, now: {changes[k][1]!r})" for k in fixed)
            + hand_note
            + ": these define the run's data, model and random streams. Start a new run instead"
            + (", or put the run's values back in config.yaml" if any(k in edited for k in fixed) else "")
        )
    if changes and not allow_change:
        raise ValueError(
            f"the config differs from the one the run in {str(folder.path)!r} was trained with: "
            + ", ".join(f"{k} (run: {a!r}, now: {b!r})" for k, (a, b) in changes.items())
            + hand_note
            + ". Resume without --config/overrides (and with config.yaml as the run wrote it) to continue "
            "as it was, or pass --allow-change to apply these changes (they are written to config.yaml "
            "and events.jsonl)"
        )
    return changes


class Trackers:
    """TensorBoard / W&B mirrors of ``metrics.jsonl`` (``log.tensorboard``, ``log.wandb``).

    The packages are optional (``gapo[tracking]``) and imported only when asked for. The W&B run's
    id is kept in the run folder (``WANDB_ID``) when it starts; a resumed run (``--resume``, or a
    second ``fit()``) passes it back (``id=..., resume="allow"``), so that it continues the same
    W&B run. Steps redone after the checkpoint that W&B has already seen are dropped by W&B (it
    keeps a step's first values; on CPU they are the same, resume being exact)."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg, self.run_dir, self._open = cfg, run_dir, None

    def check(self) -> None:
        """A missing package is an error before any work."""
        try:
            if self.cfg.log.tensorboard:
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            if self.cfg.log.wandb:
                import wandb  # noqa: F401
        except ImportError as e:
            raise ValueError(
                f"log.tensorboard/log.wandb need their packages: pip install 'gapo[tracking]' ({e})"
            ) from e

    def log(self, record: dict) -> None:
        if self._open is None:
            self._open = self._start()
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if "tb" in self._open:
            for k, v in scalars.items():
                self._open["tb"].add_scalar(k, v, record["step"])
        if "wandb" in self._open:
            self._open["wandb"].log(scalars, step=record["step"])

    def log_samples(self, step: int, records: list[dict]) -> None:
        """The completions of ``samples.jsonl``'s rows of this step (``log.samples`` of them) as
        TensorBoard text (tag ``samples``, markdown) and a W&B table (key ``samples``: step, group,
        reward, prompt, completion), every ``log.samples_every`` steps (TRL's ``log_completions``)."""
        every = self.cfg.log.samples_every
        if not records or not every or step % every or not (self.cfg.log.tensorboard or self.cfg.log.wandb):
            return
        if self._open is None:
            self._open = self._start()
        if "tb" in self._open:
            self._open["tb"].add_text("samples", samples_markdown(records), step)
        if "wandb" in self._open:
            wandb = self._open["wandb"]
            cols = ["step", "group", "reward", "prompt", "completion"]
            table = wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in records])
            wandb.log({"samples": table}, step=step)

    def _start(self) -> dict:
        self.check()
        out = {}
        if self.cfg.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            out["tb"] = SummaryWriter(str(self.run_dir / "tb"))
        if self.cfg.log.wandb:
            import wandb

            self._init_wandb(wandb)
            out["wandb"] = wandb
        return out

    def _init_wandb(self, wandb) -> None:
        id_file = self.run_dir / WANDB_ID
        saved = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
        resume = {"id": saved, "resume": "allow"} if saved else {}
        run = wandb.init(project=self.cfg.log.wandb_project, dir=str(self.run_dir), config=to_dict(self.cfg), **resume)
        run_id = getattr(run, "id", None)
        if isinstance(run_id, str) and run_id and run_id != saved:
            atomic_write(id_file, lambda tmp: tmp.write_text(run_id + "\n", encoding="utf-8"))

    def close(self) -> None:
        for name, w in (self._open or {}).items():
            w.close() if name == "tb" else w.finish()
        self._open = None


def samples_markdown(records: list[dict]) -> str:
    """Rows of ``samples.jsonl`` as markdown for TensorBoard's text tab: a heading per row (group,
    reward) and the prompt and completion as indented code blocks (their text verbatim: no
    markdown inside them is rendered)."""

    def block(text: str) -> str:
        return "\n".join("    " + ln for ln in str(text).split("\n"))

    parts = [
        f"**group {r.get('group')}, reward {r.get('reward')}**\n\nprompt:\n\n{block(r.get('prompt', ''))}"
        f"\n\ncompletion:\n\n{block(r.get('completion', ''))}"
        for r in records
    ]
    return "\n\n---\n\n".join(parts)


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
