"""`dyntra-emu run`: one cluster run on a workload, its summary and its plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from emu.cli.flags import Formatter, add_fault_option, add_input_options, add_run_options, wrap
from emu.cli.inputs import config_sources, prepare, warn_ignored_keys
from emu.cli.outdir import prepare_out_dir
from emu.cli.running import run_one
from emu.cli.timeline import check_timeline_path, save_timeline

EPILOG = """\
examples:
  dyntra-emu run
      bundled default workload, 4 ranks, DyntraLB static mode from step 0
  dyntra-emu run --workload longtail --dp 2 --out runs/longtail
  dyntra-emu run --workload my_trace.jsonl --additional-config @decode_node.json
  dyntra-emu run --additional-config \\
      '{"scheduler_config": {"dyntra_lb_config": {"enabled": true, "mode": "dynamic"}}}'
  dyntra-emu run --no-dyntra-lb                  # plain DP, same as --additional-config '{}'

The output directory gets rank<r>.events.jsonl (event logs), rank<r>.wall.jsonl
(wall-clock times), rank<r>.log (DyntraLB log), metrics.json (docs/metrics.md),
summary.md, the plots load.png, bubble.png, tpot.png, and run.json (whether the run
finished: complete, failed, interrupted; error.txt then holds every rank's report).
SIGINT (Ctrl-C) and SIGTERM stop every rank and exit 130 and 143.
Without --out it is runs/<date>-<time>-run under the current directory.
"""


def cmd_run(args) -> int:
    prepared = prepare(args, config_sources(args))
    warn_ignored_keys(args, prepared)
    timeline = (check_timeline_path(args.timeline, "--timeline", args.out) if args.timeline
                else None)
    if args.torchrun is not None and args.torchrun[0] != 0:
        # Rank 0 prepares the directory; every rank writes after the rendezvous.
        out_dir = Path(args.out)
    else:
        out_dir = prepare_out_dir(args.out, args.overwrite, "run")
    metrics = run_one(args, prepared, prepared.configs[0], out_dir, "run")
    if metrics is None:
        return 0
    # Imported only now: matplotlib costs a refused input or a failed run half a second.
    from emu.metrics import load_run
    from emu.plots import write_plots
    from emu.report import summary_table, write_summary_md

    run = load_run(out_dir)
    plots = write_plots(run, out_dir)
    if timeline is not None:
        save_timeline(run, out_dir, timeline)
    write_summary_md(out_dir / "summary.md", metrics,
                     title=f"dyntra-emu run: {prepared.workload_label}, dp={args.dp}",
                     plots=plots)
    print(summary_table(metrics))
    print(f"\nOutputs in {out_dir}/: summary.md, metrics.json, "
          f"{', '.join(p.name for p in plots)}, rank<r>.events.jsonl"
          + (f"; timeline in {timeline}" if timeline is not None else ""))
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "run", help="run the cluster on a workload; print a summary, write metrics and plots",
        description=wrap("Run the emulated DP cluster on a workload: progress while it runs, a "
                         "summary table at the end, and the run's files in an output directory."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=True)
    add_run_options(parser)
    add_fault_option(parser)
    parser.add_argument("--timeline", metavar="FILE",
                        help="also write the run's timeline to FILE (Trace Event Format, for "
                             "Perfetto and chrome://tracing; `dyntra-emu timeline` writes it "
                             "from a run directory)")
    parser.set_defaults(func=cmd_run)
    return parser
