"""``gapo pretrain``: build (or rebuild) the embedded base policies (docs/design.md §9)."""

from __future__ import annotations

from gapo.cli.common import int_at_least
from gapo.rl.names import BASE_PRESETS

HELP = "build (or rebuild) the embedded base policies"
EXAMPLES = "examples:\n  gapo pretrain\n  gapo pretrain --preset three --preset medium --eval 200"


def add_arguments(p) -> None:
    p.add_argument(
        "--preset",
        action="append",
        choices=BASE_PRESETS,
        help=f"{' | '.join(BASE_PRESETS)}; repeat for several (default: low and high)",
    )
    p.add_argument("--rebuild", action="store_true", help="train anew even if a cached copy exists")
    p.add_argument(
        "--eval",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="then report pass@k on N held-out problems (0: no evaluation)",
    )
    p.add_argument("--threads", type=int_at_least(1), default=1, help="torch CPU threads")


def run(args) -> int:
    import torch

    from gapo import tasks
    from gapo.policy.base_policy import get_base_policy, resolve
    from gapo.policy.model import load_policy
    from gapo.policy.sampling import SamplingParams
    from gapo.rl.evaluate import EvalPlan, evaluate, pass_line

    torch.set_num_threads(args.threads)
    for preset in args.preset or ["low", "high"]:  # medium (larger, slower) only when asked for
        path = get_base_policy(preset, rebuild=args.rebuild)
        print(f"{preset}: {path}")
        if args.eval:
            model, tok = load_policy(path)
            task = tasks.get("countdown", **resolve(preset).rl_task)
            res = evaluate(
                model,
                tok,
                task,
                task.generate("eval", args.eval, 1234),
                params=SamplingParams(max_new_tokens=task.max_completion_len + 1),
                plan=EvalPlan(n=16),
            )
            print("  " + pass_line(res))
    return 0
