"""`dyntra-emu inspect`: a workload's request block-count distribution at a KV block
size, with DyntraLB's thresholds on it; nothing runs.

A command of its own rather than a part of ``validate``: validate answers "would this
run start?" for a whole run (DP size, KV pool, faults) and writes nothing, where inspect
looks at the traffic alone, to choose the thresholds before any run, and writes a
picture."""

from __future__ import annotations

import argparse

from dyntra_lb.config import DyntraLBConfig, load_additional_config
from emu.block_counts import BlockCounts, plot, report
from emu.cli.errors import UsageError
from emu.cli.flags import Formatter, add_output_options, add_workload_options, wrap
from emu.cli.inputs import TraceReading, read_config_arg, read_workload
from emu.cli.outdir import out_dir_path, prepare_out_dir
from emu.cli.recipe_hint import recipe_note
from emu.knobs import Int
from emu.spec import RunSpec

EPILOG = """\
examples:
  dyntra-emu inspect --workload my_trace.jsonl --block-size 128
  dyntra-emu inspect --workload mooncake_trace.jsonl --block-size 128 \\
      --additional-config @decode_node.json --out runs/traffic
  dyntra-emu inspect --workload BurstGPT_1.csv --window 0:3600 --block-size 128

Prints the distribution, where long_req_block_threshold and bubble_threshold fall on it
(from --additional-config; DyntraLB's defaults otherwise) and the share of requests that
would arm dynamic mode; writes DIR/block_counts.png. Exit 2 for bad input.
"""


def cmd_inspect(args) -> int:
    workload, problems = read_workload(args.workload, args.seed, None, TraceReading.of(args))
    lb, config_problems = _thresholds(args.additional_config)
    problems += config_problems
    if problems:
        raise UsageError(*problems)
    for text in workload.notes:
        print(f"note: {text}")
    out_dir = prepare_out_dir(out_dir_path(args.out, "inspect"), args.overwrite)
    counts = BlockCounts.of(workload.trace, args.block_size)
    print(f"workload {workload.label}{recipe_note(args)}:")
    print("\n".join(report(counts, lb)))
    path = out_dir / "block_counts.png"
    plot(counts, lb, path)
    print(f"\nPlot: {path}")
    return 0


def _thresholds(value: str | None) -> tuple[DyntraLBConfig, list[str]]:
    """DyntraLB's config of --additional-config (its thresholds, whether or not it is
    enabled), or the defaults."""
    if value is None:
        return DyntraLBConfig(), []
    try:
        text, source = read_config_arg(value)
    except UsageError as exc:
        return DyntraLBConfig(), exc.problems
    try:
        return load_additional_config(text).dyntra_lb, []
    except ValueError as exc:
        return DyntraLBConfig(), [f"{source}: {exc}"]


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "inspect", help="a workload's request block counts and where DyntraLB's thresholds "
                        "fall on them",
        description=wrap("Read a workload (any trace format) and show the distribution of its "
                         "requests' KV block counts at --block-size, with "
                         "long_req_block_threshold and bubble_threshold marked: the numbers "
                         "to set them by. Nothing runs."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_workload_options(parser)
    parser.add_argument("--block-size", type=Int(1).parse, default=RunSpec.block_size,
                        metavar="N", help="tokens per KV block "
                                          f"(default: {RunSpec.block_size})")
    parser.add_argument("--additional-config", metavar="JSON|@FILE",
                        help="the decode node's --additional-config whose thresholds to mark "
                             "(default: DyntraLB's defaults)")
    parser.add_argument("--seed", type=Int(0).parse, default=RunSpec.seed, metavar="N",
                        help="seed of a generated (recipe:) workload (default: "
                             f"{RunSpec.seed})")
    add_output_options(parser)
    parser.set_defaults(func=cmd_inspect)
    return parser
