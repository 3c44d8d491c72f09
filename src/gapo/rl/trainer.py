"""The RLVR loop — the only stateful module of gapo (docs/design.md §4).

One step, in the order of ``train_step``: draw P prompts → sample G rollouts each and score
them (one ``Batch``) → advantages and GAPO's per-rollout ε_high from the raw group rewards →
behaviour log-probs → E epochs × M mini-batch optimiser steps of the chosen surrogate →
diagnostics. Every formula is a call into ``gapo.core``. ``Trainer`` holds the run's state; the
pieces it calls sit beside it: ``rl.problems`` (the pools and the order they are visited in),
``rl.update`` (the update's data and loss), ``rl.optimizer`` (AdamW, warm-up, the clipped step),
``rl.step_metrics`` (a step's record) and ``rl.checkpoint`` (the trainable state, ``policy/``).

Runs survive: metrics go to ``<run>/metrics.jsonl`` (one JSON object a line, ``kind`` = train |
eval), checkpoints are written atomically to ``<run>/checkpoint.pt`` (model, optimiser,
scheduler, every RNG state, step and data position), ``resume=True`` continues bit for bit on
CPU, and SIGINT/SIGTERM finish the current step, checkpoint and exit cleanly. The run-folder
rules are in ``gapo.rl.run_dir``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from gapo import tasks
from gapo.core.advantages import compute as compute_advantages
from gapo.core.advantages import success_count
from gapo.core.metrics import RATIO_ADV_WINDOW, ratio_adv_corr, ratio_adv_pairs
from gapo.exec.scoring import UserCodeError, verifier_failure_warning
from gapo.machine.allocator import tune_malloc
from gapo.machine.threads import default_threads
from gapo.policy import lora
from gapo.policy.base_policy import base_task_params, resolve_policy
from gapo.policy.chat import PromptEncoder
from gapo.policy.logprobs import logprobs
from gapo.policy.model import check_context, check_memory, eos_token_ids, load_policy
from gapo.policy.precision import autocast, grad_scaler
from gapo.policy.sampling import SamplingParams, sample
from gapo.rl import checkpoint, optimizer, problems, rollout, update
from gapo.rl.config import Config, to_dict
from gapo.rl.evaluate import EvalPlan, eval_params, evaluate, pass_line
from gapo.rl.resume import resume_changes
from gapo.rl.run_dir import RunExists, RunFolder
from gapo.rl.signals import stop_on_signals
from gapo.rl.step_metrics import gpu_memory, step_metrics, truncated
from gapo.rl.trackers import Trackers
from gapo.tasks.custom import with_rewards

__all__ = ["Trainer", "RunExists", "with_policy", "trained_policy"]


def with_policy(cfg: Config, *, progress: bool = True) -> tuple[Config, str]:
    """``(cfg', policy_path)``: the run's policy resolved (``policy.base_policy.resolve_policy``:
    the embedded preset's weights are built now, with a message and a progress bar, if they are
    neither cached nor shipped) and ``cfg'`` a copy of ``cfg`` carrying the preset's RL task params
    when it had none. ``cfg`` itself is left as it was (docs/design.md §3.2); idempotent. The
    command layer calls it before a :class:`Trainer` exists, which never resolves a policy."""
    res = resolve_policy(
        cfg.model.path, cfg.model.base_preset, task_name=cfg.task.name, task_params=cfg.task.params, progress=progress
    )
    if res.task_params is None:
        return cfg, res.path
    # shallow copies: a Config carries the file and line of each key (_sources), which
    # dataclasses.replace would drop
    out = copy.copy(cfg)
    out.task = copy.copy(cfg.task)
    out.task.params = res.task_params
    return out, res.path


def trained_policy(cfg: Config, policy_path: str | None) -> str:
    """What a :class:`Trainer` of ``cfg`` trains: ``model.path``, or the ``policy_path`` that
    :func:`with_policy` resolved. An unresolved embedded policy is refused, not built here: a
    constructor does no hidden work (building a preset takes minutes)."""
    if cfg.model.path is not None:
        if policy_path is not None and str(policy_path) != str(cfg.model.path):
            raise ValueError(f"policy_path={policy_path!r} but model.path={cfg.model.path!r}: give one of them")
        return str(cfg.model.path)
    if policy_path is None or base_task_params(None, cfg.task.name, cfg.task.params, cfg.model.base_preset):
        raise ValueError(
            f"model.path is unset, so the run trains the embedded base policy model.base_preset="
            f"{cfg.model.base_preset!r}, which a Trainer does not resolve: first "
            "cfg, policy_path = gapo.rl.trainer.with_policy(cfg) (it builds the preset if it is not cached), "
            "then Trainer(cfg, run_dir, policy_path=policy_path)"
        )
    return str(policy_path)


def _permutation(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """A permutation of ``n`` rows drawn from the trainer's stream ``gen`` (mini-batch order)."""
    return torch.randperm(n, generator=gen, device=gen.device).to(device)


class Trainer:
    """``Trainer(cfg, run_dir).fit()``; see the module docstring.

    Construction validates everything (config, task, model, device, a probe of the reward
    function, the run folder's state, the checkpoint when resuming) before anything is written.
    It trains ``model.path``, or with ``model.path`` unset the ``policy_path`` that
    :func:`with_policy` resolved with ``cfg`` (:func:`trained_policy`); it builds no base policy.
    ``resume=True`` needs ``cfg`` equal to the run's saved config; with ``allow_change=True`` the
    differing keys are applied, written to ``config.yaml`` and logged to ``events.jsonl``.
    """

    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path | RunFolder,
        *,
        policy_path: str | None = None,
        resume: bool = False,
        overwrite: bool = False,
        allow_change: bool = False,
    ):
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other")
        # the folder's lock (run_lock.RunLock) is held from the check to the end of fit(); a
        # RunFolder passed in already locked stays the caller's to release
        self.folder = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
        self._own_lock = not self.folder.lock.held
        self.run_dir, self.ckpt_path = self.folder.path, self.folder.checkpoint
        try:
            self.folder.check(resume=resume, overwrite=overwrite)  # locks an existing folder before reading it
            self.cfg = cfg = cfg.validate()
            self.policy_path = trained_policy(cfg, policy_path)
            state = self.folder.load_checkpoint(torch.device(cfg.model.device)) if resume else None
            # against the config inside the checkpoint: a hand-edited config.yaml counts as a change
            changes = resume_changes(self.folder, cfg, allow_change=allow_change, state=state) if resume else {}
            if state is not None and state["step"] >= cfg.train.steps:
                if checkpoint.policy_written(self.run_dir, state["step"]):
                    raise ValueError(
                        f"run {str(self.run_dir)!r} is finished (step {state['step']} of train.steps="
                        f"{cfg.train.steps}); nothing to resume. To train it further: --resume --allow-change "
                        f"train.steps={state['step'] * 2 or 1}; for a model out of it: gapo export "
                        f"{str(self.run_dir)}"
                    )
            # a resumed run keeps the thread count it ran with: floats depend on it in the last bits
            self._build(cfg, threads=state.get("threads") if state is not None else None)
            if state is not None:
                self._restore(state, changes)
            self._open_folder(resume, overwrite, changes)  # everything has validated: only now is it written
        except BaseException:
            if self._own_lock:
                self.folder.release()
            raise

    # ------------------------------------------------------------------ set-up
    def _build(self, cfg: Config, *, threads: int | None = None) -> None:
        """Task, policy, optimiser, problem pools and random streams; then the checks that need
        them (context length, a probe of the verifier, tracking packages). Writes nothing."""
        m, t = cfg.model, cfg.train
        if m.device == "cpu" or m.threads is not None:  # null on CPU: measured once per machine (machine/threads.py)
            torch.set_num_threads(m.threads or threads or default_threads())
        if m.device == "cpu" and m.malloc_tuning:  # no page faults for each step's activations
            tune_malloc()
        self.device = torch.device(m.device)
        torch.manual_seed(t.seed)
        self.task = tasks.build(cfg.task.name, cfg.task.params)
        self.model, self.tok, self.eos_ids, self.ref_model = _load_models(
            self.policy_path, self.device, m, cfg.algo.kl_coef
        )
        self.encoder = PromptEncoder(
            self.tok,
            chat=cfg.task.chat,
            system_prompt=cfg.task.system_prompt,
            chat_template_kwargs=cfg.task.chat_template_kwargs,
        )
        self.scaler = grad_scaler(self.device, m.dtype)
        self.opt, self.sched = optimizer.build(self.model, cfg.optim, self.device, total_steps=t.steps)
        self.max_new_tokens = cfg.sampling.max_new_tokens or self.task.max_completion_len + 1  # + EOS
        update.check_overlong(cfg.algo, self.max_new_tokens, key=cfg._where("algo.overlong_buffer"))
        # the pool is what the run will visit (at most prompts × steps problems); over-long prompts
        # (task.max_prompt_tokens) leave both pools before anything is sampled
        self.pool, self.eval_problems, self.filtered = problems.draw_run(self.task, self.encoder, cfg)
        # --reward: the task scored by the user's functions (imported and checked here, probed below)
        r = cfg.reward
        self.task = with_rewards(
            self.task,
            r.funcs,
            r.weights,
            r.ranges,
            probe=self.pool[0],
            reward_range=cfg.algo.reward_range,
            timeout_s=r.timeout_s,
            workers=max(1, cfg.task.scoring_workers),
        )
        derived = getattr(cfg, "_sources", {}).get("algo.reward_range", "")
        if derived.startswith("derived"):  # R's range, from the rewards (config.yaml records it)
            print(f"[gapo] algo.reward_range={list(cfg.algo.reward_range)}, {derived}", file=sys.stderr)
        # (gapo's decoder fast path turns itself off for adapters and gradient checkpointing)
        train_len, eval_len, longest = problems.prompt_lengths(self.encoder, self.pool, self.eval_problems)
        key, where = cfg._where("sampling.max_new_tokens"), str(self.policy_path)
        check_context(self.model, train_len + eval_len, self.max_new_tokens, key=key, where=where, longest=longest)
        longest_row = max(train_len, default=0) + self.max_new_tokens
        check_memory(self.model, self.device, t.prompts * t.group_size, longest_row, where=where)
        rollout.probe_reward(self.task, self.pool[:1] + self.eval_problems[:1], cfg.algo.reward_range)
        self.trackers = Trackers(cfg, self.run_dir)
        self.trackers.check()
        self.gen = torch.Generator(device=self.device).manual_seed(t.seed)
        self.order = problems.ProblemOrder(len(self.pool), t.seed)  # passes over the pool, reshuffled
        self.step = 0
        self._stop = False
        self.last_samples: list[dict] = []
        # the last steps' per-c (|ρ−1|, A) of positive-advantage tokens: clip/ratio_adv_corr's window
        self.ratio_adv_window: collections.deque = collections.deque(maxlen=RATIO_ADV_WINDOW)

    def _open_folder(self, resume: bool, overwrite: bool, changes: dict) -> None:
        # room for one checkpoint before anything is written (an --overwrite keeps the old run until then)
        self._ckpt_bytes = checkpoint.size(self.model)
        # and for the checkpoints it keeps (train.keep_checkpoints), less a resumed run's own
        key = self.cfg._where("train.keep_checkpoints")
        checkpoint.check_room(self.folder, self._ckpt_bytes, self.cfg.train.keep_checkpoints, resume=resume, key=key)
        if not resume:
            self.folder.open(overwrite=overwrite)
            try:
                self.folder.write_config(to_dict(self.cfg))
                problems.log_filtered(self.folder, self.filtered, self.step)
            except BaseException:
                self.folder.abort()
                raise
            return
        self.folder.truncate_logs(self.step)
        problems.log_filtered(self.folder, self.filtered, self.step)
        if changes:
            self.folder.write_config(to_dict(self.cfg))
            self.folder.log_event(
                {
                    "event": "resume",
                    "step": self.step,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "changed": {k: {"old": a, "new": b} for k, (a, b) in changes.items()},
                }
            )
            print(
                f"[gapo] resumed {str(self.run_dir)!r} at step {self.step} with changes: "
                + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items()),
                file=sys.stderr,
            )

    # ------------------------------------------------------------------ one RL step
    def train_step(self) -> dict:
        """One RL step, in the order of the algorithm (docs/design.md §4.2)."""
        a, G = self.cfg.algo, self.cfg.train.group_size
        t_step = time.perf_counter()
        batch = self._rollout()  # 1. P groups of G rollouts, sampled and scored
        t_update = time.perf_counter()
        rewards = batch.rewards.to(self.device)
        # 2. advantages from the rewards (any estimator; + DAPO's overlong term); GAPO's ε_high(i) from
        #    the *raw* group rewards, so it composes with every estimator; c = successes in each group
        shaped, rr, overlong = update.advantage_rewards(rewards, batch.rollout.lengths, a, self.max_new_tokens)
        advantages = compute_advantages(a.advantage, shaped, G, reward_range=rr, **a.advantage_params)
        eps_high = update.rollout_eps_high(a, rewards, G)  # None under BAPO/DCPO: set per micro-batch
        c = success_count(rewards, G, reward_range=a.reward_range)
        # 3. the update batch: + log π_old (epoch 0's mini-batch order is drawn first: see
        #    _update_batch) and log π_ref
        perm0 = _permutation(rewards.numel(), self.gen, self.device)
        ub, old = self._update_batch(batch, advantages, eps_high, c, perm0)
        ub.overlong = overlong
        # 4. E epochs × M mini-batches × micro-batches of forward → loss → backward, then clip → step
        stats = self._update(ub, old, perm0)
        self.sched.step()
        self.step += 1
        # 5. diagnostics, and a few rows of what was trained on (samples.jsonl)
        self.last_samples = rollout.sample_records(batch, self.step, self.cfg.log.samples, self.encoder.text)
        now = time.perf_counter()
        metrics = {
            **step_metrics(
                batch,
                ub,
                stats,
                step=self.step,
                lr=self.sched.get_last_lr()[0],
                reward_range=a.reward_range,
                max_new_tokens=self.max_new_tokens,
                tokenizer=self.tok,
            ),
            **gpu_memory(self.device),
            "time/update_s": now - t_update,
            "time/step_s": now - t_step,
        }
        failure = verifier_failure_warning(batch.stats, batch.rewards.tolist())
        if failure:  # all-zero rewards that are the verifier's failures, not wrong answers
            print(f"[gapo] warning: step {self.step}: {failure}", file=sys.stderr)
        self.ratio_adv_window.append(ratio_adv_pairs(metrics))  # the paper's diagnostic (§2.11)
        return {**metrics, **ratio_adv_corr(self.ratio_adv_window)}

    def _checkpointed(self, work):
        """``work()`` (a step or an evaluation: both score with the user's reward functions); a
        :class:`UserCodeError` in it (a reward that raised, exited or returned what is not a reward)
        first checkpoints the run as it was before ``work`` (the model and optimiser change only
        after scoring; the random streams are put back), so that it resumes once the reward is
        fixed, then goes on, naming the step and how to resume (the CLI: one error line, exit 2)."""
        streams = self.gen.get_state(), torch.get_rng_state(), self.order.state_dict()
        try:
            return work()
        except UserCodeError as e:
            self.gen.set_state(streams[0])
            torch.set_rng_state(streams[1])
            self.order.load_state_dict(streams[2])
            if self.step == 0 and self.folder.replacing:  # nothing trained: fit() puts the replaced run back
                raise UserCodeError(
                    f"{e}; nothing was trained, and the run --overwrite was replacing is put back"
                ) from e
            self.save_checkpoint()
            raise UserCodeError(
                f"{e}; the run stopped at step {self.step} and is checkpointed: once the reward is fixed, "
                f"gapo train --out {shlex.quote(str(self.run_dir))} --resume"
            ) from e

    def _rollout(self) -> rollout.Batch:
        t, a = self.cfg.train, self.cfg.algo
        make = lambda problems: rollout.sample_and_score(  # noqa: E731
            problems,
            sample=self._sample,
            texts=lambda ro: ro.texts(self.tok),
            pad_id=self.tok.pad_token_id,
            task=self.task,
            group_size=t.group_size,
            workers=self.cfg.task.scoring_workers,
            reward_range=a.reward_range,
        )
        return rollout.collect(
            lambda: self.order.next(self.pool, t.prompts),
            make,
            n_groups=t.prompts,
            dynamic_sampling=a.dynamic_sampling,
            max_refill_rounds=a.max_refill_rounds,
            pad_id=self.tok.pad_token_id,
        )

    def _sample(self, problems: list):
        G, s = self.cfg.train.group_size, self.cfg.sampling
        prompts = [self.encoder.ids(p) for p in problems for _ in range(G)]
        self.model.eval()
        with autocast(self.device, self.cfg.model.dtype):
            ro = sample(
                self.model,
                prompts,
                params=SamplingParams(**(vars(s) | {"max_new_tokens": self.max_new_tokens}), eos_token_id=self.eos_ids),
                pad_token_id=self.tok.pad_token_id,
                tokenizer=self.tok,
                generator=self.gen,
            )
        self.model.train()
        return ro

    def _logprobs(self, model, batch, rows=None):
        """Token log-probs and entropies ``(B, T)`` of the batch's completions (or ``rows`` of it),
        in float32 whatever the compute dtype."""
        ro, T = batch.rollout, batch.rollout.completion_ids.shape[1]
        ids, attn = (ro.input_ids, ro.attention_mask) if rows is None else (ro.input_ids[rows], ro.attention_mask[rows])
        with autocast(self.device, self.cfg.model.dtype):
            lp, ent = logprobs(
                model,
                ids,
                attn,
                T,
                temperature=self.cfg.sampling.temperature,
                entropy_grad=bool(self.cfg.algo.entropy_coef),
            )
        return lp.float(), ent.float()

    def _update_batch(self, batch, advantages, eps_high, c, perm0) -> tuple[update.UpdateBatch, update.OldPolicy]:
        """The update's data, built before the first epoch, with log π_old and log π_ref.

        ``algo.old_logp=sampler`` takes the sampler's log-probs. Under ``recompute`` every row's
        old log-probs are pending until its first forward (``OldPolicy.first_forward``), which is
        under π_old's parameters: here, without gradient, for every row but epoch 0's first
        mini-batch (``perm0``'s first ``B // M``), and for those the update's own first forward
        (nothing has stepped yet) — one forward fewer, none with one mini-batch (docs/design.md §4.3).
        """
        ro, mask = batch.rollout, batch.rollout.response_mask.float()
        recompute, first = self.cfg.algo.old_logp == "recompute", mask.shape[0] // self.cfg.train.mini_batches
        old_logp = torch.zeros(mask.shape, dtype=torch.float32, device=self.device) if recompute else ro.logp
        cut = truncated(ro, self.max_new_tokens, self.tok) if self.cfg.algo.mask_truncated else None
        ub = update.UpdateBatch(ro, update.loss_mask(mask, cut), advantages, eps_high, c)  # π_old: every row's mask
        old = update.OldPolicy(old_logp, mask, pending=perm0 if recompute else perm0[:0])
        rest = perm0[first:] if recompute else perm0[:0]
        if rest.numel():
            with torch.no_grad():
                old.first_forward(rest, *self._logprobs(self.model, ub, rest))
        if self.cfg.algo.kl_coef != 0:  # log π_ref; with LoRA π_ref is the network with its adapters off
            lora_ref = self.ref_model is None
            with torch.no_grad(), lora.reference(self.model) if lora_ref else contextlib.nullcontext():
                ub.ref_logp = self._logprobs(self.model if lora_ref else self.ref_model, batch)[0]
        return ub, old

    def _update(self, ub: update.UpdateBatch, old: update.OldPolicy, perm0: torch.Tensor) -> update.UpdateStats:
        """E epochs × M mini-batch optimiser steps; a mini-batch's gradient is accumulated over its
        micro-batches (``train.micro_batch_size``), each loss normalised by the whole mini-batch."""
        t, o, s = self.cfg.train, self.cfg.optim, update.LossSettings.from_algo(self.cfg.algo)
        B = ub.mask.shape[0]
        mb = B // t.mini_batches
        size = update.micro_batch_rows(t.micro_batch_size, ub.mask.shape[1], self.model.config.vocab_size)
        stats = update.UpdateStats()
        for epoch in range(t.epochs):
            perm = perm0 if epoch == 0 else _permutation(B, self.gen, self.device)
            for rows in perm[: t.mini_batches * mb].split(mb):
                subs = update.micro_batches(rows, size)
                norms = update.minibatch_norms(ub.mask[rows], ub.mask.shape[1], split=len(subs) > 1)
                self.opt.zero_grad(set_to_none=True)
                for sub in subs:
                    logp, ent = self._logprobs(self.model, ub, sub)
                    micro = ub.rows(sub, old.first_forward(sub, logp, ent))  # + log π_old (§4.3)
                    loss, metrics, counts = update.micro_batch_loss(logp, ent, micro, s, norms)
                    optimizer.backward(loss, self.scaler)
                    share = update.token_share(micro.mask, ub.mask[rows], norms)
                    stats.add(metrics, counts, share)
                stats.end_update(optimizer.step(self.model, self.opt, self.scaler, o.grad_clip, step=self.step + 1))
        stats.entropy_sum = old.entropy_sum
        return stats

    # ------------------------------------------------------------------ evaluation, logging
    def evaluate(self, *, progress: bool = False) -> dict:
        e = self.cfg.eval
        with autocast(self.device, self.cfg.model.dtype):
            res = evaluate(
                self.model,
                self.tok,
                self.task,
                self.eval_problems,
                params=eval_params(self.cfg, self.max_new_tokens, self.eos_ids),
                plan=EvalPlan(n=e.samples, seed=e.seed),
                progress=progress,
                encode=self.encoder.ids,
            )
        res.update(kind="eval", step=self.step)
        return res

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        state = {
            "step": self.step,
            **self.order.state_dict(),  # pos, order, py_rng
            "pool_size": len(self.pool),
            # with LoRA only the adapters train: the checkpoint holds them, the base stays on disk
            "model": checkpoint.trainable_state(self.model),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
            "gen": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "config": to_dict(self.cfg),
            "policy_path": self.policy_path,
            "threads": torch.get_num_threads(),
            "ratio_adv_window": list(self.ratio_adv_window),
        }
        # atomic: a crash or a full disk leaves the previous checkpoint intact and no temporary file;
        # the first one settles an --overwrite (the run it replaces is deleted only now); then kept
        # as checkpoints/step-<step>.pt with train.keep_checkpoints > 1
        checkpoint.save(self.folder, state, need=self._ckpt_bytes, keep=self.cfg.train.keep_checkpoints)

    def _restore(self, state: dict, changes: dict) -> None:
        """Load a checkpoint's state; config keys changed on resume are applied on top of it."""
        t = self.cfg.train
        checkpoint.load_trainable(
            self.model, self.opt, self.sched, state, ckpt_path=self.ckpt_path, policy_path=self.policy_path
        )
        self.order.load_state_dict(state)
        self.gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        self.step = state["step"]
        self.ratio_adv_window.extend(state.get("ratio_adv_window", []))
        if state.get("pool_size", len(self.pool)) != len(self.pool):  # resumed with other train.steps
            self.pool, _ = problems.draw(self.task, self.encoder, self.cfg, "train", state["pool_size"], t.seed)
        # the optimiser state holds the old values; the schedule's length is train.steps
        if any(k.startswith("optim.") or k == "train.steps" for k in changes):
            optimizer.apply_changes(self.opt, self.sched, self.cfg.optim)

    def save_policy(self) -> Path:
        """``policy/`` written beside and swapped in, so a failed write keeps the previous one."""
        return checkpoint.write_policy(
            self.run_dir, self.model, self.tok, self.step, ckpt_bytes=self._ckpt_bytes, ckpt_path=self.ckpt_path
        )

    # ------------------------------------------------------------------ the loop
    def fit(self, *, stop_after: int | None = None) -> dict:
        """Train to ``train.steps`` (or ``stop_after`` more steps, then checkpoint and return)."""
        t, e_every = self.cfg.train, self.cfg.eval.every
        bar, last_eval = None, None

        def log(record: dict) -> None:  # metrics.jsonl, and its TensorBoard / W&B mirrors
            self.folder.append_metrics(record)
            self.trackers.log(record)

        self.folder.reacquire()  # a second fit() of this trainer: the lock again, if the run is as it left it
        try:
            with stop_on_signals(lambda: setattr(self, "_stop", True)):  # finish the step, checkpoint, return
                if self.step == 0 and self.eval_problems:
                    last_eval = self._checkpointed(lambda: self.evaluate(progress=t.progress))
                    log(last_eval)
                bar = _step_bar(t, self.step, self.run_dir.name)
                say = bar.write if t.progress else (lambda _: None)
                start = self.step
                while self.step < t.steps:
                    rec = self._checkpointed(self.train_step)
                    log(rec)
                    self.folder.append_samples(self.last_samples)
                    bar.update(1)
                    self.trackers.log_samples(self.step, self.last_samples)  # TB text / W&B table
                    bar.set_postfix(_postfix(rec))
                    done = self.step >= t.steps
                    if self.eval_problems and (done or (e_every and self.step % e_every == 0)):
                        last_eval = self._checkpointed(self.evaluate)
                        log(last_eval)
                        say(_pass_line(self.step, last_eval))
                    stopping = self._stop or (stop_after is not None and self.step - start >= stop_after)
                    if done or stopping or (t.checkpoint_every and self.step % t.checkpoint_every == 0):
                        self.save_checkpoint()
                    if stopping and not done:
                        say(
                            f"stopped at step {self.step}; checkpoint saved. Resume: gapo train --out "
                            f"{shlex.quote(str(self.run_dir))} --resume"
                        )
                        break
                if self.step >= t.steps:
                    if self.step == start:  # extended to its own step: no step taken, the config changed
                        self.save_checkpoint()
                    self.save_policy()
                self.folder.settle()
        except BaseException:
            self.folder.abort()  # failed before its first checkpoint: put back the run it was replacing
            raise
        finally:
            if bar is not None:
                bar.close()
            self.trackers.close()
            if self._own_lock:
                self.folder.release()
        # a signal that lands after the last step (while the policy is written) stops nothing: the run is
        # finished, and a caller that read "stopped" would leave a finished run to be resumed
        return {"step": self.step, "eval": last_eval, "stopped": self._stop and self.step < t.steps}


