"""A run's problems (docs/design.md §4.1, §4.2): drawn once at set-up, and the order in which
the training pool is visited.

``draw_run`` draws the training pool (at most ``prompts × steps`` distinct problems: generating
and solving instances is not free) and the held-out evaluation problems, dropping prompts longer
than ``task.max_prompt_tokens`` after the chat template (``rollout.draw_problems``).
``ProblemOrder`` hands out the pool in passes, each a fresh shuffle by its own
``random.Random(train.seed)``, so the data order is a function of the seed and is checkpointed
with it. Nothing here touches the run folder except ``log_filtered``, which records what the
prompt filter dropped.
"""

from __future__ import annotations

import random
import sys

from gapo.rl import rollout

__all__ = ["draw", "draw_run", "prompt_lengths", "log_filtered", "ProblemOrder"]


def draw(task, encoder, cfg, split: str, n: int, seed: int) -> tuple[list, dict | None]:
    """``n`` problems of ``split`` (``rollout.draw_problems`` under the run's prompt limit)."""
    return rollout.draw_problems(
        task, encoder, split, n, seed, cfg.task.max_prompt_tokens, key=cfg._where("task.max_prompt_tokens")
    )


def draw_run(task, encoder, cfg) -> tuple[list, list, dict | None]:
    """``(pool, eval_problems, filtered)``: the training pool, the evaluation problems and, under
    ``task.max_prompt_tokens``, what the filter dropped (``None`` without a limit)."""
    t = cfg.train
    # never more than prompts × steps (passes over it are reshuffled; dynamic sampling wraps)
    pool, dropped = draw(task, encoder, cfg, "train", max(1, min(cfg.task.train_size, t.prompts * t.steps)), t.seed)
    eval_problems, eval_dropped = draw(task, encoder, cfg, "eval", cfg.eval.problems, cfg.eval.seed)
    if dropped is None:
        return pool, eval_problems, None
    filtered = {
        "max_prompt_tokens": cfg.task.max_prompt_tokens,
        **dropped,
        "eval_dropped": 0,
        "eval_prompts": 0,
        **(eval_dropped or {}),
    }
    return pool, eval_problems, filtered


def prompt_lengths(encoder, pool: list, eval_problems: list, limit: int = 2000) -> tuple[list, list, str | None]:
    """``(train, eval, longest)``: the token lengths of (the first ``limit`` of) each pool's
    prompts after the chat template, and the name of the longest prompt's problem (``None`` when
    both are empty)."""
    lengths = {
        "train": [len(encoder.ids(p)) for p in pool[:limit]],
        "eval": [len(encoder.ids(p)) for p in eval_problems[:limit]],
    }
    longest = max(((n, s, i) for s, ls in lengths.items() for i, n in enumerate(ls)), default=None)
    if longest is None:
        return lengths["train"], lengths["eval"], None
    _, split, i = longest
    return lengths["train"], lengths["eval"], rollout.problem_name((pool if split == "train" else eval_problems)[i])


def log_filtered(folder, filtered: dict | None, step: int) -> None:
    """task.max_prompt_tokens: what was dropped, said once on stderr and kept in events.jsonl."""
    if filtered is None:
        return
    f = filtered
    print(
        f"[gapo] task.max_prompt_tokens={f['max_prompt_tokens']}: dropped {f['train_dropped']} of "
        f"{f['train_prompts']} training prompts and {f['eval_dropped']} of {f['eval_prompts']} evaluation "
        "prompts (longer after the chat template)",
        file=sys.stderr,
    )
    folder.log_event({"event": "filter_prompts", "step": step, **f})


class ProblemOrder:
    """The order in which a pool of ``n`` problems is visited: passes over it, each a fresh
    permutation drawn from ``random.Random(seed)``; ``next(pool, k)`` the next ``k`` problems."""

    def __init__(self, n: int, seed: int):
        self.rng = random.Random(seed)
        self.order = self._shuffled(n)
        self.pos = 0

    def _shuffled(self, n: int) -> list[int]:
        order = list(range(n))
        self.rng.shuffle(order)
        return order

    def next(self, pool: list, k: int) -> list:
        out = []
        for _ in range(k):
            if self.pos >= len(self.order):  # a pass is over: a new permutation of the (current) pool
                self.order, self.pos = self._shuffled(len(pool)), 0
            out.append(pool[self.order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        """The checkpoint's ``pos``, ``order`` and ``py_rng`` (the names checkpoints have always had)."""
        return {"pos": self.pos, "order": self.order, "py_rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["py_rng"])
        self.pos, self.order = state["pos"], state["order"]
