"""``gapo eval``: held-out pass@k (and coverage) of a run folder (``gapo eval RUN``: its policy/,
or ``--step N``, with the run's task, reward and prompt settings), a model folder (``--model
PATH``) or the embedded base policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gapo.cli.common import add_config_args, config_from_args, int_at_least

HELP = "held-out pass@k (and coverage) of a policy"
OVERRIDE_EXAMPLE = "eval.temperature=0.6"
EXAMPLES = (
    "examples:\n  gapo eval --model runs/gapo/policy --n 16 --problems 128\n"
    "  gapo eval runs/gapo --step 50 eval.temperature=0.6\n"
    "  gapo eval --model ./Qwen2.5-0.5B-Instruct --task math:data/gsm8k.jsonl eval.temperature=0.6 "
    "sampling.max_new_tokens=512"
)
PARSER_KW = {
    "usage": "gapo eval [RUN] [options] [section.key=value ...]",
    "description": "Evaluate a run folder (gapo eval RUN: its policy/, or --step N; with the\n"
    "run's task, reward and prompt settings), a model folder (--model PATH) or the\n"
    "embedded base policy.",
}


def add_arguments(p) -> None:
    add_config_args(p, OVERRIDE_EXAMPLE)
    p.add_argument(
        "--n",
        type=int_at_least(1),
        help="samples per problem, pass@k for k up to n (default: eval.samples: the run's)",
    )
    p.add_argument(
        "--problems", type=int_at_least(1), help="problems to evaluate on (default: eval.problems: the run's)"
    )
    p.add_argument("--split", default="eval", choices=["train", "eval"], help="the task's split the problems come from")
    p.add_argument("--threads", type=int_at_least(1), default=1, help="torch CPU threads")
    p.add_argument(
        "--step",
        type=int_at_least(0),
        metavar="N",
        help="with a run folder (gapo eval RUN): the model at step N, its policy/, its last checkpoint or a "
        "kept one (train.keep_checkpoints; default: the latest); the run's task, reward and prompt settings "
        "are reused, overrides change them",
    )
    p.add_argument(
        "--allow-change",
        action="store_true",
        help="with a run folder: evaluate with its config.yaml even where it was edited after the run started "
        "(default: such an edit is an error; the config inside the checkpoint is the run's)",
    )


def run(args) -> int:
    run_dir = eval_run(args)
    if args.allow_change and run_dir is None:
        raise ValueError("--allow-change only applies to a run folder (gapo eval RUN)")
    saved = None
    if run_dir is not None:  # the run's own task, reward and prompt settings; --config/overrides change them
        from gapo.rl.run_dir import RunFolder

        saved = RunFolder(run_dir).saved_config()
    cfg = config_from_args(args, saved)  # checked before torch and transformers load

    import torch

    torch.set_num_threads(args.threads)
    cfg, model, tok, model_path = _policy(args, run_dir, cfg)
    # a run is evaluated as it evaluated itself unless told otherwise
    n, n_problems = args.n or cfg.eval.samples, args.problems or cfg.eval.problems
    if n_problems == 0:
        raise ValueError("eval.problems is 0 (the run evaluated nothing while training); pass --problems N")
    res = _evaluate(args, cfg, (model, tok, model_path), n=n, n_problems=n_problems)
    res.pop("eval/correct")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}, indent=1))
    return 0


def eval_run(args) -> str | None:
    """The run folder ``gapo eval`` was given (``gapo eval RUN`` or ``--model RUN``), else None; a
    folder that is neither a run nor a model folder is an error saying what is expected."""
    from gapo.rl.run_dir import RunFolder

    given = [o for o in args.overrides if "=" not in o]
    args.overrides = [o for o in args.overrides if "=" in o]
    if len(given) > 1:
        raise ValueError(f"give one run folder, got {given}")
    if given and args.model:
        raise ValueError(f"give either a run folder ({given[0]!r}) or --model, not both")
    path = given[0] if given else args.model
    if path is None:
        if args.step is not None:
            raise ValueError("--step N needs a run folder: gapo eval RUN --step N")
        return None
    p = Path(path)
    if p.is_dir() and RunFolder(p).is_run():
        args.model = None
        return str(p)
    if given and p.name == "policy" and RunFolder(p.parent).is_run():  # gapo eval RUN/policy: the run's
        if args.step is not None:
            raise ValueError(f"--step N reads the run folder: gapo eval {str(p.parent)} --step {args.step}")
        return str(p.parent)
    if given or args.step is not None:  # a run was meant
        what = "a model folder, not a run folder" if (p / "config.json").is_file() else "not a gapo run folder"
        raise ValueError(
            f"{str(p)!r} is {what}: gapo eval RUN wants the --out folder of a gapo train run "
            "(with .gapo-run and config.yaml; its policy/ or, with --step N, its checkpoint is "
            "evaluated); for a Hugging Face model folder use --model PATH"
        )
    if p.is_dir() and not (p / "config.json").is_file():
        raise ValueError(
            f"--model {str(p)!r} has no config.json and is not a gapo run folder: give a Hugging Face "
            "model folder (config.json + weights), a run's policy/ folder, or a run folder (gapo eval RUN)"
        )
    return None


def _policy(args, run_dir: str | None, cfg):
    """``(cfg, model, tokenizer, what the model is)``: a run's model with the config it was trained
    with (unless config.yaml's edits are allowed), else ``--model``'s or the embedded base policy."""
    from gapo.policy.model import load_policy

    if run_dir is not None:
        from gapo.rl.export import RunModels, load_run_model

        rm = RunModels(run_dir)
        cfg = config_from_args(args, rm.eval_config(allow_change=args.allow_change))
        model, tok, info = load_run_model(rm, args.step, cfg.model.device)
        model_path = f"{run_dir} ({info['source']}, step {info['step']})"
        print(f"[gapo] evaluating {model_path}; config: {rm.config_source}", file=sys.stderr)
        return cfg, model, tok, model_path
    from gapo.rl.trainer import with_policy

    cfg, model_path = with_policy(cfg)
    model, tok = load_policy(model_path, cfg.model.device)
    return cfg, model, tok, model_path


def _evaluate(args, cfg, policy: tuple, *, n: int, n_problems: int) -> dict:
    """Draw the split's problems, wrap the rewards, check the context and evaluate ``policy``
    (``(model, tokenizer, what the model is)``)."""
    import torch

    from gapo import tasks
    from gapo.policy.chat import PromptEncoder
    from gapo.policy.model import check_context
    from gapo.policy.precision import autocast
    from gapo.rl.evaluate import EvalPlan, eval_params, evaluate
    from gapo.rl.rollout import problem_name
    from gapo.tasks.custom import with_rewards

    model, tok, model_path = policy
    task = tasks.build(cfg.task.name, cfg.task.params)
    max_new_tokens = cfg.sampling.max_new_tokens or task.max_completion_len + 1
    t = cfg.task
    encoder = PromptEncoder(
        tok, chat=t.chat, system_prompt=t.system_prompt, chat_template_kwargs=t.chat_template_kwargs
    )
    problems = _problems(args, cfg, task, encoder, n_problems)
    r = cfg.reward
    task = with_rewards(
        task,
        r.funcs,
        r.weights,
        r.ranges,
        probe=problems[0] if problems else None,
        reward_range=cfg.algo.reward_range,
        timeout_s=r.timeout_s,
        workers=max(1, t.scoring_workers),
    )
    lengths = [len(encoder.ids(p)) for p in problems]
    longest = problem_name(problems[lengths.index(max(lengths))]) if lengths else None
    check_context(model, lengths, max_new_tokens, key="sampling.max_new_tokens", where=model_path, longest=longest)
    with autocast(torch.device(cfg.model.device), cfg.model.dtype):
        return evaluate(
            model,
            tok,
            task,
            problems,
            params=eval_params(cfg, max_new_tokens),
            plan=EvalPlan(n=n, seed=cfg.eval.seed),
            progress=True,
            encode=encoder.ids,
        )  # stop tokens: the tokenizer's EOS + generation_config's


def _problems(args, cfg, task, encoder, n_problems: int) -> list:
    """``n_problems`` of ``--split``, those longer than ``task.max_prompt_tokens`` dropped (said)."""
    from gapo.rl.rollout import draw_problems

    problems, dropped = draw_problems(task, encoder, args.split, n_problems, cfg.eval.seed, cfg.task.max_prompt_tokens)
    if dropped is not None:
        print(
            f"[gapo] task.max_prompt_tokens={cfg.task.max_prompt_tokens}: dropped {dropped[args.split + '_dropped']} "
            f"of {dropped[args.split + '_prompts']} {args.split} prompts",
            file=sys.stderr,
        )
    return problems
