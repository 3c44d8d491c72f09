"""Supervised pretraining of the embedded base policy on solver demonstrations (docs/design.md §9).

The base policy is a tiny ``LlamaForCausalLM`` (``gapo.policy.model``) trained with next-token loss on
``<bos> prompt completion <eos>``, the loss on the completion (and EOS) only. Every time a
problem is drawn it gets a *fresh random* correct demonstration (``task.demonstration``), so the
policy starts RL with diverse first moves rather than one memorised solution per instance.
Problems come from the task's ``train`` split only; held-out evaluation uses ``eval``.

The presets, the cache and the shipped copy are in ``gapo.policy.base_policy``.

The presets are step-limited (reproducible). ``time_budget_s`` is a safety cap in *CPU seconds
of this process* (``time.process_time``), not wall time, so a machine shared with other jobs
does not silently produce an under-trained policy; on an idle one-thread machine the two agree.
When the cap binds, the number of steps depends on the machine, and the cosine schedule follows
``progress = max(step / max_steps, cpu / time_budget_s)`` so it still anneals to the end. Set
``time_budget_s=None`` for a strictly step-limited run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from gapo import tasks
from gapo.policy.model import build_model, build_tokenizer

FORMAT_VERSION = 2  # 2: time budget counts process CPU time


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines a base policy (``name``/``rl_task``/``description`` aside).

    ``sft_mix``: ``((task_params, weight), ...)``; each batch element picks a component with
    probability ∝ weight, then a problem from that component's train pool.
    ``rl_task``: the params of the task the preset is meant to be RL-trained and evaluated on.
    """

    name: str = "custom"
    task: str = "countdown"
    sft_mix: tuple = ((dict(n_numbers=3, num_range=(1, 10)), 1.0),)
    rl_task: dict = field(default_factory=lambda: dict(n_numbers=4, num_range=(1, 10)))
    model_preset: str = "tiny"
    pool_size: int = 3000  # train problems per mix component (3-number 1-10 has ~3.1k)
    batch_size: int = 64
    max_steps: int = 600
    time_budget_s: float | None = 300.0  # CPU-second cap for slow machines; steps bind normally
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.98)
    grad_clip: float = 1.0
    seed: int = 0
    description: str = ""

    def key_fields(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("name", "rl_task", "description"):
            d.pop(k)
        d["format"] = FORMAT_VERSION
        return d

    def cache_key(self) -> str:
        blob = json.dumps(jsonable(self.key_fields()), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


# ------------------------------------------------------------------------------- training
class _Batcher:
    """Draws problems from the mix and encodes ``<bos> prompt demo <eos>`` right-padded."""

    def __init__(self, cfg: PretrainConfig, tok, seed: int):
        self.tasks = [tasks.get(cfg.task, **params) for params, _ in cfg.sft_mix]
        self.weights = [float(w) for _, w in cfg.sft_mix]
        self.pools = [t.generate("train", cfg.pool_size, seed=seed) for t in self.tasks]
        self.rng = random.Random(seed)
        self.vocab = tok.get_vocab()
        self.unk = tok.unk_token_id
        self.bos, self.eos, self.pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        self.draws = self.failures = 0
        self.last_error = ""

    def _ids(self, s: str) -> list[int]:
        return [self.vocab.get(c, self.unk) for c in s]

    def _draw(self):
        # A task whose demonstration fails on an instance must not kill a long build: redraw,
        # but give up loudly if failures are common (a broken task, not a rare corner case).
        for _ in range(100):
            j = self.rng.choices(range(len(self.tasks)), self.weights)[0]
            p = self.pools[j][self.rng.randrange(len(self.pools[j]))]
            self.draws += 1
            try:
                return p, self.tasks[j].demonstration(p, self.rng)
            except Exception as e:  # noqa: BLE001 - reported below if frequent
                self.failures += 1
                self.last_error = f"{p.prompt!r}: {e!r}"
                if self.failures > 20 and self.failures > 0.01 * self.draws:
                    raise RuntimeError(
                        f"{self.failures}/{self.draws} demonstrations failed; last: {self.last_error}"
                    ) from e
        raise RuntimeError(f"no demonstration could be made; last: {self.last_error}")

    def batch(self, n: int):
        rows, starts = [], []
        for _ in range(n):
            p, demo = self._draw()
            prompt = [self.bos] + self._ids(p.prompt)
            rows.append(prompt + self._ids(demo) + [self.eos])
            starts.append(len(prompt))
        L = max(map(len, rows))
        ids = torch.full((n, L), self.pad, dtype=torch.long)
        loss_mask = torch.zeros((n, L), dtype=torch.bool)
        for i, (r, s) in enumerate(zip(rows, starts)):
            ids[i, : len(r)] = torch.tensor(r)
            loss_mask[i, s : len(r)] = True  # targets: completion tokens and EOS
        return ids, loss_mask


def completion_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over positions where ``loss_mask`` marks the *target*.

    Right padding only, so the plain causal mask suffices (pads sit after every real token).
    """
    logits = model(input_ids=ids).logits[:, :-1].float()
    tgt, m = ids[:, 1:], loss_mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
    return (nll * m.reshape(-1)).sum() / m.sum().clamp(min=1)


def _lr_factor(progress: float, step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos


def pretrain(cfg: PretrainConfig, *, progress: bool = True, log_every: int = 50, callback=None, log=None):
    """Train a base policy from scratch; returns ``(model, tokenizer, stats)``.

    ``stats`` holds the loss curve (every ``log_every`` steps), steps taken, wall and CPU time.
    ``callback(step, model, tok)``, if given, runs every ``log_every`` steps (e.g. to evaluate;
    it must leave the model in train mode and not touch the RNGs it does not own).

    ``progress``: a tqdm bar (on a terminal) whose position is the schedule's progress
    ``max(step / max_steps, cpu / time_budget_s)``, so its ETA holds when the CPU budget ends
    the build first. ``log(line)``, if given, gets a plain line at the start, every
    ``log_every`` steps and at the end (for a log file: ``gapo compare``'s prepare.log).
    """
    if cfg.max_steps < 1 and cfg.time_budget_s is None:
        raise ValueError("pretraining needs max_steps >= 1 or a time budget")
    torch.manual_seed(cfg.seed)
    alphabet = "".join(dict.fromkeys("".join(tasks.get(cfg.task, **p).alphabet for p, _ in cfg.sft_mix)))
    tok = build_tokenizer(alphabet)
    model = build_model(len(tok), cfg.model_preset, seed=cfg.seed)
    model.train()
    t0 = time.perf_counter()
    batcher = _Batcher(cfg, tok, cfg.seed)
    t_data = time.perf_counter() - t0
    opt = _optimizer(model, cfg)
    bar = (
        tqdm(
            total=100,
            desc=f"pretrain base ({cfg.name})",
            unit="%",
            leave=False,
            bar_format="{l_bar}{bar}| {n:.0f}/100% [{elapsed}<{remaining}{postfix}]",
        )
        if progress
        else None
    )
    if log is not None:
        budget = f", at most {cfg.time_budget_s:.0f} s of CPU" if cfg.time_budget_s is not None else ""
        log(f"pretrain base ({cfg.name}): up to {cfg.max_steps} steps of {cfg.batch_size} examples{budget}")
    start, cpu0 = time.perf_counter(), time.process_time()
    report = _Reporting(log_every=log_every, callback=callback, bar=bar, log=log)
    step, ema, curve = _train_loop(model, tok, opt, batcher, cfg, cpu0, report)
    if bar is not None:
        bar.close()
    if log is not None:
        log(
            f"pretrain base ({cfg.name}): done, 100% done, {step} steps in {time.perf_counter() - start:.0f} s "
            f"({time.process_time() - cpu0:.0f} s CPU), loss " + ("n/a" if ema is None else f"{ema:.3f}")
        )
    model.eval()
    stats = {
        "steps": step,
        "train_s": round(time.perf_counter() - start, 2),
        "train_cpu_s": round(time.process_time() - cpu0, 2),
        "data_s": round(t_data, 2),
        "demo_failures": batcher.failures,
        "final_loss_ema": ema,
        "curve": curve,
    }
    return model, tok, stats


def _optimizer(model, cfg: PretrainConfig) -> torch.optim.AdamW:
    # no weight decay on embeddings, norms and biases
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=tuple(cfg.betas),
    )


def schedule_progress(step: int, cpu_s: float, cfg: PretrainConfig) -> float:
    """How far the build is, in [0, 1]: ``max(step / max_steps, cpu_s / time_budget_s)`` (the
    learning-rate schedule's own progress: whichever limit ends the build first)."""
    frac = step / cfg.max_steps if cfg.max_steps else 0.0
    if cfg.time_budget_s:
        frac = max(frac, cpu_s / cfg.time_budget_s)
    return min(frac, 1.0)


@dataclass(frozen=True)
class _Reporting:
    """Where the pretraining loop reports: every ``log_every`` steps a curve row,
    ``callback(step, model, tok)`` (e.g. an evaluation) and a ``log(line)``; the tqdm ``bar`` as
    it goes. None: not that one."""

    log_every: int
    callback: Callable | None = None
    bar: Any = None
    log: Callable[[str], None] | None = None


def _train_loop(model, tok, opt, batcher: _Batcher, cfg: PretrainConfig, cpu0: float, report: _Reporting):
    """Steps until ``cfg.max_steps`` or the CPU budget (counted from ``cpu0``); returns
    ``(steps, loss EMA, curve)`` with ``curve`` rows ``(step, wall s, loss)``."""
    log_every, callback, bar, log = report.log_every, report.callback, report.bar, report.log
    curve, ema = [], None
    start = time.perf_counter()
    step = 0
    while step < cfg.max_steps:
        elapsed = time.process_time() - cpu0
        if cfg.time_budget_s is not None and elapsed >= cfg.time_budget_s:
            break
        frac = step / cfg.max_steps
        if cfg.time_budget_s is not None:
            frac = max(frac, elapsed / cfg.time_budget_s)
        for g in opt.param_groups:
            g["lr"] = cfg.lr * _lr_factor(frac, step, cfg)
        ids, mask = batcher.batch(cfg.batch_size)
        loss = completion_loss(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if step == 1 or step % log_every == 0:
            curve.append((step, round(time.perf_counter() - start, 2), lv))
            if callback is not None and step % log_every == 0:
                callback(step, model, tok)
                model.train()
        if bar is not None or (log is not None and step % log_every == 0):
            done = schedule_progress(step, time.process_time() - cpu0, cfg)
            if bar is not None:
                bar.update(100 * done - bar.n)
                if step % 10 == 0:
                    bar.set_postfix(step=step, loss=f"{ema:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
            if log is not None and step % log_every == 0:
                wall = time.perf_counter() - start
                left = f", about {wall * (1 - done) / done:.0f} s left" if done > 0 else ""
                log(
                    f"pretrain base ({cfg.name}): step {step}, {100 * done:.0f}% done, loss {ema:.3f}, "
                    f"{wall:.0f} s{left}"
                )
    return step, ema, curve
