"""`dyntra-emu validate`: what `run` with the same flags would run, checked, nothing started."""

from __future__ import annotations

import argparse
from pathlib import Path

from emu.cli.errors import EXIT_FAILED, UsageError
from emu.cli.flags import Formatter, add_fault_option, add_input_options, wrap
from emu.cli.inputs import build_spec, config_sources, describe_config, prepare

EPILOG = """\
examples:
  dyntra-emu validate                            # the defaults `dyntra-emu run` would use
  dyntra-emu validate --additional-config @decode_node.json --dp 8
  dyntra-emu validate --workload my_trace.jsonl --dp 2 --block-size 16

Exit code 0 and an "OK" line when everything is valid; 1 and one "problem:" line per
problem otherwise; 2 for a bad flag.
"""


def cmd_validate(args) -> int:
    problems: list[str] = []
    sources = []
    try:
        sources = config_sources(args)
    except UsageError as exc:  # unreadable @file: still check the workload
        problems += exc.problems
    try:
        prepared = prepare(args, sources)
        problems += prepared.warnings
        if not problems:
            build_spec(args, prepared, prepared.configs[0], Path("."))
    except UsageError as exc:
        problems += exc.problems
    if problems:
        for problem in problems:
            print(f"problem: {problem}")
        print(f"{len(problems)} problem(s) found")
        return EXIT_FAILED
    from emu.no_effect import trace_warnings

    for warning in trace_warnings(prepared.configs[0].dyntra_lb, prepared.trace,
                                  args.block_size):
        print(f"warning: {warning}")
    impl = "" if args.impl == "kit" else f" with --impl {args.impl}"
    print(f"OK: {sources[0][1]} ({describe_config(prepared.configs[0])}) and workload "
          f"{prepared.workload_label} ({len(prepared.trace)} requests) are valid for "
          f"dp={args.dp}{impl}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "validate", help="check a config and a trace for a DP size; list every problem",
        description=wrap("Check what `dyntra-emu run` with the same flags would run, without "
                         "starting anything: the additional config (including vllm-ascend's "
                         "deployment checks for a decode node), every line of the trace, and "
                         "how both fit the DP size and KV settings."),
        formatter_class=Formatter, allow_abbrev=False, epilog=EPILOG)
    add_input_options(parser, single_config=True)
    add_fault_option(parser)
    parser.set_defaults(func=cmd_validate)
    return parser
