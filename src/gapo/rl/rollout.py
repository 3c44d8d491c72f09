"""Rollouts: sample G completions per prompt, score them, and hand the step one :class:`Batch`.

Every later stage of a step (advantages, GAPO's ε per rollout, the behaviour log-probs, the
updates, the diagnostics) reads the Batch; nothing is regrouped or re-merged downstream
(docs/design.md §4.2). Rewards are checked where they enter: finite, and inside
``algo.reward_range`` when that is a fixed range.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gapo.core.advantages import zero_std_groups
from gapo.exec.scoring import score_batch, submit_batch
from gapo.policy.sampling import Rollout

__all__ = [
    "Batch",
    "concat",
    "collect",
    "check_rewards",
    "probe_reward",
    "score",
    "merge_stats",
    "sample_records",
    "draw_problems",
    "problem_name",
]


@dataclass
class Batch:
    """P groups of G rollouts, groups contiguous (rows ``g·G … g·G+G−1`` share ``problems[g]``)."""

    problems: list  # (P,) one Problem per group
    rollout: Rollout  # prompt/completion tokens and masks, behaviour log-probs  (B, T)
    rewards: torch.Tensor  # (B,) float32, one verifier reward per rollout
    stats: dict = field(default_factory=dict)  # the verifier's outcome counts (gapo.exec.scoring)
    score_s: float = 0.0  # time spent waiting for the verifier (not overlapped with sampling)
    info: dict = field(default_factory=dict)  # rollout/* diagnostics (zero-variance groups, refills)
    texts: list = field(default_factory=list)  # (B,) the decoded completions the verifier scored

    @property
    def group_size(self) -> int:
        return self.rewards.numel() // len(self.problems)


def check_rewards(task_name: str, rewards: torch.Tensor, problems: list, reward_range) -> None:
    """Rewards are finite and, for a fixed ``reward_range``, inside it; else an error naming the
    task and the problem. ``problems[i]`` is the problem of ``rewards[i]``."""
    bad = ~torch.isfinite(rewards)
    if not isinstance(reward_range, str):
        bad |= (rewards < reward_range[0]) | (rewards > reward_range[1])
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        why = f"outside algo.reward_range {list(reward_range)}" if not isinstance(reward_range, str) else "not finite"
        raise ValueError(
            f"task {task_name!r} returned reward {float(rewards[i])!r} ({why}) for problem "
            f"{problems[i].prompt[:80]!r}; fix the verifier, or set algo.reward_range to its range "
            "(or 'group' for rewards on any scale)"
        )


def probe_reward(task, problems: list, reward_range) -> None:
    """Score an empty completion of each of ``problems``: a verifier that raises or returns a
    reward out of range fails here, before a run folder is touched."""
    rewards, _ = score_batch(task, problems, [""] * len(problems), workers=0)
    check_rewards(task.name, torch.tensor(rewards, dtype=torch.float64), problems, reward_range)


def score(task, problems: list, texts: list[str], *, group_size: int, workers: int, reward_range):
    """Rewards ``(B,)`` and the verifier's stats for the groups of ``problems``."""
    flat = [p for p in problems for _ in range(group_size)]
    rewards, stats = score_batch(task, flat, texts, workers=workers)
    check_rewards(task.name, torch.tensor(rewards, dtype=torch.float64), flat, reward_range)
    return torch.tensor(rewards, dtype=torch.float32), stats


def merge_stats(parts: list[tuple[int, dict]]) -> dict:
    """The verifier's stats of several scored chunks ``(n_completions, stats)`` as of one batch:
    counts (``reward/n``, ``reward/n_*``) add up, fractions and the mean are re-weighted."""
    if len(parts) == 1:
        return dict(parts[0][1])
    n = sum(k for k, _ in parts)
    out: dict = {}
    per_term: dict = {}  # reward/<term> (gapo.tasks.custom): a mean over reward/n_<term> completions

    def term_count(st, key):
        return st.get(key.replace("reward/", "reward/n_", 1)) if key.startswith("reward/") else None

    for k, st in parts:
        for key, v in st.items():
            if isinstance(v, (int, float)):
                m = term_count(st, key)
                w = m if m is not None else k if key.endswith(("_frac", "/mean")) else 1
                out[key] = out.get(key, 0.0) + w * v
                if m is not None:
                    per_term[key] = per_term.get(key, 0.0) + m
    for key in out:
        if key in per_term:
            out[key] /= max(per_term[key], 1)
        elif key.endswith(("_frac", "/mean")):
            out[key] /= max(n, 1)
    return out


