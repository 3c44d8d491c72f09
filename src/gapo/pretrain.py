"""Supervised pretraining of the embedded base policy on solver demonstrations (DESIGN §5).

The base policy is a tiny ``LlamaForCausalLM`` (``gapo.model``) trained with next-token loss on
``<bos> prompt completion <eos>``, the loss on the completion (and EOS) only. Every time a
problem is drawn it gets a *fresh random* correct demonstration (``task.demonstration``), so the
policy starts RL with diverse first moves rather than one memorised solution per instance.
Problems come from the task's ``train`` split only; held-out evaluation uses ``eval``.

Presets pick a supervised mix and the RL task on which the base pass rate lands in a regime
(measured values next to ``PRESETS``):

- ``low``:  SFT on 3-number Countdown plus 30% 4-number instances; RL on 4-number instances
  with at least two canonical solutions (numbers 1–10): base pass@1 ≈ 4%, pass@8 ≈ 24%.
- ``high``: SFT on 2- and 3-number instances; RL on 2-number instances: base pass@1 ≈ 86%.
  (3-number instances reach only ≈ 28% within the same ~3-minute budget.)

The cache key is a hash of every field that affects the weights (task mix, model size,
optimisation, budgets, seed, library format version); the RL task, name and description are
not part of it, so presets that differ only in their RL task share one cached policy. Built policies live in
``$GAPO_CACHE/base/<key>`` (default ``~/.cache/gapo/base/<key>``), written to a temporary folder
and renamed into place, so a crash never leaves a half-written policy that looks valid.

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
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

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
        blob = json.dumps(_jsonable(self.key_fields()), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# Calibrated on 2 shared CPU cores (one torch thread); pass rates at temperature 1.0 on 200
# held-out (eval-split) problems x 8 samples, see the commit that set them.
PRESETS: dict[str, PretrainConfig] = {
    # 600 steps x 64 (~226 CPU-s on one thread): 4-number (>=2 solutions) pass@1 0.039,
    # pass@8 0.24; plain 4-number 0.025 / 0.15.
    "low": PretrainConfig(
        name="low",
        sft_mix=(
            (dict(n_numbers=3, num_range=(1, 10)), 0.7),
            (dict(n_numbers=4, num_range=(1, 10)), 0.3),
        ),
        rl_task=dict(n_numbers=4, num_range=(1, 10), min_solutions=2),
        description="RL on 4-number Countdown (numbers 1-10, >= 2 solutions); base pass@1 ~4%",
    ),
    # 600 steps x 64 (~173 CPU-s): 2-number pass@1 0.86, pass@8 0.965 (3-number: 0.28 / 0.69).
    # The 2-number instance space is small (~35 eval instances); fine for a stability check.
    "high": PretrainConfig(
        name="high",
        sft_mix=(
            (dict(n_numbers=2, num_range=(1, 10)), 0.25),
            (dict(n_numbers=3, num_range=(1, 10)), 0.75),
        ),
        rl_task=dict(n_numbers=2, num_range=(1, 10)),
        description="RL on 2-number Countdown (numbers 1-10); base pass@1 ~86%",
    ),
}


def resolve(preset: str | PretrainConfig) -> PretrainConfig:
    if isinstance(preset, PretrainConfig):
        return preset
    if preset not in PRESETS:
        import difflib

        close = difflib.get_close_matches(str(preset), PRESETS, n=2)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown base-policy preset {preset!r}; known presets: {sorted(PRESETS)}.{hint}")
    return PRESETS[preset]


def resolve_base_task(cfg):
    """With the embedded base policy (``model.path`` unset), the preset defines the RL task's
    params unless the user set them: returns ``cfg`` with ``task.params`` filled in. The one place
    this is decided, for the trainer and the CLI alike; idempotent."""
    if cfg.model.path is None and cfg.task.name == "countdown" and not cfg.task.params:
        cfg.task.params = dict(resolve(cfg.model.base_preset).rl_task)
    return cfg


def cache_root() -> Path:
    root = os.environ.get("GAPO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "gapo"


def cache_dir(preset: str | PretrainConfig) -> Path:
    return cache_root() / "base" / resolve(preset).cache_key()


# ------------------------------------------------------------------------------- training
class _Batcher:
    """Draws problems from the mix and encodes ``<bos> prompt demo <eos>`` right-padded."""

    def __init__(self, cfg: PretrainConfig, tok, seed: int):
        from gapo import tasks

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


def pretrain(cfg: PretrainConfig, *, progress: bool = True, log_every: int = 50, callback=None):
    """Train a base policy from scratch; returns ``(model, tokenizer, stats)``.

    ``stats`` holds the loss curve (every ``log_every`` steps), steps taken, wall and CPU time.
    ``callback(step, model, tok)``, if given, runs every ``log_every`` steps (e.g. to evaluate;
    it must leave the model in train mode and not touch the RNGs it does not own).
    """
    from gapo import tasks
    from gapo.model import build_model, build_tokenizer

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
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=tuple(cfg.betas),
    )
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, desc=f"pretrain base ({cfg.name})", unit="step", leave=False)
    curve, ema = [], None
    start = time.perf_counter()
    cpu0 = time.process_time()
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
        if bar is not None:
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{ema:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
    if bar is not None:
        bar.close()
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


def shipped_dir(preset: str | PretrainConfig) -> Path | None:
    """The copy of a preset's base policy shipped inside the package (``gapo/assets/base/<key>``),
    if there is one. The ``low`` preset ships (3.4 MB) so that ``gapo demo`` starts at once; it
    is exactly what ``get_base_policy("low", rebuild=True)`` produces (step-limited, seeded),
    up to floating-point differences between CPUs."""
    d = Path(__file__).parent / "assets" / "base" / resolve(preset).cache_key()
    return d if (d / "config.json").is_file() else None


def get_base_policy(
    preset: str | PretrainConfig = "low", *, rebuild: bool = False, progress: bool = True
) -> Path:
    """Path of the base policy for ``preset``: the user's cache, else the copy shipped with gapo,
    else trained now and cached.

    Load it with ``gapo.model.load_policy(path)``. ``rebuild=True`` trains anew and replaces
    the cached copy atomically.
    """
    from gapo.model import save_policy

    cfg = resolve(preset)
    final = cache_dir(cfg)
    if final.is_dir() and (final / "config.json").is_file() and not rebuild:
        return final
    if not rebuild and (shipped := shipped_dir(cfg)) is not None:
        return shipped
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    try:
        t0 = time.perf_counter()
        model, tok, stats = pretrain(cfg, progress=progress)
        stats["build_s"] = round(time.perf_counter() - t0, 2)
        extra = {"pretrain_config": _jsonable(dataclasses.asdict(cfg)), "cache_key": cfg.cache_key(), "stats": stats}
        save_policy(model, tok, tmp, extra=extra)
        if final.exists():  # rebuild, or another process finished first
            trash = final.parent / f".old-{final.name}-{os.getpid()}-{time.time_ns()}"
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                trash = None
            os.rename(tmp, final)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        else:
            try:
                os.rename(tmp, final)
            except OSError:  # lost a race to another process: use theirs
                if not (final / "config.json").is_file():
                    raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def estimate_pass_rate(
    model,
    tok,
    task,
    problems,
    n_samples: int = 8,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int | None = None,
    batch_size: int = 512,
    seed: int = 0,
    ks: list[int] | None = None,
) -> dict:
    """Unbiased pass@k over ``problems`` from ``n_samples`` samples each (``temperature=0``:
    greedy, one sample). Returns ``{"pass@1": .., "pass@2": .., ..., "correct": [c_j], "n": n}``.
    """
    from gapo.metrics import pass_at_k_curve
    from gapo.sampling import sample

    if temperature <= 0:
        n_samples = 1
    max_new_tokens = max_new_tokens or task.max_completion_len + 1  # +1 for EOS
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    prompts = [tok(p.prompt).input_ids for p in problems]
    flat = [(j, prompts[j]) for j in range(len(problems)) for _ in range(n_samples)]
    correct = [0] * len(problems)
    for s in range(0, len(flat), batch_size):
        chunk = flat[s : s + batch_size]
        r = sample(
            model,
            [p for _, p in chunk],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            generator=gen,
        )
        for (j, _), text in zip(chunk, r.texts(tok)):
            correct[j] += int(task.score(problems[j], text) > 0)
    ks = ks or [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= n_samples]
    curve = pass_at_k_curve(n_samples, correct, ks)
    out = {f"pass@{k}": v for k, v in curve.items()}
    out.update(correct=correct, n=n_samples)
    return out
