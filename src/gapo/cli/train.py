"""``gapo train``: one run, from a config file and/or ``key=value`` overrides, fresh, resumed or
replacing an earlier run (the run-folder rules: docs/run-folders.md)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from gapo.cli.common import add_config_args, config_from_args

HELP = "train with a config file and/or key=value overrides"
OVERRIDE_EXAMPLE = "algo.eps_high_max=0.28"
EXAMPLES = (
    "examples:\n  gapo train --out runs/gapo algo.eps_schedule=linear algo.eps_high_max=0.28 train.steps=200\n"
    "  gapo train --out runs/sapo algo.loss=sapo algo.loss_params.tau_neg=1.05   (the adaptive clips: "
    "docs/design.md §2.13)\n"
    "  gapo train --out runs/gapo --resume\n"
    "  gapo train --out runs/gapo --resume --allow-change train.steps=400\n"
    "  gapo train --out runs/math --task math:data/gsm8k.jsonl --model ./Qwen2.5-0.5B-Instruct "
    "model.device=cuda\n"
    "  gapo train --out runs/mine --task data:my.jsonl task.params.prompt_field=instruction --model ./my-model "
    "--reward my_rewards.py:score --reward my_rewards.py:brevity reward.weights=[1,0.5] task.max_prompt_tokens=512"
)


def add_arguments(p) -> None:
    add_config_args(p, OVERRIDE_EXAMPLE)
    p.add_argument("--out", help="run folder (default: runs/<timestamp>)")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint, with its saved config"
    )
    g.add_argument(
        "--overwrite", action="store_true", help="replace the gapo run in --out (only once the new run has validated)"
    )
    p.add_argument(
        "--allow-change",
        action="store_true",
        help="with --resume: apply config/overrides that differ from the saved config (logged)",
    )


def run(args) -> int:
    from gapo.rl.run_dir import RunFolder  # torch-free: the config is checked before torch loads

    if args.resume and not args.out:
        raise ValueError("--resume needs --out RUN_FOLDER (the run to continue)")
    if args.allow_change and not args.resume:
        raise ValueError("--allow-change only applies with --resume")
    base = None
    out = args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    # the run folder is resolved (a symlinked --out: where it points) and, if it exists, locked
    # before anything of it is read; the lock is held until the run ends (run_lock.RunLock)
    folder = RunFolder(out)
    try:
        if args.resume:  # a resumed run starts from its own saved config; changes must be asked for
            folder.check(resume=True, overwrite=False)
            base = folder.saved_config()
        cfg = config_from_args(args, base)
        if not args.resume:  # a folder that is refused is refused before a base policy is built
            folder.check(resume=False, overwrite=args.overwrite)
        from gapo.rl.trainer import Trainer, with_policy  # torch, transformers: once the config has validated

        # the base policy is resolved here (built, with a message and a bar, if not cached), not by the Trainer
        cfg, policy_path = with_policy(cfg, progress=cfg.train.progress)
        tr = Trainer(
            cfg,
            folder,
            policy_path=policy_path,
            resume=args.resume,
            overwrite=args.overwrite,
            allow_change=args.allow_change,
        )
        res = tr.fit()
    finally:
        folder.release()
    say_train_result(out, res, cfg.train.steps)
    return 130 if res["stopped"] else 0


def last_eval_record(out) -> dict | None:
    """The run's last ``kind: eval`` record in metrics.jsonl (this session's or an earlier one's)."""
    last = None
    try:
        lines = (Path(out) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for ln in lines:
        try:
            rec = json.loads(ln)
        except ValueError:  # a partial last line of a killed run
            continue
        if isinstance(rec, dict) and rec.get("kind") == "eval":
            last = rec
    return last


def say_train_result(out, res: dict, steps: int) -> None:
    """What ``gapo train`` ends with: where the run is, how far it got, which evaluation the pass@k
    figures are (after an interruption the last one may be the step-0 one, before any training),
    and the exact command that resumes it."""
    ev = res["eval"] or last_eval_record(out)
    if res["stopped"]:
        print(f"stopped at step {res['step']} of {steps}; checkpoint saved in {out}")
    else:
        print(f"run folder: {out}  (finished: step {res['step']} of {steps})")
    if ev:
        m = ev.get("step", "?")
        when = " (before training)" if m == 0 else ""
        lead = "last evaluation" if res["stopped"] or m != res["step"] else "evaluation"
        from gapo.rl.evaluate import pass_line

        print(f"{lead} at step {m}{when}: {pass_line(ev)}")
    elif res["stopped"]:
        print("no evaluation yet (eval.problems=0, or none was due)")
    if res["stopped"]:
        print(f"resume with: gapo train --out {shlex.quote(str(out))} --resume")
