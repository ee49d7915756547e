"""`dyntra-emu run`: one cluster run on a workload, its summary and its plots."""

from __future__ import annotations

import argparse

from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, add_fault_option, add_input_options, add_run_options, wrap
from emu.cli.inputs import (
    build_spec,
    check_specs,
    config_source,
    ignored_keys,
    read_inputs,
    warn_ignored_keys,
)
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.recipe_hint import print_setup_hint
from emu.cli.running import resolve_launch, run_one
from emu.cli.split import add_run_split_options, check_split_flags, cmd_run_split
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

The output directory gets the records in Parquet (docs/records.md):
rank<r>.steps/ and rank<r>.requests/ (`dyntra-emu events` prints them as
JSON Lines), rank<r>.wall/ (wall-clock times); rank<r>.log (DyntraLB log),
rank<r>.progress.jsonl (what the progress bar reads), metrics.json (docs/metrics.md),
summary.md, the plots load.png, bubble.png, tpot.png, and run.json (whether the run
finished: complete, failed, interrupted; error.txt then holds every rank's report).
SIGINT (Ctrl-C) and SIGTERM stop every rank and exit 130 and 143.
With --split N the trace runs as N windows side by side (docs/split.md): each
window's run in windows/w<k>/, the stitched metrics.json, summary and plots
in the output directory.
Without --out it is runs/<date>-<time>-run under the current directory.
"""


def cmd_run(args) -> int:
    launch = resolve_launch(args)
    check_split_flags(args, executor_flags=True)
    if args.split is not None and launch.torchrun is not None:
        raise UsageError("--split: not under torchrun (the windows are runs of their own, "
                         "started by dyntra-emu on an executor); start dyntra-emu directly")
    text, source, problems = config_source(args)
    inputs = read_inputs(args, launch.dp)
    out_dir = out_dir_path(args.out, "run")
    timeline = (check_timeline_path(args.timeline, "--timeline", out_dir) if args.timeline
                else None)
    spec = build_spec(args, launch.dp, inputs, text, out_dir)
    [checked] = check_specs(args, inputs, [(spec, source)], local_ranks=launch.local_ranks,
                            problems=problems)
    if launch.rank == 0:  # under torchrun: rank 0 warns and prepares the directory
        warn_ignored_keys("run", ignored_keys([(checked.config, source)]))
        print_setup_hint(args.workload, spec)
    if args.split is not None:
        return cmd_run_split(args, inputs, checked, source, out_dir)
    if launch.rank == 0:
        prepare_out_dir(out_dir, args.overwrite)
    measured = run_one(args, checked, launch, "run")
    if measured is None:
        return 0
    # Imported only now: matplotlib costs a refused input or a failed run half a second.
    from emu.plots import write_plots
    from emu.report import summary_table, write_summary_md

    metrics, run = measured
    plots = write_plots(run, out_dir)
    if timeline is not None:
        save_timeline(run, out_dir, timeline)
    write_summary_md(out_dir / "summary.md", metrics,
                     title=f"dyntra-emu run: {spec.workload}, dp={spec.dp_size}",
                     plots=plots)
    print(summary_table(metrics))
    print(f"\nOutputs in {out_dir}/: summary.md, metrics.json, "
          f"{', '.join(p.name for p in plots)}, rank<r>.<table>/"
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
    add_run_split_options(parser)
    parser.add_argument("--timeline", metavar="FILE",
                        help="also write the run's timeline to FILE (Trace Event Format, for "
                             "Perfetto and chrome://tracing; `dyntra-emu timeline` writes it "
                             "from a run directory)")
    parser.set_defaults(func=cmd_run)
    return parser
