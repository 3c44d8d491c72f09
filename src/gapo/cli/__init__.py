"""``gapo`` command line, one module per command: demo | train | eval | export | pretrain | report
| compare | config.

Each command's module has ``HELP`` (its line in ``gapo --help``), ``EXAMPLES`` (its epilog),
``add_arguments(parser)`` and ``run(args) -> exit status``, and may have ``PARSER_KW`` (its own
usage line and description); ``build_parser`` builds the parser from that table. Heavy libraries
(torch, transformers) are imported inside ``run``, so ``gapo --help`` and a config error are fast
(docs/design.md §3.3).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from gapo import __version__
from gapo.cli.common import HelpFormatter

COMMANDS = ("demo", "train", "eval", "export", "pretrain", "report", "compare", "config")


def command_modules() -> dict[str, ModuleType]:
    """``{command: its module}``, in ``gapo --help``'s order."""
    return {name: importlib.import_module(f"gapo.cli.{name}") for name in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gapo",
        description="GAPO (Group Adaptive Clipping Policy Optimization) and "
        "its baselines for RL with verifiable rewards.",
    )
    ap.add_argument("--version", action="version", version=f"gapo {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, mod in command_modules().items():
        p = sub.add_parser(
            name, help=mod.HELP, epilog=mod.EXAMPLES, formatter_class=HelpFormatter, **getattr(mod, "PARSER_KW", {})
        )
        mod.add_arguments(p)
        p.set_defaults(fn=mod.run)
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
