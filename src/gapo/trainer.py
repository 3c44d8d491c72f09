"""The RLVR loop — the only stateful module of gapo.

One step (DESIGN §3): draw P prompts → sample G rollouts each → score → advantages and GAPO's
per-rollout ε_high from the raw group rewards → old log-probs → E epochs × M mini-batch
optimiser steps of the chosen surrogate → diagnostics. Everything that is math is a call into
``gapo.advantages``, ``gapo.clipping``, ``gapo.losses`` and ``gapo.metrics``.

Runs survive: metrics go to ``<run>/metrics.jsonl`` (one JSON object a line, ``kind`` = train |
eval), checkpoints are written atomically to ``<run>/checkpoint.pt`` (model, optimiser,
scheduler, every RNG state, step and data position), ``resume=True`` continues bit for bit on
CPU, and SIGINT/SIGTERM finish the current step, checkpoint and exit cleanly.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from gapo import advantages as adv_mod
from gapo import tasks
from gapo.aggregation import agg_loss
from gapo.clipping import eps_high_for
from gapo.config import Config, diff, from_dict, to_dict
from gapo.losses import LOSSES, log_ratio
from gapo.metrics import clip_counts_by_c, clip_stats_from_counts, merge_counts
from gapo.run_dir import RunExists, RunFolder, atomic_write

__all__ = ["Trainer", "RunExists"]


def _jsonable(v):
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


# Keys a resumed run cannot take a new value for: they define its data, its model and its random
# streams (restored from the checkpoint), so a new value would be silently ignored.
RESUME_FIXED = ("task.", "model.path", "model.base_preset", "train.seed")


class Trainer:
    """``Trainer(cfg, run_dir).fit()``; see the module docstring.

    Construction validates everything (config, task, model, device, a probe of the reward
    function, the run folder's state, the checkpoint when resuming) before anything is written;
    run-folder rules in ``gapo.run_dir``. ``resume=True`` needs ``cfg`` equal to the run's saved
    config; with ``allow_change=True`` the differing keys are applied, written to ``config.yaml``
    and logged to ``events.jsonl``.
    """

    def __init__(self, cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 allow_change: bool = False):
        from gapo.model import load_policy
        from gapo.pretrain import resolve_base_task

        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other")
        self.folder = RunFolder(run_dir)
        self.run_dir = self.folder.path
        self.ckpt_path = self.folder.checkpoint
        self.folder.check(resume=resume, overwrite=overwrite)
        self.cfg = cfg = resolve_base_task(cfg.validate())
        state, changes = (self._resume_state(cfg, allow_change) if resume else (None, {}))

        m, t = cfg.model, cfg.train
        if m.device == "cpu" or m.threads is not None:
            torch.set_num_threads(m.threads or 1)
        self.device = torch.device(m.device)
        torch.manual_seed(t.seed)
        self.task = build_task(cfg)
        self.policy_path = m.path or str(self._base_policy())
        self.model, self.tok = load_policy(self.policy_path, self.device)
        self.model.train()
        self.ref_model = None
        if cfg.algo.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        o = cfg.optim
        # the fused kernel: the same AdamW update, ~4x faster than the per-tensor loop on CPU
        fused = {"fused": True} if self.device.type in ("cpu", "cuda") else {}
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay,
                                     **fused)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps else 1.0)
        self.max_new_tokens = cfg.sampling.max_new_tokens or self.task.max_completion_len + 1
        # the pool is what the run will visit: generating (and solving) instances is not free, so
        # never more than prompts × steps (passes over it are reshuffled; dynamic sampling wraps)
        self.pool = self.task.generate("train", max(1, min(cfg.task.train_size, t.prompts * t.steps)), t.seed)
        self.eval_problems = self.task.generate("eval", cfg.eval.problems, cfg.eval.seed) if cfg.eval.problems else []
        self._check_against_model()
        self._probe_reward()
        self._check_tracking()
        self.prompt_ids = {}
        self.py_rng = random.Random(t.seed)
        self.gen = torch.Generator(device=self.device).manual_seed(t.seed)
        self.order = self._shuffled()
        self.pos = 0
        self.step = 0
        self._stop = False
        self._writers = None
        if state is not None:
            self._restore(state, changes)
        # everything has validated: only now is the run folder written
        if resume:
            self.folder.rewrite_metrics(self.folder.records_up_to(self.step))
            if changes:
                self.folder.write_config(to_dict(cfg))
                self.folder.log_event({"event": "resume", "step": self.step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       "changed": {k: {"old": a, "new": b} for k, (a, b) in changes.items()}})
                print(f"[gapo] resumed {str(self.run_dir)!r} at step {self.step} with changes: "
                      + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items()), file=sys.stderr)
        else:
            self.folder.open(overwrite=overwrite)
            try:
                self.folder.write_config(to_dict(cfg))
            except BaseException:
                self.folder.abort()
                raise

    # ------------------------------------------------------------------ set-up helpers
    def _resume_state(self, cfg: Config, allow_change: bool) -> tuple[dict, dict]:
        """The checkpoint and the config keys that differ from the run's saved config."""
        try:  # normalised: keys added since the run was made compare at their defaults
            saved = to_dict(from_dict(self.folder.saved_config()))
        except ValueError as e:
            raise ValueError(f"cannot resume: {str(self.folder.config)!r}: {e}") from None
        changes = diff(saved, to_dict(cfg))
        fixed = [k for k in changes if k.startswith(RESUME_FIXED)]
        if fixed:
            raise ValueError(f"cannot resume {str(self.run_dir)!r} with a different " + ", ".join(
                f"{k} (run: {changes[k][0]!r}, now: {changes[k][1]!r})" for k in fixed)
                + ": these define the run's data, model and random streams. Start a new run instead")
        if changes and not allow_change:
            raise ValueError(f"the config differs from the one saved in {str(self.folder.config)!r}: " + ", ".join(
                f"{k} (run: {a!r}, now: {b!r})" for k, (a, b) in changes.items())
                + ". Resume without --config/overrides to continue as it was, or pass --allow-change to apply "
                "these changes (they are written to config.yaml and events.jsonl)")
        state = self.folder.load_checkpoint(torch.device(cfg.model.device))
        if state["step"] >= cfg.train.steps:
            raise ValueError(f"run {str(self.run_dir)!r} is finished (step {state['step']} of train.steps="
                             f"{cfg.train.steps}); nothing to resume. To train it further: --resume --allow-change "
                             f"train.steps={state['step'] * 2 or 1}")
        return state, changes

    def _base_policy(self) -> Path:
        from gapo.pretrain import get_base_policy

        return get_base_policy(self.cfg.model.base_preset, progress=self.cfg.train.progress)

    def _check_against_model(self) -> None:
        check_context(self.model, self.tok, self.pool[:2000] + self.eval_problems[:2000], self.max_new_tokens,
                      key=self.cfg._where("sampling.max_new_tokens"), where=str(self.policy_path))

    def _probe_reward(self) -> None:
        """Score an empty completion of one train and one eval problem: a reward function that
        raises, or returns a non-number, fails here, before the run folder is touched."""
        from gapo.scoring import score_batch

        probe = self.pool[:1] + self.eval_problems[:1]
        rewards, _ = score_batch(self.task, probe, [""] * len(probe), workers=0)
        self._check_rewards(torch.tensor(rewards, dtype=torch.float64), probe)

    def _check_rewards(self, rewards: torch.Tensor, problems: list) -> None:
        """Rewards are finite and inside ``algo.reward_range`` (when it is a fixed range)."""
        rr = self.cfg.algo.reward_range
        bad = ~torch.isfinite(rewards)
        if not isinstance(rr, str):
            bad |= (rewards < rr[0]) | (rewards > rr[1])
        if bad.any():
            i = int(torch.nonzero(bad)[0])
            where = f"outside algo.reward_range {list(rr)}" if not isinstance(rr, str) else "not finite"
            raise ValueError(f"task {self.cfg.task.name!r} returned reward {float(rewards[i])!r} ({where}) for problem "
                             f"{problems[i].prompt[:80]!r}; fix the verifier, or set algo.reward_range to its range "
                             "(or 'group' for rewards on any scale)")

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.pool)))
        self.py_rng.shuffle(order)
        return order

    def _next_problems(self, n: int) -> list:
        out = []
        for _ in range(n):
            if self.pos >= len(self.order):
                self.order, self.pos = self._shuffled(), 0
            out.append(self.pool[self.order[self.pos]])
            self.pos += 1
        return out

    def _encode(self, problem) -> list[int]:
        ids = self.prompt_ids.get(problem.prompt)
        if ids is None:
            ids = self.prompt_ids[problem.prompt] = self.tok(problem.prompt).input_ids
        return ids

    # ------------------------------------------------------------------ one RL step
    def _sample(self, problems: list):
        from gapo.sampling import sample

        G = self.cfg.train.group_size
        prompts = [self._encode(p) for p in problems for _ in range(G)]
        self.model.eval()
        r = sample(self.model, prompts, max_new_tokens=self.max_new_tokens, temperature=self.cfg.sampling.temperature,
                   top_p=self.cfg.sampling.top_p, eos_token_id=self.tok.eos_token_id,
                   pad_token_id=self.tok.pad_token_id, generator=self.gen)
        self.model.train()
        return r

    def _score(self, problems: list, texts: list[str]):
        from gapo.scoring import score_batch

        G = self.cfg.train.group_size
        flat = [p for p in problems for _ in range(G)]
        rewards, stats = score_batch(self.task, flat, texts, workers=self.cfg.task.scoring_workers)
        self._check_rewards(torch.tensor(rewards, dtype=torch.float64), flat)
        return torch.tensor(rewards, dtype=torch.float32), stats

    def _sample_and_score(self, problems: list):
        """Sample and score; returns ``(rollout, rewards, stats, score_wait_s)``.

        With ``task.scoring_workers > 0`` (slow verifiers: math-verify, code in the sandbox) the
        groups are sampled in chunks and each chunk's scoring runs in the worker pool while the
        next chunk is sampled; only the wait after the last chunk is counted as scoring time.
        """
        from gapo.scoring import submit_batch

        workers = self.cfg.task.scoring_workers
        if workers == 0:
            ro = self._sample(problems)
            ts = time.perf_counter()
            rewards, stats = self._score(problems, ro.texts(self.tok))
            return ro, rewards, stats, time.perf_counter() - ts
        G = self.cfg.train.group_size
        n_chunks = min(4, len(problems))
        size = -(-len(problems) // n_chunks)
        pending = []
        for c in range(0, len(problems), size):
            chunk = problems[c : c + size]
            ro_c = self._sample(chunk)
            flat = [p for p in chunk for _ in range(G)]
            pending.append((chunk, ro_c, submit_batch(self.task, flat, ro_c.texts(self.tok), workers=workers)))
        ts = time.perf_counter()
        parts, stats, n = [], {}, 0
        for chunk, ro_c, fut in pending:
            rw, st = fut.result()
            self._check_rewards(torch.tensor(rw, dtype=torch.float64), [p for p in chunk for _ in range(G)])
            parts.append((chunk, ro_c, torch.tensor(rw, dtype=torch.float32)))
            k = len(rw)
            for key, v in st.items():  # fractions and means: weighted by completions; counts: summed
                if isinstance(v, (int, float)):
                    w = k if key.endswith(("_frac", "/mean")) else 1
                    stats[key] = stats.get(key, 0.0) + w * v
            n += k
        for key in stats:
            if key.endswith(("_frac", "/mean")):
                stats[key] /= max(n, 1)
        wait = time.perf_counter() - ts
        _, ro, rewards = self._gather(parts, [(i, g) for i, part in enumerate(parts) for g in range(len(part[0]))])
        return ro, rewards, stats, wait

    def _rollout(self) -> dict:
        """Sample and score P groups; with dynamic sampling, replace zero-variance groups."""
        t, a = self.cfg.train, self.cfg.algo
        G = t.group_size
        t0 = time.perf_counter()
        t_score = 0.0
        problems = self._next_problems(t.prompts)
        ro, rewards, stats, wait = self._sample_and_score(problems)
        t_score += wait
        zero = adv_mod.zero_std_groups(rewards, G)
        info = {"rollout/frac_zero_std": float(zero.float().mean()), "rollout/refill_rounds": 0}
        if a.dynamic_sampling:
            parts = [(problems, ro, rewards)]
            keep = [(0, g) for g in range(t.prompts) if not zero[g]]
            spare = [(0, g) for g in range(t.prompts) if zero[g]]
            rounds = 0
            while len(keep) < t.prompts and rounds < a.max_refill_rounds:
                rounds += 1
                more = self._next_problems(t.prompts)
                ro2, r2, _, wait = self._sample_and_score(more)
                t_score += wait
                z2 = adv_mod.zero_std_groups(r2, G)
                parts.append((more, ro2, r2))
                keep += [(rounds, g) for g in range(t.prompts) if not z2[g]]
                spare += [(rounds, g) for g in range(t.prompts) if z2[g]]
            chosen = (keep + spare)[: t.prompts]
            problems, ro, rewards = self._gather(parts, chosen)
            info["rollout/refill_rounds"] = rounds
            info["rollout/frac_zero_std_after_refill"] = float(adv_mod.zero_std_groups(rewards, G).float().mean())
        info["time/sample_s"] = time.perf_counter() - t0 - t_score
        info["time/score_s"] = t_score
        info.update({k: v for k, v in stats.items() if k.startswith("reward/") and k != "reward/n"})
        return dict(problems=problems, rollout=ro, rewards=rewards, info=info)

    def _gather(self, parts, chosen):
        """Concatenate the chosen groups of several rollouts (padding them to one width)."""
        from gapo.sampling import Rollout

        G = self.cfg.train.group_size
        P = max(p[1].prompt_ids.shape[1] for p in parts)
        T = max(p[1].completion_ids.shape[1] for p in parts)
        pad = self.tok.pad_token_id

        def widen(x, width, left, value):
            extra = width - x.shape[1]
            if extra == 0:
                return x
            filler = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
            return torch.cat([filler, x] if left else [x, filler], dim=1)

        fields = {k: [] for k in ("prompt_ids", "prompt_mask", "completion_ids", "response_mask", "logp")}
        problems, rewards = [], []
        for part, g in chosen:
            probs, ro, rw = parts[part]
            rows = slice(g * G, (g + 1) * G)
            problems.append(probs[g])
            rewards.append(rw[rows])
            fields["prompt_ids"].append(widen(ro.prompt_ids[rows], P, True, pad))
            fields["prompt_mask"].append(widen(ro.prompt_mask[rows], P, True, 0))
            fields["completion_ids"].append(widen(ro.completion_ids[rows], T, False, pad))
            fields["response_mask"].append(widen(ro.response_mask[rows], T, False, 0))
            fields["logp"].append(widen(ro.logp[rows], T, False, 0.0))
        return problems, Rollout(**{k: torch.cat(v) for k, v in fields.items()}), torch.cat(rewards)

    def _logprobs(self, model, ids, attn, T):
        from gapo.sampling import logprobs

        return logprobs(model, ids, attn, T, temperature=self.cfg.sampling.temperature,
                        entropy_grad=bool(self.cfg.algo.entropy_coef))

    def train_step(self) -> dict:
        cfg, a, t = self.cfg, self.cfg.algo, self.cfg.train
        G = t.group_size
        t_step = time.perf_counter()
        batch = self._rollout()
        ro, rewards = batch["rollout"], batch["rewards"]
        rewards_d = rewards.to(self.device)
        t_upd = time.perf_counter()
        # focal scales by the group's success rate p̂, read on the configured reward range
        extra = {"reward_range": a.reward_range} if a.advantage == "focal" else {}
        advantages = adv_mod.compute(a.advantage, rewards_d, G, **a.advantage_params, **extra)
        eps_high = eps_high_for(a.eps_schedule, rewards_d, G, eps_low=a.eps_low, eps_high=a.eps_high,
                                reward_range=a.reward_range).to(self.device)
        success = adv_mod.group_success_count(rewards_d, G, reward_range=a.reward_range)
        ids, attn, mask = ro.input_ids, ro.attention_mask, ro.response_mask.float()
        T = ro.completion_ids.shape[1]
        level = "sequence" if a.loss == "gspo" else "token"
        B = ids.shape[0]
        mb = B // t.mini_batches
        ent_sum = None
        # Epoch 0's permutation is drawn before the behaviour log-probs (nothing between draws from
        # self.gen, so the random stream is unchanged). Its first mini-batch is then forwarded under
        # exactly the parameters of π_old, so its old_logp is that forward's logp.detach() (as
        # TRL does for num_iterations = 1): the separate no-grad pass covers only the other rows,
        # and none at all with one mini-batch. This is the same quantity, not an approximation.
        perm0 = torch.randperm(B, generator=self.gen, device=self.gen.device).to(self.device)
        reuse = a.old_logp == "recompute"
        with torch.no_grad():
            if reuse:
                old_logp = torch.zeros(mask.shape, dtype=torch.float32, device=self.device)
                ent_sum = 0.0
                rest = perm0[mb:]
                if rest.numel():
                    lp_rest, ent_rest = self._logprobs(self.model, ids[rest], attn[rest], T)
                    old_logp[rest] = lp_rest.float()
                    ent_sum = float((ent_rest * mask[rest]).sum())
            else:
                old_logp = ro.logp
            ref_logp = self._logprobs(self.ref_model, ids, attn, T)[0] if self.ref_model is not None else None

        loss_fn = LOSSES[a.loss]
        sums: dict[str, float] = {}
        counts: dict = {}
        n_updates = 0
        grad_norms = []
        for _epoch in range(t.epochs):
            perm = perm0 if _epoch == 0 else torch.randperm(B, generator=self.gen, device=self.gen.device).to(self.device)
            for i in range(t.mini_batches):
                rows = perm[i * mb : (i + 1) * mb]
                m = mask[rows]
                logp, ent = self._logprobs(self.model, ids[rows], attn[rows], T)
                if reuse and _epoch == 0 and i == 0:  # parameters still those of π_old (see above)
                    old_logp[rows] = logp.detach().float()
                    ent_sum += float((ent.detach() * m).sum())
                loss, metrics = loss_fn(logp, old_logp[rows], advantages[rows], m, eps_low=a.eps_low,
                                        eps_high=eps_high[rows], agg=a.agg, clip_ratio_c=a.clip_ratio_c)
                total = loss
                if ref_logp is not None:
                    d = ref_logp[rows] - logp
                    kl = -d if a.kl_estimator == "k1" else torch.exp(d) - d - 1.0
                    kl_term = agg_loss(kl, m, a.agg)
                    total = total + a.kl_coef * kl_term
                    metrics["loss/kl_ref"] = kl_term.detach()
                ent_term = agg_loss(ent, m, a.agg)
                if a.entropy_coef:
                    total = total - a.entropy_coef * ent_term
                if ent_sum is None and _epoch == 0:
                    sums["_ent_tok"] = sums.get("_ent_tok", 0.0) + float((ent.detach() * m).sum())
                self.opt.zero_grad(set_to_none=True)
                total.backward()
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
                if not torch.isfinite(gn):
                    raise FloatingPointError(f"non-finite gradient norm at step {self.step + 1}; "
                                             "lower optim.lr or check the rewards")
                self.opt.step()
                grad_norms.append(float(gn))
                metrics["loss/policy"] = loss.detach()
                metrics["loss/total"] = total.detach()
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n_updates += 1
                with torch.no_grad():
                    ratio = torch.exp(log_ratio(logp.detach(), old_logp[rows], m, level))
                    merge_counts(counts, clip_counts_by_c(ratio, advantages[rows], m, success[rows],
                                                          eps_low=a.eps_low, eps_high=eps_high[rows]))
        self.sched.step()
        self.step += 1

        n_tok = float(mask.sum())
        out = {"kind": "train", "step": self.step}
        out.update({k: v / n_updates for k, v in sums.items() if not k.startswith("_")})
        out["policy/entropy"] = (ent_sum if ent_sum is not None else sums.get("_ent_tok", 0.0)) / max(n_tok, 1.0)
        out["rollout/reward"] = float(rewards.mean())
        # a success reaches R_max; under a "group"/"batch" range, gapo's verifiers' 1.0 (Task.score)
        top = 1.0 if isinstance(a.reward_range, str) else a.reward_range[1]
        out["rollout/pass_rate"] = float((rewards >= top).float().mean())
        out["rollout/response_len"] = n_tok / B
        out["optim/lr"] = self.sched.get_last_lr()[0]
        out["optim/grad_norm"] = sum(grad_norms) / len(grad_norms)
        if (advantages > 0).any():
            out["clip/eps_high_pos_mean"] = float(eps_high[advantages > 0].mean())
        out.update(clip_stats_from_counts(counts))
        pos_tok = sum(f["pos_tokens"] for f in counts.values())
        out["clip/frac_high_pos"] = sum(f["pos_clipped"] for f in counts.values()) / pos_tok if pos_tok else 0.0
        out.update(batch["info"])
        out["time/update_s"] = time.perf_counter() - t_upd
        out["time/step_s"] = time.perf_counter() - t_step
        return out

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, *, progress: bool = False) -> dict:
        from gapo.evaluate import evaluate

        e = self.cfg.eval
        res = evaluate(self.model, self.tok, self.task, self.eval_problems, n=e.samples, temperature=e.temperature,
                       max_new_tokens=self.max_new_tokens, seed=e.seed, progress=progress)
        res.update(kind="eval", step=self.step)
        return res

    # ------------------------------------------------------------------ logging
    def log(self, record: dict) -> None:
        record = {k: _jsonable(v) for k, v in record.items()}
        self.folder.append_metrics(record)
        w = self._get_writers()
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step",)}
        if "tb" in w:
            for k, v in scalars.items():
                w["tb"].add_scalar(k, v, record["step"])
        if "wandb" in w:
            w["wandb"].log(scalars, step=record["step"])

    def _check_tracking(self) -> None:
        """A missing tracking package is an error before any work (and before the folder is written)."""
        try:
            if self.cfg.log.tensorboard:
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            if self.cfg.log.wandb:
                import wandb  # noqa: F401
        except ImportError as e:
            raise ValueError(f"log.tensorboard/log.wandb need their packages: pip install 'gapo[tracking]' ({e})") from e

    def _get_writers(self) -> dict:
        if self._writers is None:
            self._writers = {}
            self._check_tracking()
            if self.cfg.log.tensorboard:
                from torch.utils.tensorboard import SummaryWriter
            if self.cfg.log.wandb:
                import wandb
            if self.cfg.log.tensorboard:
                self._writers["tb"] = SummaryWriter(str(self.run_dir / "tb"))
            if self.cfg.log.wandb:
                wandb.init(project=self.cfg.log.wandb_project, dir=str(self.run_dir), config=to_dict(self.cfg))
                self._writers["wandb"] = wandb
        return self._writers

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        state = {
            "step": self.step, "pos": self.pos, "order": self.order, "pool_size": len(self.pool),
            "model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
            "py_rng": self.py_rng.getstate(), "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
            "config": to_dict(self.cfg), "policy_path": self.policy_path,
        }
        # atomic: a crash or a full disk leaves the previous checkpoint intact and no temporary file
        atomic_write(self.ckpt_path, lambda tmp: torch.save(state, tmp))

    def _restore(self, state: dict, changes: dict) -> None:
        """Load a checkpoint's state; config keys changed on resume are applied on top of it."""
        try:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.sched.load_state_dict(state["sched"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise ValueError(f"cannot resume: {str(self.ckpt_path)!r} does not fit the model at "
                             f"{str(self.policy_path)!r} ({e})") from None
        self.py_rng.setstate(state["py_rng"])
        self.gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        self.step, self.pos, self.order = state["step"], state["pos"], state["order"]
        if state.get("pool_size", len(self.pool)) != len(self.pool):  # resumed with other train.steps
            self.pool = self.task.generate("train", state["pool_size"], self.cfg.train.seed)
        if any(k.startswith("optim.") for k in changes):  # the optimiser state holds the old values
            o = self.cfg.optim
            self.sched.base_lrs = [o.lr for _ in self.opt.param_groups]
            factor = self.sched.lr_lambdas[0](self.sched.last_epoch)
            for g in self.opt.param_groups:
                g.update(initial_lr=o.lr, lr=o.lr * factor, betas=o.betas, weight_decay=o.weight_decay)
            self.sched._last_lr = [g["lr"] for g in self.opt.param_groups]

    def save_policy(self) -> Path:
        """``policy/`` written beside and swapped in, so a failed write keeps the previous one."""
        import shutil

        from gapo.model import save_policy

        final = self.run_dir / "policy"
        tmp = self.run_dir / f".policy.{os.getpid()}.tmp"
        old = self.run_dir / f".policy.{os.getpid()}.old"
        try:
            save_policy(self.model, self.tok, tmp)
            if final.exists():
                os.rename(final, old)
            os.rename(tmp, final)
        except OSError as e:
            if old.exists() and not final.exists():
                os.rename(old, final)
            raise OSError(e.errno, f"cannot write the policy to {str(final)!r}: {e.strerror or e}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        return final

    # ------------------------------------------------------------------ the loop
    def fit(self, *, stop_after: int | None = None) -> dict:
        """Train to ``train.steps`` (or ``stop_after`` more steps, then checkpoint and return)."""
        cfg, t = self.cfg, self.cfg.train
        e_every = cfg.eval.every
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum, frame):
            if self._stop:  # second signal: give up at once
                signal.signal(signum, old[signum])
                raise KeyboardInterrupt
            self._stop = True

        in_main = _main_thread()
        if in_main:
            for s in old:
                signal.signal(s, on_signal)
        bar = None
        last_eval = None
        try:
            self._get_writers()  # a missing tracking package fails here, before any work
            if self.step == 0 and self.eval_problems:
                last_eval = self.evaluate(progress=t.progress)
                self.log(last_eval)
            if t.progress:
                from tqdm.auto import tqdm
                bar = tqdm(total=t.steps, initial=self.step, desc=self.run_dir.name, unit="step", dynamic_ncols=True)
            start = self.step
            while self.step < t.steps:
                rec = self.train_step()
                self.log(rec)
                self.folder.settle()  # the new run is under way: the run it replaces can go
                if bar:
                    bar.update(1)
                    bar.set_postfix(reward=f"{rec['rollout/reward']:.3f}", clip=f"{rec.get('loss/clipfrac', 0):.3f}",
                                    kl=f"{rec.get('loss/approx_kl', 0):.1e}", ent=f"{rec['policy/entropy']:.2f}")
                done = self.step >= t.steps
                if self.eval_problems and (done or (e_every and self.step % e_every == 0)):
                    last_eval = self.evaluate()
                    self.log(last_eval)
                    if bar:
                        bar.write(f"step {self.step}: " + "  ".join(
                            f"{k[5:]}={v:.3f}" for k, v in last_eval.items() if k.startswith("eval/pass@")))
                stopping = self._stop or (stop_after is not None and self.step - start >= stop_after)
                if done or stopping or (t.checkpoint_every and self.step % t.checkpoint_every == 0):
                    self.save_checkpoint()
                if stopping and not done:
                    if bar:
                        bar.write(f"stopped at step {self.step}; checkpoint saved. Resume with --resume.")
                    break
            if self.step >= t.steps:
                self.save_policy()
            self.folder.settle()
        except BaseException:
            self.folder.abort()  # failed before its first step: put back the run it was replacing
            raise
        finally:
            if bar:
                bar.close()
            if in_main:
                for s, h in old.items():
                    signal.signal(s, h)
            for name, w in (self._writers or {}).items():
                if name == "tb":
                    w.close()
                elif name == "wandb":
                    w.finish()
            self._writers = None
        return {"step": self.step, "eval": last_eval, "stopped": self._stop}


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def build_task(cfg: Config):
    """The configured task; a constructor error (bad params, a missing or malformed dataset)
    becomes a ``ValueError`` that names the task and its params."""
    try:
        return tasks.get(cfg.task.name, **cfg.task.params)
    except ImportError as e:
        raise ValueError(f"task {cfg.task.name!r} needs an optional package: {e}") from None
    except (TypeError, ValueError, KeyError, OSError) as e:
        msg = str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
        raise ValueError(f"task {cfg.task.name!r} with task.params={cfg.task.params}: {msg}") from None


def check_context(model, tok, problems: list, max_new_tokens: int, *, key: str, where: str) -> None:
    """``max_new_tokens`` after the longest prompt fits the model's context (when it declares one)."""
    mc = model.config
    ctx = next((getattr(mc, k) for k in ("max_position_embeddings", "n_positions", "max_sequence_length")
                if isinstance(getattr(mc, k, None), int)), None)
    if ctx is None or not problems:
        return
    longest = max(len(ids) for ids in tok([p.prompt for p in problems]).input_ids)
    if longest + max_new_tokens > ctx:
        raise ValueError(f"{key}: {max_new_tokens} new tokens after a prompt of up to {longest} tokens exceed the "
                         f"model's context of {ctx} tokens ({where!r}); set sampling.max_new_tokens to at most "
                         f"{ctx - longest}")
