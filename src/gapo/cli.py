"""``gapo`` command line: demo | train | eval | export | pretrain | report | compare.

Heavy libraries (torch, transformers) are imported inside the commands so ``gapo --help`` is fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gapo.rl.names import BASE_PRESETS

# The demo: the same base policy and seed, fixed clipping vs GAPO, everything else equal.
# The update regime is the grid's calibrated one (RESULTS.md): 8 mini-batches × 2 epochs at lr 5e-5,
# where fixed clipping binds on a few percent of positive-advantage tokens, so the clip bound matters.
DEMO_COMMON = [
    "model.base_preset=low",
    "train.prompts=16",
    "train.group_size=8",
    "train.mini_batches=8",
    "train.epochs=2",
    "optim.lr=5e-5",
    "algo.advantage=drgrpo",
    "algo.eps_low=0.2",
    "eval.problems=64",
    "eval.samples=16",
    "train.checkpoint_every=0",
]
DEMO_METHODS = {
    "fixed": ["algo.eps_schedule=fixed", "algo.eps_high_max=0.2"],
    "gapo": ["algo.eps_schedule=linear", "algo.eps_high_max=0.28"],
}


def parse_task(spec: str) -> list[str]:
    """``countdown`` | ``arithmetic`` | ``math:PATH`` | ``data:PATH`` | ``rg:NAME`` | ``humaneval`` | ``mbpp:PATH``
    → overrides."""
    name, _, arg = spec.partition(":")
    out = [f"task.name={name}"]
    if arg:
        key = {"math": "path", "mbpp": "path", "rg": "dataset", "data": "path"}.get(name)
        if key is None:
            raise ValueError(f"task {name!r} takes no ':' argument (got {spec!r})")
        if key == "path" and Path(arg).expanduser().exists():
            # absolute in the run's config.yaml, so `gapo eval RUN` and `--resume` work from any folder
            arg = str(Path(arg).expanduser().absolute())
        out.append(f"task.params.{key}={arg}")
    return out


def _int_at_least(lo: int):
    """An argparse type: an integer >= ``lo``, with a message that says so."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {v}")
        return v

    parse.__name__ = f"integer >= {lo}"
    return parse


