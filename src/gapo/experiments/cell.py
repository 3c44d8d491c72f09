"""The child-process side of ``gapo compare`` (internal; its arguments may change at any time).

    python -m gapo.experiments.cell --cell <out>/<regime>/<method>/seed<k>
    python -m gapo.experiments.cell --prepare OUT REGIME SPEC_JSON EVAL_JSON

:func:`gapo.experiments.grid.run_grid` spawns one such process per job with one torch thread:
``--prepare`` builds (or fetches from the cache) a regime's base policy and evaluates it once
(``<out>/<regime>/base_eval.json``); ``--cell`` trains one cell from its spec
(``seed<k>.json`` next to the run folder) and writes ``done.json`` or ``failed.json``. Exit
codes: 0 done, 1 failed (recorded), 75 busy (another process holds the cell's run-folder lock;
nothing written), 130 stopped by SIGTERM (checkpointed; resumes next time).
A cell stops the same way when the ``gapo compare`` that started it ends, even by ``kill -9``
(:func:`_stop_with_parent`), and one that finds its folder locked waits a while for the holder (an
orphan of a killed grid, finishing its step) before it answers busy.
torch, transformers and the trainer (about 10 s of CPU to import) are imported only once a job
needs them: a cell whose folder is locked, unusable or whose spec is invalid ends in about a second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from gapo.experiments.grid_bases import weights_sha256
from gapo.experiments.grid_spec import cell_file, pretrain_config, regime_task, write_json
from gapo.rl.config import from_dict
from gapo.rl.run_dir import RunFolder
from gapo.rl.run_lock import RunLocked

BUSY = 75  # EX_TEMPFAIL: the cell's folder is locked by another process; nothing was written
PARENT_ENV = "GAPO_GRID_PID"  # set by pool.spawn: the pid of the `gapo compare` that started this job
BUSY_WAIT_S = 60.0  # how long a cell waits for its folder's lock before it answers BUSY


def _stop_with_parent() -> bool:
    """Send this process SIGTERM when the ``gapo compare`` that spawned it (pid in ``$GAPO_GRID_PID``)
    ends, however it ends: the trainer then finishes its step, checkpoints and exits 130, as when the
    grid stops it. Without this a grid killed with ``kill -9`` leaves its cells training on, holding
    their folders' locks, and the rerun finds them busy. Returns False if that process has gone
    already (the job must not start). Linux: ``PR_SET_PDEATHSIG``; elsewhere a thread polls
    ``getppid()``."""
    try:
        parent = int(os.environ.get(PARENT_ENV, ""))
    except ValueError:
        return True  # not started by a grid (run by hand): nothing to follow
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        else:
            return os.getppid() == parent  # checked after the call: it may have died just before

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread, like the grid's own SIGTERM

    if os.getppid() != parent:
        return False
    threading.Thread(target=watch, name="gapo-grid-watch", daemon=True).start()
    return True


def _prepare_regime(out: Path, regime: str, spec_json: str, eval_json: str) -> int:
    """Build (or fetch) the regime's base policy and evaluate it once."""
    import torch

    from gapo import tasks
    from gapo.policy.base_policy import get_base_policy
    from gapo.policy.model import load_policy
    from gapo.rl.evaluate import EvalPlan, evaluate

    torch.set_num_threads(1)
    spec, ev = json.loads(spec_json), json.loads(eval_json)
    rdir = Path(out) / regime
    # plain progress lines into prepare.log (the parent's bar reads their "N% done")
    path = get_base_policy(pretrain_config(spec), progress=False, log=lambda line: print(line, flush=True))
    t = regime_task(spec)
    task = tasks.get(t["name"], **t["params"])
    model, tok = load_policy(path)
    res = {}
    if ev["problems"]:
        problems = task.generate("eval", ev["problems"], ev["seed"])
        res = evaluate(
            model,
            tok,
            task,
            problems,
            params=base_eval_params(ev, task),
            plan=EvalPlan(n=ev["samples"], seed=ev["seed"]),
        )
        res.update(kind="eval", step=0)
    rec = {"policy": str(path), "weights_sha256": weights_sha256(path), "eval_cfg": ev, "eval": res}
    write_json(rdir / "base_eval.json", rec)
    return 0


def base_eval_params(ev: dict, task):
    """How the regime's base is evaluated (``ev``: grid_bases.base_eval_cfg's record), a
    ``SamplingParams``: as its cells' own evaluations sample (rl.evaluate.eval_params), so that
    step 0 and later steps compare."""
    from gapo.policy.sampling import SamplingParams  # torch: in the child that evaluates

    max_new = ev["max_new_tokens"] or task.max_completion_len + 1
    return SamplingParams(max_new, ev["temperature"], ev.get("top_p", 1.0), None, tuple(ev.get("stop", ())))


def _cell_trainer(cfg, folder, *, resume: bool, base_eval: dict | None = None):
    """A trainer of ``cfg`` in ``folder`` (``resume``: from its checkpoint, else over it) whose
    step-0 evaluation is the regime's shared one: every cell of a regime starts from the same
    policy and is evaluated on the same problems with the same seed."""
    from gapo.rl.trainer import Trainer

    class _CellTrainer(Trainer):
        def evaluate(self, *, progress=False):
            if self.step == 0 and base_eval:
                return dict(base_eval)
            return super().evaluate(progress=progress)

    return _CellTrainer(cfg, folder, resume=resume, overwrite=not resume)  # no checkpoint: start over