def sample_and_score(
    problems: list,
    *,
    sample: Callable[[list], Rollout],
    texts: Callable[[Rollout], list[str]],
    pad_id: int,
    task,
    group_size: int,
    workers: int,
    reward_range,
) -> Batch:
    """Sample ``problems``' groups with ``sample`` and score them.

    With ``workers > 0`` (slow verifiers: math-verify, code in the sandbox) the groups are sampled
    in chunks and each chunk is scored in the worker pool while the next one is sampled; only the
    wait after the last chunk counts as scoring time.
    """
    if workers == 0:
        ro = sample(problems)
        ts = time.perf_counter()
        decoded = texts(ro)
        rewards, stats = score(task, problems, decoded, group_size=group_size, workers=0, reward_range=reward_range)
        return Batch(problems, ro, rewards, stats, time.perf_counter() - ts, texts=decoded)
    size = -(-len(problems) // min(4, len(problems)))
    pending = []
    for start in range(0, len(problems), size):
        chunk = problems[start : start + size]
        ro = sample(chunk)
        flat = [p for p in chunk for _ in range(group_size)]
        decoded = texts(ro)
        pending.append((chunk, ro, decoded, submit_batch(task, flat, decoded, workers=workers)))
    ts = time.perf_counter()
    parts, counted = [], []
    for chunk, ro, decoded, fut in pending:
        rewards, stats = fut.result()
        check_rewards(
            task.name,
            torch.tensor(rewards, dtype=torch.float64),
            [p for p in chunk for _ in range(group_size)],
            reward_range,
        )
        parts.append(Batch(chunk, ro, torch.tensor(rewards, dtype=torch.float32), texts=decoded))
        counted.append((len(rewards), stats))
    wait = time.perf_counter() - ts
    whole = concat(parts, [(i, g) for i, b in enumerate(parts) for g in range(len(b.problems))], pad_id=pad_id)
    whole.stats, whole.score_s = merge_stats(counted), wait
    return whole


def collect(
    draw: Callable[[], list],
    make: Callable[[list], Batch],
    *,
    n_groups: int,
    dynamic_sampling: bool,
    max_refill_rounds: int,
    pad_id: int,
) -> Batch:
    """One rollout batch of ``n_groups`` groups: ``make(draw())``; with DAPO's dynamic sampling,
    zero-variance groups (all rewards equal: no gradient) are replaced by groups of fresh draws,
    for at most ``max_refill_rounds`` rounds (then the remaining places keep zero-variance groups).
    The verifier's stats are those of the first draw."""
    t0 = time.perf_counter()
    first = make(draw())
    G = first.group_size
    zero = zero_std_groups(first.rewards, G)
    info = {"rollout/frac_zero_std": float(zero.float().mean()), "rollout/refill_rounds": 0}
    batch, score_s = first, first.score_s
    if dynamic_sampling:
        parts = [first]
        keep = [(0, g) for g in range(n_groups) if not zero[g]]
        spare = [(0, g) for g in range(n_groups) if zero[g]]
        rounds = 0
        while len(keep) < n_groups and rounds < max_refill_rounds:
            rounds += 1
            more = make(draw())
            score_s += more.score_s
            z = zero_std_groups(more.rewards, G)
            parts.append(more)
            keep += [(rounds, g) for g in range(n_groups) if not z[g]]
            spare += [(rounds, g) for g in range(n_groups) if z[g]]
        batch = concat(parts, (keep + spare)[:n_groups], pad_id=pad_id)
        batch.stats = first.stats
        info["rollout/refill_rounds"] = rounds
        info["rollout/frac_zero_std_after_refill"] = float(zero_std_groups(batch.rewards, G).float().mean())
    info["time/sample_s"] = time.perf_counter() - t0 - score_s
    info["time/score_s"] = score_s
    batch.score_s, batch.info = score_s, info
    return batch


def concat(parts: list[Batch], chosen: list[tuple[int, int]], *, pad_id: int) -> Batch:
    """The groups ``chosen`` (``(part, group)`` pairs) of several batches as one, padded to one
    width (prompts on the left, completions on the right)."""
    G = parts[0].group_size
    # widths in tokens (P in docs/design.md is the number of prompts, not this)
    prompt_len = max(b.rollout.prompt_ids.shape[1] for b in parts)
    completion_len = max(b.rollout.completion_ids.shape[1] for b in parts)

    def widen(x, width, left, value):
        extra = width - x.shape[1]
        if extra == 0:
            return x
        filler = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
        return torch.cat([filler, x] if left else [x, filler], dim=1)

    fields = {k: [] for k in ("prompt_ids", "prompt_mask", "completion_ids", "response_mask", "logp")}
    problems, rewards, texts = [], [], []
    for part, g in chosen:
        b = parts[part]
        rows = slice(g * G, (g + 1) * G)
        problems.append(b.problems[g])
        rewards.append(b.rewards[rows])
        texts += b.texts[rows]
        fields["prompt_ids"].append(widen(b.rollout.prompt_ids[rows], prompt_len, True, pad_id))
        fields["prompt_mask"].append(widen(b.rollout.prompt_mask[rows], prompt_len, True, 0))
        fields["completion_ids"].append(widen(b.rollout.completion_ids[rows], completion_len, False, pad_id))
        fields["response_mask"].append(widen(b.rollout.response_mask[rows], completion_len, False, 0))
        fields["logp"].append(widen(b.rollout.logp[rows], completion_len, False, 0.0))
    # the stop tokens and strings are the sampler's settings, the same for every part
    stops = {"eos_ids": parts[0].rollout.eos_ids, "stop": parts[0].rollout.stop}
    return Batch(
        problems, Rollout(**{k: torch.cat(v) for k, v in fields.items()}, **stops), torch.cat(rewards), texts=texts
    )


def sample_records(batch: Batch, step: int, n: int, render: Callable[[object], str]) -> list[dict]:
    """The first ``n`` rollouts of ``batch`` as ``samples.jsonl`` records: the exact prompt text
    the model read (``render(problem)``: after the chat template, a conversation whole), the
    completion, its reward and group."""
    G = batch.group_size
    return [
        {
            "step": step,
            "group": i // G,
            "prompt": render(batch.problems[i // G]),
            "completion": batch.texts[i],
            "reward": float(batch.rewards[i]),
        }
        for i in range(min(n, len(batch.texts)))
    ]


def problem_name(problem) -> str:
    """Where a problem came from, for messages: ``file:line`` (JSONL), ``file row N``, its
    ``task_id``, or the start of its prompt."""
    meta = getattr(problem, "meta", None) or {}
    if meta.get("source") is not None and meta.get("line") is not None:
        src = str(meta["source"])
        jsonl = src.lower().removesuffix(".gz").endswith((".jsonl", ".ndjson"))
        return f"{src}:{meta['line']}" if jsonl else f"{src} row {meta['line']}"
    if meta.get("task_id") is not None:
        return f"problem {meta['task_id']!r}"
    return f"the problem {problem.prompt[:60]!r}"


def draw_problems(
    task, encoder, split: str, n: int, seed: int, max_tokens: int | None, *, key: str = "task.max_prompt_tokens"
) -> tuple[list, dict | None]:
    """``(problems, info)``: ``task.generate(split, n, seed)`` without the prompts longer than
    ``max_tokens`` tokens (``encoder.ids``: after the chat template; ``encoder.check`` first: a
    conversation the template cannot render whole stops here, naming its row). A dataset task (one with
    ``split_size``) is filtered whole, so the run still gets ``n`` problems where the split has
    them (training cycles through the kept ones, as ``generate`` does; with nothing dropped the
    problems are exactly ``generate``'s); a generated task has its ``n`` problems filtered.
    ``info``: ``{split}_dropped`` and ``{split}_prompts`` (distinct prompts), None without a limit.
    A split left empty is an error naming ``key``."""
    if max_tokens is None or n == 0:
        drawn = task.generate(split, n, seed) if n else []
        encoder.check(drawn, problem_name)
        return drawn, None
    whole = getattr(task, "split_size", None)
    drawn = task.generate(split, whole(split), seed) if whole is not None else task.generate(split, n, seed)
    encoder.check(drawn, problem_name)
    lengths = {encoder.key(p): len(encoder.ids(p)) for p in drawn}
    long = {q for q, k in lengths.items() if k > max_tokens}
    kept = [p for p in drawn if encoder.key(p) not in long]
    if not kept:
        what = "training" if split == "train" else f"{split!r} (set eval.problems=0 to skip evaluation)"
        raise ValueError(
            f"{key}: {max_tokens} drops every {what} prompt (the shortest has "
            f"{min(lengths.values())} tokens after the chat template); raise it"
        )
    if split == "train":
        kept = (kept * -(-n // len(kept)))[:n]
    else:
        kept = kept[:n]
    return kept, {f"{split}_dropped": len(long), f"{split}_prompts": len(lengths)}