class _Help(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default: ``(default: X)`` is appended unless the help
    already says what the default is (a None default must be described in words there, e.g.
    "default: runs/<timestamp>"); flags read "(default: off)". Examples in the epilog keep their
    line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{text} (default: {'off' if isinstance(action, argparse._StoreTrueAction) else 'on'})"
        if action.default is None:
            return text
        return f"{text} (default: %(default)s)"


# one example per command, each with keys that command reads
EXAMPLES = {
    "demo": "examples:\n  gapo demo\n  gapo demo --steps 30 --eval-samples 8 --out runs/demo-short",
    "train": (
        "examples:\n  gapo train --out runs/gapo algo.eps_schedule=linear algo.eps_high_max=0.28 train.steps=200\n"
        "  gapo train --out runs/gapo --resume\n"
        "  gapo train --out runs/gapo --resume --allow-change train.steps=400\n"
        "  gapo train --out runs/math --task math:data/gsm8k.jsonl --model ./Qwen2.5-0.5B-Instruct "
        "model.device=cuda\n"
        "  gapo train --out runs/mine --task data:my.jsonl task.params.prompt_field=instruction --model ./my-model "
        "--reward my_rewards.py:score --reward my_rewards.py:brevity reward.weights=[1,0.5] task.max_prompt_tokens=512"
    ),
    "eval": (
        "examples:\n  gapo eval --model runs/gapo/policy --n 16 --problems 128\n"
        "  gapo eval runs/gapo --step 50 eval.temperature=0.6\n"
        "  gapo eval --model ./Qwen2.5-0.5B-Instruct --task math:data/gsm8k.jsonl eval.temperature=0.6 "
        "sampling.max_new_tokens=512"
    ),
    "export": (
        "examples:\n  gapo export runs/qwen-gsm8k\n  gapo export runs/qwen-gsm8k --step 150 --out qwen-rl "
        "--dtype bfloat16\n  gapo export runs/qwen-lora --merge-lora --out qwen-lora-merged"
    ),
    "pretrain": "examples:\n  gapo pretrain\n  gapo pretrain --preset three --preset medium --eval 200",
    "report": "examples:\n  gapo report runs/demo/fixed runs/demo/gapo --out runs/demo/report",
    "compare": (
        "examples:\n  gapo compare --quick\n  gapo compare --config configs/grid.yaml --out runs/full\n"
        "  gapo compare --config configs/grid.yaml --out runs/full --report-only"
    ),
}
# the overrides' example per command: a key that command reads
OVERRIDE_EXAMPLES = {"train": "algo.eps_high_max=0.28", "eval": "eval.temperature=0.6"}


def _common_train_args(p: argparse.ArgumentParser, cmd: str = "train") -> None:
    p.add_argument(
        "--config",
        help="YAML config file (sections: task, reward, model, sampling, algo, optim, train, "
        "eval, log; default: none, the defaults of src/gapo/rl/config.py)",
    )
    p.add_argument(
        "--task",
        help="countdown | arithmetic | math:PATH | data:PATH | rg:NAME | humaneval | mbpp:PATH "
        "(PATH: JSONL, JSON, Parquet, CSV, a save_to_disk folder or a dataset folder; data:PATH names "
        "its columns with task.params.prompt_field / answer_fields and needs --reward; default: the config's "
        "task.name, countdown)",
    )
    p.add_argument(
        "--model",
        help="local Hugging Face checkpoint folder (default: the embedded base policy of "
        "model.base_preset, low | high | three | medium)",
    )
    p.add_argument(
        "--reward",
        action="append",
        metavar="MODULE:FN",
        help="a reward of your own, module.path:function or my_rewards.py:function, called as "
        "fn(prompt, completion, **fields) -> float or None (skip); repeat for several, weighted by "
        "reward.weights=[1, 0.5]; 'task' is the task's own verifier as one term (without it --reward "
        "replaces the verifier). Sets reward.funcs (default: none, the task's verifier)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help=f"section.key=value overrides, e.g. {OVERRIDE_EXAMPLES[cmd]} "
        "(keys: src/gapo/rl/config.py; applied after --config)",
    )


def _load(args, base: dict | None = None) -> object:
    """The config: ``base`` (a resumed run's saved config) or the defaults, then ``--config``,
    ``--task``/``--model`` and the overrides."""
    import json

    from gapo.rl.config import load_config

    overrides = []
    if args.task:
        overrides += parse_task(args.task)
    if getattr(args, "model", None):
        overrides.append(f"model.path={args.model}")
    if getattr(args, "reward", None):  # recorded as found from here (Config.validate): the saved config works anywhere
        overrides.append(f"reward.funcs={json.dumps(args.reward)}")
    return load_config(args.config, overrides + list(args.overrides), base=base)


def cmd_train(args) -> int:
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
        cfg = _load(args, base)
        from gapo.rl.trainer import Trainer  # torch, transformers: only once the config has validated

        tr = Trainer(cfg, folder, resume=args.resume, overwrite=args.overwrite, allow_change=args.allow_change)
        res = tr.fit()
    finally:
        folder.release()
    _say_train_result(out, res, cfg.train.steps)
    return 130 if res["stopped"] else 0


def _last_eval_record(out) -> dict | None:
    """The run's last ``kind: eval`` record in metrics.jsonl (this session's or an earlier one's)."""
    import json

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


def _say_train_result(out, res: dict, steps: int) -> None:
    """What ``gapo train`` ends with: where the run is, how far it got, which evaluation the pass@k
    figures are (after an interruption the last one may be the step-0 one, before any training),
    and the exact command that resumes it."""
    import shlex

    ev = res["eval"] or _last_eval_record(out)
    if res["stopped"]:
        print(f"stopped at step {res['step']} of {steps}; checkpoint saved in {out}")
    else:
        print(f"run folder: {out}  (finished: step {res['step']} of {steps})")
    if ev:
        m = ev.get("step", "?")
        when = " (before training)" if m == 0 else ""
        lead = "last evaluation" if res["stopped"] or m != res["step"] else "evaluation"
        print(
            f"{lead} at step {m}{when}: "
            + "  ".join(f"{k[5:]}={v:.3f}" for k, v in ev.items() if k.startswith("eval/pass@"))
        )
    elif res["stopped"]:
        print("no evaluation yet (eval.problems=0, or none was due)")
    if res["stopped"]:
        print(f"resume with: gapo train --out {shlex.quote(str(out))} --resume")


def _eval_run(args) -> str | None:
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


def cmd_eval(args) -> int:
    import json

    run = _eval_run(args)
    if args.allow_change and run is None:
        raise ValueError("--allow-change only applies to a run folder (gapo eval RUN)")
    saved = None
    if run is not None:  # the run's own task, reward and prompt settings; --config/overrides change them
        from gapo.rl.run_dir import RunFolder

        saved = RunFolder(run).saved_config()
    cfg = _load(args, saved)  # checked before torch and transformers load

    import torch

    from gapo import tasks
    from gapo.policy.chat import PromptEncoder
    from gapo.policy.model import check_context, load_policy
    from gapo.policy.precision import autocast
    from gapo.rl.evaluate import EvalPlan, eval_params, evaluate
    from gapo.rl.rollout import draw_problems, problem_name
    from gapo.tasks.custom import with_rewards

    torch.set_num_threads(args.threads)
    if run is not None:  # the config the run was trained with, unless config.yaml's edits are allowed
        from gapo.rl.export import RunModels, load_run_model

        rm = RunModels(run)
        cfg = _load(args, rm.eval_config(allow_change=args.allow_change))
        model, tok, info = load_run_model(rm, args.step, cfg.model.device)
        model_path = f"{run} ({info['source']}, step {info['step']})"
        print(f"[gapo] evaluating {model_path}; config: {rm.config_source}", file=sys.stderr)
    else:
        from gapo.rl.trainer import with_policy

        cfg, model_path = with_policy(cfg)
        model, tok = load_policy(model_path, cfg.model.device)
    # a run is evaluated as it evaluated itself unless told otherwise
    n, n_problems = args.n or cfg.eval.samples, args.problems or cfg.eval.problems
    if n_problems == 0:
        raise ValueError("eval.problems is 0 (the run evaluated nothing while training); pass --problems N")
    task = tasks.build(cfg.task.name, cfg.task.params)
    max_new_tokens = cfg.sampling.max_new_tokens or task.max_completion_len + 1
    encoder = PromptEncoder(
        tok,
        chat=cfg.task.chat,
        system_prompt=cfg.task.system_prompt,
        chat_template_kwargs=cfg.task.chat_template_kwargs,
    )
    problems, dropped = draw_problems(task, encoder, args.split, n_problems, cfg.eval.seed, cfg.task.max_prompt_tokens)
    if dropped is not None:
        print(
            f"[gapo] task.max_prompt_tokens={cfg.task.max_prompt_tokens}: dropped {dropped[args.split + '_dropped']} "
            f"of {dropped[args.split + '_prompts']} {args.split} prompts",
            file=sys.stderr,
        )
    task = with_rewards(
        task,
        cfg.reward.funcs,
        cfg.reward.weights,
        cfg.reward.ranges,
        probe=problems[0] if problems else None,
        reward_range=cfg.algo.reward_range,
        timeout_s=cfg.reward.timeout_s,
    )
    lengths = [len(encoder.ids(p)) for p in problems]
    check_context(
        model,
        lengths,
        max_new_tokens,
        key="sampling.max_new_tokens",
        where=model_path,
        longest=problem_name(problems[lengths.index(max(lengths))]) if lengths else None,
    )
    with autocast(torch.device(cfg.model.device), cfg.model.dtype):
        res = evaluate(
            model,
            tok,
            task,
            problems,
            params=eval_params(cfg, max_new_tokens),
            plan=EvalPlan(n=n, seed=cfg.eval.seed),
            progress=True,
            encode=encoder.ids,
        )  # stop tokens: the tokenizer's EOS + generation_config's
    res.pop("eval/correct")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}, indent=1))
    return 0