def _load_models(path, device: torch.device, m, kl_coef: float):
    """``(model, tokenizer, stop ids, reference model or None)``: the policy to train, in training
    mode, with gradient checkpointing and LoRA adapters as ``model.*`` asks."""
    # float32 weights whatever the checkpoint's dtype; model.dtype is the compute dtype (autocast)
    model, tok = load_policy(path, device, dtype=torch.float32)
    # stop at the tokenizer's EOS and at every id of generation_config.eos_token_id
    eos_ids = eos_token_ids(model, tok)
    if m.gradient_checkpointing:  # activations of each decoder layer recomputed in backward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if m.lora:
        model = lora.apply_lora(model, m.lora)
    model.train()
    # the reference policy of the KL term is the starting policy, frozen (with LoRA: the same
    # network with its adapters disabled, so no second copy)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if kl_coef > 0 and not m.lora else None
    return model, tok, eos_ids, ref_model


def _step_bar(t, step: int, name: str) -> tqdm:
    """``fit``'s progress bar over ``train.steps`` (silent without ``train.progress``)."""
    return tqdm(total=t.steps, initial=step, desc=name, unit="step", dynamic_ncols=True, disable=not t.progress)


def _postfix(rec: dict) -> dict[str, str]:
    """A step's record on the progress bar: reward, clip fraction, approximate KL, entropy."""
    return {
        "reward": f"{rec['rollout/reward']:.3f}",
        "clip": f"{rec.get('loss/clipfrac', 0):.3f}",
        "kl": f"{rec.get('loss/approx_kl', 0):.1e}",
        "ent": f"{rec['policy/entropy']:.2f}",
    }


def _pass_line(step: int, ev: dict) -> str:
    """An evaluation's pass@k values, the line printed above the bar."""
    return f"step {step}: {pass_line(ev)}"
