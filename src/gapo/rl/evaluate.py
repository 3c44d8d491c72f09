"""Held-out evaluation: unbiased pass@k, entrance coverage and first-move diversity.

For each problem, ``n`` samples at the evaluation temperature give ``c_j`` correct ones and

- ``eval/pass@k`` = mean_j pass_at_k(n, c_j, k) for k = 1, 2, 4, …, n (arXiv 2107.03374);
- ``eval/coverage`` (tasks with ``solutions``/``canonical``, e.g. Countdown): mean_j of the share
  of problem j's distinct canonical solutions found among its n samples ("entrance coverage",
  cf. arXiv 2608.29188);
- ``eval/first_move_entropy``: mean_j of the entropy (nats) of the first-move distribution of
  problem j's samples, and ``eval/first_moves_distinct`` the mean number of distinct first moves;
- ``eval/response_len`` (tokens) and ``eval/entropy_proxy`` = mean −logp of sampled tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from tqdm.auto import tqdm

from gapo.core.checks import as_int
from gapo.core.metrics import first_move_entropy, pass_at_k_curve
from gapo.exec.scoring import score_samples
from gapo.policy.chat import PromptEncoder
from gapo.policy.model import eos_token_ids
from gapo.policy.sampling import SamplingParams, sample
from gapo.rl.rollout import problem_name

__all__ = ["evaluate", "EvalPlan", "eval_params", "pass_line"]


def pass_line(ev: dict) -> str:
    """An evaluation record's pass@k values on one line: ``pass@1=0.250  pass@2=0.375``."""
    return "  ".join(f"{k[5:]}={v:.3f}" for k, v in ev.items() if k.startswith("eval/pass@"))


def eval_params(cfg, max_new_tokens: int, eos_token_id=None) -> SamplingParams:
    """What evaluation samples, from a run's config: ``eval.temperature`` and ``eval.top_p``, its
    own (pass@k is measured on the policy as it is, by default at temperature 1 and top_p 1,
    whatever training samples at, with none of ``sampling.top_k``, ``sampling.min_p`` and
    ``sampling.repetition_penalty``), and training's ``sampling.stop`` and ``max_new_tokens``
    (``sampling.max_new_tokens``, resolved by the caller): the completion's format and length."""
    e = cfg.eval
    return SamplingParams(max_new_tokens, e.temperature, e.top_p, eos_token_id, cfg.sampling.stop)


@dataclass(frozen=True)
class EvalPlan:
    """How many samples ``evaluate`` draws per problem, and how (the ``eval`` config keys).

    - ``n``: int >= 1, samples per problem (the ``n`` of pass@k; k runs over 1, 2, 4, …, n);
    - ``seed``: int, the seed of the sampling generator (the same seed, the same samples);
    - ``batch_size``: int >= 1, rows (problem × sample) per ``sample`` call; it bounds memory
      and, as the rows of a batch share the generator's stream, which random numbers a row draws.

    An invalid value is a ``ValueError`` naming the field, raised when the plan is built.
    """

    n: int = 16
    seed: int = 0
    batch_size: int = 512

    def __post_init__(self):
        for name, lo in (("n", 1), ("seed", None), ("batch_size", 1)):
            v = getattr(self, name)
            i = as_int(v)  # Python or NumPy integers, not bools or floats
            if i is None or (lo is not None and i < lo):
                raise ValueError(f"{name} must be an int{f' >= {lo}' if lo is not None else ''}, got {v!r}")
            object.__setattr__(self, name, i)


