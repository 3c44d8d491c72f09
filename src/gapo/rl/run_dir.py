"""Run folders: what gapo writes, and the rules that keep a user's run from being lost.

A run folder holds ``.gapo-run`` (the marker), ``config.yaml`` (the run's configuration, kept
current), ``metrics.jsonl`` (one JSON record a line), ``checkpoint.pt``, ``policy/`` (the final
policy) and ``events.jsonl`` (configuration changes made on resume). The rules:

- Nothing is written before the whole run has validated (config, model, data, task, device,
  reward function): :meth:`RunFolder.check` only reads.
- ``--overwrite`` only replaces a folder that is a gapo run (marker, or the ``config.yaml`` +
  ``metrics.jsonl`` of runs made before the marker existed). The old run is moved aside, and is
  deleted only once the new run has completed its first step; if the new run fails before that,
  the old run is put back (:meth:`RunFolder.open`, :meth:`RunFolder.settle`, :meth:`RunFolder.abort`).
- Every file gapo replaces is written to a temporary file and renamed into place, and a failed
  write (full disk, read-only folder) removes the temporary file and raises one clear error.
- On resume, a partial last line of ``metrics.jsonl`` (a run killed while writing) is dropped,
  and records after the checkpoint are dropped too: those steps are redone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from gapo.rl.config import Config, diff, from_dict, to_dict

__all__ = ["RunFolder", "RunExists", "MARKER", "atomic_write", "resume_changes", "Trackers", "load_run",
           "RESUME_FIXED", "stop_on_signals"]

# Keys a resumed run cannot take a new value for: they define its data, its model and its random
# streams (restored from the checkpoint), so a new value would be silently ignored.
RESUME_FIXED = ("task.", "model.path", "model.base_preset", "train.seed")

MARKER = ".gapo-run"


class RunExists(ValueError):
    """The run folder exists and neither ``--resume`` nor ``--overwrite`` was given."""


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
            raise OSError(e.errno, f"cannot write {str(path)!r}: {e.strerror or e}; "
                                   f"the previous version (if any) is intact") from e
        raise


class RunFolder:
    """One run folder: read-only checks first, writes only after :meth:`open`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metrics = self.path / "metrics.jsonl"
        self.checkpoint = self.path / "checkpoint.pt"
        self.config = self.path / "config.yaml"
        self._aside: Path | None = None  # the run being replaced, until the new one is settled

    # ------------------------------------------------------------------ read-only
    def is_run(self) -> bool:
        p = self.path
        return (p / MARKER).is_file() or ((p / "config.yaml").is_file() and (p / "metrics.jsonl").is_file())

    def is_empty(self) -> bool:
        return not self.path.exists() or (self.path.is_dir() and not any(self.path.iterdir()))

    def check(self, *, resume: bool, overwrite: bool) -> None:
        """Raise a clear ``ValueError`` if this folder may not be used as asked. Writes nothing."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise ValueError(f"run folder {str(p)!r} is a file, not a folder; choose another --out")
        if not p.exists():
            parent = next((a for a in p.absolute().parents if a.exists()), None)
            if parent is not None and not parent.is_dir():
                raise ValueError(f"run folder {str(p)!r}: {str(parent)!r} is a file, not a folder")
        if resume:
            if not p.exists():
                raise ValueError(f"cannot resume: there is no run folder at {str(p)!r}")
            if not self.is_run():
                raise ValueError(f"cannot resume: {str(p)!r} is not a gapo run folder (no {MARKER} or config.yaml "
                                 "+ metrics.jsonl)")
            if not self.checkpoint.is_file():
                raise ValueError(f"cannot resume: no checkpoint at {str(self.checkpoint)!r}")
            return
        if self.is_empty():
            return
        if not overwrite:
            raise RunExists(f"run folder {str(p)!r} exists; pass --resume to continue it or --overwrite to "
                            "replace it")
        if not self.is_run():
            raise ValueError(f"refusing to overwrite {str(p)!r}: it is not empty and not a gapo run folder "
                             f"(no {MARKER}); choose another --out or empty it yourself")

    def saved_config(self) -> dict:
        """The run's own ``config.yaml`` as a dict; a clear error when it is unreadable."""
        try:
            data = yaml.safe_load(self.config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ValueError(f"cannot resume: {str(self.config)!r} is unreadable ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"cannot resume: {str(self.config)!r} is not a gapo config")
        return data

    def load_checkpoint(self, map_location) -> dict:
        """The checkpoint's state dict; a truncated or foreign file is a clear error."""
        try:
            state = torch.load(self.checkpoint, map_location=map_location, weights_only=False)
        except Exception as e:  # zip/pickle errors of a truncated or foreign file
            raise ValueError(f"cannot resume: checkpoint {str(self.checkpoint)!r} is unreadable "
                             f"({type(e).__name__}: {e}); it may be truncated. Start over with --overwrite "
                             "or restore the file") from None
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
                raise ValueError(f"cannot resume: {str(path)}:{i} is not JSON; fix or delete that line")
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
                keep.append(ln)
        return keep

    # ------------------------------------------------------------------ writes
    def open(self, *, overwrite: bool) -> None:
        """Create the folder (moving an old run aside when overwriting) and write the marker."""
        p = self.path
        try:
            if overwrite and p.exists() and not self.is_empty():
                aside = p.with_name(f".{p.name}.replaced-{os.getpid()}-{time.time_ns()}")
                os.rename(p, aside)
                self._aside = aside
            p.mkdir(parents=True, exist_ok=True)
            self.write_text(MARKER, json.dumps({"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        except OSError as e:
            self.abort()
            raise OSError(e.errno, f"cannot create the run folder {str(p)!r}: {e.strerror or e}") from None

    def settle(self) -> None:
        """The new run is under way: delete the run it replaces."""
        if self._aside is not None:
            shutil.rmtree(self._aside, ignore_errors=True)
            self._aside = None

    def abort(self) -> None:
        """The new run failed before it settled: put the replaced run back."""
        if self._aside is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.rename(self._aside, self.path)
        self._aside = None

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
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def resume_changes(folder: RunFolder, cfg: Config, *, allow_change: bool) -> dict[str, tuple]:
    """The keys in which ``cfg`` differs from the run's saved config, ``key -> (old, new)``.

    A key in ``RESUME_FIXED`` is always an error; any other difference is an error unless
    ``allow_change`` (the caller then applies and logs it)."""
    try:  # normalised: keys added since the run was made compare at their defaults
        saved = to_dict(from_dict(folder.saved_config(), migrate=True))
    except ValueError as e:
        raise ValueError(f"cannot resume: {str(folder.config)!r}: {e}") from None
    changes = diff(saved, to_dict(cfg))
    fixed = [k for k in changes if k.startswith(RESUME_FIXED)]
    if fixed:
        raise ValueError(f"cannot resume {str(folder.path)!r} with a different " + ", ".join(
            f"{k} (run: {changes[k][0]!r}, now: {changes[k][1]!r})" for k in fixed)
            + ": these define the run's data, model and random streams. Start a new run instead")
    if changes and not allow_change:
        raise ValueError(f"the config differs from the one saved in {str(folder.config)!r}: " + ", ".join(
            f"{k} (run: {a!r}, now: {b!r})" for k, (a, b) in changes.items())
            + ". Resume without --config/overrides to continue as it was, or pass --allow-change to apply "
            "these changes (they are written to config.yaml and events.jsonl)")
    return changes


class Trackers:
    """TensorBoard / W&B mirrors of ``metrics.jsonl`` (``log.tensorboard``, ``log.wandb``).

    The packages are optional (``gapo[tracking]``) and imported only when asked for."""

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
            raise ValueError(f"log.tensorboard/log.wandb need their packages: pip install 'gapo[tracking]' ({e})") from e

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
            wandb.init(project=self.cfg.log.wandb_project, dir=str(self.run_dir), config=to_dict(self.cfg))
            out["wandb"] = wandb
        return out

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

    parts = [f"**group {r.get('group')}, reward {r.get('reward')}**\n\nprompt:\n\n{block(r.get('prompt', ''))}"
             f"\n\ncompletion:\n\n{block(r.get('completion', ''))}" for r in records]
    return "\n\n---\n\n".join(parts)


def load_run(run_dir: str | Path) -> dict:
    """``{"name", "dir", "train": [records], "eval": [records], "samples": [records]}`` of one
    run folder (``samples``: ``samples.jsonl``, what the model was trained on; may be empty)."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{str(run_dir)!r} is not a gapo run folder (no metrics.jsonl)")
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