def _check_finite(cdir: Path) -> None:
    recs = [json.loads(x) for x in (cdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    bad = [r["step"] for r in recs if any(isinstance(v, str) and v in ("nan", "inf", "-inf") for v in r.values())]
    if bad:
        raise FloatingPointError(f"non-finite metrics at steps {bad[:5]}")


def _finished_run(cdir: Path, steps: int, evaluates: bool) -> dict | None:
    """``{"eval": record or None}`` if the run in ``cdir`` already trained all ``steps`` and wrote its
    policy (and logged its final evaluation, if it evaluates), else None. Such a run without
    ``done.json`` was stopped by a signal after its last step (``Trainer.fit`` before commit 5223c87
    reported it as stopped); its result is in the folder, so it is recorded, not resumed (the trainer
    refuses that)."""
    from gapo.rl.checkpoint import policy_written

    metrics = cdir / "metrics.jsonl"
    if not (cdir / "checkpoint.pt").is_file() or not metrics.is_file() or not policy_written(cdir, steps):
        return None
    recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    if not any(r.get("kind") == "train" and r.get("step") == steps for r in recs):
        return None
    evals = [r for r in recs if r.get("kind") == "eval" and r.get("step") == steps]
    if evaluates and not evals:
        return None
    return {"eval": {k: v for k, v in evals[-1].items() if k.startswith("eval/")} if evals else None}


def _run_cell(cdir: Path) -> int:
    """Train one cell from its spec; ``done.json`` on success, ``failed.json`` on error."""
    cdir = Path(cdir)
    folder = RunFolder(cdir)
    cdir.mkdir(parents=True, exist_ok=True)  # the lock is a file in the folder
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        try:  # one writer: held until done.json is written and the checkpoint removed
            folder.lock.acquire()
            break
        except RunLocked as e:  # not this cell's failure: another process is writing it
            if time.monotonic() >= deadline:
                print(f"cell {str(cdir)!r} (waited {BUSY_WAIT_S:.0f} s): {e}", file=sys.stderr, flush=True)
                return BUSY
            time.sleep(0.5)  # most often a killed grid's orphan, checkpointing its step
    try:
        return _run_locked_cell(cdir, folder)
    finally:
        folder.release()


def _run_locked_cell(cdir: Path, folder: RunFolder) -> int:
    spec = json.loads(cell_file(cdir, "json").read_text())
    t0 = time.time()
    try:
        cfg = from_dict(spec["config"]).validate()
        folder.check(resume=False, overwrite=True)  # puts back a run an interrupted --overwrite moved aside
        import torch  # only now: a cell that fails the checks above does so in about a second

        torch.set_num_threads(1)
        resume = (cdir / "checkpoint.pt").is_file()
        res = _finished_run(cdir, cfg.train.steps, bool(cfg.eval.problems)) if resume else None
        if res is None:
            tr = _cell_trainer(cfg, folder, resume=resume, base_eval=spec.get("base_eval"))
            res = tr.fit()
            if res["stopped"]:
                return 130
        else:
            res["step"] = cfg.train.steps
        _check_finite(cdir)
        final = {k: v for k, v in (res["eval"] or {}).items() if k != "eval/correct"}
        # per-problem success counts of the final evaluation (for problem-level intervals; the
        # run folder's metrics.jsonl has them for every evaluation)
        write_json(
            cdir / "done.json",
            {
                "step": res["step"],
                "wall_s": time.time() - t0,
                "eval": final,
                "correct": (res["eval"] or {}).get("eval/correct"),
                "resumed": resume,
            },
        )
        (cdir / "checkpoint.pt").unlink(missing_ok=True)  # the run is finished: the checkpoint is only disk weight
        return 0
    except Exception as e:  # noqa: BLE001 - recorded, the grid goes on
        write_json(
            cdir / "failed.json",
            {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "wall_s": time.time() - t0},
        )
        traceback.print_exc()
        return 1


def main(argv: list[str] | None = None) -> int:
    """The child's entry point (see the module docstring); not a user command."""
    ap = argparse.ArgumentParser(
        prog="python -m gapo.experiments.cell", description="internal: one job of `gapo compare` (spawned by run_grid)"
    )
    job = ap.add_mutually_exclusive_group(required=True)
    job.add_argument("--cell", metavar="DIR", help="train the cell whose run folder is DIR")
    job.add_argument(
        "--prepare",
        nargs=4,
        metavar=("OUT", "REGIME", "SPEC_JSON", "EVAL_JSON"),
        help="build and evaluate a regime's base policy",
    )
    a = ap.parse_args(argv)
    if not _stop_with_parent():
        return 130  # the grid that started this job is gone: nothing run, nothing written
    if a.cell:
        return _run_cell(Path(a.cell))
    return _prepare_regime(Path(a.prepare[0]), a.prepare[1], a.prepare[2], a.prepare[3])


if __name__ == "__main__":
    sys.exit(main())