def cmd_export(args) -> int:
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


def cmd_pretrain(args) -> int:
    import torch

    from gapo import tasks
    from gapo.policy.base_policy import get_base_policy, resolve
    from gapo.policy.model import load_policy
    from gapo.policy.sampling import SamplingParams
    from gapo.rl.evaluate import EvalPlan, evaluate

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
            print("  " + "  ".join(f"{k[5:]}={v:.3f}" for k, v in res.items() if k.startswith("eval/pass@")))
    return 0


def cmd_report(args) -> int:
    from gapo.rl.run_dir import load_run  # torch-free: a wrong folder is named before the plotting stack loads

    runs = [load_run(d) for d in args.runs]
    from gapo.experiments.report import default_report_dir, format_samples, format_table, summarise, write_report

    # default: one run's own RUN/report/; several runs: report-<names>/ in their common parent
    out = Path(args.out) if args.out else default_report_dir(args.runs)
    md = write_report(runs, out)
    print(format_table([summarise(r) for r in runs]))
    for r in runs:
        if r["samples"]:
            print(format_samples(r, n=2))
    print(f"report written to {out} ({md.name} and {len(list(out.glob('*.png')))} figures)")
    return 0


def cmd_demo(args) -> int:
    import torch

    from gapo.experiments.report import format_table, summarise, write_report
    from gapo.policy.base_policy import get_base_policy
    from gapo.rl.config import load_config
    from gapo.rl.run_dir import load_run
    from gapo.rl.trainer import Trainer

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    out = Path(args.out)
    print(demo_estimate(args.steps, args.eval_every, args.eval_problems, args.eval_samples), flush=True)
    print("[1/3] base policy (cached after the first run; preset 'low')", flush=True)
    get_base_policy("low")
    print(f"      ready after {time.perf_counter() - t0:.0f}s", flush=True)
    runs = []
    for i, (name, extra) in enumerate(DEMO_METHODS.items()):
        print(f"[2/3] RL run {i + 1}/{len(DEMO_METHODS)}: {name}", flush=True)
        cfg = load_config(
            None,
            DEMO_COMMON
            + extra
            + [
                f"train.steps={args.steps}",
                f"eval.every={args.eval_every}",
                f"train.seed={args.seed}",
                f"eval.problems={args.eval_problems}",
                f"eval.samples={args.eval_samples}",
            ],
        )
        Trainer(cfg, out / name, overwrite=True).fit()
        runs.append(load_run(out / name))
    print("[3/3] report", flush=True)
    notes = (
        f"Embedded base policy (preset `low`, 4-number Countdown), {args.steps} RL steps of 16 prompts × 8 "
        f"rollouts, 8 mini-batches × 2 epochs at lr 5e-5, seed {args.seed}; held-out pass@k from "
        f"{args.eval_samples} samples on {args.eval_problems} problems. One seed: differences between the "
        "two runs of a few points are within seed-to-seed noise; RESULTS.md has the multi-seed comparison."
    )
    md = write_report(
        runs, out / "report", title="gapo demo: fixed clipping vs GAPO (Countdown, low regime)", notes=notes
    )
    keys = [
        "before/pass@1",
        "after/pass@1",
        "before/pass@8",
        "after/pass@8",
        "after/pass@16",
        "after/coverage",
        "train/clip/frac_high_pos",
        "train/time/step_s",
    ]
    print(format_table([summarise(r) for r in runs], keys))
    print(f"report: {md}   (total {time.perf_counter() - t0:.0f}s)")
    return 0


