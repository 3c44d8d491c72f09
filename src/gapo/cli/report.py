"""``gapo report``: tables, captioned plots and sample rollouts from run folders."""

from __future__ import annotations

from pathlib import Path

HELP = "tables and plots from run folders"
EXAMPLES = "examples:\n  gapo report runs/demo/fixed runs/demo/gapo --out runs/demo/report"


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", help="one or more run folders (required)")
    p.add_argument(
        "--out",
        help="report folder (default: RUN/report/ for one run; for several, report-<names>/ in their common parent)",
    )


def run(args) -> int:
    from gapo.rl.run_records import load_run  # torch-free: a wrong folder is named before the plotting stack loads

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
