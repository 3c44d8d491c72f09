"""Run folders: what gapo writes, and the rules that keep a user's run from being lost.

A run folder holds ``.gapo-run`` (the marker), ``config.yaml``, ``metrics.jsonl``,
``samples.jsonl``, ``checkpoint.pt`` (which also carries the configuration it was trained with),
``policy/`` (the final policy) and ``events.jsonl``. :class:`RunFolder` enforces docs/design.md
§5.2's rules: one writer (the folder's own lock, :mod:`gapo.rl.run_lock`), nothing inside another
run, nothing written before the run has validated, ``--overwrite`` that never loses the run it
replaces (made and locked beside it, the old run moved aside and still locked until the new run's
first checkpoint, put back on failure or by the next check after a kill), symlinks resolved,
atomic writes, and an exact resume (records after the checkpoint and a cut last line dropped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

# torch is imported where a checkpoint is read or written, not here: a resumed run's config is
# read and checked before torch loads (a config error costs well under a second of CPU)
from gapo.rl.disk_space import free_bytes, mb, space_note
from gapo.rl.run_lock import LOCK_NAME, RunLock, RunLocked

__all__ = [
    "RunFolder",
    "require_run",
    "RunExists",
    "MARKER",
    "refuse_inside_run",
    "atomic_write",
]

MARKER = ".gapo-run"
ASIDE_TAG = ".replaced-"  # .<name>.replaced-<pid>-<ns>: a run that --overwrite moved aside
NEW_TAG = ".new-"  # .<name>.new-<pid>-<ns>: the folder of an --overwrite's new run, before it is in place
TRASH_TAG = ".discarded-"  # .<name>.discarded-<pid>-<ns>: a replaced run being deleted


class RunExists(ValueError):
    """The run folder exists and neither ``--resume`` nor ``--overwrite`` was given."""


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
        except Exception as e:  # noqa: BLE001 - zip/pickle errors of a truncated or foreign file, of many kinds
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
        free = free_bytes(self.path)
        if free is not None and free < need:
            raise OSError(
                errno.ENOSPC,
                f"not enough free space for run folder {str(self.path)!r}: a checkpoint needs "
                f"about {mb(need)}, {mb(free)} are free there. Free some space or choose "
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

    @property
    def replacing(self) -> bool:
        """An ``--overwrite``'s old run is aside, to be deleted at the first checkpoint (:meth:`settle`)
        or put back if the new run fails before it (:meth:`abort`)."""
        return self._aside is not None

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
            free = free_bytes(self.path)
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
