"""``gapo export``: a plain Hugging Face model folder from a run (its final policy or a
checkpoint)."""

from __future__ import annotations

from gapo.cli.common import int_at_least

HELP = "a plain Hugging Face model folder from a run (final policy or checkpoint)"
EXAMPLES = (
    "examples:\n  gapo export runs/qwen-gsm8k\n  gapo export runs/qwen-gsm8k --step 150 --out qwen-rl "
    "--dtype bfloat16\n  gapo export runs/qwen-lora --merge-lora --out qwen-lora-merged"
)


def add_arguments(p) -> None:
    p.add_argument("run", help="the run folder (gapo train --out), finished or stopped early")
    p.add_argument(
        "--step",
        type=int_at_least(0),
        metavar="N",
        help="the model at step N: the final policy's, the last checkpoint's or a kept checkpoint's step "
        "(train.keep_checkpoints; default: the latest)",
    )
    p.add_argument(
        "--out",
        help="the folder to write (default: RUN-step<N> beside the run folder; never inside a run folder, "
        "which an --overwrite of the run would delete); must not exist or be empty",
    )
    p.add_argument(
        "--dtype",
        default="keep",
        choices=["keep", "float32", "bfloat16", "float16"],
        help="weights' dtype; keep: the base model's (a bfloat16 base gives bfloat16, not the float32 "
        "master weights of the checkpoint)",
    )
    p.add_argument(
        "--merge-lora",
        action="store_true",
        help="a LoRA run: write the merged model (default: the peft adapter folder)",
    )


def run(args) -> int:
    from gapo.rl.run_dir import refuse_inside_run, require_run

    require_run(args.run)  # a wrong folder is named before torch loads
    if args.out is not None:
        refuse_inside_run(args.out, "--out")
    from gapo.rl.export import export

    out, info = export(args.run, args.out, step=args.step, dtype=args.dtype, merge_lora=args.merge_lora)
    kind = "LoRA adapter (peft; base " + repr(info["base"]) + ")" if info["adapter"] else "model"
    print(
        f"exported the {kind} of {args.run} at step {info['step']} (from its {info['source']}) as "
        f"{info['dtype']} to {out}"
    )
    return 0
