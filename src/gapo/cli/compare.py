"""``gapo compare``: a grid of methods × regimes × seeds (gapo.experiments.grid), resumable, and
its report."""

from __future__ import annotations

from pathlib import Path

HELP = "a grid of methods × regimes × seeds (see gapo.experiments.grid)"
EXAMPLES = (
    "examples:\n  gapo compare --quick\n  gapo compare --config configs/grid.yaml --out runs/full\n"
    "  gapo compare --config configs/grid.yaml --out runs/full --report-only"
)


def add_arguments(p) -> None:
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


def run(args) -> int:
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