@torch.no_grad()
def evaluate(
    model,
    tok,
    task,
    problems: list,
    params: SamplingParams | None = None,
    plan: EvalPlan | None = None,
    *,
    progress: bool = False,
    encode=None,
) -> dict:
    """Evaluate ``model`` on ``problems`` with ``plan.n`` samples each; see the module docstring.

    ``params`` (``gapo.policy.sampling.SamplingParams``) is what is sampled, the evaluation
    temperature among it; sampling stops as in training: at the stop tokens
    ``params.eos_token_id`` (``None``: the tokenizer's EOS and ``generation_config.eos_token_id``,
    ``gapo.policy.model.eos_token_ids``) and at the stop strings ``params.stop``; the text scored
    is cut there. ``plan`` (``EvalPlan``, default ``EvalPlan()``) is how many samples, with which
    seed. ``encode(problem) -> ids`` builds the model's input (default: the tokenizer on the raw
    ``problem.prompt``, and a conversational problem is an error naming it rather than its last
    turn alone; the trainer and ``gapo eval`` pass their chat-template encoder's ``ids``)."""
    plan = EvalPlan() if plan is None else plan
    if not isinstance(params, SamplingParams):
        raise TypeError(
            "evaluate() needs params=SamplingParams(max_new_tokens=...), got "
            + ("none" if params is None else type(params).__name__)
        )
    if not isinstance(plan, EvalPlan):
        raise TypeError(f"evaluate(): plan must be an EvalPlan, got {type(plan).__name__}")
    if encode is None:
        raw = PromptEncoder(tok, chat=False)
        raw.check(problems, problem_name)
        encode = raw.ids
    n = plan.n
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    if params.eos_token_id is None:
        params = replace(params, eos_token_id=eos_token_ids(model, tok))
    texts, tok_sum, logp_sum = _sample_all(model, tok, [encode(p) for p in problems], params, plan, progress)
    model.train(was_training)
    flat = len(problems) * n
    out, correct = _score_and_summarise(task, problems, texts, n)
    out["eval/response_len"] = tok_sum / max(flat, 1)
    out["eval/entropy_proxy"] = -logp_sum / max(tok_sum, 1.0)
    out["eval/n"] = n
    out["eval/problems"] = len(problems)
    out["eval/correct"] = correct
    out["time/eval_s"] = time.perf_counter() - t0
    return out


def _sample_all(model, tok, prompts: list, params: SamplingParams, plan: EvalPlan, progress: bool):
    """``plan.n`` samples of each prompt, in batches of ``plan.batch_size`` rows from one seeded
    generator: ``(texts[j] = prompt j's completions, response tokens, their summed logp)``."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(plan.seed)
    flat = [j for j in range(len(prompts)) for _ in range(plan.n)]
    texts: list[list[str]] = [[] for _ in prompts]
    tok_sum, logp_sum = 0.0, 0.0
    bar = tqdm(total=len(flat), desc="eval", unit="sample", leave=False, disable=not progress)
    for s in range(0, len(flat), plan.batch_size):
        rows = flat[s : s + plan.batch_size]
        r = sample(
            model,
            [prompts[j] for j in rows],
            params=params,
            pad_token_id=tok.pad_token_id,
            tokenizer=tok,
            generator=gen,
        )
        for j, text in zip(rows, r.texts(tok)):
            texts[j].append(text)
        tok_sum += float(r.response_mask.sum())
        logp_sum += float((r.logp * r.response_mask).sum())
        bar.update(len(rows))
    bar.close()
    return texts, tok_sum, logp_sum


def _score_and_summarise(task, problems: list, texts: list[list[str]], n: int) -> tuple[dict, list[int]]:
    """pass@k, first-move diversity and coverage of ``texts[j]`` (problem j's n samples), and the
    number of correct samples per problem. Each sample is scored once; a task that raises or
    returns a non-finite reward is a ValueError naming the task and the problem
    (gapo.exec.scoring), not a bare traceback."""
    # correct: reward > 0 (the built-in verifiers' 0/1), or, for rewards of your own
    # (gapo.tasks.custom), a reward reaching the task's success_reward (R_max of algo.reward_range)
    top = getattr(task, "success_reward", None)
    # (a user's reward functions are scored in one batch, in a worker: gapo.exec.scoring.score_samples)
    ok = [[(r >= top) if top is not None else r > 0 for r in rs] for rs in score_samples(task, problems, texts)]
    correct = [sum(o) for o in ok]
    out: dict = {f"eval/pass@{k}": v for k, v in pass_at_k_curve(n, correct).items()}
    moves = [[task.first_move(t) for t in ts] for ts in texts]
    out["eval/first_move_entropy"] = sum(map(first_move_entropy, moves)) / max(len(problems), 1)
    out["eval/first_moves_distinct"] = sum(len({m for m in ms if m is not None}) for ms in moves) / max(
        len(problems), 1
    )
    if hasattr(task, "solutions") and hasattr(task, "canonical"):
        shares = []
        for p, ts, os_ in zip(problems, texts, ok):
            sols = task.solutions(p)
            found = {task.canonical(t, p) for t, o in zip(ts, os_) if o} - {None}
            shares.append(len(found & set(sols)) / len(sols) if sols else 0.0)
        out["eval/coverage"] = sum(shares) / max(len(shares), 1)
    return out, correct
