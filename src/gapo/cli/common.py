"""What several commands share: the help formatter, integer options with a floor, ``--task``
specs, and the config arguments (``--config``, ``--task``, ``--model``, ``--reward``, overrides)
with the config they resolve to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


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


def int_at_least(lo: int):
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


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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


def add_config_args(p: argparse.ArgumentParser, override_example: str) -> None:
    """The arguments that make a config: ``--config``, ``--task``, ``--model``, ``--reward`` and
    ``section.key=value`` overrides (``override_example``: one key the command reads)."""
    p.add_argument(
        "--config",
        help="YAML config file (sections: task, reward, model, sampling, algo, optim, train, "
        "eval, log; default: none, the defaults `gapo config` lists)",
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
        help=f"section.key=value overrides, e.g. {override_example} "
        "(keys: `gapo config`, docs/config.md; applied after --config)",
    )


def config_from_args(args, base: dict | None = None):
    """The config: ``base`` (a resumed run's saved config) or the defaults, then ``--config``,
    ``--task``/``--model`` and the overrides."""
    from gapo.rl.config import load_config  # inside: `gapo --help` reads no config module (design §3.3)

    overrides = []
    if args.task:
        overrides += parse_task(args.task)
    if getattr(args, "model", None):
        overrides.append(f"model.path={args.model}")
    if getattr(args, "reward", None):  # recorded as found from here (Config.validate): the saved config works anywhere
        overrides.append(f"reward.funcs={json.dumps(args.reward)}")
    return load_config(args.config, overrides + list(args.overrides), base=base)