# the default demo (2 runs x 60 steps, 4 evaluations of 64 problems x 16 samples each) measured 99 s
# on 2 quiet cores (BENCHMARKS.md section 7, f863976); the estimate scales it by the work asked for
DEMO_MEASURED_S, DEMO_DEFAULT_WORK = 99.0, (60, 4 * 64 * 16)


def demo_estimate(steps: int, eval_every: int, problems: int, samples: int) -> str:
    """The line the demo prints before it starts: the measured default scaled by RL steps and by
    evaluation samples (each about half of the default demo's time)."""
    n_evals = 2 + (max(steps - 1, 0) // eval_every if eval_every else 0)  # step 0, every N, the last
    work = 0.5 * steps / DEMO_DEFAULT_WORK[0] + 0.5 * n_evals * problems * samples / DEMO_DEFAULT_WORK[1]
    s = 10.0 + (DEMO_MEASURED_S - 10.0) * work  # about 10 s of it is start-up (imports, the base policy)
    est = f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"
    return (
        f"estimate: about {est} on 2 quiet CPU cores for 2 runs x {steps} steps and {n_evals} evaluations "
        f"of {problems} x {samples} samples each (the default demo measured {DEMO_MEASURED_S:.0f} s there; "
        "a busy machine takes 3-5 times longer; the progress bars show the live ETA)"
    )


def cmd_compare(args) -> int:
    if args.config and not Path(args.config).is_file():  # named before torch loads (the grid module needs it)
        raise ValueError(f"--config: grid file {args.config!r} does not exist")
    from gapo.experiments.grid import run_grid
    from gapo.experiments.grid_spec import QUICK_GRID, load_grid
    from gapo.experiments.report import grid_report

    if args.quick and args.config:
        raise ValueError("give either --quick or --config, not both")
    grid = load_grid(args.config or QUICK_GRID)
    out = Path(args.out or grid.get("out") or "runs/compare")
    if not args.report_only:
        stats = run_grid(grid, out, retry_failed=args.retry_failed, say=lambda s: print(s, flush=True))
        print(
            f"grid: {stats['done']} cells run, {stats['failed']} failed, {stats['skipped']} skipped "
            f"of {stats['total']} in {stats['wall_s']:.0f}s"
        )
    grid_report(grid, out, args.report_dir, args.figures_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gapo",
        description="GAPO (Group Adaptive Clipping Policy Optimization) and "
        "its baselines for RL with verifiable rewards.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    sub_kw = dict(formatter_class=_Help)
    p = sub.add_parser(
        "demo",
        help="fixed clipping vs GAPO from the embedded base policy, with a report",
        epilog=EXAMPLES["demo"],
        **sub_kw,
    )
    p.add_argument("--out", default="runs/demo", help="folder of the two runs (OUT/fixed, OUT/gapo) and OUT/report")
    p.add_argument("--steps", type=_int_at_least(1), default=60, help="RL steps of each run")
    p.add_argument(
        "--eval-every",
        type=_int_at_least(0),
        default=20,
        help="held-out evaluation every N steps (0: only before and after)",
    )
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="train.seed of both runs")
    p.add_argument("--eval-problems", type=_int_at_least(1), default=64, help="held-out problems per evaluation")
    p.add_argument(
        "--eval-samples",
        type=_int_at_least(1),
        default=16,
        help="samples per held-out problem (pass@k for k up to this)",
    )
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser(
        "train", help="train with a config file and/or key=value overrides", epilog=EXAMPLES["train"], **sub_kw
    )
    _common_train_args(p, "train")
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
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser(
        "eval",
        help="held-out pass@k (and coverage) of a policy",
        epilog=EXAMPLES["eval"],
        usage="gapo eval [RUN] [options] [section.key=value ...]",
        description="Evaluate a run folder (gapo eval RUN: its policy/, or --step N; with the\n"
        "run's task, reward and prompt settings), a model folder (--model PATH) or the\n"
        "embedded base policy.",
        **sub_kw,
    )
    _common_train_args(p, "eval")
    p.add_argument(
        "--n",
        type=_int_at_least(1),
        help="samples per problem, pass@k for k up to n (default: eval.samples: the run's)",
    )
    p.add_argument(
        "--problems", type=_int_at_least(1), help="problems to evaluate on (default: eval.problems: the run's)"
    )
    p.add_argument("--split", default="eval", choices=["train", "eval"], help="the task's split the problems come from")
    p.add_argument("--threads", type=_int_at_least(1), default=1, help="torch CPU threads")
    p.add_argument(
        "--step",
        type=_int_at_least(0),
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
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser(
        "export",
        help="a plain Hugging Face model folder from a run (final policy or checkpoint)",
        epilog=EXAMPLES["export"],
        **sub_kw,
    )
    p.add_argument("run", help="the run folder (gapo train --out), finished or stopped early")
    p.add_argument(
        "--step",
        type=_int_at_least(0),
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
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser(
        "pretrain", help="build (or rebuild) the embedded base policies", epilog=EXAMPLES["pretrain"], **sub_kw
    )
    p.add_argument(
        "--preset",
        action="append",
        choices=BASE_PRESETS,
        help=f"{' | '.join(BASE_PRESETS)}; repeat for several (default: low and high)",
    )
    p.add_argument("--rebuild", action="store_true", help="train anew even if a cached copy exists")
    p.add_argument(
        "--eval",
        type=_int_at_least(0),
        default=0,
        metavar="N",
        help="then report pass@k on N held-out problems (0: no evaluation)",
    )
    p.add_argument("--threads", type=_int_at_least(1), default=1, help="torch CPU threads")
    p.set_defaults(fn=cmd_pretrain)

    p = sub.add_parser("report", help="tables and plots from run folders", epilog=EXAMPLES["report"], **sub_kw)
    p.add_argument("runs", nargs="+", help="one or more run folders (required)")
    p.add_argument(
        "--out",
        help="report folder (default: RUN/report/ for one run; for several, report-<names>/ in their common parent)",
    )
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser(
        "compare",
        help="a grid of methods × regimes × seeds (see gapo.experiments.grid)",
        epilog=EXAMPLES["compare"],
        **sub_kw,
    )
    p.add_argument("--config", help="grid YAML (default: the --quick grid, configs/grid-quick.yaml)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="the CI-sized grid, configs/grid-quick.yaml (about 3 min on 2 quiet cores from an empty cache; "
        "measured 22 min on 2 cores at a load average of 10-12)",
    )
    p.add_argument("--out", help="the cells' folder (default: the grid's `out`, else runs/compare)")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report from finished cells")
    p.add_argument("--retry-failed", action="store_true", help="rerun cells that failed (default: skip them)")
    p.add_argument("--report-dir", help="summary.json, cells.csv, tables.md (default: the grid's, else OUT/report)")
    p.add_argument("--figures-dir", help="PNG figures (default: the grid's, else the report folder)")
    p.set_defaults(fn=cmd_compare)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    # key=value overrides may come before and after flags (argparse takes one run of positionals)
    stray = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if stray:
        hint = (
            "; quote an override whose value has spaces: 'task.params={a: 1, b: 2}'"
            if any(not x.startswith("-") for x in stray)
            else ""
        )
        ap.error(f"unrecognized arguments: {' '.join(stray)}{hint}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        return args.fn(args)
    except (ValueError, OSError, FloatingPointError) as e:  # OSError: full disk, read-only folder, …
        print(f"gapo {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gapo {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
