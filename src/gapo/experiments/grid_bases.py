"""The regimes' base policies of a ``gapo compare`` grid (phase 1, before any cell runs).

Every cell of a regime starts from the same base policy and is evaluated on the same held-out
problems with the same sampling seed, so the pre-training evaluation is computed once per regime
(``<out>/<regime>/base_eval.json``: the policy's folder, its weights' sha256, the evaluation's
settings and result) and reused by every cell. A record is reused while its settings match
(:func:`base_eval_cfg`) and its policy is still there; a base rebuilt for a regime whose cells
already ran must be the one they trained from (:func:`prepare_regimes`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from tqdm import tqdm

from gapo.experiments.grid_spec import cell_config, methods_of, pretrain_config, regime_task, write_json
from gapo.experiments.pool import Job, above, run_jobs

# gapo.policy.base_policy imports torch: it is imported where a base policy is looked up, so that a
# cell process (gapo.experiments.cell imports weights_sha256 from here) that fails or is skipped
# before its training does so without it
__all__ = ["base_eval_cfg", "weights_sha256", "was_run", "prepare_regimes"]


def _eval_cfg(grid: dict, regime: str) -> dict:
    cfg = cell_config(grid, regime, methods_of(grid, regime)[0], grid["seeds"][0], base_path="x")
    ev = {
        "problems": cfg.eval.problems,
        "samples": cfg.eval.samples,
        "temperature": cfg.eval.temperature,
        "seed": cfg.eval.seed,
        "max_new_tokens": cfg.sampling.max_new_tokens,
    }
    # what else the cells' own evaluations sample with (rl.evaluate.eval_params), recorded only when
    # set: a base evaluation recorded before these keys existed (at their defaults) still matches
    if cfg.eval.top_p != 1.0:
        ev["top_p"] = cfg.eval.top_p
    if cfg.sampling.stop:
        ev["stop"] = list(cfg.sampling.stop)
    return ev


def base_eval_cfg(grid: dict, regime: str) -> dict:
    """What a regime's ``base_eval.json`` must record as its ``eval_cfg`` to be reused: the
    evaluation's settings and the base policy's identity (a regime whose base or task changed must
    not reuse another policy's evaluation, or path). As it reads back from JSON (tuples as lists)."""
    spec = grid["_regimes"][regime]
    ev = {**_eval_cfg(grid, regime), "base_key": pretrain_config(spec).cache_key(), "task": regime_task(spec)}
    return json.loads(json.dumps(ev))


def weights_sha256(policy: Path | str) -> str | None:
    """sha256 over a policy folder's ``*.safetensors`` files (sorted by name), or None if it has none."""
    files = sorted(Path(policy).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _base_still_there(rec: dict) -> bool:
    """A ``base_eval.json`` record's policy is on this machine, and (where the record has its
    digest) with the same weights."""
    path = Path(rec.get("policy", ""))
    if not (path / "config.json").is_file():
        return False
    want = rec.get("weights_sha256")
    return want is None or weights_sha256(path) == want


def _same_base(old: dict, new: dict) -> bool:
    """Whether a rebuilt base is the one an earlier ``base_eval.json`` recorded: the same weights
    digest where both have one, else the same evaluation, value for value (its timings aside)."""
    if old.get("weights_sha256") and new.get("weights_sha256"):
        return old["weights_sha256"] == new["weights_sha256"]

    def values(rec):
        return {k: v for k, v in (rec.get("eval") or {}).items() if not k.startswith("time/")}

    return values(old) == values(new)


def was_run(cdir: Path) -> bool:
    """The cell finished or checkpointed: its config and its base are fixed from then on (a started
    cell resumes from weights trained on that base)."""
    return (cdir / "done.json").is_file() or (cdir / "checkpoint.pt").is_file()


def _trained_from(regime_dir: Path) -> bool:
    """Some cell under the regime's folder was run (any method or seed, in this grid or not)."""
    return any(was_run(d) for d in regime_dir.glob("*/seed*"))


def prepare_regimes(grid: dict, out: Path, t0: float, say) -> dict[str, dict]:
    """Phase 1: every regime's base policy and base evaluation (one job per regime, in parallel,
    skipped where ``base_eval.json`` matches and its policy is still there); returns each regime's
    ``base_eval.json``. A base rebuilt for a regime that has finished or started cells must be the
    one they trained from (pretraining is reproducible on one machine type, not across all): if it
    is not, the old record is put back and nothing runs."""
    prep, before = [], {}
    for r in grid["regimes"]:
        ev = base_eval_cfg(grid, r)
        be = out / r / "base_eval.json"
        if be.is_file():
            rec = json.loads(be.read_text())
            if rec.get("eval_cfg") == ev:
                if _base_still_there(rec):
                    continue
                if _trained_from(out / r):
                    before[r] = rec  # rebuilt below, then checked against the base those cells used
        prep.append(_prepare_job(out, r, grid["_regimes"][r], ev, t0))
        say(_prepare_line(out, r, grid["_regimes"][r], ev))
    bar = _PrepareBar([(r, log) for r, _, log, _ in prep]) if prep else None
    try:
        run_jobs(prep, grid["workers"], bar.wrap(say) if bar else say, tick=bar.refresh if bar else None)
    finally:
        if bar is not None:
            bar.close()
    bases = {}
    for r in grid["regimes"]:
        be = out / r / "base_eval.json"
        if not be.is_file():
            raise RuntimeError(f"regime {r}: base policy could not be prepared; see {out / r / 'prepare.log'}")
        bases[r] = json.loads(be.read_text())
    for r, old in before.items():
        _check_rebuilt(out, r, old, bases[r])
    return bases


def _prepare_job(out: Path, r: str, spec: dict, ev: dict, t0: float) -> Job:
    """``cell --prepare``: build (or fetch) regime ``r``'s base policy and evaluate it once."""
    return (
        r,
        ["--prepare", str(out), r, json.dumps(spec), json.dumps(ev)],
        out / r / "prepare.log",
        lambda rc, dt: (
            f"[{time.time() - t0:6.0f}s] regime {r}: base policy "
            f"{'ready' if rc == 0 else f'FAILED (rc={rc}, see prepare.log)'} ({dt:.0f}s)"
        ),
    )


def _prepare_line(out: Path, r: str, spec: dict, ev: dict) -> str:
    """What phase 1 will do for regime ``r``: evaluate a cached base, or build one first (minutes)."""
    from gapo.policy.base_policy import cache_dir, shipped_dir  # torch: see the note at the imports

    cfg = pretrain_config(spec)
    if (cache_dir(cfg) / "config.json").is_file() or shipped_dir(cfg) is not None:
        return f"regime {r}: base policy {cfg.name!r} is cached; evaluating it on {ev['problems']} problems"
    budget = f", at most {cfg.time_budget_s / 60:.0f} min of CPU" if cfg.time_budget_s else ""
    return (
        f"regime {r}: building base policy {cfg.name!r} (up to {cfg.max_steps} SFT steps{budget}; "
        f"progress in {out / r / 'prepare.log'})"
    )


def _check_rebuilt(out: Path, r: str, old: dict, new: dict) -> None:
    """A rebuilt base that is not the one regime ``r``'s cells trained from: the old record is put
    back and the grid stops."""
    if _same_base(old, new):
        return
    write_json(out / r / "base_eval.json", old)
    raise RuntimeError(
        f"regime {r}: the base policy rebuilt at {new['policy']} is not the one the finished or "
        f"started cells in {out / r} trained from (weights sha256 {new.get('weights_sha256')}, recorded "
        f"{old.get('weights_sha256')}; base pass@1 {new['eval'].get('eval/pass@1')}, recorded "
        f"{(old.get('eval') or {}).get('eval/pass@1')}); resuming would mix two base policies. Put the "
        f"original weights at {old.get('policy')}, or run the grid into a new --out."
    )


class _PrepareBar:
    """One tqdm bar over the regimes' base-policy builds, moved by the ``N% done`` lines their
    children write to prepare.log (``gapo.policy.pretrain.pretrain``'s ``log``)."""

    _PCT = re.compile(rb"(\d+)% done")

    def __init__(self, logs: list[tuple[str, Path]]):
        self.logs, self.done, self.total = logs, 0, 100 * len(logs)  # percent points (a disabled bar counts nothing)
        self.bar = tqdm(
            total=100 * len(logs),
            desc="base policies",
            unit="%",
            dynamic_ncols=True,
            disable=None,
            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}]",
        )

    def refresh(self) -> None:
        done = 0
        for _, log in self.logs:
            try:
                with open(log, "rb") as f:
                    f.seek(max(0, os.path.getsize(log) - 4096))
                    hits = self._PCT.findall(f.read())
            except OSError:
                hits = []
            done += int(hits[-1]) if hits else 0
        if done > self.done:
            self.bar.update(done - self.done)
            self.done = done

    def wrap(self, say):
        return above(self.bar, say)

    def close(self) -> None:
        self.bar.close()
